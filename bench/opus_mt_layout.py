"""Our Marian export re-laid out as the OPUS-MT models are: what ``transduce import`` reads from
the Hub, made from a trained model (bench/marian_import.py, tests/interop/test_import_hf.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from transduce.errors import require
from transduce.interop.base import no_progress_bars

EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
              "lm_head.weight")


def marian_order(config: dict, vocab: dict[str, int]) -> list[int]:
    """Our id of each OPUS-MT id: ``</s>`` 0, ``<unk>`` 1, the other pieces in order, then our BOS
    last (OPUS-MT's ``<pad>`` and decoder start); our PAD has no row. The special ids are read from
    the export's config.json, never assumed."""
    pad, bos, eos = config["pad_token_id"], config["decoder_start_token_id"], config["eos_token_id"]
    unk = vocab["<unk>"]
    return [eos, unk] + [i for i in range(len(vocab)) if i not in {pad, bos, eos, unk}] + [bos]


def opus_mt_layout(hf_dir: str | os.PathLike, out: str | os.PathLike, separate_vocabs: bool = False) -> Path:
    """Our Marian export ``hf_dir`` re-laid out as the OPUS-MT models are (:func:`marian_order`):
    one row fewer, our BOS row becoming ``<pad>``, which is also the decoder start.
    ``separate_vocabs`` writes a target_vocab.json and gives the decoder embeddings of its own."""
    transformers = require("transformers", "export")
    hf_dir, out = Path(hf_dir), Path(out)
    shutil.copytree(hf_dir, out)
    vocab = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
    pieces = sorted(vocab, key=vocab.get)
    with no_progress_bars(transformers):
        model = transformers.MarianMTModel.from_pretrained(hf_dir)
    config = model.config.to_dict()
    ours = marian_order(config, vocab)
    marian = {pieces[i] if i != ours[-1] else "<pad>": m for m, i in enumerate(ours)}
    for name in ("vocab.json",) + (("target_vocab.json",) if separate_vocabs else ()):
        (out / name).write_text(json.dumps(marian, ensure_ascii=False), encoding="utf-8")
    state, index = model.state_dict(), torch.tensor(ours)
    for name in EMBEDDINGS:
        state[name] = state[name][index].clone()
    state["final_logits_bias"] = state["final_logits_bias"][:, index]
    pad = len(ours) - 1
    config.update(vocab_size=len(ours), decoder_vocab_size=len(ours), pad_token_id=pad, eos_token_id=0,
                  decoder_start_token_id=pad, bos_token_id=None, forced_eos_token_id=0)
    if separate_vocabs:
        config.update(share_encoder_decoder_embeddings=False, separate_vocabs=True)
    relaid = transformers.MarianMTModel(transformers.MarianConfig(**config))
    relaid.load_state_dict(state, strict=False)
    relaid.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=0, bad_words_ids=[[pad]], num_beams=4,
        max_length=512)
    for stale in out.glob("model*.safetensors"):
        stale.unlink()
    with no_progress_bars(transformers):
        relaid.save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}), encoding="utf-8")
    return out
