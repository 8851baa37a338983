"""The test run's one trained model: word-for-word translation (the ``trained_dir`` fixture).

The task ("the red dog" -> "der rot Hund") is mostly learned in a few hundred Adam steps
(about 75% of sentences exact), enough for searches to end with EOS well before their length
limit, which parity tests between runtimes need, and for the demo page to show a sensible
diagonal attention map. The model directory is built once per test session
(``tests/conftest.py``'s ``trained_dir`` calls :func:`toy_model_dir`) and shared by every test that
needs a trained model: export, serving, search, speed, the CLI.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F

# A word-for-word "translation": learned as fast as copying, and reads like one in the demo.
LEXICON = dict(pair.split(":") for pair in (
    "the:der a:ein dog:Hund cat:Katze bird:Vogel house:Haus tree:Baum river:Fluss red:rot "
    "blue:blau green:grün big:groß small:klein old:alt young:jung runs:läuft sleeps:schläft "
    "sings:singt sees:sieht eats:isst over:über under:unter near:bei today:heute").split())
WORDS = tuple(LEXICON)


def toy_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` random English word strings (2-6 words) and their word-for-word German."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        pairs.append((" ".join(words), " ".join(LEXICON[w] for w in words)))
    return pairs


def _batch(rows: list[list[int]], pad: int = 0) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


def train_toy_model(out: Path, steps: int = 400, seed: int = 0) -> Path:
    """Train a tokenizer and a tiny post-LN Transformer on :func:`toy_pairs`; save both in ``out``."""
    from transduce.config import model_preset
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import Transformer, save_model

    pairs = toy_pairs(2000, seed)
    tok = Tokenizer.train([s for s, _ in pairs], [t for _, t in pairs], out, vocab_size=120)
    torch.manual_seed(seed)
    cfg = model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                       d_model=64, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=128,
                       dropout=0.0, max_positions=64)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 30))
    data = [(tok.encode(s, "src") + [2], [1] + tok.encode(t, "tgt") + [2]) for s, t in pairs]
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        batch = rng.sample(data, 32)
        src, tgt = _batch([s for s, _ in batch]), _batch([t for _, t in batch])
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    save_model(model.eval(), out)
    return out


def toy_model_dir(tmp_path_factory) -> Path:
    """The session's trained toy model directory (trained on first use)."""
    out = tmp_path_factory.getbasetemp() / "toy-model"
    if not (out / "model.safetensors").is_file():
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny matrices: threads only add OpenMP spin-wait overhead
        try:
            train_toy_model(out)
        finally:
            torch.set_num_threads(before)
    return out
