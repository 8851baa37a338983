"""Guided alignment training through ``transduce train`` (``data.train_alignments``): the links
stored with the prepared pairs (filtered with them, swapped with ``data.reverse``), the batches'
references equal to the library's from the pieces, the prepared path equal to the raw one, exact
resume, the one-line errors, and an end-to-end run whose guided head aligns better."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from transduce.cli import main
from transduce.config import DataConfig, RunConfig
from transduce.data import toy
from transduce.data.prepare import prepare_dataset, prepared_for_run
from transduce.data.tokenizer import load_tokenizer
from transduce.errors import ConfigError, DataError
from transduce.inference.text.alignment import format_alignment
from transduce.inference.search import AttentionChoice
from transduce.model import load_model
from transduce.model.transformer import Transformer
from transduce.training.distributed import DistInfo
from transduce.training.guided import alignment_targets
from transduce.training.loop import Trainer, run_training
from resume_helpers import assert_resume_exact_and_average

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import alignment as bench_alignment  # noqa: E402

N_TRAIN = 300
MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 2, "d_ff": 64}
DATA = {"corpus": "toy", "toy_train_size": N_TRAIN, "toy_valid_size": 20, "toy_test_size": 20, "vocab_size": 120,
        "max_tokens": 256}


def _pairs(n: int = N_TRAIN, n_test: int = 20) -> dict[str, list[tuple[str, str]]]:
    return toy.make_splits(seed=0, n_train=n, n_valid=20, n_test=n_test)


def _links(pairs) -> list[list[tuple[int, int]]]:
    lemmas = bench_alignment._lemmas()
    return [bench_alignment.lexicon_links(s, t, lemmas) for s, t in pairs]


def _align_file(tmp_path: Path, links, name: str = "train.align") -> Path:
    path = tmp_path / name
    path.write_text("".join(format_alignment(lk) + "\n" for lk in links))
    return path


def _cfg(align: Path | None, **train) -> RunConfig:
    data = {**DATA, "train_alignments": None if align is None else str(align)}
    return RunConfig.from_dict({"model": MODEL, "data": data, "train": {
        "eval_bleu": False, "warmup_steps": 5, "log_every": 1, "num_threads": 1, **train}})


def _kept_links(data, pairs, links, reverse: bool = False):
    """The file's links of the pairs the prepared train split kept (matched in order by their ids)."""
    tok, split, want, k = data.tokenizer, data.split("train"), [], 0
    for (s, t), lk in zip(pairs, links):
        if reverse:
            s, t, lk = t, s, [(j, i) for i, j in lk]
        if k < len(split) and [list(x) for x in split.pair(k)] == [tok.encode(s, "src"), tok.encode(t, "tgt")]:
            want.append(lk)
            k += 1
    assert k == len(split)
    return want


@pytest.mark.parametrize("reverse", [False, True])
def test_prepared_links_are_those_of_the_kept_pairs(tmp_path, reverse):
    pairs = _pairs()["train"]
    links = _links(pairs)
    cfg = replace(_cfg(_align_file(tmp_path, links)).data, max_len=9, reverse=reverse)
    data = prepare_dataset(cfg, tmp_path / "prep", workers=1)
    stored = data.alignments("train")
    filtered = data.manifest["splits"]["train"]["filter"]
    assert filtered["too_long"] > 0 and len(stored) == len(data.split("train"))  # some links dropped with their pairs
    want = _kept_links(data, pairs, links, reverse)
    assert [stored[i].tolist() for i in range(len(stored))] == [[list(x) for x in lk] for lk in want]
    assert not data.has_alignments("valid")


def _feed_batches(cfg: RunConfig, run_dir: Path, steps: int = 3):
    data = prepared_for_run(cfg.data, run_dir, seed=0, workers=1)
    trainer = Trainer(cfg, run_dir, data, DistInfo(), torch.device("cpu"))
    return data, [b for step in range(steps) for b in trainer.feed.step_data(0, step).batches]


