"""The full model: cache equivalence, masks in effect, positions, parameter counts."""

import itertools
import math

import pytest
import torch

from transduce.config import ModelConfig, model_preset
from transduce.model import Transformer
from transduce.model.embeddings import RotaryEmbedding, sinusoidal_table
from attention_helpers import decode_step_by_step

V = 40


def _model(seed=0, **kw) -> Transformer:
    torch.manual_seed(seed)
    base = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=48, dropout=0.1, max_positions=64)
    return Transformer(ModelConfig(**{**base, **kw})).eval()


def _batch(seed=0, b=3, s=7, t=6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, s), generator=g)
    src[1, 5:] = 0   # padded source rows
    src[2, 3:] = 0
    tgt = torch.randint(3, V, (b, t), generator=g)
    tgt[:, 0] = 1
    return src, tgt


OPTIONS = list(itertools.product(["post", "pre"], ["sinusoidal", "learned", "rope"],
                                 ["relu", "gelu", "swiglu"], [True, False], [True, False]))


@pytest.mark.parametrize("norm,positions,activation,bias,shared", OPTIONS)
def test_incremental_decoding_equals_full_forward(norm, positions, activation, bias, shared):
    model = _model(norm=norm, positions=positions, activation=activation, bias=bias,
                   share_embeddings=shared, tie_output=shared)
    src, tgt = _batch()
    with torch.no_grad():
        full = model(src, tgt)                                            # (B, T, V)
        # one token at a time, and a multi-token chunk on top of a cache (2, then the rest at once)
        steps, chunks, cache = decode_step_by_step(model, src, tgt, chunk=2)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunks, full, atol=1e-5, rtol=1e-4)
    assert cache.length == tgt.shape[1]


def test_cache_reorder_selects_rows():
    model = _model()
    src, tgt = _batch()
    with torch.no_grad():
        enc = model.encode(src)
        out = model.decode(tgt[:, :3], enc, model.new_cache())
        index = torch.tensor([2, 0, 0])
        cache = out.cache.reorder(index)
        nxt = model.decode(tgt[index, 3:4], enc.index_select(index), cache).logits
        full = model(src[index], tgt[index, :4])[:, 3:4]
    torch.testing.assert_close(nxt, full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope"])
def test_causal_mask_hides_the_future(positions):
    model = _model(positions=positions)
    src, tgt = _batch()
    with torch.no_grad():
        base = model(src, tgt)
        for t in range(tgt.shape[1] - 1):
            changed = tgt.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + 7) % (V - 3) + 3
            out = model(src, changed)
            torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-5, rtol=1e-4)
            assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])


@pytest.mark.parametrize("norm,positions", [("post", "sinusoidal"), ("pre", "rope"), ("post", "learned")])
def test_source_padding_is_inert(norm, positions):
    model = _model(norm=norm, positions=positions)
    src, tgt = _batch()
    padded = torch.cat([src, torch.zeros(src.shape[0], 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        enc_a, enc_b = model.encode(src), model.encode(padded)
        real = src != 0
        torch.testing.assert_close(enc_b.memory[:, : src.shape[1]][real], enc_a.memory[real], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-4)


def test_sinusoidal_table_matches_formula():
    d = 16
    table = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_rope_dot_product_depends_only_on_relative_position():
    rope = RotaryEmbedding(16)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (rope(q, start=m) * rope(k, start=n)).sum().item()

    assert score(3, 1) == pytest.approx(score(13, 11), abs=1e-4)
    assert score(40, 2) == pytest.approx(score(138, 100), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    # rotation preserves the norm
    torch.testing.assert_close(rope(q, start=5).norm(), q.norm())


def test_shared_and_untied_embeddings():
    shared = _model()
    assert shared.output_proj.weight is shared.src_embed.tokens.weight is shared.tgt_embed.tokens.weight
    untied = _model(share_embeddings=False, tie_output=False, src_vocab_size=30)
    assert untied.src_embed.tokens.weight is not untied.tgt_embed.tokens.weight
    assert untied.output_proj.weight is not untied.tgt_embed.tokens.weight
    assert untied.src_embed.tokens.weight.shape == (30, 32)
    n_shared, n_untied = shared.num_parameters(), untied.num_parameters()
    assert n_untied - n_shared == 30 * 32 + V * 32


def test_embeddings_scaled_by_sqrt_d_model():
    model = _model(dropout=0.0, positions="rope")
    ids = torch.tensor([[5, 6]])
    emb = model.src_embed(ids)
    torch.testing.assert_close(emb, model.src_embed.tokens.weight[ids] * math.sqrt(32))


def test_prelm_has_final_norm_and_bias_free_has_no_biases():
    assert _model(norm="pre").encoder_norm is not None and _model().encoder_norm is None
    nobias = _model(bias=False)
    assert not [n for n, _ in nobias.named_parameters() if n.endswith(".bias")]


# The paper's Table 3 reports 65M (base) and 213M (big) parameters; at a 37k joint
# vocabulary with tied embeddings we count 63,082,496 and 214,245,376.
@pytest.mark.parametrize("preset,paper,exact", [("base", 65e6, 63_082_496), ("big", 213e6, 214_245_376)])
def test_paper_parameter_counts(preset, paper, exact):
    with torch.device("meta"):
        model = Transformer(model_preset(preset, src_vocab_size=37000, tgt_vocab_size=37000))
    n = model.num_parameters()
    assert n == exact
    assert abs(n - paper) / paper < 0.05


def test_training_step_reduces_loss():
    model = _model(dropout=0.0)
    model.train()
    src, tgt = _batch()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
