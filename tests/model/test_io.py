"""Saving and loading model directories."""

import pytest
import torch
from safetensors.torch import save_file

from transduce.config import AttentionConfig, ModelConfig
from transduce.checksums import record
from transduce.errors import CheckpointError
from transduce.model import Transformer, load_model, save_model


def _model(**kw):
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**dict(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2,
                                              n_encoder_layers=1, n_decoder_layers=1, d_ff=32), **kw}))


@pytest.mark.parametrize("kw", [{}, dict(share_embeddings=False, tie_output=False), dict(positions="learned"),
                                dict(attention=AttentionConfig("local", cross="local", window=1, global_tokens=1)),
                                dict(attention=AttentionConfig("linformer", linformer_k=2), max_positions=8)])
def test_round_trip(tmp_path, kw):
    model = _model(**kw).eval()
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.config == model.config
    src, tgt = torch.tensor([[4, 5, 2]]), torch.tensor([[1, 6]])
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), rtol=0, atol=0)
    if kw == {}:
        assert loaded.output_proj.weight is loaded.src_embed.tokens.weight  # ties survive
    assert not list((tmp_path / "m").glob("*.tmp"))


def test_shape_mismatch_is_explained(tmp_path):
    save_model(_model(), tmp_path / "m")
    other = _model(d_ff=64)
    save_model(other, tmp_path / "other")
    (tmp_path / "m" / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"ffn.fc1.weight has shape \(64, 16\), the config expects \(32, 16\)"):
        load_model(tmp_path / "m")


def test_missing_tensor_is_explained(tmp_path):
    save_model(_model(), tmp_path / "m")
    untied = _model(share_embeddings=False, tie_output=False)
    save_model(untied, tmp_path / "u")
    (tmp_path / "m" / "model.safetensors").write_bytes((tmp_path / "u" / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="unexpected"):
        load_model(tmp_path / "m")


def test_corrupt_foreign_and_missing(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "nothing")
    save_model(_model(), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(b"garbage" * 10)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_model(tmp_path / "m")
    save_file({"w": torch.zeros(2)}, str(weights))
    with pytest.raises(CheckpointError, match="not a transduce checkpoint"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "config.yaml").write_text("model: {d_model: 15, n_heads: 2}")
    record(tmp_path / "m", ["config.yaml"])  # an edit on purpose (else the checksum catches it first)
    with pytest.raises(CheckpointError, match="model.d_model"):
        load_model(tmp_path / "m")


def test_decoding_settings_are_saved_loaded_and_checked(tmp_path):
    import yaml

    from transduce.config import DecodeConfig
    from transduce.errors import ConfigError
    from transduce.model.io import load_decode_config

    model = Transformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2,
                                    n_encoder_layers=1, n_decoder_layers=1, d_ff=16))
    save_model(model, tmp_path / "old")
    assert load_decode_config(tmp_path / "old") == DecodeConfig()  # saved without: the defaults
    save_model(model, tmp_path / "new", DecodeConfig(beam=5, lenpen=1.0))
    assert load_decode_config(tmp_path / "new") == DecodeConfig(beam=5, lenpen=1.0)
    config = yaml.safe_load((tmp_path / "new" / "config.yaml").read_text())
    config["decode"]["beam"] = 0
    (tmp_path / "new" / "config.yaml").write_text(yaml.safe_dump(config))
    record(tmp_path / "new", ["config.yaml"])
    with pytest.raises(ConfigError, match=r"config.yaml: decode.beam: must be positive"):
        load_decode_config(tmp_path / "new")


@pytest.mark.parametrize("where", ["first tensor byte", "last byte"])
def test_one_flipped_bit_is_caught_by_the_checksum(tmp_path, where):
    """Silent corruption (a flipped bit in the weights) is a one-line error, never a wrong model."""
    from transduce.cli import main

    save_model(_model(), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header if where == "first tensor byte" else -1] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt: its tensors do not match the checksum"):
        load_model(tmp_path / "m")
    assert main(["info", str(tmp_path / "m")]) == 0  # the header alone is still readable


def test_files_without_a_checksum_still_load(tmp_path):
    """Models saved before the checksum existed have none in their header."""
    from safetensors.torch import load_file

    from transduce.model.io import DIGEST_KEY, FORMAT, FORMAT_VERSION

    model = _model().eval()
    save_model(model, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    save_file(load_file(str(weights)), str(weights), metadata={"format": FORMAT, "version": FORMAT_VERSION})
    from safetensors import safe_open
    with safe_open(str(weights), framework="pt") as f:
        assert DIGEST_KEY not in f.metadata()
    src, tgt = torch.tensor([[4, 5, 2]]), torch.tensor([[1, 6]])
    torch.testing.assert_close(load_model(tmp_path / "m")(src, tgt), model(src, tgt), rtol=0, atol=0)
