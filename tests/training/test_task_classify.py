"""Training an encoder-only classifier (train.task classify) on text<TAB>label files, from a masked LM."""

import io
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from dataclasses import replace

from transduce.config import ModelConfig, RunConfig, save_yaml
from transduce.data.batch import collate
from transduce.data.encoder_inputs import classification_batch
from transduce.cli import main
from transduce.data.labelled import read_labelled
from transduce.evaluation.metrics import classification_scores
from transduce.inference.classify import Classifier
from transduce.errors import ConfigError, DataError
from transduce.model import EncoderOnly, load_model
from transduce.training.loop import run_training
from transduce.training.step import forward_backward

MODEL = {"arch": "encoder_only", "d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 0,
         "d_ff": 64, "max_positions": 64, "positions": "learned", "activation": "gelu", "scale_embeddings": False,
         "embed_norm": True}
TRAIN = {"max_steps": 40, "save_every": 20, "eval_every": 20, "log_every": 5, "warmup_steps": 5,
         "num_threads": 1, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3, "keep_last": 3}
ANIMALS = ("dog", "cat", "bird")
VERBS = ("sees", "has", "wants", "likes", "finds")
THINGS = ("ball", "tree", "house", "car")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _lines():
    """(sentence, label): the label is the sentence's animal."""
    return [(f"the {a} {v} the {t}", a) for a in ANIMALS for v in VERBS for t in THINGS]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Monolingual text, the same sentences labelled (train/valid), and a masked LM pre-trained on the text."""
    root = tmp_path_factory.mktemp("classify")
    lines = _lines()
    (root / "text.txt").write_text("\n".join(s for s, _ in lines * 4) + "\n")
    (root / "train.tsv").write_text("".join(f"{s}\t{a}\n" for s, a in lines[::2] * 3))
    (root / "valid.tsv").write_text("".join(f"{s}\t{a}\n" for s, a in lines[1::2]))
    data = {"corpus": "files", "train_tgt": str(root / "text.txt"), "vocab_size": 40, "max_tokens": 300,
            "max_len": 30}
    run_training(RunConfig.from_dict({"model": MODEL, "data": data, "train": {**TRAIN, "max_steps": 20}}),
                 root / "mlm")
    return root


def _cfg(root, model=None, data=None, **train):
    data = {"corpus": "files", "train_src": str(root / "train.tsv"), "valid_src": str(root / "valid.tsv"),
            "max_tokens": 300, "max_len": 30, "tokenizer": str(root / "mlm" / "model"), **(data or {})}
    return RunConfig.from_dict({"model": {**MODEL, "n_classes": 3, **(model or {})}, "data": data,
                                "train": {**TRAIN, **train}})


def test_task_is_inferred_and_its_data_checked(corpus):
    assert _cfg(corpus).task == "classify"
    with pytest.raises(ConfigError, match=r"^train.task: mlm does not fit .*model.n_classes=3 \(it trains classify\)$"):
        _cfg(corpus, task="mlm")
    with pytest.raises(ConfigError, match="^data.tokenizer: train.task classify needs an existing tokenizer"):
        _cfg(corpus, data={"tokenizer": None})
    assert _cfg(corpus, data={"tokenizer": None}, init_from="somewhere").train.init_from == "somewhere"
    with pytest.raises(ConfigError, match="^data.train_tgt: "):
        _cfg(corpus, data={"valid_tgt": "x.txt"})
    with pytest.raises(ConfigError, match="^data.corpus: "):
        _cfg(corpus, data={"corpus": "toy"})


def test_label_files_are_checked_line_by_line(corpus, tmp_path):
    (tmp_path / "bad.tsv").write_text("a dog\tdog\nno label here\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected text<TAB>label or text_a<TAB>text_b<TAB>label; "
                                        r"got 1 field\(s\)$"):
        read_labelled(tmp_path / "bad.tsv")
    (tmp_path / "bad.tsv").write_text("a dog\tthe dog\tsame\na\tb\tc\td\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected .*; got 4 field\(s\)$"):
        read_labelled(tmp_path / "bad.tsv")
    (tmp_path / "bad.tsv").write_text("a dog\tthe dog\tsame\na dog\t\tsame\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected .*; got 3 field\(s\), one empty$"):
        read_labelled(tmp_path / "bad.tsv")
    (tmp_path / "bad.tsv").write_text("a dog\tthe dog\tsame\na dog\tdog\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: a single text, but line 1 is a sentence pair"):
        read_labelled(tmp_path / "bad.tsv")
    assert read_labelled(corpus / "valid.tsv")[0] == (("the dog sees the tree",), "dog")
    (tmp_path / "valid.tsv").write_text("the dog sees the ball\tdog\nthe cow sees the ball\tcow\n")
    with pytest.raises(DataError, match=r"valid.tsv:2: label 'cow' is not one of the 3 classes \(bird, cat, dog\)"):
        run_training(_cfg(corpus, data={"valid_src": str(tmp_path / "valid.tsv")}), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^model.n_classes: 2, but .*train.tsv has 3 labels \(bird, cat, dog\)$"):
        run_training(_cfg(corpus, model={"n_classes": 2}), tmp_path / "run2")


def test_step_loss_is_cross_entropy_of_the_pooled_head():
    torch.manual_seed(0)
    cfg = ModelConfig(**{**MODEL, "src_vocab_size": 30, "tgt_vocab_size": 30, "n_classes": 3, "dropout": 0.0})
    model = EncoderOnly(cfg)
    batch = classification_batch(collate([([5, 6, 7], [2]), ([8], [0])]))
    assert batch.src[:, 0].tolist() == [1, 1] and batch.tgt_out.tolist() == [[2], [0]]  # BOS first; label 0 kept
    sums = forward_backward(model, [batch], 0.0, 0, 1.0, "fp32", torch.device("cpu"))
    want = F.cross_entropy(model.classify(model(batch.src)), torch.tensor([2, 0]), reduction="sum")
    torch.testing.assert_close(sums[1], want.detach())


@pytest.fixture(scope="module")
def tuned(corpus, tmp_path_factory):
    """A classifier fine-tuned from the masked LM: (trainer, final metrics, run directory)."""
    run = tmp_path_factory.mktemp("tuned") / "run"
    trainer, metrics = run_training(_cfg(corpus, init_from=str(corpus / "mlm" / "model")), run)
    return trainer, metrics, run


def test_a_classifier_fine_tunes_from_the_masked_lm(corpus, tuned):
    trainer, metrics, run = tuned
    assert metrics["val_acc"] >= 0.9 and "val_ppl" not in metrics
    model = load_model(run / "best")
    assert model.config.labels == ("bird", "cat", "dog") and model.mlm_head is None  # names saved with the model
    log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["val_acc"] for r in log if "val_acc" in r][-1] == metrics["val_acc"]
    trainer.init_from(corpus / "mlm" / "model")  # the encoder and embeddings carried over, the head left alone
    pretrained = load_model(corpus / "mlm" / "model").state_dict()
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in pretrained.items() if not k.startswith("mlm_head."))
    assert any(not torch.equal(a, b) for a, b in zip(state.values(), load_model(run / "model")
                                                      .state_dict().values()))


def test_a_classifier_starts_from_a_classifier_of_other_classes_with_a_new_last_layer(corpus, tmp_path, caplog):
    run_training(_cfg(corpus, max_steps=1, init_from=str(corpus / "mlm" / "model")), tmp_path / "a")
    (tmp_path / "two.tsv").write_text("the dog sees the ball\tdog\nthe cat sees the ball\tcat\n" * 20)
    cfg = _cfg(corpus, model={"n_classes": 2}, data={"train_src": str(tmp_path / "two.tsv"), "valid_src": None},
               init_from=str(tmp_path / "a" / "model"), max_steps=1)
    with caplog.at_level("WARNING", logger="transduce.training"):
        trainer, _ = run_training(cfg, tmp_path / "b")
    warned = [r.getMessage() for r in caplog.records if "classifier of" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0] and warned[0].endswith(
        "is a classifier of 3 classes (bird, cat, dog); this run's 2 classes (cat, dog) get a new classification "
        "layer (the encoder and pooler kept)")
    assert load_model(tmp_path / "b" / "model").config.labels == ("cat", "dog")
    own = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.init_from(tmp_path / "a" / "model")  # again: the encoder and pooler read, the last layer left as it is
    start, state = load_model(tmp_path / "a" / "model").state_dict(), trainer.model.state_dict()
    assert state["cls_head.classifier.weight"].shape == (2, MODEL["d_model"])
    assert all(torch.equal(state[k], v) for k, v in start.items() if not k.startswith("cls_head.classifier."))
    assert all(torch.equal(state[k], own[k]) for k in own if k.startswith("cls_head.classifier."))


def test_classify_command_labels_text_and_scores_a_labelled_file(corpus, tuned, monkeypatch, capsys):
    model = str(tuned[2] / "best")
    assert main(["classify", model, "--input", str(corpus / "valid.tsv"), "--score"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["sentences"] == 30 and scores["accuracy"] >= 0.9 and scores["macro_f1"] >= 0.9
    texts = ["the dog sees the car", "a bird", "the cat has the house"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(texts) + "\n"))
    assert main(["classify", model]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == Classifier.load(model).classify(texts, batch_size=2) and out[0] == "dog" and out[2] == "cat"
    assert main(["classify", str(corpus / "mlm" / "model")]) == 2
    assert capsys.readouterr().err.strip().endswith("model.arch=encoder_only model with a masked-LM head")


def test_accuracy_and_macro_f1():
    scores = classification_scores(["a", "a", "b", "c"], ["a", "b", "b", "b"])
    assert scores["accuracy"] == 0.5 and scores["sentences"] == 4
    assert scores["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)  # F1 of a, b and the never-gold c


def test_classifier_resume_is_exact(corpus, tmp_path):
    init = {"init_from": str(corpus / "mlm" / "model")}
    run_training(_cfg(corpus, max_steps=8, save_every=4, eval_every=4, **init), tmp_path / "a")
    run_training(_cfg(corpus, max_steps=4, save_every=4, eval_every=4, **init), tmp_path / "b")
    run_training(_cfg(corpus, max_steps=8, save_every=4, eval_every=4, **init), tmp_path / "b", resume=True)
    a = load_file(str(tmp_path / "a" / "checkpoints" / "step_00000008" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoints" / "step_00000008" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- sentence pairs ----------------------------------------------------------------------------

def _pair_lines(n=300):
    """(first sentence, second sentence, label), drawn at random: the label is the second sentence's animal."""
    import random
    rng, sentences = random.Random(0), [s for s, _ in _lines()]
    out = []
    for _ in range(n):
        b = rng.choice(ANIMALS)
        out.append((rng.choice(sentences), f"the {b} {rng.choice(VERBS)} the {rng.choice(THINGS)}", b))
    return out


