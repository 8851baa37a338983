"""The Multi30k recipe configs load, and a few steps of them train on the real files (both
directions); the full 60-minute runs are bench/multi30k.py's job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transduce.config import load_run_config
from transduce.cli import train_main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("pair", ["en_de", "en_fr"])
def test_recipe_configs_are_the_documented_shape(pair):
    cfg = load_run_config(CONFIGS / f"multi30k_{pair}.yaml")
    m, t = cfg.model, cfg.train
    assert (m.n_encoder_layers, m.n_decoder_layers, m.d_model, m.d_ff, m.n_heads) == (4, 4, 128, 256, 4)
    assert m.share_embeddings and m.dropout == 0.3 and m.norm == "pre"
    assert cfg.data.corpus == "multi30k" and cfg.data.tgt_lang == pair[-2:]
    assert t.max_minutes == 60 and t.schedule == "linear" and t.average_last and cfg.decode.beam == 5


@pytest.mark.parametrize("reverse", [False, True])
def test_recipe_trains_on_multi30k(multi30k_root, tmp_path, reverse):
    out = tmp_path / "run"
    small = ["model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=32", "model.d_ff=64",
             "data.vocab_size=500", "data.max_tokens=1024", "data.valid_max_sentences=20", f"data.root={multi30k_root}",
             "train.max_steps=6", "train.warmup_steps=2", "train.save_every=2", "train.eval_every=6",
             "train.log_every=1", "train.keep_last=3", "train.average_last=3"]
    assert train_main(str(CONFIGS / "multi30k_en_de.yaml"), small, str(out), False, reverse) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 6 and "val_bleu" in records[-1]
    assert (out / "model" / "model.safetensors").is_file()
    saved = load_run_config(out / "config.yaml")
    assert saved.data.reverse is reverse
    # the direction: val's first source is English ("A ...") forwards, German ("Eine ...") reversed
    from transduce.data.prepare import split_texts
    first_src = split_texts(saved.data, "valid")[0][0]
    assert first_src.split()[0] in (("Eine", "Ein", "Zwei", "Mehrere") if reverse else ("A", "Two", "Several"))


def test_recipe_trains_on_the_tokenized_text(multi30k_root, tmp_path):
    """data.corpus=multi30k_tok reads tok/*.lc.norm.tok.* and the model writes lowercased text."""
    out = tmp_path / "run"
    small = ["model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=32", "model.d_ff=64",
             "data.corpus=multi30k_tok", "data.vocab_size=500", "data.max_tokens=1024",
             "data.valid_max_sentences=20", f"data.root={multi30k_root}", "train.max_steps=4",
             "train.warmup_steps=2", "train.save_every=2", "train.eval_every=4", "train.keep_last=2",
             "train.average_last=2"]
    assert train_main(str(CONFIGS / "multi30k_en_de.yaml"), small, str(out), False, False) == 0
    from transduce.data.prepare import split_texts
    from transduce.data.prepared import PreparedData
    manifest = PreparedData.open(out / "prepared").manifest
    # prepare keeps every line; data.valid_max_sentences cuts validation at train time (no new prepare)
    assert [sum(manifest["splits"][k]["filter"].values()) for k in ("train", "valid", "test")] == [29000, 1014, 1000]
    data = load_run_config(out / "config.yaml").data
    assert split_texts(data, "valid")[0] == ("a group of men are loading cotton onto a truck",
                                             "eine gruppe von männern lädt baumwolle auf einen lastwagen")
    assert split_texts(data, "test")[0][1] == (multi30k_root / "tok" / "test_2016_flickr.lc.norm.tok.de"
                                               ).read_text(encoding="utf-8").splitlines()[0]
