"""What every Hugging Face export and import shares: reading a model directory (its JSON files
and weights, a SentencePiece model rewritten to our ids, the model loaded by transformers), the
check of a transduce model against the transformers one it came from or went to, the tokenizer
files an export writes beside the model (checked through ``AutoTokenizer``), and the generation
defaults of an encoder-decoder export. The families (:mod:`.marian`, :mod:`.gpt2`, :mod:`.bert`,
:mod:`.longformer`, :mod:`.t5`) are written over it; :func:`~transduce.interop.dispatch.import_hf`
picks one by config.json's ``model_type``.

Legend: B probe sentences, V vocabulary.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from torch import Tensor

from ..config import DecodeConfig, ModelConfig
from ..data.hf_tokenizer import HFTokenizer
from ..data.tokenizer import SPECIAL_PIECES
from ..errors import TransduceError, one_line, require
from ..model import Transformer
from ..progress import progress_bar
from .base import ExportError, no_progress_bars
from .verify import LOGIT_TOL, check_close, check_same_outputs, search_ids, probe_sources, probe_targets

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


def load_hf_model(cls, where: Path):
    """``cls.from_pretrained(where)`` in float32 eval mode, quietly; a one-line error if it fails."""
    transformers = require("transformers", "export", "transduce import")
    with no_progress_bars(transformers):
        try:
            return cls.from_pretrained(where).float().eval()
        except (OSError, ValueError, RuntimeError) as e:
            raise HFImportError(f"{where}: transformers cannot load it ({one_line(e)})") from None


@torch.no_grad()
def check_against_hf(model: Transformer, hf, src_order: Tensor, tgt_order: Tensor, atol: float = LOGIT_TOL,
                     max_len: int = 12) -> dict[str, object]:
    """An imported model against the transformers model it came from on the probe set: logits
    within ``atol`` and the same greedy and beam-4 outputs. ``src_order``/``tgt_order``: the
    transformers id of each of our ids (the first occurrence of an id is ours)."""
    src = probe_sources(model)
    tgt = probe_targets(model, src.shape[0])
    src_m, mask = src_order[src], (src != model.config.pad_id).long()
    inverse = torch.empty(int(tgt_order.max()) + 1, dtype=torch.long)
    inverse[tgt_order.flip(0)] = torch.arange(len(tgt_order) - 1, -1, -1)  # first occurrence wins
    never = [[i] for i in sorted(set(tgt_order[:2].tolist()))]  # pad and start: our searches never emit them
    with progress_bar(3, unit="checks", desc="verifying") as bar:
        got = hf(input_ids=src_m, attention_mask=mask, decoder_input_ids=tgt_order[tgt]).logits
        checks: dict[str, object] = {
            "max_logit_diff": check_close("imported logits", model(src, tgt), got[..., tgt_order], atol)}
        bar.update()
        for beam in (1, 4):
            want = search_ids(model, src, beam, max_len)
            options = dict(length_penalty=0.0, early_stopping=True) if beam > 1 else {}
            gen = hf.generate(input_ids=src_m, attention_mask=mask, num_beams=beam, max_length=max_len + 1,
                              do_sample=False, forced_eos_token_id=None, decoder_start_token_id=int(tgt_order[1]),
                              bad_words_ids=never, **options)  # (OPUS-MT forces EOS last; bos is the start)
            got_ids = [inverse[row[1:]].tolist() for row in gen]  # without the decoder start
            name = "greedy" if beam == 1 else "beam"
            checks[f"{name}_differences"] = check_same_outputs(f"imported {name}", model, src, want, got_ids,
                                                               beam=beam > 1)
            bar.update()
    return checks


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
