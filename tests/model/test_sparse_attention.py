"""BigBird block-sparse and Reformer LSH attention: each blocked/chunked kernel against its dense
reference (forward and gradients), each reference against its formula written out, and the
kinds inside models (seeded patterns, cache, save/load, one-line errors)."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig
from transduce.errors import ConfigError
from transduce.model import DecoderOnlyLM, Transformer, load_model, save_model
from transduce.model.bigbird import BigBirdAttention, bigbird_attention, bigbird_reference, block_pattern, random_blocks
from transduce.model.io import build_model
from transduce.model.lsh import LSHAttention, lsh_attention, lsh_buckets, lsh_reference
from attention_helpers import H, decode_step_by_step

V, DH = 40, 8


def _qkv(b, t, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, H, t, DH, generator=g, dtype=dtype).requires_grad_() for _ in range(3))


def _padding(b, t):
    """Key masks (B, 1, 1, T): the first sentence whole, the others 5 and 2 shorter."""
    lengths = torch.tensor([t, max(t - 5, 1), max(t - 2, 1)][:b])
    return (torch.arange(t) < lengths[:, None])[:, None, None, :]


def _grads(out, tensors):
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), tensors)


def _assert_equal_forward_and_gradients(ours, ref, inputs):
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(_grads(ours, inputs), _grads(ref, inputs)):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


# BigBird

@pytest.mark.parametrize("t,block,n_random", [(64, 8, 2), (37, 4, 2), (100, 7, 3), (24, 4, 0), (13, 4, 3),
                                              (9, 4, 1), (5, 8, 1), (16, 16, 2)])
@pytest.mark.parametrize("b,padded", [(1, False), (3, True)])
def test_bigbird_blocks_equal_the_masked_reference(t, block, n_random, b, padded):
    """Blocks that do not divide T (padded), fewer blocks than the pattern wants (random slots
    left empty), one block longer than the sequence (full attention): all equal the reference."""
    q, k, v = _qkv(b, t, seed=t)
    mask = _padding(b, t) if padded else None
    ours = bigbird_attention(q, k, v, mask, block, n_random, seed=3)
    ref = bigbird_reference(q, k, v, mask, block, n_random, seed=3)
    _assert_equal_forward_and_gradients(ours, ref, (q, k, v))


@pytest.mark.parametrize("step_scores", [1, 100, 600])
def test_bigbird_steps_equal_the_reference(step_scores):
    """The global query blocks over a few keys a step, the middle blocks a few a step (at 1: one
    block, one key block a step): forward and gradients, recomputed step by step in the backward
    pass, equal the reference's."""
    q, k, v = _qkv(2, 70, seed=1)
    mask = _padding(2, 70)
    ref = bigbird_reference(q, k, v, mask, 4, 2, seed=3)
    _assert_equal_forward_and_gradients(bigbird_attention(q, k, v, mask, 4, 2, 3, step_scores=step_scores),
                                        ref, (q, k, v))


@pytest.mark.parametrize("kind", ["bigbird", "lsh"])
def test_dropout_gradients_are_those_of_the_forward(kind):
    """The backward pass draws each step's dropout mask again from the forward's seed: gradcheck
    (float64) under a fixed global seed, which fixes the masks, holds; and dropout drops."""
    q, k, v = (x.detach().double().requires_grad_() for x in _qkv(1, 19, seed=2))
    mask = _padding(1, 19)

    def attend(q, k, v, dropout=0.3):
        torch.manual_seed(0)
        if kind == "bigbird":
            return bigbird_attention(q, k, v, mask, 4, 2, 3, dropout=dropout, step_scores=50)
        return lsh_attention(q, k, v, mask, LSHAttention(4, 2, 4, seed=1), dropout=dropout, step_scores=20)
    assert not torch.allclose(attend(q, k, v), attend(q, k, v, dropout=0.0))
    assert torch.autograd.gradcheck(attend, (q, k, v), fast_mode=True)


def test_bigbird_pattern_is_window_global_and_r_random_blocks():
    nb, r = 12, 3
    pattern = block_pattern(nb, H, r, seed=5)                               # (H, nb, nb)
    i, j = torch.arange(nb)[:, None], torch.arange(nb)[None, :]
    fixed = ((i - j).abs() <= 1) | (i == 0) | (i == nb - 1) | (j == 0) | (j == nb - 1)
    assert (pattern & fixed).eq(fixed.expand_as(pattern)).all()             # window and global always
    extra = (pattern & ~fixed).sum(-1)                                      # (H, nb): random blocks per row
    assert extra[:, 1:-1].eq(r).all() and extra[:, [0, -1]].eq(0).all()
    assert not torch.equal(pattern[0], pattern[1])                          # drawn per head
    assert torch.equal(pattern, block_pattern(nb, H, r, seed=5))            # a function of the seed
    assert not torch.equal(pattern, block_pattern(nb, H, r, seed=6))
    idx, used = random_blocks(6, 1, 5, seed=0)                              # 6 blocks: 1 or 2 candidates a row
    assert used.sum(-1)[0, 1:-1].tolist() == [2, 1, 1, 2]


