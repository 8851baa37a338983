"""`transduce import` of Longformer directories: locally built random tiny LongformerForMaskedLM /
LongformerModel give transformers' logits (final states) on padded inputs longer than their
windows, with no global tokens and with global ones (``global_attention_mask`` on the first
positions = our ``model.global_tokens``); the probes would catch a wrong window or the global
rows computed from the local projections; bad directories fail in one line with nothing written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from transduce.cli import main
from transduce.errors import TransduceError
from transduce.interop.bert import vocab_order
from transduce.interop import import_hf
from transduce.model import EncoderOnly, load_model
from extra_helpers import need_extra
from bert_fixtures import bert_tokenizer_dirs
from longformer_fixtures import CASES, build_longformer

need_extra("pretrained", "tokenizers")
transformers = need_extra("export", "transformers")

from transduce.data.hf_tokenizer import HFTokenizer  # noqa: E402


@pytest.fixture(scope="module")
def roberta_tokenizer(tmp_path_factory) -> Path:
    return bert_tokenizer_dirs(tmp_path_factory.mktemp("tokenizers"))["roberta"]


def _with_globals(model: EncoderOnly, g: int) -> EncoderOnly:
    """The same weights with the first ``g`` positions global."""
    again = EncoderOnly(replace(model.config, attention=replace(model.config.attention, global_tokens=g))).eval()
    again.load_state_dict(model.state_dict())
    return again


def _ours_vs_theirs(model: EncoderOnly, hf, order: torch.Tensor, g: int, seed: int = 7):
    """Our outputs and transformers' (in our id order) at the real positions of right-padded rows
    of our ids, 19, 12 and 5 long, the first ``g`` positions global on both sides."""
    v = model.config.src_vocab_size
    ids = torch.randint(4, v - 1, (3, 19), generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[0, 9] = 1, v - 1  # BOS first; one [MASK]
    for row, n in enumerate((19, 12, 5)):
        ids[row, n - 1], ids[row, n:] = 2, 0
    keep = ids != 0
    marks = torch.zeros_like(ids)
    marks[:, :g] = 1
    with torch.no_grad():
        out = hf(input_ids=order[ids], attention_mask=keep.long(), global_attention_mask=marks)
        states = model(ids)
    if hasattr(out, "logits"):
        return model.mlm_logits(states)[keep], out.logits[..., order][keep]
    return states[keep], out.last_hidden_state[keep]


def _import(tmp_path: Path, case: str, roberta_tokenizer: Path, seed: int = 0):
    hf = build_longformer(tmp_path / "hf", case, roberta_tokenizer, seed)
    checks = import_hf(tmp_path / "hf", tmp_path / "ours")
    order = vocab_order(HFTokenizer.from_hf_dir(tmp_path / "hf"), hf.config.vocab_size, tmp_path)
    return hf, checks, load_model(tmp_path / "ours"), order


@pytest.mark.parametrize("case", list(CASES))
def test_import_equals_transformers_with_and_without_global_tokens(tmp_path, case, roberta_tokenizer):
    hf, checks, model, order = _import(tmp_path, case, roberta_tokenizer)
    diffs = [v for k, v in checks.items() if k.startswith("max_")]
    assert len(diffs) == 2 and max(diffs) < 1e-4 and checks["tokenizer_differences"] == 0
    cfg = model.config
    windows = CASES[case]["attention_window"]
    a = cfg.attention
    assert (a.kind, a.global_tokens, a.global_projections, cfg.tie_output) == (
        "local", 0, True, "untied" not in case)
    assert [layer.self_attn.kernel.window for layer in model.layers] == (
        [w // 2 for w in windows] if isinstance(windows, list) else [windows // 2] * 2)
    for g in (0, 1, 3):  # no global tokens (what the model is written with), <s>, a few
        ours, theirs = _ours_vs_theirs(_with_globals(model, g), hf, order, g)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("mistake", ["window", "global_projections"])
def test_the_probes_catch_a_wrong_window_or_global_rows(tmp_path, roberta_tokenizer, mistake):
    """What the check compares is sensitive to both halves of the mapping: one more token of
    window, or the global rows from the local projections, moves the outputs far past 1e-4."""
    hf, _, model, order = _import(tmp_path, "LongformerForMaskedLM", roberta_tokenizer)
    cfg = model.config
    a = cfg.attention
    wrong = replace(a, window=a.window + 1) if mistake == "window" else replace(a, global_projections=False)
    state = {k: v for k, v in model.state_dict().items() if "_global_" not in k or wrong.global_projections}
    bad = EncoderOnly(replace(cfg, attention=replace(wrong, global_tokens=1))).eval()
    bad.load_state_dict(state)
    ours, theirs = _ours_vs_theirs(bad, hf, order, 1)
    assert (ours - theirs).abs().max() > 0.1  # (2.2 and 4.8 on this fixture; the check allows 1e-4)


def test_longformer_model_keeps_its_encoder_and_gets_a_new_head(tmp_path, roberta_tokenizer):
    hf, checks, model, _ = _import(tmp_path, "LongformerModel", roberta_tokenizer)
    assert set(checks) == {"max_state_diff_global_0", "max_state_diff_global_2", "tokenizer_differences"}
    assert model.mlm_head.decoder.weight is model.embed.tokens.weight  # tied, as LongformerForMaskedLM's
    assert torch.equal(model.mlm_head.bias, torch.zeros_like(model.mlm_head.bias))


def _refused(where: Path, roberta_tokenizer: Path, match: str, changes: dict,
             case: str = "LongformerForMaskedLM") -> None:
    build_longformer(where / "hf", case, roberta_tokenizer)
    config = json.loads((where / "hf" / "config.json").read_text())
    (where / "hf" / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(TransduceError, match=match) as e:
        import_hf(where / "hf", where / "ours")
    assert "\n" not in str(e.value) and not (where / "ours").exists()


@pytest.mark.parametrize("changes, match", [
    (dict(architectures=["LongformerForSequenceClassification"]), "LongformerForSequenceClassification.*not "
                                                                  "importable.*supported: LongformerForMaskedLM"),
    (dict(attention_window=5), r"attention_window=\[5, 5\] must be positive even integers"),
    (dict(attention_window=[4, 4, 4]), r"attention_window=\[4, 4, 4\] is not an int or a list of one per layer"),
    (dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    (dict(intermediate_size=48), "does not match the model config|shape"),
])
def test_unsupported_or_mismatched_configs_fail_in_one_line(tmp_path, roberta_tokenizer, changes, match):
    _refused(tmp_path, roberta_tokenizer, match, changes)


def test_cli_imports_a_longformer_directory(tmp_path, capsys, roberta_tokenizer):
    build_longformer(tmp_path / "hf", "LongformerForMaskedLM-per-layer", roberta_tokenizer)
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_logit_diff_global_2"] < 1e-4 and load_model(tmp_path / "ours").config.attention.windows == (2, 4)


LR = 1e-6  # the fine-tuning test's rate: one step keeps the weights within 1e-6 of the import


def test_fine_tuning_an_import_with_a_global_token(tmp_path, roberta_tokenizer):
    """`train --init-from IMPORTED --set model.attention.global_tokens=1`: masked-LM training starts from the
    imported weights with <s> global (Longformer's fine-tuning setting; the import has none). Its
    one step is Adam's first (no warmup), which moves each weight by lr * g / (|g| + eps): by lr
    at most, and by about lr where the gradient is not ~0, as in the global projections, which
    only a global token's row uses."""
    from toy_model import toy_pairs

    build_longformer(tmp_path / "hf", "LongformerForMaskedLM", roberta_tokenizer)
    import_hf(tmp_path / "hf", tmp_path / "ours")
    for name, seed in (("train", 1), ("valid", 2)):
        (tmp_path / f"{name}.txt").write_text("".join(f"{en}\n" for en, _ in toy_pairs(40, seed)))
    (tmp_path / "run.yaml").write_text(json.dumps({
        "data": {"corpus": "files", "train_tgt": str(tmp_path / "train.txt"), "valid_tgt": str(tmp_path / "valid.txt"),
                 "max_tokens": 512, "max_len": 38},
        "train": {"max_steps": 1, "eval_every": 1, "save_every": 1, "lr": LR, "schedule": "constant",
                  "warmup_steps": 0}}))
    assert main(["train", str(tmp_path / "run.yaml"), "--init-from", str(tmp_path / "ours"), "--set",
                 "model.attention.global_tokens=1", "--out", str(tmp_path / "run")]) == 0
    start, tuned = load_model(tmp_path / "ours"), load_model(tmp_path / "run" / "model")
    assert (start.config.attention.global_tokens, tuned.config.attention.global_tokens) == (0, 1)
    assert replace(tuned.config, attention=replace(tuned.config.attention, global_tokens=0)) == start.config
    moved = {}
    for (name, a), b in zip(start.state_dict().items(), tuned.state_dict().values()):
        step = (b - a).abs()  # float32: exact but for b's rounding, half an ulp of a
        assert (step <= LR + a.abs() * torch.finfo(torch.float32).eps).all(), name
        moved[name] = step.max().item()
    assert sum(v > LR / 2 for v in moved.values()) > len(moved) / 2
    # the first layer's global projections moved (their weights: a key bias shifts every score of a
    # query alike, so its gradient is rounding); the last layer's global row feeds only <s>'s
    # output, which no masked-LM loss reads: their gradient is 0, and so is their step
    projections = {n: v for n, v in moved.items() if "_global_proj." in n}  # q, k, v: weight, bias; 2 layers
    assert len(projections) == 12
    assert all(v > LR / 2 for n, v in projections.items() if n.startswith("layers.0.") and n.endswith(".weight"))
    assert all(v == 0 for n, v in projections.items() if n.startswith("layers.1."))
    # the global token matters: the same weights without it give other outputs
    ids = torch.randint(4, tuned.config.src_vocab_size - 1, (2, 19), generator=torch.Generator().manual_seed(3))
    ids[:, 0] = 1
    with torch.no_grad():
        assert (tuned(ids) - _with_globals(tuned, 0)(ids)).abs().max() > 0.1
