"""Score a model directory on a test set, whatever its task: what ``transduce evaluate`` runs.

A translation model (or an ensemble, or one with a draft) translates the source file and is
scored against the references (sacrebleu BLEU and chrF, :func:`~.metrics.evaluate_files`); a
language model or masked LM gets its perplexity on the text (:func:`~.heldout.perplexity`); a
classifier its accuracy and macro-F1 on labelled lines (:func:`~.heldout.accuracy`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..config import TASKS, DecodeConfig, model_task
from ..data.corpus import read_lines
from ..errors import ConfigError
from ..inference import draft_summary
from ..inference.runtime import ModelDirs, Runtime, load, model_dirs
from ..model.io import load_model_config
from .heldout import accuracy, perplexity
from .metrics import evaluate_files


@dataclass(frozen=True)
class EvalFiles:
    """What a model is scored on.

    Attributes:
        ref: translation: the references, aligned with ``src``; lm and mlm: the text to score;
            classify: ``text<TAB>label`` lines.
        src: translation only: the source sentences.
        tok_ref: translation only: lowercased Moses-tokenized references (adds ``bleu_moses_lc``).
        lang: the target language of ``tok_ref`` (Moses rules).
        hyp_tokenized: the model writes tokenized text already (score it as it is).
        compare: translation only: another system to test the model against (paired bootstrap
            and approximate randomization, :mod:`.significance`): its translations of ``src``
            (a file), or a model directory, which translates ``src`` with the same settings.
    """

    ref: str
    src: str | None = None
    tok_ref: str | None = None
    lang: str | None = None
    hyp_tokenized: bool = False
    compare: str | None = None


def evaluate_model(paths: ModelDirs, files: EvalFiles, runtime: Runtime = Runtime(),
                   overrides: dict[str, Any] | None = None, draft: str | None = None,
                   seed: int | None = None) -> dict[str, Any]:
    """Score the model directories on ``files`` as their task says (see the module docstring);
    ``overrides`` replace the saved decoding settings (DecodeConfig field -> value), ``seed``
    masks a masked LM's text. A setting the task does not use is a one-line ConfigError."""
    dirs, overrides = model_dirs(paths), dict(overrides or {})
    task = model_task(load_model_config(dirs[0]))
    if TASKS[task].translates:
        return _evaluate_translation(dirs, files, runtime, overrides, draft, seed)
    _check_unused(task, dirs, files, runtime, overrides, draft, seed)
    if TASKS[task].labelled:
        return accuracy(dirs[0], files.ref, device=runtime.device)
    kwargs = {} if seed is None else {"seed": seed}
    return perplexity(dirs[0], files.ref, overrides.get("batch_tokens", DecodeConfig.batch_tokens),
                      device=runtime.device, **kwargs)


def _evaluate_translation(dirs: list[str], files: EvalFiles, runtime: Runtime, overrides: dict[str, Any],
                          draft: str | None, seed: int | None) -> dict[str, Any]:
    if files.src is None:
        raise ConfigError("src: a translation model is scored by translating src against ref")
    if seed is not None:
        raise ConfigError("seed: is for masked LMs (train.task mlm); this is a translation model")
    with load(dirs, runtime, draft) as translator:
        decode = translator.settings(**overrides)
        other = None if files.compare is None else _other_translations(files.compare, files.src, runtime, decode)
        result = evaluate_files(translator, files.src, files.ref, decode, tok_ref_path=files.tok_ref, lang=files.lang,
                                hyps_tokenized=files.hyp_tokenized, compare=other)
        summary = draft_summary(translator)
    if summary is None:
        return result
    return {**result, "draft": {"draft_tokens": decode.draft_tokens, "draft_threshold": decode.draft_threshold,
                                **summary}}


def _other_translations(other: str, src: str, runtime: Runtime, decode: DecodeConfig) -> list[str]:
    """``--compare``'s translations: a model directory's of ``src`` with ``decode``, or a file's lines."""
    from pathlib import Path

    if not Path(other).is_dir():
        if not Path(other).is_file():
            raise ConfigError(f"compare: {other} is neither a hypothesis file nor a model directory")
        return list(read_lines(other))
    with load([other], runtime) as translator:
        return translator.translate(list(read_lines(src)), decode)


def _check_unused(task: str, dirs: list[str], files: EvalFiles, runtime: Runtime, overrides: dict[str, Any],
                  draft: str | None, seed: int | None) -> None:
    """A ConfigError naming the first setting that a model scored on ``ref`` alone does not use."""
    spec = TASKS[task]
    given = [f.name for f in fields(EvalFiles) if f.name != "ref" and getattr(files, f.name)]
    given += [f"decode.{k}" for k in overrides if not spec.perplexity or k != "batch_tokens"]
    given += [f"runtime.{f.name}" for f in fields(Runtime) if f.name not in ("device", "threads")
              and getattr(runtime, f.name) != f.default]
    given += ["model_dirs (an ensemble)"] * (len(dirs) > 1) + ["draft"] * (draft is not None)
    given += ["seed"] * (seed is not None and not spec.masked)
    if given:
        raise ConfigError(f"{given[0]}: not used for a train.task {task} model, which is scored on ref alone")
