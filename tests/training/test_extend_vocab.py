"""train.extend_vocab / ``transduce train --init-from M --extend-vocab [N]``: the init model's tokenizer
gains the new text's subwords, its vocabulary rows grow, every old id and row is kept."""

import logging
import random
import shutil

import pytest
import torch
import yaml

from transduce.cli import main
from transduce.config import DecodeConfig, GenerationConfig, RunConfig, with_vocab
from transduce.data import toy
from transduce.data.tokenizer import Tokenizer
from transduce.errors import ConfigError
from transduce.inference.classify import Classifier
from transduce.inference.generate import Generator
from transduce.inference.translator import Translator
from transduce.model import build_model, load_model
from transduce.model.io import unique_state_dict
from transduce.training.checkpoint import save_model_dir
from transduce.training.loop import run_training

ARCHS = {
    "translation": {"arch": "encoder_decoder", "n_encoder_layers": 1, "n_decoder_layers": 1},
    "lm": {"arch": "decoder_only", "n_encoder_layers": 0, "n_decoder_layers": 2},
    "mlm": {"arch": "encoder_only", "n_encoder_layers": 2, "n_decoder_layers": 0, "positions": "learned",
            "max_positions": 64, "activation": "gelu", "scale_embeddings": False, "embed_norm": True},
}
TRAIN = {"max_steps": 1, "save_every": 50, "eval_every": 50, "log_every": 1, "warmup_steps": 1,
         "threads": 1, "schedule": "constant", "lr": 1e-3, "label_smoothing": 0.0}
