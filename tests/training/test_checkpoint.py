"""Checkpoint averaging and model directories."""


import pytest
import torch

from transduce.config import ModelConfig
from transduce.errors import CheckpointError
from transduce.model import Transformer, load_model, save_model
from transduce.training.checkpoint import average_checkpoints


class _Tok:
    def save(self, d):
        (d / "spm.model").write_bytes(b"tok")


def _saved(tmp_path, name, seed, **kw):
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**dict(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2,
                                              n_encoder_layers=1, n_decoder_layers=1, d_ff=16), **kw}))
    save_model(model, tmp_path / name)
    (tmp_path / name / "spm.model").write_bytes(b"tok")
    return model


def test_average_is_the_mean(tmp_path):
    models = [_saved(tmp_path, f"c{i}", seed=i) for i in range(3)]
    out = average_checkpoints([tmp_path / f"c{i}" for i in range(3)], tmp_path / "avg")
    avg = load_model(out)
    for name, p in avg.named_parameters():
        expected = sum(dict(m.named_parameters())[name] for m in models) / 3
        torch.testing.assert_close(p, expected, atol=1e-6, rtol=1e-6)
    assert (out / "spm.model").read_bytes() == b"tok"


def test_average_refuses_different_configs(tmp_path):
    _saved(tmp_path, "a", 0)
    _saved(tmp_path, "b", 0, d_ff=32)
    with pytest.raises(CheckpointError, match="config differs"):
        average_checkpoints([tmp_path / "a", tmp_path / "b"], tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_model_directories_are_ordinary_0755_directories(tmp_path):
    """One atomic directory writer (transduce.atomic.atomic_dir) for checkpoints, model/ and
    exports: the finished directory is 0755, not mkdtemp's private 0700."""
    import stat

    from transduce.training.checkpoint import save_model_dir
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2,
                                    n_encoder_layers=1, n_decoder_layers=1, d_ff=16))
    out = save_model_dir(model, _Tok(), tmp_path / "model")
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    save_model_dir(model, _Tok(), tmp_path / "model")  # replacing keeps it so
    assert stat.S_IMODE(out.stat().st_mode) == 0o755 and not list(tmp_path.glob(".*"))


def test_a_damaged_trainer_state_is_refused(tmp_path):
    """trainer.pt (optimizer state) is checked against the sha256 state.json recorded for it."""
    from transduce.training.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2,
                                    n_encoder_layers=1, n_decoder_layers=1, d_ff=16))
    state = {"optimizer": torch.optim.Adam(model.parameters()).state_dict(), "moments": torch.randn(50)}
    path = save_checkpoint(tmp_path / "ckpts", 10, model, _Tok(), state, {"step": 10}, keep_last=2)
    weights, trainer_state, info = load_checkpoint(path)
    assert info == {"step": 10} and torch.equal(trainer_state["moments"], state["moments"])
    data = bytearray((path / "trainer.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / "trainer.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="trainer.pt: corrupt"):
        load_checkpoint(path)