def test_bigbird_with_one_block_is_full_attention():
    q, k, v = _qkv(2, 10)
    mask = _padding(2, 10)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(bigbird_attention(q, k, v, mask, 16, 3, 0), want)


# LSH

@pytest.mark.parametrize("t,chunk,n_hashes,n_buckets", [(64, 8, 2, 8), (37, 4, 3, 4), (100, 7, 1, 6), (5, 8, 2, 4),
                                                         (1, 4, 2, 2), (50, 50, 4, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,padded", [(1, False), (3, True)])
def test_lsh_chunks_equal_the_dense_reference(t, chunk, n_hashes, n_buckets, causal, b, padded):
    q, k, v = _qkv(b, t, seed=t)
    mask = _padding(b, t) if padded else None
    lsh = LSHAttention(chunk, n_hashes, n_buckets, seed=1)
    ours = lsh_attention(q, k, v, mask, lsh, causal)
    ref = lsh_reference(q, k, v, mask, lsh, causal)
    _assert_equal_forward_and_gradients(ours, ref, (q, k, v))


@pytest.mark.parametrize("step_scores", [1, 300, 2000])
@pytest.mark.parametrize("causal", [False, True])
def test_lsh_steps_equal_the_reference(step_scores, causal):
    """A chunk a step (at 1) or a few chunks of a round: forward and gradients, recomputed step by
    step in the backward pass, equal the reference's; with a zero key and one shorter than
    F.normalize's eps, whose unit-length copies are x / eps (their gradient g / eps)."""
    q, k, v = _qkv(2, 70, seed=4)
    with torch.no_grad():
        k[1, :, 9] = 0.0
        k[0, :, 20] *= 1e-14
    mask = _padding(2, 70)
    lsh = LSHAttention(4, 2, 4, seed=1)
    _assert_equal_forward_and_gradients(lsh_attention(q, k, v, mask, lsh, causal, step_scores=step_scores),
                                        lsh_reference(q, k, v, mask, lsh, causal), (q, k, v))


def test_a_short_input_takes_smaller_steps_and_still_equals_the_reference(monkeypatch):
    """A step's scores follow the length below 4k positions (so its temporaries stay small beside
    q, k, v), the long-input size above: a short input takes more steps than the long-input size
    would give it, and the kernels still equal their references."""
    from transduce.model import bigbird, gathered_attention as ga, lsh as lsh_module

    assert [ga.step_size(t) for t in (600, 1024, 4096, 16384)] == [600 * 16, 2 ** 14, ga.STEP_SCORES, ga.STEP_SCORES]
    steps = []

    def counted(q, k, v, plan, *args, **kwargs):
        steps.append(len(list(plan())))
        return ga.gathered_attention(q, k, v, plan, *args, **kwargs)

    monkeypatch.setattr(bigbird, "gathered_attention", counted)
    monkeypatch.setattr(lsh_module, "gathered_attention", counted)
    q, k, v = _qkv(2, 600, seed=5)
    mask, lsh = _padding(2, 600), LSHAttention(16, 2, 8, seed=1)
    _assert_equal_forward_and_gradients(bigbird_attention(q, k, v, mask, 8, 2, 3),
                                        bigbird_reference(q, k, v, mask, 8, 2, seed=3), (q, k, v))
    _assert_equal_forward_and_gradients(lsh_attention(q, k, v, mask, lsh), lsh_reference(q, k, v, mask, lsh),
                                        (q, k, v))
    with torch.no_grad():
        bigbird_attention(q, k, v, mask, 8, 2, 3, step_scores=ga.STEP_SCORES)
        lsh_attention(q, k, v, mask, lsh, step_scores=ga.STEP_SCORES)
    assert steps[0] > steps[2] and steps[1] > steps[3], steps


def test_lsh_buckets_break_ties_as_argmax():
    """argmax([xR; -xR]) taken without the concatenated copy keeps argmax's first maximum: a zero
    key (every entry tied) and a key and its negation land as the formula says."""
    lsh = LSHAttention(4, 3, 8, seed=5)
    k = torch.randn(1, H, 12, DH, generator=torch.Generator().manual_seed(0))
    k[0, :, 3] = 0.0
    k[0, :, 7] = -k[0, :, 6]
    rotations = torch.randn(DH, 3, 4, generator=torch.Generator().manual_seed(5))
    x = torch.einsum("bhtd,dnr->bhntr", k, rotations)
    assert torch.equal(lsh_buckets(k, lsh), torch.cat([x, -x], -1).argmax(-1))


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_reference_is_its_formula(causal):
    """One round, chunks longer than the sequence: query i attends to the keys of its bucket
    (h(x) = argmax([xR; -xR])), earlier ones if causal, over normalised keys, its own key only
    when it has no other; written out query by query, in float64."""
    t = 23
    q, k, v = _qkv(1, t, dtype=torch.float64)
    lsh = LSHAttention(32, 1, 4, seed=2)
    g = torch.Generator().manual_seed(2)
    rotation = torch.randn(DH, 1, 2, generator=g).double()[:, 0]           # (Dh, nbk/2)
    x = k[0].detach() @ rotation                                            # (H, T, 2)
    bucket = torch.cat([x, -x], -1).argmax(-1)                              # (H, T)
    assert torch.equal(lsh_buckets(k, lsh)[0, :, 0], bucket)
    kn = k[0] / k[0].norm(dim=-1, keepdim=True)
    want = torch.empty(H, t, DH, dtype=torch.float64)
    for h in range(H):
        for i in range(t):
            keys = [j for j in range(t) if bucket[h, j] == bucket[h, i] and j != i and (j < i or not causal)] or [i]
            w = torch.softmax(torch.stack([q[0, h, i] @ kn[h, j] for j in keys]) / math.sqrt(DH), 0)
            want[h, i] = sum(wj * v[0, h, j] for wj, j in zip(w, keys))
    torch.testing.assert_close(lsh_reference(q, k, v, None, lsh, causal)[0], want)


def test_lsh_causal_outputs_do_not_see_the_future():
    """Changing the later positions changes nothing before them: a position's buckets, chunks and
    keys depend on earlier positions only (buckets are padded to whole chunks)."""
    q, k, v = _qkv(1, 40)
    lsh = LSHAttention(4, 2, 4, seed=0)
    q2, k2, v2 = (torch.cat([x[:, :, :25], torch.randn(1, H, 15, DH)], 2) for x in (q, k, v))
    a, b = lsh_attention(q, k, v, None, lsh, True), lsh_attention(q2, k2, v2, None, lsh, True)
    torch.testing.assert_close(a[:, :, :25], b[:, :, :25], atol=1e-6, rtol=1e-6)


# In models

def _cfg(**kw):
    base = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=H * DH, n_heads=H, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=48, dropout=0.0, max_positions=64,
                attention={"block": 4, **kw.pop("attention", {})})
    return ModelConfig(**{**base, **kw})


def _batch(b=3, s=29, t=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, s), generator=g)
    src[1, s - 4:] = 0
    tgt = torch.randint(3, V, (b, t), generator=g)
    tgt[:, 0] = 1
    return src, tgt


@pytest.mark.parametrize("kw", [dict(attention=dict(kind="bigbird", random_blocks=2)),
                                dict(attention=dict(kind="lsh", lsh_buckets=4)),
                                dict(arch="encoder_only", attention=dict(kind="bigbird")),
                                dict(arch="decoder_only", attention=dict(kind="lsh"))])
def test_saved_model_runs_the_same_pattern(tmp_path, kw):
    """The random blocks and rotations come from model.attention_seed: a reloaded model gives
    the same outputs; another seed gives others."""
    torch.manual_seed(0)
    model = build_model(_cfg(**kw)).eval()
    save_model(model, tmp_path / "m")
    src, tgt = _batch()
    ids = (src,) if model.config.arch != "encoder_decoder" else (src, tgt)
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path / "m")(*ids), model(*ids))
        other = build_model(_cfg(**{**kw, "attention": {**kw["attention"], "seed": 1}})).eval()
        other.load_state_dict(model.state_dict())
        assert not torch.allclose(other(*ids), model(*ids), atol=1e-4)


