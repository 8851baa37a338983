"""Longformer's options of local attention: the global tokens' own projections against a dense
float64 reference (the band rows from q/k/v_proj under the band + global mask, the global rows
from q/k/v_global_proj over every key), a window per layer, their config errors, and a model
with them saved and loaded."""

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig
from transduce.errors import ConfigError
from transduce.model import EncoderOnly, MultiHeadAttention, load_model, save_model
from transduce.config import AttentionConfig
from transduce.model.masks import combine, local_mask

B, H, DH, W = 3, 2, 8, 2
D = H * DH
TOL = dict(atol=1e-12, rtol=1e-10)


def _module(n_global: int, global_projections: bool = True, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    m = MultiHeadAttention(D, H, pattern=AttentionConfig("local", window=W, global_tokens=n_global,
                                                         global_projections=global_projections))
    with torch.no_grad():
        for p in m.parameters():  # non-zero biases
            p.add_(0.1 * torch.randn_like(p))
    return m.double().eval()


def _inputs(t: int, padded: bool, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, t, D, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([t, t - 3, 2]) if padded else torch.full((B,), t)
    return x, (torch.arange(t) < lengths[:, None])[:, None, None, :]    # (B, 1, 1, T)


def _dense(m: MultiHeadAttention, x, mask, n_global: int):
    """Eq. 1 over every key: the band + global mask for the local heads, then the first G rows
    replaced by the global heads over every (non-pad) key."""
    def heads(layer):
        return m.split_heads(layer(x))                                   # (B, H, T, Dh)
    t = x.shape[1]
    band = local_mask(torch.arange(t), torch.arange(t), W, n_global)
    out = F.scaled_dot_product_attention(heads(m.q_proj), heads(m.k_proj), heads(m.v_proj),
                                         attn_mask=combine(mask, band))
    glob = F.scaled_dot_product_attention(heads(m.q_global_proj), heads(m.k_global_proj), heads(m.v_global_proj),
                                          attn_mask=mask)
    rows = torch.arange(t)[None, None, :, None] < n_global
    out = torch.where(rows, glob, out)
    return m.out_proj(out.transpose(1, 2).reshape(B, t, D))


@pytest.mark.parametrize("t", [3, 7, 19])  # all global, a few blocks, the fused kernel
@pytest.mark.parametrize("n_global", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_global_projections_equal_the_dense_reference(t, n_global, padded):
    m = _module(n_global)
    x, mask = _inputs(t, padded)
    got, _ = m(x, x, mask)
    want = _dense(m, x, mask, n_global)
    torch.testing.assert_close(got, want, **TOL)
    weights = [m.q_global_proj.weight, m.k_global_proj.weight, m.q_proj.weight, x]
    signs = torch.linspace(-1, 1, got.numel(), dtype=got.dtype).view_as(got)
    ours = torch.autograd.grad((got * signs).sum(), weights, allow_unused=True)  # (all global: no q_proj)
    for a, b, w in zip(ours, torch.autograd.grad((want * signs).sum(), weights), weights):
        torch.testing.assert_close(torch.zeros_like(w) if a is None else a, b, **TOL)


def test_global_projections_change_only_the_global_rows():
    """Against the same weights without them: the global rows differ, the band rows see the
    global tokens through k/v_proj either way (in the first layer, before anything mixes)."""
    with_g, without = _module(2), _module(2, global_projections=False)
    without.load_state_dict({k: v for k, v in with_g.state_dict().items() if "_global_" not in k})
    x, mask = _inputs(9, padded=True)
    a, b = with_g(x, x, mask)[0], without(x, x, mask)[0]
    torch.testing.assert_close(a[:, 2:], b[:, 2:], **TOL)
    assert (a[:, :2] - b[:, :2]).abs().min() > 1e-6


def test_without_global_tokens_the_global_projections_are_unused():
    with_g, without = _module(0), _module(0, global_projections=False)
    without.load_state_dict({k: v for k, v in with_g.state_dict().items() if "_global_" not in k})
    x, mask = _inputs(9, padded=True)
    torch.testing.assert_close(with_g(x, x, mask)[0], without(x, x, mask)[0], **TOL)


def _cfg(**kw) -> ModelConfig:
    base = dict(arch="encoder_only", src_vocab_size=30, tgt_vocab_size=30, d_model=D, n_heads=H, d_ff=32,
                n_encoder_layers=2, n_decoder_layers=0, max_positions=40, positions="learned",
                attention={"kind": "local", "window": 2, "global_tokens": 1, "global_projections": True,
                           **kw.pop("attention", {})})
    return ModelConfig(**{**base, **kw})


def test_a_window_per_layer_and_a_saved_model(tmp_path):
    model = EncoderOnly(_cfg(attention=dict(windows=[1, 3]))).eval()
    assert [layer.self_attn.kernel.window for layer in model.layers] == [1, 3]
    assert model.config.attention.windows == (1, 3)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    assert again.config == model.config
    ids = torch.randint(4, 29, (2, 12))
    torch.testing.assert_close(again(ids), model(ids), rtol=0, atol=0)  # the same weights, the same kernels


@pytest.mark.parametrize("kw, message", [
    (dict(attention=dict(kind="full")),
     "model.attention.global_projections: needs model.attention.kind=local and model.arch=encoder_only"),
    (dict(attention=dict(global_projections=False, windows=(2,))),
     "model.attention.windows: needs one window per encoder layer"),
    (dict(attention=dict(windows=(2, 0))), r"model.attention.windows: must be integers >= 1; got \[2, 0\]"),
    (dict(positions="rope"), "model.attention.global_projections: does not rotate its projections"),
    (dict(arch="encoder_decoder", n_decoder_layers=1, tgt_vocab_size=30,
          attention=dict(global_projections=False, windows=(2, 2))),
     "model.attention.windows: needs model.attention.kind=local and model.arch=encoder_only"),
])
def test_bad_longformer_options_are_one_line_errors(kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        _cfg(**kw)
    assert "\n" not in str(e.value)


def test_the_decoding_speed_layer_runs_the_same_global_rows():
    """prepare_for_decoding (fused q/k/v, the model's own local kernel) leaves the global rows'
    projections to the module: the same outputs as the plain model."""
    from transduce.inference.speed import prepare_for_decoding, restore

    model = EncoderOnly(_cfg(attention=dict(global_tokens=2))).eval()
    ids = torch.randint(4, 29, (3, 15))
    ids[1, 9:] = 0
    with torch.no_grad():
        want = model(ids)
        prepare_for_decoding(model)
        got = model(ids)
        restore(model)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
