"""Search algorithms on id tensors, and the one dispatcher that picks among them.

``common`` (output type, length limits, scoring), ``greedy``, ``sampling``, ``beam``,
``speculative`` (a draft model proposes), ``ensemble`` (several models as one), ``static_shapes``
(static shapes: CUDA graphs, or a compiled step on the CPU), ``constraints`` (lexically constrained
beams), ``forced`` (the score of a given output), ``lm`` (a language model's continuations),
``repetition`` (n-gram blocking, repetition penalty) and ``dispatch`` (:class:`SearchSpec`: which
one runs); around them ``shortlist`` (the target vocabulary a batch may use) and ``rerank`` (an
n-best list reranked: MBR, noisy channel).
"""

from .beam import beam_search
from .common import AttentionChoice, SearchOutput, length_penalty, max_lengths, prefix_ids
from .dispatch import SearchSpec
from .ensemble import Ensemble
from .greedy import greedy_search
from .sampling import sample
from .speculative import DraftStats, Speculation, speculative_search
from .static_shapes import static_search

__all__ = [
    "AttentionChoice", "SearchOutput", "length_penalty", "max_lengths", "prefix_ids", "SearchSpec",
    "greedy_search", "beam_search", "sample", "speculative_search", "Speculation", "DraftStats",
    "Ensemble", "static_search",
]