def test_batches_carry_the_references_the_library_makes_and_prepared_equals_raw(tmp_path):
    pairs = _pairs()["train"]
    links = _links(pairs)
    cfg = _cfg(_align_file(tmp_path, links))
    data, batches = _feed_batches(cfg, tmp_path / "raw")
    split, tok = data.split("train"), data.tokenizer
    by_ids = {tuple(map(tuple, (tok.encode(s, "src"), tok.encode(t, "tgt")))): lk for (s, t), lk in zip(pairs, links)}
    linked = 0
    for b in batches:
        s, t = b.src.shape[1], b.tgt_out.shape[1]
        for row in range(len(b)):
            src = [int(x) for x in b.src[row] if x > 2]
            tgt = [int(x) for x in b.tgt_out[row] if x > 2]
            lk = by_ids[(tuple(src), tuple(tgt))]
            want = alignment_targets(lk, tok.pieces(src, "src"), tok.pieces(tgt, "tgt"), s, t)
            torch.testing.assert_close(b.alignment[row], want)
            linked += int(want.sum())
    assert linked > 0 and len(split) == N_TRAIN
    assert main(["prepare", str(_yaml(tmp_path, cfg)), "--out", str(tmp_path / "prep"), "--workers", "1"]) == 0
    prepared = replace(cfg, data=replace(cfg.data, train_alignments=None, prepared=str(tmp_path / "prep")))
    _, again = _feed_batches(prepared, tmp_path / "run")
    for a, b in zip(batches, again):
        assert torch.equal(a.src, b.src) and torch.equal(a.alignment, b.alignment)


def _yaml(tmp_path: Path, cfg: RunConfig) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


def test_resume_is_exact_with_guided_training(tmp_path):
    align = _align_file(tmp_path, _links(_pairs()["train"]))

    def cfg(**train):
        return _cfg(align, **{"max_steps": 12, "save_every": 6, "eval_every": 6, **train})

    assert_resume_exact_and_average(cfg, tmp_path, Transformer, "decoder_layers.0.cross_attn.q_proj.weight")
    trainer, _ = run_training(_cfg(None, max_steps=12, save_every=6, eval_every=6), tmp_path / "plain")
    guided = load_model(tmp_path / "a" / "model").state_dict()
    plain = load_model(tmp_path / "plain" / "model").state_dict()
    assert not torch.equal(guided["decoder_layers.0.cross_attn.q_proj.weight"],
                           plain["decoder_layers.0.cross_attn.q_proj.weight"])  # the guided loss trained it
    saved = yaml.safe_load((tmp_path / "a" / "model" / "config.yaml").read_text())
    assert saved["decode"]["alignment_head"] == 0 and saved["decode"]["alignment_layer"] == -2
    assert trainer.guided is None


