"""Local T5 and mT5 directories for the import/export tests: transformers' classes with random
weights and tiny shapes, and a SentencePiece unigram model (T5's ids: pad 0, eos 1, unk 2, no
bos) trained on a few thousand sentences of the embedded toy corpus (transduce.data.toy), which
also gives the probe sentences: no hub, no data directory."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path

import torch

from transduce.data.toy import generate_pairs

N_TRAIN_PAIRS = 3000
TRAIN_SEED, PROBE_SEED = 0, 1  # the probe sentences are others than the SentencePiece model saw


@functools.lru_cache(maxsize=4)
def _pairs(n: int, seed: int) -> tuple[tuple[str, str], ...]:
    return tuple(generate_pairs(n, seed))


def toy_lines(side: str, n: int, skip: int = 0, seed: int = PROBE_SEED) -> list[str]:
    """Sentences ``skip`` to ``skip + n`` of the toy pairs drawn with ``seed``, English (``side``
    "en") or German ("de")."""
    column = ("en", "de").index(side)
    return [pair[column] for pair in _pairs(skip + n, seed)[skip:]]


def train_spiece(out: Path, vocab_size: int = 600) -> Path:
    """T5's kind of SentencePiece model (unigram, pad 0, eos 1, unk 2) on English and German lines."""
    import sentencepiece as spm

    lines = toy_lines("en", N_TRAIN_PAIRS, seed=TRAIN_SEED) + toy_lines("de", N_TRAIN_PAIRS, seed=TRAIN_SEED)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    path = out / "spiece.model"
    path.write_bytes(buf.getvalue())
    return path


def hf_t5_dir(transformers, spiece: Path, out: Path, kind: str, seed: int = 0, extra_ids: int = 100,
              d_kv: int = 8) -> Path:
    """A random T5ForConditionalGeneration directory. ``kind``: "t5" (T5 1.0: relu, tied, the
    output rescale) or "mt5" (model_type mt5: gated-gelu and an lm_head of its own). The vocabulary
    is the SentencePiece model's pieces, the sentinels and unused rows up to a multiple of 8.
    d_model is 32 and there are 4 heads of ``d_kv`` (8: d_model / heads; T5 1.1 and mT5 small
    have heads of another width)."""
    import sentencepiece as spm

    n = spm.SentencePieceProcessor(model_file=str(spiece)).get_piece_size() + extra_ids
    shape = dict(vocab_size=(n + 7) // 8 * 8, d_model=32, d_kv=d_kv, d_ff=48, num_layers=2,
                 num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                 decoder_start_token_id=0)  # (as the published configs say)
    torch.manual_seed(seed)
    if kind == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(feed_forward_proj="relu", **shape))
    else:
        model = transformers.MT5ForConditionalGeneration(transformers.MT5Config(feed_forward_proj="gated-gelu",
                                                                                **shape))
    model.eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than T5's init, so that the outputs differ by position
            p.mul_(4.0 if p.dim() == 2 and p.shape[1] == 4 else 1.0)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    if kind == "mt5":  # an output layer of its own, as mT5 and T5 1.1 have
        _untie(out, seed)
    (out / "spiece.model").write_bytes(spiece.read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer",
                                                           "extra_ids": extra_ids}), encoding="utf-8")
    return out


def _untie(out: Path, seed: int) -> None:
    """Give a saved model its own lm_head.weight and the config of T5 1.1 / mT5 (untied)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(out / "model.safetensors"))
    shared = state["shared.weight"]
    g = torch.Generator().manual_seed(seed + 1)
    state["lm_head.weight"] = torch.randn(shared.shape, generator=g) * shared.std()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    config["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