@pytest.fixture(scope="module")
def pairs(corpus):
    rows = _pair_lines()
    (corpus / "pairs_train.tsv").write_text("".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows[:240]))
    (corpus / "pairs_valid.tsv").write_text("".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows[240:]))
    return corpus


def _pair_cfg(root, **train):
    return _cfg(root, model={"type_vocab_size": 2},
                data={"train_src": str(root / "pairs_train.tsv"), "valid_src": str(root / "pairs_valid.tsv")}, **train)


def test_a_pair_step_feeds_bert_token_types_to_the_model():
    """a EOS b is read as BOS a EOS b EOS with token type 1 on b EOS: the loss is the cross-entropy of
    the model given exactly those types (and not that of the model given none)."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{**MODEL, "src_vocab_size": 30, "tgt_vocab_size": 30, "n_classes": 3, "dropout": 0.0,
                         "type_vocab_size": 2})
    model = EncoderOnly(cfg)
    batch = classification_batch(collate([([5, 6, 2, 7], [2]), ([8, 2, 9, 9, 9], [0])]))
    assert batch.src.tolist() == [[1, 5, 6, 2, 7, 2, 0], [1, 8, 2, 9, 9, 9, 2]]
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]])
    sums = forward_backward(model, [batch], 0.0, 0, 1.0, "fp32", torch.device("cpu"))
    want = F.cross_entropy(model.classify(model(batch.src, types)), torch.tensor([2, 0]), reduction="sum")
    torch.testing.assert_close(sums[1], want.detach())
    untyped = F.cross_entropy(model.classify(model(batch.src)), torch.tensor([2, 0]), reduction="sum")
    assert not torch.allclose(sums[1], untyped)


def test_a_pair_is_cut_longest_first(corpus):
    from transduce.data.labelled import encode_example
    from transduce.data.tokenizer import Tokenizer
    tok = Tokenizer.load(corpus / "mlm" / "model")
    a, b = "the dog sees the ball the dog sees the ball", "the cat"
    ids_a, ids_b = tok.encode(a, "src"), tok.encode(b, "src")
    assert encode_example(tok, (a, b), 100) == [*ids_a, 2, *ids_b]
    room = len(ids_b) * 2 + 2
    assert encode_example(tok, (a, b), room) == [*ids_a[:len(ids_b) + 1], 2, *ids_b]  # only the longer text cut
    assert encode_example(tok, (a,), 3) == ids_a[:3]


def test_a_classifier_learns_from_sentence_pairs_and_classifies_pairs(pairs, tmp_path, monkeypatch, capsys):
    """The label is in the second sentence, the first holds a distracting animal: the classifier
    must read the pair as two segments; `classify` takes pairs too (a file with --score, tabs on stdin)."""
    _, metrics = run_training(_pair_cfg(pairs, max_steps=120), tmp_path / "run")  # 60 steps: 4 of 6 seeds
    assert metrics["val_acc"] >= 0.9
    model = str(tmp_path / "run" / "model")  # the final weights, those the last metrics scored
    assert main(["classify", model, "--input", str(pairs / "pairs_valid.tsv"), "--score"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == metrics["val_acc"]
    monkeypatch.setattr("sys.stdin", io.StringIO("the dog sees the ball\tthe cat has the tree\n"
                                                 "the cat sees the ball\tthe bird likes the car\n"))
    assert main(["classify", model]) == 0
    assert capsys.readouterr().out.splitlines() == ["cat", "bird"]
    monkeypatch.setattr("sys.stdin", io.StringIO("a\tb\tc\n"))
    assert main(["classify", model]) == 2
    assert capsys.readouterr().err.strip().endswith("<stdin>:1: expected a text or text_a<TAB>text_b; got 3 fields")


def test_pairs_need_two_token_types_and_every_split_one_kind_of_row(pairs, tuned, tmp_path):
    with pytest.raises(ConfigError, match=r"^model.type_vocab_size: sentence pairs \(.*\) need two token types, "
                                          r"as BERT's \(2\); got 0$"):
        run_training(_cfg(pairs, data={"train_src": str(pairs / "pairs_train.tsv"), "valid_src": None}),
                     tmp_path / "a")
    with pytest.raises(DataError, match=r"valid.tsv:1: sentence pairs in .*pairs_train.tsv, but not here"):
        run_training(_cfg(pairs, model={"type_vocab_size": 2}, data={"train_src": str(pairs / "pairs_train.tsv")}),
                     tmp_path / "b")
    with pytest.raises(ConfigError, match=r"^sentence pairs need a model with two token types .*; this one has 0$"):
        Classifier.load(tuned[2] / "best").classify(["a dog", ("the dog", "a cat")])


# ---- prepared on disk --------------------------------------------------------------------------

def _losses(run):
    log = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("val_acc")) for r in log]


def test_prepared_classification_set_trains_as_the_raw_files_and_resumes_exactly(corpus, tmp_path, capsys):
    """`transduce prepare` writes the labelled set once (ids, label ids, the label list); training
    from it logs the losses a run from the raw files logs (that run prepares into RUN_DIR/prepared),
    and a resumed run ends with the same weights."""
    from transduce.data.prepared import PreparedData
    init = {"init_from": str(corpus / "mlm" / "model")}
    raw = _cfg(corpus, max_steps=8, save_every=4, eval_every=4, log_every=1, **init)
    run_training(raw, tmp_path / "raw")
    save_yaml(replace(raw, data=replace(raw.data, tokenizer=None)).to_dict(), tmp_path / "raw.yaml")
    assert main(["prepare", str(tmp_path / "raw.yaml"), "--out", str(tmp_path / "data")]) == 0  # init_from's tokenizer
    assert "prepared" in capsys.readouterr().out
    data = PreparedData.open(tmp_path / "data")
    assert data.labels == ("bird", "cat", "dog") and data.segments == 1 and len(data.split("train")) == 90
    assert data.split("train").pair(0)[1].tolist() == [2]  # "the dog sees the ball": dog, class 2
    on_disk = {"prepared": str(tmp_path / "data"), "train_src": None, "valid_src": None, "tokenizer": None,
               "corpus": "toy"}
    run_training(_cfg(corpus, max_steps=4, save_every=4, eval_every=4, log_every=1, data=on_disk, **init),
                 tmp_path / "p")
    run_training(_cfg(corpus, max_steps=8, save_every=4, eval_every=4, log_every=1, data=on_disk, **init),
                 tmp_path / "p", resume=True)
    assert not (tmp_path / "p" / "prepared").exists()
    assert _losses(tmp_path / "p") == _losses(tmp_path / "raw")
    a = load_file(str(tmp_path / "raw" / "checkpoints" / "step_00000008" / "model.safetensors"))
    b = load_file(str(tmp_path / "p" / "checkpoints" / "step_00000008" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    mlm = RunConfig.from_dict({"model": MODEL, "data": {"prepared": str(tmp_path / "data"), "max_len": 30},
                               "train": TRAIN})
    with pytest.raises(ConfigError, match=r"^data.prepared: .* holds a classification set .*; "
                                          r"train.task mlm needs text$"):
        run_training(mlm, tmp_path / "mlm")
