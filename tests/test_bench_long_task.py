"""bench/long_task.py: its generated task is what it claims (labels read off the inputs, near
markers within [CLS]'s local reach and far ones out of it), and a tiny run reports every variant."""

import json
import sys
from pathlib import Path

import pytest
import torch

# Imported by name from bench/ (not by file location) so the spawned workers can import it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import long_task  # noqa: E402

from transduce.config import AttentionConfig, ModelConfig  # noqa: E402
from transduce.model import EncoderOnly  # noqa: E402


@pytest.mark.parametrize("copies", [0, 1, 3])
def test_labels_are_computable_from_the_text_and_buckets_are_where_claimed(copies):
    length, window, layers = 60, 5, 3
    rows = long_task.make_split(200, length, window, layers, seed=7, copies=copies)
    assert [b for _, _, b in rows] == ["near", "far"] * 100
    assert {label for _, label, _ in rows} == set(long_task.VALUES)
    for text, label, bucket in rows:
        words = text.split()
        assert len(words) == length and words.count(long_task.MARKER) == 1
        assert long_task.answer_of(text) == label
        assert long_task.bucket_of(text, window, layers) == bucket
        marker = words.index(long_task.MARKER) + 1  # model position (BOS is 0)
        if bucket == "near":
            assert marker + 1 <= window               # the value is one window from [CLS]
        else:
            assert marker > layers * window           # marker and value out of local reach
        counts = {v: words.count(v) for v in long_task.VALUES}
        # copies 0: the answer is the only value; otherwise every value equally often (no count shortcut)
        assert counts == ({v: int(v == label) for v in long_task.VALUES} if copies == 0
                          else dict.fromkeys(long_task.VALUES, copies))


@pytest.mark.parametrize("n_global", [0, 1])
def test_local_attention_reach_of_the_cls_state_is_layers_times_window(n_global):
    """The premise of the near/far split: with local attention, position 0's final state depends
    on positions <= L * W only, unless it is a global token."""
    window, layers, length = 3, 2, 20
    cfg = ModelConfig(arch="encoder_only", src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2,
                      n_encoder_layers=layers, n_decoder_layers=0, d_ff=32, dropout=0.0, max_positions=length,
                      attention=AttentionConfig("local", window=window, global_tokens=n_global), n_classes=4)
    torch.manual_seed(0)
    model = EncoderOnly(cfg).eval()
    ids = torch.randint(4, 29, (1, length))
    ids[0, 0] = 1
    with torch.no_grad():
        cls = model(ids)[0, 0]
        for pos, reachable in ((layers * window, True), (layers * window + 1, n_global > 0)):
            changed = ids.clone()
            changed[0, pos] = 29 if ids[0, pos] != 29 else 28
            moved = (model(changed)[0, 0] - cls).abs().max().item()
            assert (moved > 1e-6) == reachable, (pos, moved)


@pytest.mark.parametrize("variants,in_process", [(long_task.VARIANTS, True), (("local_global",), False)])
def test_a_tiny_run_reports_every_variant(tmp_path, capsys, variants, in_process):
    """All variants one after another in this process, and one in a spawned worker process."""
    report = long_task.main(["--variants", ",".join(variants), *(["--in-process"] if in_process else []),
                             "--minutes", "0.01", "--length", "24", "--window", "4", "--layers", "2",
                             "--d-model", "16", "--linformer-k", "8", "--train-size", "40", "--valid-size", "8",
                             "--test-size", "10", "--max-tokens", "256", "--out", str(tmp_path)])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    assert [r["variant"] for r in report["results"]] == list(variants)
    assert report["concurrent"] == (1 if in_process else len(variants))
    assert report["task"]["far_marker_words"] == [8, 22]
    for r in report["results"]:
        assert "error" not in r, r
        assert r["steps"] >= 1 and r["train_examples"] >= 1
        assert r["train_tokens"] == r["train_examples"] * 26 and r["tokens_per_s"] > 0
        for bucket in ("all", "near", "far"):
            assert 0.0 <= r[f"acc_{bucket}"] <= 1.0
    tok_dir = tmp_path / "tokenizer"
    from transduce.data.tokenizer import Tokenizer
    text = (tmp_path / "data" / "test.tsv").read_text().splitlines()[0].split("\t")[0]
    assert len(Tokenizer.load(tok_dir).encode(text, "src")) == 24  # one piece per word


def test_an_unknown_variant_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        long_task.main(["--variants", "full,sparse", "--out", str(tmp_path)])
    assert e.value.code == 2
