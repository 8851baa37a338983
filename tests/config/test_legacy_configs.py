"""Configs and model directories written before model.attention was a section (commit 683217a)
load unchanged, with one notice line naming the new keys.

tests/fixtures/legacy_683217a/ holds four model directories that 683217a's code wrote (a translation
model with local self- and cross-attention and a global token, a T5 import, a GPT-2 import, a BERT
classifier import) and ``expected.json``, what that code computed with them: the last row's
logits of a fixed probe (first 16 and their sum) and its front door's output (translations,
greedy continuations, labels). The same kernels run both (the attention code is unchanged), on
one thread as they were written.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from extra_helpers import need_extra
from transduce.config import AttentionConfig, DecodeConfig, GenerationConfig, load_run_config
from transduce.config import legacy
from transduce.config.base import apply_overrides
from transduce.info import model_info
from transduce.inference import load
from transduce.model.io import load_model, save_model

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_683217a"
EXPECTED = json.loads((ROOT / "expected.json").read_text(encoding="utf-8"))
SRC = ["the red dog runs", "a small cat sees the old tree"]
PROMPTS = ["the red", "a dog"]


@pytest.fixture(autouse=True)
def _fresh_notices(monkeypatch):
    monkeypatch.setattr(legacy, "_SAID", set())  # each test sees its notice


def _probe(model) -> list[float]:
    probe = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.no_grad():
        if model.config.arch == "encoder_decoder":
            logits = model(probe, torch.tensor([[model.config.bos_id, 5, 6]]))
        else:
            logits = model(probe)
    return logits.reshape(-1, logits.shape[-1])[-1].double()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_an_old_model_directory_loads_and_runs_as_it_did(name, caplog, one_thread):
    want = EXPECTED[name]
    if (ROOT / name / "tokenizer.json").is_file():  # a byte-level BPE or WordPiece tokenizer
        need_extra("pretrained", "tokenizers")
    with caplog.at_level(logging.WARNING, logger="transduce.config"):
        model = load_model(ROOT / name)
    notices = [r.getMessage() for r in caplog.records if r.name == "transduce.config"]
    assert len(notices) == 1 and "model.attention -> model.attention.kind" in notices[0]
    assert "model.attention_window -> model.attention.window" in notices[0] and "\n" not in notices[0]
    row = _probe(model)
    torch.testing.assert_close(row[:16], torch.tensor(want["probe_logits"], dtype=torch.float64), rtol=0, atol=2e-5)
    assert float(row.sum()) == pytest.approx(want["probe_sum"], abs=1e-3)
    with load(str(ROOT / name)) as front:
        if "translate" in want:
            assert front.translate(SRC) == want["translate"]
            assert front.translate(SRC, DecodeConfig(beam=1, max_len_b=8)) == want["translate_greedy"]
        elif "generate" in want:
            assert front.generate(PROMPTS, GenerationConfig(max_new_tokens=6, temperature=0.0)) == want["generate"]
        else:
            assert front.classify(SRC) == want["classify"]
    assert model_info(ROOT / name)["attention"]["kind"] == model.config.attention.kind


def test_the_old_local_attention_settings_arrive_in_the_section():
    a = load_model(ROOT / "demo_local").config.attention
    assert a == AttentionConfig("local", cross="local", window=3, global_tokens=1)


def test_saving_an_old_model_writes_the_new_form_and_reads_back_silently(tmp_path, caplog):
    model = load_model(ROOT / "demo_local")
    save_model(model, tmp_path / "m")
    saved = (tmp_path / "m" / "config.yaml").read_text(encoding="utf-8")
    assert "attention:\n    kind: local\n    cross: local\n    window: 3" in saved and "attention_window" not in saved
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="transduce.config"):
        again = load_model(tmp_path / "m")
    assert again.config == model.config and not caplog.records


def test_an_old_model_directory_is_not_rewritten_on_load(tmp_path):
    shutil.copytree(ROOT / "t5_import", tmp_path / "t5")
    before = (tmp_path / "t5" / "config.yaml").read_bytes()
    load_model(tmp_path / "t5")  # the checksum holds: the migration is in memory
    assert (tmp_path / "t5" / "config.yaml").read_bytes() == before


def test_an_old_run_config_and_old_overrides_read_as_the_new_keys(tmp_path, caplog):
    (tmp_path / "old.yaml").write_text("model: {attention: local, attention_window: 8, cross_attention: local}\n"
                                       "train: {num_threads: 2}\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="transduce.config"):
        cfg = load_run_config(tmp_path / "old.yaml", ["model.global_tokens=1", "model.attention.seed=3"])
    assert cfg.model.attention == AttentionConfig("local", cross="local", window=8, global_tokens=1, seed=3)
    assert cfg.train.threads == 2
    lines = [r.getMessage() for r in caplog.records]
    assert any("model.global_tokens -> model.attention.global_tokens" in line for line in lines)
    assert any("train.num_threads -> train.threads" in line for line in lines)


def test_the_nested_form_and_its_overrides():
    d = apply_overrides({"model": {"attention": {"kind": "local", "window": 4}}},
                        ["model.attention.kind=lsh", "model.attention.block=8"])
    assert d == {"model": {"attention": {"kind": "lsh", "window": 4, "block": 8}}}
    cfg = load_run_config(None, ["model.attention.kind=local", "model.attention.window=16"])
    assert (cfg.model.attention.kind, cfg.model.attention.window) == ("local", 16)
    assert load_run_config(None).to_dict()["model"]["attention"]["kind"] == "full"
