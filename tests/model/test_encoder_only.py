"""The encoder-only (BERT-style) model: its embeddings, masking of pads, heads, save and load."""

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig
from transduce.errors import ConfigError
from transduce.model import EncoderOnly, Transformer, build_model, load_model, save_model

V = 40


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(arch="encoder_only", src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4,
                                 n_encoder_layers=2, d_ff=64, dropout=0.0, positions="learned", max_positions=32,
                                 activation="gelu", embed_norm=True, type_vocab_size=2,
                                 scale_embeddings=False), **kw})


def _model(**kw) -> EncoderOnly:
    torch.manual_seed(0)
    return EncoderOnly(_cfg(**kw)).eval()


IDS = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]])


@pytest.mark.parametrize("kw", [{}, dict(norm="pre"), dict(positions="rope", embed_norm=False),
                                dict(positions="sinusoidal", type_vocab_size=0)])
@torch.no_grad()
def test_padding_is_inert(kw):
    """A sentence's states do not depend on the pads after it (they are masked as keys)."""
    model = _model(**kw)
    states = model(IDS)
    alone = model(IDS[1:, :4])
    torch.testing.assert_close(states[1, :4], alone[0], rtol=0, atol=1e-5)


@torch.no_grad()
def test_attention_is_bidirectional():
    """Unlike the decoder, an early position sees later ones."""
    model = _model()
    changed = IDS.clone()
    changed[0, 4] = 11
    assert not torch.allclose(model(IDS)[0, 1], model(changed)[0, 1])


@torch.no_grad()
def test_embeddings_are_the_bert_sum_then_layer_norm():
    model = _model()
    types = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    emb = model.embed
    want = F.layer_norm(emb.tokens.weight[IDS] + emb.positions.weight[:6] + emb.token_types.weight[types],
                        (32,), emb.norm.weight, emb.norm.bias, 1e-5)
    torch.testing.assert_close(emb(IDS, token_types=types), want)
    # no token types means type 0 everywhere
    torch.testing.assert_close(model(IDS), model(IDS, torch.zeros_like(IDS)))
    assert not torch.allclose(model(IDS), model(IDS, types))


def test_token_types_without_a_type_embedding_are_refused():
    with pytest.raises(ValueError, match="type_vocab_size=0"):
        _model(type_vocab_size=0)(IDS, torch.zeros_like(IDS))


@torch.no_grad()
def test_masked_lm_head_is_bert_transform_then_tied_decoder():
    model = _model()
    head = model.mlm_head
    assert head.decoder.weight is model.embed.tokens.weight
    states = torch.randn(3, 32)
    h = F.layer_norm(F.gelu(head.dense(states)), (32,), head.norm.weight, head.norm.bias, 1e-5)
    torch.testing.assert_close(model.mlm_logits(states), h @ model.embed.tokens.weight.T + head.bias)
    assert model.mask_id == V - 1
    assert model.cls_head is None
    with pytest.raises(ValueError, match="masked-LM head"):
        model.classify(model(IDS))


@torch.no_grad()
def test_classification_head_pools_the_first_position():
    model = _model(n_classes=3)
    assert model.mlm_head is None
    states = model(IDS)
    head = model.cls_head
    torch.testing.assert_close(model.classify(states), head.classifier(torch.tanh(head.pooler(states[:, 0]))))
    assert model.classify(states).shape == (2, 3)
    with pytest.raises(ValueError, match="classification head"):
        model.mlm_logits(states)


def test_untied_decoder_is_its_own_matrix_and_bias_free_has_no_biases():
    model = _model(tie_output=False, share_embeddings=False)
    assert model.mlm_head.decoder.weight is not model.embed.tokens.weight
    for kw in (dict(bias=False), dict(bias=False, n_classes=2)):
        assert not [name for name, _ in _model(**kw).named_parameters() if name.endswith("bias")]


@pytest.mark.parametrize("kw", [{}, dict(n_classes=3), dict(tie_output=False, share_embeddings=False)])
def test_save_and_load_return_the_encoder(tmp_path, kw):
    model = _model(**kw)
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, EncoderOnly) and loaded.config == model.config
    torch.testing.assert_close(loaded(IDS), model(IDS), rtol=0, atol=0)
    if not kw:
        assert loaded.mlm_head.decoder.weight is loaded.embed.tokens.weight  # the tie survives


def test_build_model_chooses_the_class_by_arch():
    assert isinstance(build_model(_cfg()), EncoderOnly)
    plain = ModelConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4, d_ff=64)
    assert type(build_model(plain)) is Transformer
    with pytest.raises(ConfigError, match="^model.arch: encoder_only models are built by build_model"):
        Transformer(_cfg())