def test_lsh_shares_the_query_and_key_projections():
    model = Transformer(_cfg(attention=dict(kind="lsh")))
    for layer in list(model.encoder_layers) + list(model.decoder_layers):
        assert layer.self_attn.k_proj is layer.self_attn.q_proj
    assert model.decoder_layers[0].cross_attn.k_proj is not model.decoder_layers[0].cross_attn.q_proj


def test_cached_lsh_decoding_equals_uncached():
    torch.manual_seed(0)
    model = Transformer(_cfg(attention=dict(kind="lsh", lsh_buckets=4, lsh_hashes=2))).eval()
    src, tgt = _batch()
    with torch.no_grad():
        whole = model(src, tgt)
        steps, chunks, _ = decode_step_by_step(model, src, tgt, chunk=5)
    torch.testing.assert_close(steps, whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunks, whole, atol=1e-5, rtol=1e-4)


def test_cached_lsh_lm_equals_uncached():
    torch.manual_seed(0)
    lm = DecoderOnlyLM(_cfg(arch="decoder_only", attention=dict(kind="lsh", lsh_buckets=4))).eval()
    ids = _batch()[1]
    with torch.no_grad():
        whole = lm(ids)
        cache, steps = lm.new_cache(), []
        for t in range(ids.shape[1]):
            out = lm.decode(ids[:, t:t + 1], cache)
            cache = out.cache
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw", [dict(attention=dict(kind="bigbird", random_blocks=1)),
                                dict(attention=dict(kind="lsh", lsh_buckets=4))])
