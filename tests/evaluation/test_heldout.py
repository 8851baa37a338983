"""``transduce evaluate`` for lm, mlm and classify models (transduce.evaluation.perplexity / accuracy),
checked against a plain forward pass and F.cross_entropy."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from transduce.cli import main
from transduce.config import DecodeConfig, ModelConfig, RunConfig, with_vocab
from transduce.data import toy
from transduce.data.encoder_inputs import VALID_STREAM, mask_tokens, masking_generator
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transduce.errors import ConfigError
from transduce.evaluation import accuracy, perplexity
from transduce.model import build_model, load_model
from transduce.training.checkpoint import save_model_dir
from transduce.training.loop import run_training

MODELS = {
    "lm": {"arch": "decoder_only", "n_encoder_layers": 0, "n_decoder_layers": 2, "max_positions": 40,
           "positions": "learned"},
    "mlm": {"arch": "encoder_only", "n_encoder_layers": 2, "n_decoder_layers": 0, "positions": "learned",
            "max_positions": 40, "activation": "gelu", "scale_embeddings": False, "embed_norm": True},
    "classify": {"arch": "encoder_only", "n_encoder_layers": 1, "n_decoder_layers": 0, "n_classes": 2,
                 "labels": ["long", "short"]},
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A toy tokenizer, text (one line longer than the models' 40 positions), and a labelled file."""
    root = tmp_path_factory.mktemp("heldout")
    pairs = toy.make_splits(seed=0, n_train=300, n_valid=40, n_test=10)
    Tokenizer.train([s for s, _ in pairs["train"]], [t for _, t in pairs["train"]], root / "tok", 150)
    lines = [s for s, _ in pairs["valid"]] + ["", " ".join(s for s, _ in pairs["valid"][:6])]
    (root / "text.txt").write_text("".join(f"{line}\n" for line in lines))
    (root / "labelled.tsv").write_text("".join(f"{s}\t{'long' if len(s) > 30 else 'short'}\n"
                                               for s, _ in pairs["valid"]))
    return root


def _model_dir(root, task):
    out = root / task
    if not out.exists():
        tok = Tokenizer.load(root / "tok")
        extra = 1 if task != "lm" else 0
        model = ModelConfig(d_model=32, n_heads=2, d_ff=64, **MODELS[task])
        torch.manual_seed(0)
        save_model_dir(build_model(with_vocab(model, tok.src_vocab_size + extra, tok.tgt_vocab_size + extra)),
                       tok, out, DecodeConfig())
    return out


def _rows(root, room):
    tok = Tokenizer.load(root / "tok")
    return [tok.encode(line)[:room] for line in (root / "text.txt").read_text().splitlines() if line.strip()]


@torch.no_grad()
def _lm_nll(root):
    """Summed NLL and token count, one line at a time: BOS + ids -> ids + EOS."""
    model, nll, n = load_model(_model_dir(root, "lm")), 0.0, 0
    for ids in _rows(root, model.config.max_positions - 1):
        logits = model(torch.tensor([[BOS_ID] + ids]))[0]                 # (T, V)
        nll += F.cross_entropy(logits, torch.tensor(ids + [EOS_ID]), reduction="sum").item()
        n += len(ids) + 1
    return nll, n


@torch.no_grad()
def _mlm_nll(root, seed):
    """Summed NLL of the masked tokens, line j masked by the key (seed, VALID_STREAM, 0, j)."""
    model, nll, n = load_model(_model_dir(root, "mlm")), 0.0, 0
    for j, ids in enumerate(_rows(root, model.config.max_positions - 2)):
        inputs, labels = mask_tokens(torch.tensor([[BOS_ID] + ids + [EOS_ID]]), model.mask_id,
                                     masking_generator(seed, VALID_STREAM, 0, j))
        keep = labels != PAD_ID
        logits = model.mlm_logits(model(inputs)[keep])                    # (N, V)
        nll += F.cross_entropy(logits, labels[keep], reduction="sum").item()
        n += int(keep.sum())
    return nll, n


