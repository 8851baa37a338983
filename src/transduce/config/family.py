"""What each model family (``model.arch``) and each training task (``train.task``) is, decided here once.

:data:`FAMILIES` and :data:`TASKS` are looked up once (``ModelConfig.family``, ``RunConfig.task_spec``,
``TASKS[task]``); the trainer, evaluation, ``transduce info``, the front doors and the exports read
the value's fields (its forward for a batch, its vocabulary, what it can do) instead of asking the
name again. Adding a family or a task is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .model import ModelConfig


@dataclass(frozen=True)
class Family:
    """One ``model.arch``.

    Attributes:
        task: what its models train and run (an encoder_only model with classes: classify).
        states: (model, batch, its config) -> the states before the output projection or heads
            (B, T, D) for the batch's labels; the model may be wrapped (DDP, compiled): it is called.
        side: the tokenizer side of its vocabulary, that of its output tokens (``src`` or ``tgt``).
        layers, vocab_sizes, options: its stacks' depths, its vocabularies, its own options
            (``transduce info``).
        translates: an encoder-decoder: cross-attention, a search and saved decode settings; the
            Translator, ensembles, the server and guided alignment are for it.
        generates: a language model, continuing text (the Generator).
        masked_lm: BERT's: a [MASK] row past the tokenizer's ids, and heads on the encoder's states
            (masked-LM, next-sentence, classifier) instead of an output projection over every position.
    """

    arch: str
    task: str
    states: Callable[[Any, Any, "ModelConfig"], Any]
    side: str
    layers: tuple[str, ...]
    vocab_sizes: tuple[str, ...]
    options: tuple[str, ...]
    translates: bool = False
    generates: bool = False
    masked_lm: bool = False

    @property
    def vocab(self) -> str:
        """The vocabulary size of its output tokens: ``src_vocab_size`` or ``tgt_vocab_size``."""
        return f"{self.side}_vocab_size"


@dataclass(frozen=True)
class TaskSpec:
    """One ``train.task``.

    Attributes:
        lengths: the sides whose lengths size its batches (source, target).
        text: the sides of the corpus a tokenizer learns from (source, target).
        added: the tokens it adds to a sentence of ``data.max_len`` (BOS, EOS).
        front_door: the class :func:`~transduce.inference.load` gives for its models; None: none runs them.
        translates: validated by greedy BLEU, scored against references, quantized to static int8.
        labelled: reads ``text<TAB>label`` lines; its loss and accuracy are per sentence.
        masked, spans: its inputs are BERT's masked tokens / T5's span corruption (sentinel ids),
            from a seeded key per sentence.
        perplexity: scored by (masked-token) perplexity on held-out text.
    """

    task: str
    lengths: tuple[str, str]
    text: tuple[str, str]
    added: int
    front_door: str | None = None
    translates: bool = False
    labelled: bool = False
    masked: bool = False
    spans: bool = False
    perplexity: bool = False

    @property
    def corrupted(self) -> bool:
        """Its inputs are made from each step's sentences and a seed (masking or span corruption)."""
        return self.masked or self.spans


FAMILIES = {f.arch: f for f in (
    Family("encoder_decoder", "translation", lambda model, batch, cfg: model(batch.src, batch.tgt_in, project=False),
           "tgt", ("n_encoder_layers", "n_decoder_layers"), ("src_vocab_size", "tgt_vocab_size"), ("output_bias",),
           translates=True),
    Family("decoder_only", "lm", lambda model, batch, cfg: model(batch.tgt_in, project=False),
           "tgt", ("n_decoder_layers",), ("tgt_vocab_size",), (), generates=True),
    Family("encoder_only", "mlm",
           lambda model, batch, cfg: model(batch.src, batch.src_types() if cfg.type_vocab_size else None),
           "src", ("n_encoder_layers",), ("src_vocab_size",), ("embed_norm", "type_vocab_size"), masked_lm=True),
)}
ARCHS = tuple(FAMILIES)

# An LM reads only the target side; a masked LM, a classifier or span corruption only the source
# side (a span batch's target is shorter than its input). Translation adds EOS to the source and BOS
# to the target, an LM BOS, a masked LM or classifier BOS and EOS; span corruption's input is at
# most the sentence + EOS.
TASKS = {t.task: t for t in (
    TaskSpec("translation", ("src", "tgt"), ("src", "tgt"), 1, "Translator", translates=True),
    TaskSpec("lm", ("tgt", "tgt"), ("tgt", "tgt"), 1, "Generator", perplexity=True),
    TaskSpec("mlm", ("src", "src"), ("src", "src"), 2, masked=True, perplexity=True),
    TaskSpec("classify", ("src", "src"), ("src", "src"), 2, "Classifier", labelled=True),
    TaskSpec("span", ("src", "src"), ("src", "tgt"), 1, spans=True),
)}


def model_task(cfg: ModelConfig) -> str:
    """What a model of ``cfg`` does: the task of its ``arch``, or classify for a model with
    ``n_classes`` (encoder_only)."""
    return "classify" if cfg.n_classes else FAMILIES[cfg.arch].task