def test_training_reduces_loss(kw):
    """(40 steps end at 0.05-0.12 of the first loss over seeds 0-2: lsh's decoder sees only its
    bucket of the prefix, so it learns slower than full attention; 0.25 leaves a margin.)"""
    torch.manual_seed(0)
    model = Transformer(_cfg(**kw)).train()
    src, tgt = _batch()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = F.cross_entropy(model(src, tgt[:, :-1]).reshape(-1, V), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0]


@pytest.mark.parametrize("kind", ["bigbird", "lsh"])
def test_attention_maps_need_full_attention(kind):
    model = Transformer(_cfg(attention=dict(kind=kind)))
    with pytest.raises(ConfigError, match=f"attention maps need full attention; this model has {kind}"):
        model.encode(_batch()[0], need_weights=True)


def test_bigbird_is_encoder_only():
    """The kernel refuses causal attention and cached queries in one line (config keeps models
    from asking: the decoder's self-attention stays full)."""
    model = Transformer(_cfg(attention=dict(kind="bigbird")))
    assert model.decoder_layers[0].self_attn.is_full
    attn = model.encoder_layers[0].self_attn
    x = torch.randn(1, 9, H * DH)
    with pytest.raises(ConfigError, match="bigbird is encoder self-attention only") as e:
        attn(x, x, is_causal=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw, message", [
    (dict(attention=dict(kind="bigbird"), arch="decoder_only"),
     "model.attention.kind: bigbird applies to encoder self-attention"),
    (dict(attention=dict(cross="bigbird")), "model.attention.cross: bigbird applies to encoder self-attention only"),
    (dict(attention=dict(cross="lsh")), "model.attention.cross: lsh applies to self-attention only"),
    (dict(attention=dict(kind="lsh", lsh_hashes=0)),
     r"model.attention.lsh_hashes: must be >= 1 \(rounds of hashing\); got 0"),
    (dict(attention=dict(kind="lsh", lsh_buckets=5)), "model.attention.lsh_buckets: must be even and >= 2; got 5"),
    (dict(attention=dict(kind="bigbird", block=0)), "model.attention.block: must be >= 1; got 0"),
    (dict(attention=dict(kind="bigbird", random_blocks=-1)), "model.attention.random_blocks: must be >= 0; got -1"),
])
def test_bad_sparse_options_are_one_line_errors(kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        _cfg(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("make, message", [
    (lambda: LSHAttention(8, 0, 4, 0), "lsh needs chunk >= 1, n_hashes >= 1"),
    (lambda: LSHAttention(8, 2, 3, 0), "lsh needs chunk >= 1, n_hashes >= 1 and an even n_buckets"),
    (lambda: BigBirdAttention(0, 3, 0), "bigbird needs block >= 1"),
])
def test_kernels_built_directly_check_their_settings(make, message):
    with pytest.raises(ConfigError, match=message) as e:
        make()
    assert "\n" not in str(e.value)


def test_lsh_source_padding_is_inert():
    """Right padding changes nothing at the real positions: a position's chunk counts only the
    positions before it, and padded keys are masked. (BigBird's pattern is a function of the
    padded length, as Hugging Face's: there it is not inert.)"""
    torch.manual_seed(0)
    model = Transformer(_cfg(attention=dict(kind="lsh", lsh_buckets=4))).eval()
    src, tgt = _batch()
    padded = torch.cat([src, torch.zeros(src.shape[0], 7, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)