@pytest.mark.parametrize("lines, where, message", [
    (lambda lk: lk[:-1], N_TRAIN, "alignments end after"),
    (lambda lk: lk + ["0-0"], N_TRAIN + 1, "lines of alignments"),
    (lambda lk: lk[:4] + ["0-0 1:2"] + lk[5:], 5, "expected i-j pairs"),
    (lambda lk: lk[:6] + ["0-0 0-99"] + lk[7:], 7, "out of range"),
])
def test_bad_alignment_files_are_one_line_errors_and_write_nothing(tmp_path, capsys, lines, where, message):
    good = [format_alignment(lk) for lk in _links(_pairs()["train"])]
    align = tmp_path / "train.align"
    align.write_text("".join(line + "\n" for line in lines(good)))
    with pytest.raises(DataError, match=f"train.align:{where}: .*{message}"):
        prepare_dataset(_cfg(align).data, tmp_path / "prep", workers=1)
    assert not (tmp_path / "prep").exists() and not list(tmp_path.glob(".prep*"))
    capsys.readouterr()
    assert main(["train", str(_yaml(tmp_path, _cfg(align))), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"train.align:{where}: " in err[-1] and "Traceback" not in "".join(err)
    assert not (tmp_path / "run" / "prepared").exists()


def test_guided_training_needs_a_translation_model_and_no_prepared_file(tmp_path):
    align = _align_file(tmp_path, _links(_pairs()["train"]))
    cfg = RunConfig.from_dict({"model": {**MODEL, "arch": "decoder_only"},
                               "data": {**DATA, "train_alignments": str(align)},
                               "train": {"num_threads": 1, "eval_bleu": False}})
    with pytest.raises(ConfigError, match="encoder-decoder"):
        _feed_batches(cfg, tmp_path / "lm")
    with pytest.raises(ConfigError, match="data.train_alignments"):
        DataConfig(corpus="toy", train_alignments=str(align), prepared=str(tmp_path))
    with pytest.raises(ConfigError, match="guided_alignment_weight"):
        _cfg(align, guided_alignment_weight=-1.0)


@pytest.mark.slow
def test_transduce_train_with_alignments_makes_its_guided_head_align(tmp_path):
    """Same data, seed and steps, with and without the alignment file: the guided run's head 0 of
    the penultimate layer has a lower AER on held-out toy pairs than any head of the plain run's."""
    splits = _pairs(1000, 100)
    align = _align_file(tmp_path, _links(splits["train"]))
    base = {"model": {**MODEL, "dropout": 0.0}, "data": {**DATA, "toy_train_size": 1000, "toy_test_size": 100,
                                                         "vocab_size": 200, "max_tokens": 512},
            "train": {"eval_bleu": False, "schedule": "constant", "lr": 3e-3, "warmup_steps": 20, "max_steps": 200,
                      "num_threads": 1, "log_every": 50, "eval_every": 1000, "save_every": 1000}}
    refs = _links(splits["test"])
    aer = {}
    for name, extra in (("plain", []), ("guided", ["--set", f"data.train_alignments={align}"])):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(base))
        assert main(["train", str(path), "--out", str(tmp_path / name), *extra]) == 0
        model, tok = load_model(tmp_path / name / "model").eval(), load_tokenizer(tmp_path / name / "model")
        test = bench_alignment.encode_pairs(tok, splits["test"])
        with torch.inference_mode():
            aer[name] = [bench_alignment.aer(model, tok, test, refs, AttentionChoice(-2, h))[0] for h in (None, 0, 1)]
    assert aer["guided"][1] < min(aer["plain"]) - 0.1, aer
    assert np.isfinite(aer["guided"]).all()


def test_bpe_dropout_segmentations_carry_references_too(tmp_path):
    align = _align_file(tmp_path, _links(_pairs()["train"]))
    cfg = _cfg(align)
    cfg = replace(cfg, data=replace(cfg.data, bpe_dropout=0.3))
    _, batches = _feed_batches(cfg, tmp_path / "run", steps=2)
    for b in batches:
        rows = b.alignment.sum(-1)                                                        # (B, T): 1 linked, else 0
        assert ((rows - 1).abs() < 1e-5).logical_or(rows == 0).all() and rows.sum() > 0
        assert (b.alignment[b.tgt_out == 0] == 0).all()                                   # no reference at padding


@pytest.mark.parametrize("layer", [-2, 0, 1])
def test_one_layers_weights_equal_those_of_every_layers(layer):
    from transduce.config import model_preset
    torch.manual_seed(0)
    model = Transformer(model_preset("tiny", src_vocab_size=30, tgt_vocab_size=30, d_model=32, n_heads=2,
                                     n_encoder_layers=1, n_decoder_layers=3, d_ff=64, dropout=0.0)).eval()
    src, tgt = torch.randint(3, 30, (2, 7)), torch.randint(3, 30, (2, 5))
    full = model.decode(tgt, model.encode(src), need_weights=True, project=False)
    states, weights = model(src, tgt, project=False, weights_layer=layer)
    torch.testing.assert_close(states, full.states)
    torch.testing.assert_close(weights, full.cross_attentions[layer])
    torch.testing.assert_close(model(src, tgt), full.states @ model.output_proj.weight.T + model.output_proj.bias
                               if model.output_proj.bias is not None else full.states @ model.output_proj.weight.T)
