"""Text in, text out in this process: :class:`Translator` runs the searches on a model it loads and
places (the text side, settings to results, is :mod:`.translation`'s :class:`BaseTranslator`).

Examples:
    >>> tr = Translator.load("runs/base/model")                            # doctest: +SKIP
    >>> tr.translate(["A dog runs.", ""])                                   # doctest: +SKIP
    ['Ein Hund läuft.', '']
    >>> best = tr.translate_detailed(["A dog runs."], nbest=2)[0].hypotheses[0]  # doctest: +SKIP
    >>> best.pieces, best.score, best.attention.shape                      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Iterator, Sequence

import torch
from torch import Tensor

from ..config import DecodeConfig, Runtime
from ..data.tokenizer import load_tokenizer
from ..device import autocast_context, resolve_device
from ..errors import CheckpointError, ConfigError
from ..model.io import load_decode_config
from .search.common import AttentionChoice, SearchOutput
from .search.dispatch import SearchSpec
from .search.ensemble import Ensemble
from .search.forced import ForcedOutput, ForceSpec
from .placement import ModelDirs, apply_threads, load_model_dir, model_dirs, prepared_for
from .search.shortlist import Shortlist
from .search.speculative import Speculation, check_draft
from .speed import restore
from .translation import BaseTranslator, Hypothesis, Translation, check_layer_head, input_limit

# the text side's names, where they were first imported from
__all__ = ["BaseTranslator", "Hypothesis", "Translation", "Translator", "check_layer_head", "draft_summary",
           "input_limit", "load_search_model", "shared_tokenizer"]


class Translator(BaseTranslator):
    """A model and its tokenizer, ready to translate lists of sentences in this process.

    Args:
        model: an eval-mode :class:`~transduce.model.Transformer` (or anything with the same
            ``encode``/``decode``/``new_cache``/``config``, such as an
            :class:`~transduce.inference.search.ensemble.Ensemble`).
        tokenizer: a :class:`~transduce.data.tokenizer.Tokenizer` (``encode``/``decode``/``pieces``).
        runtime: device, precision and int8 (:class:`~transduce.config.Runtime`;
            ``workers`` is :class:`~transduce.inference.pool.TranslatorPool`'s).
        decode: the default decoding settings (:attr:`decode`); inputs longer than
            ``max_input_len`` are cut to that many tokens, with a warning.
        speculation: a draft model (same tokenizer) that proposes tokens for ``model`` to check:
            greedy search and sampling then run as speculative decoding (same output,
            :mod:`~transduce.inference.search.speculative`): ``decode``'s beam becomes 1 and a
            beam search asked for is refused; its ``stats`` count the accepted proposals.
        shortlist: the target vocabulary shortlist that ``decode.shortlist`` searches over
            (:mod:`~transduce.inference.search.shortlist`; :meth:`load` reads the model directory's).

    The model is prepared for decoding in place (:func:`~transduce.inference.speed.prepare_for_decoding`:
    fused projections, shared source rows, on CPU oneDNN linear layers; same parameters and
    results), and searches keep packed and fused copies of the weights. :meth:`close` (or
    leaving a ``with Translator(...)`` block) hands the model back as it came (int8 aside),
    without those copies: do that before training a model you translated with.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, runtime: Runtime = Runtime(),
                 decode: DecodeConfig | None = None, speculation: Speculation | None = None,
                 shortlist: Shortlist | None = None):
        if not model.config.family.translates:
            raise ConfigError(f"translate: needs an encoder_decoder model; this one is {model.config.arch}"
                              + (" (continue text with transduce generate)" if model.config.family.generates
                                 else ""))
        self.device = resolve_device(runtime.device, "runtime.device")
        autocast_context(self.device, runtime.precision, "runtime.precision")  # a bad precision fails here
        if runtime.int8 and self.device.type != "cpu":
            raise ConfigError(f"runtime.int8: dynamic int8 quantisation runs on the CPU; got device {self.device}")
        if runtime.compile and speculation is not None:
            raise ConfigError("runtime.compile: speculative decoding runs eagerly; drop the draft model or compile")
        self.runtime = runtime
        self.model = prepared_for(model, self.device, runtime)
        self.speculation = speculation
        if speculation is not None:
            check_draft(model.config, speculation.draft.config)
            speculation.draft = prepared_for(speculation.draft, self.device, runtime)
        self.tokenizer = tokenizer
        self.config = model.config
        self.shortlist = shortlist
        self.decode = decode or DecodeConfig()
        if speculation is not None:  # speculative decoding is greedy search (or sampling)
            self.decode = replace(self.decode, beam=1, nbest=1)

    def close(self) -> None:
        """Undo the preparation and drop the kept weight copies (see
        :func:`~transduce.inference.speed.restore`). The translator still works afterwards, more
        slowly (each search prepares the model for its own duration)."""
        restore(self.model)
        if self.speculation is not None:
            restore(self.speculation.draft)

    @classmethod
    def load(cls, paths: ModelDirs, runtime: Runtime = Runtime(),
             draft: str | os.PathLike | None = None) -> "Translator":
        """The model, tokenizer and saved decoding settings of a model directory, or the
        :class:`~transduce.inference.search.ensemble.Ensemble` of several (one tokenizer for all;
        the first one's decoding settings); ``draft``: a model directory of the same tokenizer
        whose model proposes tokens (speculative decoding). Prefer
        :func:`~transduce.inference.runtime.load`, which also builds pools."""
        dirs = model_dirs(paths)
        tokenizer = shared_tokenizer(dirs, draft)
        device = resolve_device(runtime.device, "runtime.device")
        apply_threads(runtime)
        model, speculation = load_search_model(dirs, draft, torch.device("cpu") if runtime.engines else device)
        return cls(model, tokenizer, runtime, load_decode_config(dirs[0]), speculation, Shortlist.load(dirs[0]))

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to bf16/fp16 when ``runtime.precision`` asks for it, else nothing."""
        return autocast_context(self.device, self.runtime.precision)

    def _search(self, batches: list[Tensor], spec: SearchSpec, prefixes: list[Tensor | None] | None = None,
                constraints: list[Tensor | None] | None = None, inside: Tensor | None = None) -> Iterator[SearchOutput]:
        none = [None] * len(batches)
        inside = None if inside is None else inside.to(self.device)
        if spec.decode.shortlist and self.shortlist is None:
            raise ConfigError("decode.shortlist: this model directory has no vocabulary shortlist; build one with "
                              "transduce shortlist MODEL_DIR --src S --tgt T")
        for src, prefix, phrases in zip(batches, prefixes or none, constraints or none):
            with torch.inference_mode(), self.autocast():
                out = spec.run(self.model, src.to(self.device), None if prefix is None else prefix.to(self.device),
                               self.speculation, None if phrases is None else phrases.to(self.device),
                               shortlist=self.shortlist, on_step=self.on_step,
                               inside=inside).cpu()
            yield out  # outside the block: the caller does not run in inference mode

    def _force(self, src: Tensor, tgt: Tensor, decode: DecodeConfig, attention: AttentionChoice | None = None
               ) -> ForcedOutput:
        with torch.inference_mode(), self.autocast():
            return ForceSpec(decode, attention).run(self.model, src.to(self.device), tgt.to(self.device))


def load_search_model(dirs: Sequence[str], draft: str | os.PathLike | None, device: torch.device
                      ) -> tuple[torch.nn.Module, Speculation | None]:
    """The model a search runs on, from directories checked by :func:`shared_tokenizer`: one
    model, or the :class:`~transduce.inference.search.ensemble.Ensemble` of several; and the
    draft model's :class:`~transduce.inference.search.speculative.Speculation`, if any."""
    if draft is not None and len(dirs) > 1:
        raise ConfigError("draft: speculative decoding checks one model's proposals; give one model directory")
    model = load_model_dir(dirs[0], device) if len(dirs) == 1 else Ensemble([load_model_dir(d, device) for d in dirs])
    return model, None if draft is None else Speculation(load_model_dir(draft, device))


def shared_tokenizer(dirs: Sequence[str], draft: str | os.PathLike | None = None):
    """The tokenizer of ``dirs[0]``, after a one-line error unless the other directories (an
    ensemble) and the ``draft`` exist and have the same one."""
    others = [(d, "model_dirs", "an ensemble needs one tokenizer") for d in dirs[1:]]
    if draft is not None:
        others.append((os.fspath(draft), "draft", "a draft must share the model's (train it with "
                       "data.tokenizer=MODEL_DIR)"))
    for path, _, _ in others:
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: model directory not found")
    tokenizer = load_tokenizer(dirs[0])
    for path, key, why in others:
        if load_tokenizer(path).digest() != tokenizer.digest():
            raise ConfigError(f"{key}: {path} has another tokenizer than {dirs[0]}; {why}")
    return tokenizer


def draft_summary(translator) -> dict | None:
    """A translator's speculative decoding statistics so far (None without a draft model, or
    when the draft runs in worker processes, whose statistics stay there)."""
    speculation = getattr(translator, "speculation", None)
    if speculation is None:
        return None
    s = speculation.stats
    return {"acceptance": round(s.acceptance, 4), "tokens_per_model_step": round(s.tokens_per_round, 3)}
