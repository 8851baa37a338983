"""Fine-tuning an imported T5 trains what Hugging Face's T5 trains: the training step's loss
(:func:`~transduce.training.step.forward_backward`, the fused projection and label-smoothed loss)
equals ``T5ForConditionalGeneration(labels=...)``'s loss, and its gradients are T5's. Our
vocabulary holds T5's pad row twice (pad, and bos: the decoder start); the imported model leaves
bos out of the softmax (``model.bos_in_softmax: false``) in training as in decoding, or the loss
would be higher by log(1 + p(pad)) per token and label smoothing would spread over one id too many.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
import yaml

from transduce.cli import main
from transduce.data.batch import Batch
from transduce.data.tokenizer import Tokenizer
from transduce.interop import export_model
from transduce.interop import import_hf
from transduce.interop.t5 import our_t5_state
from transduce.model import load_model
from transduce.training.step import forward_backward
from transduce.training.validation import smoothed_batch_loss
from extra_helpers import need_extra
from t5_fixtures import hf_t5_dir, toy_lines, train_spiece

transformers = need_extra("export", "transformers")
need_extra("export", "google.protobuf")  # rewriting the SentencePiece model's proto

N = 12  # probe sentences


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (HF directory, imported directory): T5 1.0 (tied, rescaled) and mT5 (untied)."""
    root = tmp_path_factory.mktemp("t5ft")
    spiece = train_spiece(root)
    out = {}
    for i, kind in enumerate(("t5", "mt5")):
        hf = hf_t5_dir(transformers, spiece, root / f"hf-{kind}", kind, seed=i)
        import_hf(hf, root / kind)
        out[kind] = hf, root / kind
    return out


def _probe(hf_dir):
    """HF's inputs, HF's labels (-100 at padding) and our Batch of the same N pairs."""
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    enc = tok(toy_lines("en", N), return_tensors="pt", padding=True)
    labels = tok(toy_lines("de", N), return_tensors="pt", padding=True)["input_ids"]  # (B, T)
    # our ids: pad 0, bos 1 (pad's row again), eos 2, unk 3, then T5's ids from 3 on, in order
    ours = lambda ids: torch.where(ids >= 3, ids + 1, torch.tensor([0, 2, 3])[ids.clamp(max=2)])  # noqa: E731
    src, tgt_out = ours(enc["input_ids"]), ours(labels)
    tgt_in = torch.cat([torch.ones(N, 1, dtype=torch.long), tgt_out[:, :-1]], dim=1)  # BOS first
    batch = Batch(src, tgt_in, tgt_out, int((src != 0).sum()), int((tgt_out != 0).sum()))
    return enc, labels.masked_fill(labels == 0, -100), batch


def _grads(module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["t5", "mt5"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_training_loss_and_gradients_equal_t5s(models, kind, eps):
    """In float64 (so the tolerances are far from rounding): the step's summed loss is HF's mean
    loss times the label count (eps 0: HF's own ``labels=`` loss; eps 0.1: F.cross_entropy with
    label smoothing over T5's logits, which are ours without bos's column), and every gradient
    is T5's: pad's and bos's rows both get T5's pad row's (``training.step.tie_duplicate_rows``)."""
    hf_dir, ours_dir = models[kind]
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir).double().eval()  # eval: no dropout
    model = load_model(ours_dir).double().eval()
    assert not model.config.bos_in_softmax
    enc, labels, batch = _probe(hf_dir)
    out = hf(**enc, labels=labels)
    n = int((labels != -100).sum())
    want = out.loss * n if eps == 0 else F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(),
                                                         label_smoothing=eps, reduction="sum")
    want.backward()
    sums = forward_backward(model, [batch], eps, model.config.label_pad_id, 1.0, "fp32", torch.device("cpu"))
    assert batch.n_tgt_tokens == n
    torch.testing.assert_close(sums[0].double(), want.detach(), rtol=1e-5, atol=0.0)
    if eps == 0:
        torch.testing.assert_close(sums[1].double(), want.detach(), rtol=1e-5, atol=0.0)
    with torch.no_grad():  # a run's validation loss: the same, unfused
        torch.testing.assert_close(smoothed_batch_loss(model, batch, eps)[0], want.detach(), rtol=1e-5, atol=0.0)
    order = torch.tensor([0, 0, 1, 2] + list(range(3, model.config.tgt_vocab_size - 1)))
    expected = our_t5_state({k: g.float() for k, g in _grads(hf).items()}, model.config, order)
    got = {k: g.float() for k, g in _grads(model).items()}
    for name in [k for k in got if k in ("src_embed.tokens.weight", "output_proj.weight")]:
        assert torch.equal(got[name][0], got[name][1])  # T5's pad row is both of ours: one gradient
    assert got.keys() == expected.keys()
    for name, g in got.items():
        scale = expected[name].abs().max().item()
        assert scale > 0, name
        assert (g - expected[name]).abs().max().item() <= 1e-5 * scale, name


@pytest.fixture(scope="module")
def finetuned(models, tmp_path_factory):
    """A copy of the imported T5 fine-tuned for 3 steps on text-to-text lines through the CLI, then
    the copy deleted: (run directory, digest of the imported tokenizer)."""
    root = tmp_path_factory.mktemp("t5run")
    shutil.copytree(models["t5"][1], root / "init")
    for split, skip in (("train", 0), ("valid", 200)):
        pairs = zip(toy_lines("en", 40, skip), toy_lines("de", 40, skip))
        (root / f"{split}.tsv").write_text("".join(f"translate English to German: {en}\t{de}\n" for en, de in pairs),
                                           encoding="utf-8")
    config = {"data": {"corpus": "tsv", "train_src": str(root / "train.tsv"), "valid_src": str(root / "valid.tsv"),
                       "max_tokens": 600},
              "train": {"max_steps": 3, "log_every": 1, "eval_every": 3, "save_every": 3, "eval_bleu": False,
                        "threads": 1, "warmup_steps": 1, "lr": 1e-3, "schedule": "constant"}}
    (root / "ft.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["train", str(root / "ft.yaml"), "--out", str(root / "run"), "--init-from", str(root / "init")]) == 0
    digest = Tokenizer.load(root / "init").digest()
    shutil.rmtree(root / "init")
    return root / "run", digest


def test_finetuned_t5_keeps_one_pad_row_and_exports_to_t5(models, finetuned, tmp_path):
    """After training, pad's and bos's rows are still one row (equal bit for bit, and trained), so
    the model is still a T5: its export verifies against transformers."""
    model, imported = load_model(finetuned[0] / "model"), load_model(models["t5"][1])
    rows = model.src_embed.tokens.weight
    assert torch.equal(rows[0], rows[1])
    assert not torch.equal(rows[0], imported.src_embed.tokens.weight[0])
    checks = export_model(finetuned[0] / "model", "hf", tmp_path / "hf").checks
    assert checks["max_logit_diff"] <= 1e-4 and checks["greedy_differences"] == 0


def test_finetuned_t5_resumes_without_its_starting_directory(finetuned):
    """The run kept the imported tokenizer (its init directory is deleted): resume and its model work."""
    run, digest = finetuned
    assert main(["train", "--out", str(run), "--resume", "--set", "train.max_steps=4"]) == 0
    assert (run / "checkpoints" / "step_00000004").is_dir()
    assert Tokenizer.load(run / "model").digest() == digest