WORDS = ("photosynthesis", "chlorophyll", "chloroplasts", "mitochondria", "glucose")
NEW_WORD = "chlorophyll"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _model(task, joint=True):
    separate = {} if joint else {"share_embeddings": False}  # two vocabularies, two embeddings
    return {"d_model": 32, "n_heads": 2, "d_ff": 64, **ARCHS["mlm" if task == "classify" else task], **separate}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Toy-corpus text (the old domain) and new-domain files: parallel, monolingual, labelled."""
    root = tmp_path_factory.mktemp("extend")
    pairs = toy.make_splits(seed=0, n_train=300, n_valid=10, n_test=10)["train"]
    rng = random.Random(0)
    new = [f"The {rng.choice(WORDS)} of the {rng.choice(WORDS)} makes {rng.choice(WORDS)}." for _ in range(200)]
    (root / "new.en").write_text("\n".join(new) + "\n")
    (root / "new.de").write_text("\n".join(s.replace("The", "Die").replace("makes", "macht") for s in new) + "\n")
    (root / "new.tsv").write_text("".join(f"{s}\t{'plant' if 'phyll' in s else 'cell'}\n" for s in new))
    return root, pairs, new


def _init_dir(root, pairs, task, joint=True):
    """An init model directory (untrained weights; a toy-trained tokenizer)."""
    out = root / f"init_{task}_{'joint' if joint else 'separate'}"
    if not out.exists():
        tok = Tokenizer.train([s for s, _ in pairs], [t for _, t in pairs], root / "tok_tmp", 120, joint=joint)
        extra = 1 if task in ("mlm", "classify") else 0
        model = RunConfig.from_dict({"model": _model(task, joint), "data": {"max_len": 60}}).model
        cfg = with_vocab(model, tok.src_vocab_size + extra, tok.tgt_vocab_size + extra)
        torch.manual_seed(0)
        save_model_dir(build_model(cfg), tok, out, DecodeConfig(beam=1))
        shutil.rmtree(root / "tok_tmp")
    return out


def _data(root, task):
    if task == "translation":
        return {"corpus": "files", "train_src": str(root / "new.en"), "train_tgt": str(root / "new.de"),
                "valid_src": str(root / "new.en"), "valid_tgt": str(root / "new.de")}
    if task == "classify":
        return {"corpus": "files", "train_src": str(root / "new.tsv"), "valid_src": str(root / "new.tsv")}
    return {"corpus": "files", "train_tgt": str(root / "new.en"), "valid_tgt": str(root / "new.en")}


def _cfg(root, task, init, joint=True, **train):
    model = {**_model(task, joint), **({"n_classes": 2} if task == "classify" else {})}
    data = {**_data(root, task), "max_tokens": 600, "max_len": 60, "valid_max_sentences": 20}
    return RunConfig.from_dict({"model": model, "data": data,
                                "train": {**TRAIN, "init_from": str(init), "extend_vocab": 40, **train}})


def _grown(root, pairs, task, tmp_path, joint=True):
    """(init model, its tokenizer, the run's grown model before training, the extended tokenizer)."""
    init = _init_dir(root, pairs, task, joint)
    cfg = _cfg(root, task, init, joint)
    trainer, _ = run_training(cfg, tmp_path / "run")
    torch.manual_seed(cfg.train.seed)  # the model as the Trainer built it, then initialised from init
    trainer.model = build_model(trainer.model_cfg)
    trainer.init_from(init)
    return load_model(init), Tokenizer.load(init), trainer.model.eval(), Tokenizer.load(tmp_path / "run" / "tokenizer")


@pytest.mark.parametrize("task,joint", [("translation", True), ("translation", False), ("lm", True),
                                        ("mlm", True), ("classify", True)])
def test_old_rows_are_kept_and_new_rows_initialised(corpus, tmp_path, task, joint):
    root, pairs, _ = corpus
    old, old_tok, new, tok = _grown(root, pairs, task, tmp_path, joint)
    assert tok.extends(old_tok) and tok.src_vocab_size > old_tok.src_vocab_size
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["tokenizer"] == \
        str(tmp_path / "run" / "tokenizer")
    extra = 1 if task in ("mlm", "classify") else 0
    before, after = unique_state_dict(old), unique_state_dict(new)
    grown = [k for k in before if k in after and before[k].shape != after[k].shape]
    expect = {"translation": 1 if joint else 2, "lm": 1, "mlm": 2, "classify": 1}[task]  # embeddings, mlm bias
    assert len(grown) == expect, grown
    for k in after:
        if k not in grown and k in before and not k.startswith("cls_head."):
            assert torch.equal(before[k], after[k]), k
    for k in grown:
        v_old = before[k].shape[0] - extra
        assert torch.equal(after[k][:v_old], before[k][:v_old]), k  # bitwise
        if extra:
            assert torch.equal(after[k][-1], before[k][-1]), k  # [MASK] moved to the new last id
        rows = after[k][v_old:after[k].shape[0] - extra]
        if k.endswith("bias"):
            assert torch.equal(rows, torch.zeros_like(rows))  # as a fresh head's bias
        else:  # a fresh embedding's N(0, D^-1/2) rows
            assert abs(rows.std().item() - 32 ** -0.5) < 0.3 * 32 ** -0.5, k


@pytest.mark.parametrize("task", ["translation", "lm", "mlm"])
def test_outputs_on_old_vocabulary_are_unchanged_before_training(corpus, tmp_path, task):
    root, pairs, _ = corpus
    old, old_tok, new, tok = _grown(root, pairs, task, tmp_path)
    ids = torch.tensor([[1] + old_tok.encode(pairs[0][0])[:12] + [2]])        # (1, T), old ids only
    v = old_tok.tgt_vocab_size
    with torch.no_grad():
        if task == "translation":
            want, got = old(ids, ids[:, :-1]), new(ids, ids[:, :-1])               # (1, T - 1, V)
        elif task == "lm":
            want, got = old(ids), new(ids)                                         # (1, T, V)
        else:  # a masked position: the old model's [MASK] id, the new model's (its last)
            assert new.mask_id == tok.src_vocab_size and old.mask_id == v
            want = old.mlm_logits(old(torch.where(ids == 5, old.mask_id, ids)))    # (1, T, V + 1)
            got = new.mlm_logits(new(torch.where(ids == 5, new.mask_id, ids)))
            torch.testing.assert_close(got[..., -1], want[..., -1])              # the [MASK] logit moved too
    torch.testing.assert_close(got[..., :v], want[..., :v], rtol=1e-5, atol=1e-5)
    assert got.shape[-1] - want.shape[-1] == tok.tgt_vocab_size - v > 0


@pytest.mark.parametrize("task", ["translation", "lm", "classify"])
def test_a_short_fine_tune_saves_a_model_that_loads_and_runs(corpus, tmp_path, task):
    root, pairs, new_lines = corpus
    init = _init_dir(root, pairs, task)
    run_training(_cfg(root, task, init, max_steps=3), tmp_path / "run")
    model_dir = tmp_path / "run" / "model"
    tok = Tokenizer.load(model_dir)
    assert tok.digest() == Tokenizer.load(tmp_path / "run" / "tokenizer").digest()
    assert len(tok.encode(NEW_WORD)) < len(Tokenizer.load(init).encode(NEW_WORD))
    if task == "translation":
        with Translator.load(model_dir) as translator:
            assert len(translator.translate(new_lines[:3])) == 3
    elif task == "lm":
        texts = Generator.load(model_dir).generate(["The"], GenerationConfig(max_new_tokens=5, temperature=0.0))
        assert len(texts) == 1
    else:
        assert set(Classifier.load(model_dir).classify(new_lines[:4])) <= {"cell", "plant"}


def test_nothing_new_to_add_is_a_warning_and_trains_on(corpus, tmp_path, caplog):
    """The init model's tokenizer already covers the text (here: the text it was trained on)."""
    root, pairs, _ = corpus
    init = _init_dir(root, pairs, "lm")
    (tmp_path / "old.en").write_text("".join(f"{s}\n" for s, _ in pairs))
    (tmp_path / "old.de").write_text("".join(f"{t}\n" for _, t in pairs))
    cfg = _cfg(root, "translation", _init_dir(root, pairs, "translation"))
    cfg = RunConfig.from_dict({**cfg.to_dict(), "data": {**cfg.to_dict()["data"], "train_src": str(tmp_path / "old.en"),
                                                          "train_tgt": str(tmp_path / "old.de")}})
    with caplog.at_level(logging.WARNING, logger="transduce.training"):
        run_training(cfg, tmp_path / "run")
    assert "has no pieces" in caplog.text
    assert Tokenizer.load(tmp_path / "run" / "model").digest() == Tokenizer.load(init).digest()


def test_errors_are_one_line(corpus, tmp_path):
    root, pairs, _ = corpus
    init = _init_dir(root, pairs, "lm")
    with pytest.raises(ConfigError, match=r"^train.extend_vocab: needs train.init_from: the model whose vocabulary"):
        _cfg(root, "lm", init, init_from=None)
    with pytest.raises(ConfigError, match=r"^train.extend_vocab: must be a positive number of new pieces; got 0$"):
        _cfg(root, "lm", init, extend_vocab=0)
    cfg = _cfg(root, "lm", init)
    other = RunConfig.from_dict({**cfg.to_dict(), "data": {**cfg.to_dict()["data"], "tokenizer": str(init)}})
    with pytest.raises(ConfigError, match=r"^train.extend_vocab: extends train.init_from's tokenizer; leave "
                                          r"data.tokenizer unset"):
        run_training(other, tmp_path / "run")


def test_cli_extend_vocab_and_resume(corpus, tmp_path, capsys):
    root, pairs, _ = corpus
    init, out = _init_dir(root, pairs, "lm"), tmp_path / "run"
    cfg = _cfg(root, "lm", init).to_dict()
    cfg["train"].update(init_from=None, extend_vocab=None, save_every=2)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "cfg.yaml"), "--extend-vocab"]) == 2
    assert capsys.readouterr().err.strip() == ("transduce train: error: train.extend_vocab: needs train.init_from: "
                                               "the model whose vocabulary it extends")
    assert main(["train", str(tmp_path / "cfg.yaml"), "--init-from", str(init), "--extend-vocab", "7",
                 "--out", str(out), "--set", "train.max_steps=2"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["extend_vocab"] == 7
    assert Tokenizer.load(out / "model").tgt_vocab_size == Tokenizer.load(init).tgt_vocab_size + 7
    digest = Tokenizer.load(out / "tokenizer").digest()
    assert main(["train", "--out", str(out), "--resume", "--set", "train.max_steps=3"]) == 0  # the run's tokenizer
    assert Tokenizer.load(out / "model").digest() == digest
