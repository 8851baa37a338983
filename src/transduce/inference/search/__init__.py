"""Search algorithms on id tensors, and the one dispatcher that picks among them.

``common`` (output type, length limits, scoring), ``greedy``, ``sampling``, ``beam``,
``speculative`` (a draft model proposes), ``ensemble`` (several models as one), ``static``
(static shapes, CUDA graphs) and ``dispatch`` (:class:`SearchSpec`: which one runs).
"""

from .beam import beam_search
from .common import AttentionChoice, SearchOutput, length_penalty, max_lengths, prefix_ids
from .dispatch import SearchSpec
from .ensemble import Ensemble
from .greedy import greedy_search
from .sampling import sample
from .speculative import DraftStats, Speculation, speculative_search
from .static import static_search

__all__ = [
    "AttentionChoice", "SearchOutput", "length_penalty", "max_lengths", "prefix_ids", "SearchSpec",
    "greedy_search", "beam_search", "sample", "speculative_search", "Speculation", "DraftStats",
    "Ensemble", "static_search",
]
