"""Training an encoder-only masked LM (train.task mlm): masked batches, loss, data side, resume, averaging."""


import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig, RunConfig
from transduce.data.batch import collate
from transduce.data.encoder_inputs import masked_batch, masking_generator
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transduce.errors import ConfigError
from transduce.model import EncoderOnly, load_model
from transduce.training.loop import run_training
from transduce.training.step import forward_backward

from resume_helpers import assert_resume_exact_and_average, assert_trains_with_perplexity

MODEL = {"arch": "encoder_only", "d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 0,
         "d_ff": 64, "max_positions": 64, "norm": "post", "positions": "learned", "activation": "gelu",
         "scale_embeddings": False, "embed_norm": True}
TRAIN = {"max_steps": 12, "save_every": 6, "eval_every": 6, "log_every": 3, "warmup_steps": 5,
         "num_threads": 1, "keep_last": 3, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3}
TOY = {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 30, "toy_test_size": 10,
       "vocab_size": 120, "max_tokens": 400, "max_len": 60}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _cfg(data=None, model=None, **train):
    return RunConfig.from_dict({"model": {**MODEL, **(model or {})}, "data": data or TOY, "train": {**TRAIN, **train}})


def test_task_is_inferred_from_arch_and_checked():
    assert _cfg().task == "mlm"
    with pytest.raises(ConfigError, match="train.task"):
        _cfg(task="lm")
    with pytest.raises(ConfigError, match="data.max_len"):  # BOS + 63 tokens + EOS do not fit 64 positions
        _cfg({**TOY, "max_len": 63})
    assert _cfg({**TOY, "max_len": 62}).data.max_len == 62
    with pytest.raises(ConfigError, match="train.cuda_graphs"):
        _cfg(cuda_graphs=True)
    files = RunConfig.from_dict({"model": MODEL, "data": {"corpus": "files", "train_tgt": "x.txt", "max_len": 60}})
    assert files.task == "mlm"  # monolingual text needs no *_src


def test_masked_batch_is_bos_source_eos_masked_from_its_key():
    batch = collate([(list(range(3, 43)), [7]), (list(range(10, 30)), [8, 9])])
    a = masked_batch(batch, 50, masking_generator(1, 0, 0, 4))
    b = masked_batch(batch, 50, masking_generator(1, 0, 0, 4))
    c = masked_batch(batch, 50, masking_generator(1, 0, 0, 5))
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    assert not torch.equal(a.tgt_out, c.tgt_out)
    assert a.src.shape == (2, batch.src.size(1) + 1) and torch.equal(a.src, a.tgt_in)
    assert a.src[:, 0].eq(BOS_ID).all() and a.src[1, 21] == EOS_ID and a.src[1, 22:].eq(PAD_ID).all()
    selected = a.tgt_out != PAD_ID
    assert a.n_tgt_tokens == int(selected.sum()) > 0
    original = torch.cat([torch.full((2, 1), BOS_ID), batch.src], dim=1)
    assert torch.equal(a.tgt_out[selected], original[selected])
    assert torch.equal(a.src[~selected], original[~selected])  # only selected tokens change


def _encoder() -> EncoderOnly:
    torch.manual_seed(0)
    cfg = _cfg().model
    return EncoderOnly(ModelConfig(**{**cfg.__dict__, "src_vocab_size": 51, "tgt_vocab_size": 51,
                                      "dropout": 0.0}))


def test_step_loss_is_cross_entropy_at_the_selected_positions():
    model = _encoder()
    batch = masked_batch(collate([(list(range(3, 40)), [7]), (list(range(5, 20)), [8])]), model.mask_id,
                         masking_generator(0, 0, 0, 0))
    sums = forward_backward(model, [batch], 0.0, PAD_ID, 1.0, "fp32", torch.device("cpu"))
    logits = model.mlm_logits(model(batch.src))                          # (B, S + 1, V)
    want = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD_ID, reduction="sum")
    torch.testing.assert_close(sums[1], want.detach())


def test_a_batch_with_nothing_selected_adds_nothing():
    model = _encoder()
    batch = masked_batch(collate([([5], [7])]), model.mask_id, masking_generator(0, 0, 0, 0))
    batch.tgt_out.fill_(PAD_ID)  # one token: selected or not, force the empty case
    sums = forward_backward(model, [batch], 0.1, PAD_ID, 1.0, "fp32", torch.device("cpu"))
    assert sums.tolist() == [0.0, 0.0]
    assert all(p.grad is None or not p.grad.isnan().any() for p in model.parameters())


def test_mlm_trains_on_the_toy_source_side(tmp_path):
    _, metrics = run_training(_cfg(), tmp_path / "run")
    assert_trains_with_perplexity(metrics, tmp_path / "run")
    model = load_model(tmp_path / "run" / "model")
    assert isinstance(model, EncoderOnly) and model.config.n_classes == 0
    tok = Tokenizer.load(tmp_path / "run" / "model")
    assert model.config.src_vocab_size == tok.src_vocab_size + 1  # [MASK] is one id past the tokenizer's
    assert isinstance(load_model(tmp_path / "run" / "best"), EncoderOnly)


def test_validation_masks_the_same_way_every_time(tmp_path):
    trainer, metrics = run_training(_cfg(max_steps=2, eval_every=2, save_every=2), tmp_path / "run")
    torch.manual_seed(123)  # no global random state takes part
    assert trainer.validate() == trainer.validate() == {k: metrics[k] for k in ("val_loss", "val_ppl")}


def test_mlm_trains_on_monolingual_text(tmp_path):
    lines = [f"der hund {w} den ball" for w in ("sieht", "hat", "will", "mag")] * 40
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines[:20]) + "\n")
    data = {"corpus": "files", "train_tgt": str(tmp_path / "train.txt"), "valid_tgt": str(tmp_path / "valid.txt"),
            "vocab_size": 40, "max_tokens": 200, "max_len": 60}
    _, metrics = run_training(_cfg(data, max_steps=60, eval_every=60, save_every=60), tmp_path / "run")
    assert metrics["val_ppl"] < 6  # a masked word is one of at most four (or fixed): far below the vocabulary


def test_mlm_resume_is_exact_and_checkpoints_average(tmp_path):
    assert_resume_exact_and_average(_cfg, tmp_path, EncoderOnly, "layers.0.ffn.fc1.weight")
