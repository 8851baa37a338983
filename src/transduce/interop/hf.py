"""What every Hugging Face export and import shares: the two skeletons, written once
(:func:`export_family`, :func:`import_family`) over a family's description (:class:`HFExport`,
:class:`HFImport`: its tables, config mapping both ways, vocabulary order, tokenizer files, what it
refuses, its probes); transformers' model as the reference of :func:`~.verify.check_against`
(:func:`hf_reference`); reading a model directory (its JSON files and weights, a SentencePiece model
rewritten to our ids, the model loaded by transformers); the tokenizer files an export writes
beside the model (checked through ``AutoTokenizer``) and the generation defaults of an
encoder-decoder export. The families (:mod:`.marian`, :mod:`.gpt2`, :mod:`.bert`,
:mod:`.longformer`, :mod:`.t5`) hold their descriptions; :func:`~transduce.interop.dispatch.import_hf`
picks one by config.json's ``model_type``.

Legend: B probe sentences, V vocabulary.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from ..config import DecodeConfig, ModelConfig
from ..data.hf_tokenizer import HFTokenizer
from ..data.tokenizer import SPECIAL_PIECES
from ..errors import ConfigError, TransduceError, one_line, require
from ..model import build_model, save_model
from ..model.io import load_state_checked
from .base import ExportError, load_for_export, no_progress_bars, staging_dir, torch_threads
from .verify import Probe, Reference, check_against, default_probe

logger = logging.getLogger(__name__)


# Texts a byte-level BPE tokenizer must split as transformers does: spaces, tabs, accents, CJK,
# emoji, a control character, empty and blank lines.
SAMPLE_TEXT = ["A dog runs across the grass.", "Zwei Männer  sitzen\tauf einer Bank.", "", "  ",
               "Café naïve 東京 👍🏽 \x07", "line one\n\nline three"]


class HFImportError(TransduceError):
    """A Hugging Face directory transduce cannot import (missing file, unsupported option, failed check)."""


def refuse_unsupported(config: dict, name: Path, wanted: dict, why: str) -> None:
    """One line naming the first key of ``config`` whose value is not the one transduce maps
    (``wanted``: key -> the only value supported; an absent key counts as that value)."""
    for key, want in wanted.items():
        if config.get(key, want) != want:
            raise HFImportError(f"{name}: {key}={config[key]!r} is not supported ({why}: {key}={want!r})")


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise HFImportError(f"{path}: not found (a MarianMTModel directory holds config.json, weights, "
                            "source.spm, target.spm and vocab.json; a T5 one config.json, weights, spiece.model; "
                            "a BERT, RoBERTa or Longformer one config.json, weights and a vocabulary)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFImportError(f"{path}: not valid JSON ({one_line(e)})") from None
    if not isinstance(data, dict):
        raise HFImportError(f"{path}: expected a JSON object")
    return data


def read_weights(where: Path) -> dict[str, Tensor]:
    """model.safetensors, or pytorch_model.bin read with ``weights_only=True`` (no pickled code)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if (where / "model.safetensors").is_file():
        try:
            state = load_file(str(where / "model.safetensors"))
        except (SafetensorError, OSError, ValueError) as e:
            raise HFImportError(f"{where / 'model.safetensors'}: unreadable ({one_line(e)})") from None
    elif (where / "pytorch_model.bin").is_file():
        try:
            state = torch.load(where / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure: a corrupt or unsafe file
            raise HFImportError(f"{where / 'pytorch_model.bin'}: not loadable as plain weights "
                                    f"({one_line(e)})") from None
    else:
        raise HFImportError(f"{where}: no model.safetensors or pytorch_model.bin")
    return {k: v.float() for k, v in state.items() if isinstance(v, Tensor)}


def rewrite_spm(path: Path, vocab) -> tuple[bytes, int]:
    """The SentencePiece model at ``path`` with its pieces in our id order: ``vocab.order[i]`` is
    the Hugging Face id of our id i, ``vocab.pieces`` the piece of each Hugging Face id. Our four
    special pieces first; a piece the model lacks becomes UNUSED (decoded, never segmented to).
    Returns the serialized model and how many of the model's pieces ``vocab`` lacks (dropped)."""
    pb = require("sentencepiece.sentencepiece_model_pb2", "export", "transduce import")
    if not path.is_file():
        raise HFImportError(f"{path}: not found")
    proto = pb.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise HFImportError(f"{path}: not a SentencePiece model ({one_line(e)})") from None
    kind = pb.ModelProto.SentencePiece
    have = {p.piece: p for p in proto.pieces if p.type in (kind.NORMAL, kind.USER_DEFINED, kind.BYTE)}
    out = pb.ModelProto()
    out.CopyFrom(proto)
    del out.pieces[:]
    for piece, ptype in zip(SPECIAL_PIECES, (kind.CONTROL, kind.CONTROL, kind.CONTROL, kind.UNKNOWN)):
        out.pieces.add(piece=piece, score=0.0, type=ptype)
    for i in vocab.order.tolist()[len(SPECIAL_PIECES):]:
        known = have.get(vocab.pieces[i])
        if known is None:  # the other side's piece: decoded, never segmented to
            out.pieces.add(piece=vocab.pieces[i], score=0.0, type=kind.UNUSED)
        else:
            out.pieces.add(piece=known.piece, score=known.score, type=known.type)
    kept = set(vocab.pieces)
    dropped = [p for p in have if p not in kept]
    if dropped:
        logger.warning("%s: %d piece(s) are not in the vocabulary (Marian maps them to <unk>); transduce "
                       "segments them into smaller pieces, e.g. %r", path, len(dropped), dropped[0])
    spec = out.trainer_spec
    spec.vocab_size = len(out.pieces)
    spec.pad_id, spec.bos_id, spec.eos_id, spec.unk_id = range(4)
    spec.pad_piece, spec.bos_piece, spec.eos_piece, spec.unk_piece = SPECIAL_PIECES
    return out.SerializeToString(), len(dropped)


def decode_config(where: Path) -> DecodeConfig:
    """The beam size of the model's generation_config.json (4 if none), with our length penalty."""
    path = where / "generation_config.json"
    beam = read_json(path).get("num_beams", 4) if path.is_file() else 4
    return DecodeConfig(beam=max(1, int(beam)))


def load_hf_model(cls, where: Path, error=None):
    """``cls.from_pretrained(where)`` in float32 eval mode, quietly; a one-line ``error``
    (HFImportError) if it fails."""
    transformers = require("transformers", "export", "transduce import")
    with no_progress_bars(transformers):
        try:
            return cls.from_pretrained(where).float().eval()
        except (OSError, ValueError, RuntimeError) as e:
            raise (error or HFImportError)(f"{where}: transformers cannot load it ({one_line(e)})") from None




def copy_tokenizer(model_dir: Path, out: Path, tok, tokenizer_class: str = "GPT2Tokenizer") -> None:
    """Our tokenizer files beside the export (``load_tokenizer`` works on ``out``); a Hugging Face
    one (byte-level BPE, WordPiece) also with the files AutoTokenizer reads, naming its special
    tokens and ``tokenizer_class``."""
    for f in model_dir.iterdir():
        if f.is_file() and (f.suffix in (".model", ".yaml") or f.name == "tokenizer.json") and f.name != "config.yaml":
            shutil.copy2(f, out / f.name)
    if isinstance(tok, HFTokenizer):
        names = {f"{role}_token": token for role, token in tok.tokens.items()}
        prefix = {"add_prefix_space": False} if tok.kind == "byte_level_bpe" else {}
        config = {"tokenizer_class": tokenizer_class, **prefix, **names}
        (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
        (out / "special_tokens_map.json").write_text(json.dumps(names, ensure_ascii=False), encoding="utf-8")


def hf_tokenizer_differences(tok: HFTokenizer, out: Path, error=ExportError) -> int:
    """How many of a few hard texts AutoTokenizer on ``out`` splits differently from ``tok``
    (a one-line ``error`` if any)."""
    auto = require("transformers", "export").AutoTokenizer.from_pretrained(out)
    bad = [t for t in SAMPLE_TEXT if auto(t, add_special_tokens=False)["input_ids"] != tok.encode(t)]
    if bad:
        raise error(f"verification failed: AutoTokenizer on {out} splits {bad[0]!r} differently from ours")
    return 0


def generation_config(cfg: ModelConfig):
    """Defaults for ``generate``: beam 4, never PAD or BOS (as our search), stop at K finished.

    HF divides scores by len ** length_penalty, not by the GNMT penalty we use; with
    ``length_penalty=0`` (our ``lenpen=0``) both rank hypotheses by their plain log-probability.
    """
    transformers = require("transformers", "export")
    return transformers.GenerationConfig(
        decoder_start_token_id=cfg.bos_id, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id,
        pad_token_id=cfg.pad_id, bad_words_ids=[[cfg.pad_id], [cfg.bos_id]], num_beams=4,
        early_stopping=True, length_penalty=0.6, max_length=min(512, cfg.max_positions),
    )



class HFSeq2Seq(Reference):
    """A transformers encoder-decoder (Marian, T5) in our ids: ``src_order``/``tgt_order`` the
    transformers id of each of ours (None: ours; the first occurrence of an id is ours). Its
    searches as ours: from our BOS, length penalty 0, stopping at ``beam`` finished, never the
    tokens ours never emits (PAD, BOS), no forced first or last token."""

    def __init__(self, hf, cfg: ModelConfig, src_order: Tensor | None = None, tgt_order: Tensor | None = None):
        self.hf, self.pad, self.bos, self.never = hf, cfg.pad_id, cfg.bos_id, cfg.never_generated
        self.src = torch.arange(cfg.src_vocab_size) if src_order is None else src_order
        self.tgt = torch.arange(cfg.tgt_vocab_size) if tgt_order is None else tgt_order
        self.inverse = torch.empty(int(self.tgt.max()) + 1, dtype=torch.long)
        self.inverse[self.tgt.flip(0)] = torch.arange(len(self.tgt) - 1, -1, -1)  # first occurrence wins

    def outputs(self, probe: Probe) -> dict[str, Tensor]:
        src, tgt = probe.inputs
        got = self.hf(input_ids=self.src[src], attention_mask=(src != self.pad).long(),
                      decoder_input_ids=self.tgt[tgt]).logits
        return {"logits": got[..., self.tgt]}

    def search(self, src: Tensor, beam: int, max_len: int) -> list[list[int]]:
        never = [[i] for i in sorted(set(self.tgt[list(self.never)].tolist()))]
        options = dict(length_penalty=0.0, early_stopping=True) if beam > 1 else {}
        gen = self.hf.generate(input_ids=self.src[src], attention_mask=(src != self.pad).long(), num_beams=beam,
                               max_length=max_len + 1, do_sample=False, forced_bos_token_id=None,
                               forced_eos_token_id=None, decoder_start_token_id=int(self.tgt[self.bos]),
                               bad_words_ids=never, **options)  # (OPUS-MT forces EOS last)
        return [self.inverse[row[1:]].tolist() for row in gen]  # without the decoder start


class HFCausalLM(Reference):
    """A transformers language model (GPT-2) in our ids (they are its ids); greedy as our
    ``generate``: never the tokens ours never generates, EOS ends a row."""

    def __init__(self, hf, cfg: ModelConfig):
        self.hf, self.cfg = hf, cfg

    def outputs(self, probe: Probe) -> dict[str, Tensor]:
        prompts = probe.inputs[0]
        return {"logits": self.hf(input_ids=prompts, attention_mask=torch.ones_like(prompts)).logits}

    def generate(self, prompts: Tensor, new: int) -> list[list[int]]:
        cfg = self.cfg
        gen = self.hf.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                               do_sample=False, num_beams=1, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
                               suppress_tokens=list(cfg.never_generated) or None)
        rows = [row[prompts.shape[1]:].tolist() for row in gen]
        return [r[:r.index(cfg.eos_id)] if cfg.eos_id in r else r for r in rows]


class HFEncoder(Reference):
    """A transformers encoder (BERT, RoBERTa, Longformer) in our ids, ``order`` the transformers id
    of each of ours (None: ours), called with ``extra`` arguments too; its outputs are those of its
    heads: masked-LM, class or next-sentence logits, or a headless model's final states."""

    def __init__(self, hf, cfg: ModelConfig, order: Tensor | None = None, **extra):
        self.hf, self.extra = hf, extra
        self.order = torch.arange(cfg.src_vocab_size) if order is None else order

    def outputs(self, probe: Probe) -> dict[str, Tensor]:
        ids, types = probe.inputs
        out = self.hf(input_ids=self.order[ids], attention_mask=probe.keep.long(), token_type_ids=types,
                      **self.extra)
        if hasattr(out, "seq_relationship_logits"):
            return {"mlm_logits": out.prediction_logits[..., self.order], "nsp_logits": out.seq_relationship_logits}
        if getattr(out, "logits", None) is None:
            return {"states": out.last_hidden_state}
        return {"mlm_logits": out.logits[..., self.order]} if out.logits.dim() == 3 else {"class_logits": out.logits}


def hf_reference(hf, cfg: ModelConfig, orders: tuple[Tensor | None, Tensor | None] | None) -> Reference:
    """transformers' model ``hf`` of a model of ``cfg``'s kind as :func:`~.verify.check_against`'s
    reference; ``orders``: its (source, target) id of each of ours (None: ours)."""
    src, tgt = orders or (None, None)
    if cfg.family.translates:
        return HFSeq2Seq(hf, cfg, src, tgt)
    return HFCausalLM(hf, cfg) if cfg.family.generates else HFEncoder(hf, cfg, src)


@dataclass(frozen=True)
class HFExport:
    """What a family supplies to :func:`export_family` (``cfg``: our ModelConfig; ``order``: the
    exported id of each of ours, None: ours; a config given as a dict is written as config.json as
    it is, the weights as model.safetensors: T5's untied head)."""

    name: str                                                     # the family in messages ("Marian")
    hf_class: Callable[[ModelConfig], str]                        # cfg -> the transformers class written
    incompatibilities: Callable[[ModelConfig], list[str]]         # cfg -> options it lacks, a phrase each
    hf_config: Callable[[ModelConfig, Tensor | None], Any]        # (cfg, order) -> its config
    state_dict: Callable[[Any, Tensor | None], dict[str, Tensor]]  # (model, order) -> our weights, its names
    write_tokenizer: Callable[..., None]                          # (model_dir, tokenizer, out, cfg, order)
    tokenizer_problem: Callable[[Any, ModelConfig], str | None] | None = None  # given: a tokenizer is needed
    order: Callable[[ModelConfig, Any], Tensor | None] = lambda cfg, tok: None  # (cfg, tokenizer) -> order
    generation: Callable[[ModelConfig], Any] | None = None        # cfg -> its generation config
    tied: tuple[str, ...] = ()                                    # its parameters tied to another
    checks: Callable[..., dict] = lambda *args: {}                # (model, tokenizer, out, hf, order) -> more


def export_family(model_dir: str | os.PathLike, out: Path, family: HFExport) -> dict[str, object]:
    """Write ``family``'s transformers directory for ``model_dir`` into ``out``: our model loaded and
    checked, its config and mapped weights saved, the tokenizer files beside them; then verified,
    transformers reading ``out`` against our model on the probes (and ``family.checks``)."""
    transformers = require("transformers", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=family.tokenizer_problem is not None)
    cfg = model.config
    problems = family.incompatibilities(cfg)
    if problems:
        raise ExportError(f"cannot export to Hugging Face {family.name}: {'; '.join(problems)}")
    problem = family.tokenizer_problem and family.tokenizer_problem(tok, cfg)
    if problem:
        raise ExportError(f"{model_dir}: {problem}")
    order = family.order(cfg, tok)
    config, state = family.hf_config(cfg, order), family.state_dict(model, order)
    generation = family.generation and family.generation(cfg)
    hf_class = getattr(transformers, family.hf_class(cfg))
    with no_progress_bars(transformers):
        if isinstance(config, dict):  # written as it is (transformers would tie T5's lm_head to its embedding)
            from safetensors.torch import save_file
            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
            (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
            generation.save_pretrained(out)
        else:
            hf = hf_class(config)
            missing, unexpected = hf.load_state_dict(state, strict=False)
            missing = [k for k in missing if k not in family.tied]
            if missing or unexpected:
                raise ExportError(f"{family.name} weight mapping is incomplete: missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]}")
            if family.tied:
                hf.tie_weights()
            if generation is not None:
                hf.generation_config = generation
            hf.save_pretrained(out)
        family.write_tokenizer(Path(model_dir), tok, out, cfg, order)
        hf = load_hf_model(hf_class, out, ExportError)
        checks = check_against(model, hf_reference(hf, cfg, (order, order)), default_probe(model), family.name)
        checks.update(family.checks(model, tok, out, hf, order))
    return checks


@dataclass(frozen=True)
class HFImport:
    """What a family supplies to :func:`import_family` (``config``: config.json's dict; ``vocab``:
    what ``vocabulary`` read, the family's own: the ids, tokenizer and what else the rest reads)."""

    vocabulary: Callable[[Path, dict], Any]                                   # (where, config) -> vocab
    model_config: Callable[[dict, Path, dict[str, Tensor], Any], ModelConfig]  # (config, where, state, vocab)
    our_state: Callable[[dict[str, Tensor], ModelConfig, Any, Path], dict[str, Tensor]]  # (.., cfg, vocab, where)
    tokenizer: Callable[[Path, Any], tuple[Any, dict]]        # (where, vocab) -> ours, and checks of it
    hf_class: Callable[[Any], str]                            # vocab -> the transformers class that loads it
    orders: Callable[[Any], tuple[Tensor, Tensor] | None]     # vocab -> its (src, tgt) id of ours; None: ours
    refused: Mapping[str, object] = field(default_factory=dict)  # key -> the only value mapped, and why:
    why: str = ""
    probe: Callable[[Any], Probe] = default_probe             # our model -> its probe
    checks: Callable[..., dict] = lambda *args: {}            # (where, vocab, tokenizer) -> more checks
    verify: Callable[..., dict] | None = None                 # (model, hf, vocab) -> checks, not the probe's


def import_family(where: Path, config: dict, out, force: bool, family: HFImport,
                  origin: dict[str, str] | None = None) -> dict[str, object]:
    """:func:`~transduce.interop.dispatch.import_hf` for ``family``'s directory ``where`` whose
    config.json holds ``config``: what it refuses, its vocabulary, weights and our config read (a
    missing key or a value our config refuses a one-line error), its weights mapped into our model
    and tokenizer; verified against transformers' model of ``where``
    on the family's probes, then the model directory ``out`` written (config.yaml, with decoding
    settings for a translation model and the ``origin`` given: a repository imported by name,
    model.safetensors, tokenizer). Returns the measurements."""
    name = where / "config.json"
    refuse_unsupported(config, name, family.refused, family.why)
    try:
        vocab = family.vocabulary(where, config)
        state = read_weights(where)
        cfg = family.model_config(config, where, state, vocab)
    except KeyError as e:
        raise HFImportError(f"{name}: missing key {e.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as e:
        raise HFImportError(f"{name}: does not map to a valid transduce config ({one_line(e)})") from None
    state = family.our_state(state, cfg, vocab, where)
    model = build_model(cfg)
    load_state_checked(model, state, f"{where} (mapped to transduce)")
    model.eval()
    tokenizer, tokenizer_checks = family.tokenizer(where, vocab)
    with staging_dir(out, force) as tmp, torch_threads(1):
        transformers = require("transformers", "export", "transduce import")
        hf_class = family.hf_class(vocab)
        hf = load_hf_model(getattr(transformers, hf_class), where)
        checks = family.verify(model, hf, vocab) if family.verify else check_against(
            model, hf_reference(hf, cfg, family.orders(vocab)), family.probe(model), "imported")
        checks.update(tokenizer_checks)
        checks.update(family.checks(where, vocab, tokenizer))
        save_model(model, tmp, decode_config(where) if cfg.family.translates else None, origin)
        tokenizer.save(tmp)
    logger.info("imported %s (%s) into %s (%s)", where, hf_class, out, ", ".join(f"{k}={v}" for k, v in checks.items()))
    return checks