def test_lm_perplexity_is_exp_of_the_mean_token_nll(corpus):
    nll, n = _lm_nll(corpus)
    got = perplexity(_model_dir(corpus, "lm"), corpus / "text.txt")
    long = sum(len(ids) > 39 for ids in _rows(corpus, None))
    assert got["tokens"] == n and got["sentences"] == 41 and got["truncated"] == long >= 1  # empty line skipped
    assert got["nll"] == pytest.approx(nll / n, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    one_by_one = perplexity(_model_dir(corpus, "lm"), corpus / "text.txt", batch_tokens=1)
    assert one_by_one["perplexity"] == pytest.approx(got["perplexity"], rel=1e-6)  # batching and padding
    assert one_by_one["tokens"] == got["tokens"]


def test_mlm_perplexity_is_over_the_seeded_masked_tokens(corpus):
    nll, n = _mlm_nll(corpus, seed=5)
    got = perplexity(_model_dir(corpus, "mlm"), corpus / "text.txt", seed=5)
    assert got["task"] == "mlm" and got["seed"] == 5 and got["tokens"] == n > 0
    assert got["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    one_by_one = perplexity(_model_dir(corpus, "mlm"), corpus / "text.txt", batch_tokens=1, seed=5)
    assert one_by_one["tokens"] == n and one_by_one["perplexity"] == pytest.approx(got["perplexity"], rel=1e-6)
    other = perplexity(_model_dir(corpus, "mlm"), corpus / "text.txt", seed=6)
    assert other["perplexity"] != got["perplexity"]


def test_classify_figures_are_classify_scores(corpus, capsys):
    model = _model_dir(corpus, "classify")
    assert main(["classify", str(model), "--input", str(corpus / "labelled.tsv"), "--score"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(model), "--ref", str(corpus / "labelled.tsv")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated == {"task": "classify", **scored} == accuracy(model, corpus / "labelled.tsv")
    assert scored["sentences"] == 40


def test_cli_evaluate_lm_prints_json(corpus, capsys):
    assert main(["evaluate", str(_model_dir(corpus, "lm")), "--ref", str(corpus / "text.txt")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["perplexity"] == pytest.approx(perplexity(_model_dir(corpus, "lm"), corpus / "text.txt")["perplexity"])


@pytest.mark.parametrize("task,argv,message", [
    ("lm", ["--src", "x.txt"], "src: not used for a train.task lm model, which is scored on ref alone"),
    ("mlm", ["--beam", "2"], "decode.beam: not used for a train.task mlm model, which is scored on ref alone"),
    ("lm", ["--seed", "3"], "seed: not used for a train.task lm model, which is scored on ref alone"),
    ("classify", ["--batch-tokens", "9"], "decode.batch_tokens: not used for a train.task classify model, which is "
                                          "scored on ref alone"),
])
def test_cli_wrong_flags_for_the_task_are_one_line_errors(corpus, capsys, task, argv, message):
    assert main(["evaluate", str(_model_dir(corpus, task)), "--ref", str(corpus / "text.txt"), *argv]) == 2
    assert capsys.readouterr().err.strip() == f"transduce evaluate: error: {message}"


def test_translation_needs_src_and_perplexity_needs_a_language_model(model_dir, corpus, capsys):
    assert main(["evaluate", str(model_dir), "--ref", str(corpus / "text.txt")]) == 2
    assert capsys.readouterr().err.strip() == ("transduce evaluate: error: src: a translation model is scored "
                                               "by translating src against ref")
    with pytest.raises(ConfigError, match="perplexity is for train.task lm or mlm models; this one is translation$"):
        perplexity(model_dir, corpus / "text.txt")


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_evaluate_on_the_validation_file_reproduces_the_logged_val_ppl(corpus, tmp_path, task):
    valid = (corpus / "text.txt").read_text().splitlines()[:40]
    (tmp_path / "valid.txt").write_text("".join(f"{line}\n" for line in valid))
    model = {"d_model": 32, "n_heads": 2, "d_ff": 64, **MODELS[task], "max_positions": 128}
    data = {"corpus": "files", "train_tgt": str(tmp_path / "valid.txt"), "valid_tgt": str(tmp_path / "valid.txt"),
            "tokenizer": str(corpus / "tok"), "max_tokens": 300, "max_len": 100}
    train = {"max_steps": 2, "eval_every": 2, "save_every": 2, "seed": 4, "label_smoothing": 0.0,
             "schedule": "constant", "lr": 1e-3, "threads": 1}
    _, metrics = run_training(RunConfig.from_dict({"model": model, "data": data, "train": train}),
                              tmp_path / "run")
    got = perplexity(tmp_path / "run" / "model", tmp_path / "valid.txt", batch_tokens=50, seed=4)
    assert got["perplexity"] == pytest.approx(metrics["val_ppl"], rel=1e-5)
