"""A tiny model learns to reverse sequences: the whole training step works."""

import torch

from transduce.config import DecodeConfig

from transduce.config import ModelConfig, TrainConfig
from transduce.data.batch import collate
from transduce.inference.search import greedy_search
from transduce.model import Transformer
from transduce.training.loop import build_optimizer, forward_backward
from transduce.training.schedule import learning_rate


def test_tiny_model_learns_to_reverse():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    vocab = 16
    pairs = []
    for _ in range(256):
        seq = torch.randint(4, vocab, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
        pairs.append((seq, seq[::-1]))
    model = Transformer(ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64, n_heads=4,
                                    n_encoder_layers=2, n_decoder_layers=2, d_ff=128, dropout=0.0))
    cfg = TrainConfig(schedule="inverse_sqrt", lr=2e-3, warmup_steps=50)
    opt = build_optimizer(model, cfg)
    device = torch.device("cpu")
    for step in range(1, 401):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg, 64)
        batch = collate([pairs[i] for i in torch.randint(0, 256, (64,), generator=g).tolist()])
        forward_backward(model, [batch], 0.0, 0, batch.n_tgt_tokens, "fp32", device)
        opt.step()
        opt.zero_grad()
    model.eval()
    batch = collate(pairs[:64])
    out = greedy_search(model, batch.src, DecodeConfig(max_len_a=1.0, max_len_b=2))
    correct = sum(out.hypothesis(i) == pairs[i][1] + [2] for i in range(64))
    assert correct >= 63, f"only {correct}/64 reversed exactly"
