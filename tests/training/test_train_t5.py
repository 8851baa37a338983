"""A T5 trained with the existing trainer and CLI (configs/t5_tiny.yaml), then translated, saved
and exported to Hugging Face's T5 as any model is."""

from __future__ import annotations

from pathlib import Path

import pytest

from transduce.cli import main
from transduce.model import load_model
from extra_helpers import need_extra

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "t5_tiny.yaml"


def _train(out: Path, steps: int, pairs: int, *sets: str) -> Path:
    """configs/t5_tiny.yaml for ``steps`` steps on ``pairs`` toy training pairs (and a twentieth of
    that to validate and test), with ``--set``s: the model directory."""
    options = [f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.save_every={steps}",
               "train.num_threads=1", f"data.toy_train_size={pairs}", f"data.toy_valid_size={pairs // 20}",
               f"data.toy_test_size={pairs // 20}", *sets]
    assert main(["train", str(CONFIG), "--out", str(out), *(a for o in options for a in ("--set", o))]) == 0
    return out / "model"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("t5") / "run", 8, 400)


def test_trains_and_translates(trained, tmp_path):
    cfg = load_model(trained).config
    assert (cfg.positions, cfg.norm_kind, cfg.activation, cfg.scale_attention) == ("relative", "rms", "geglu", False)
    (tmp_path / "in.txt").write_text("the dog sees the ball\na woman reads\n", encoding="utf-8")
    assert main(["translate", str(trained), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 2


def test_exports_to_t5_for_conditional_generation(trained, tmp_path):
    transformers = need_extra("export", "transformers")
    assert main(["export", str(trained), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")("the dog")["input_ids"][-1] == 2


def test_the_papers_scales_fold_into_the_exported_t5(tmp_path):
    """A T5 trained with the paper's sqrt(d) embedding scale (untied output) and 1/sqrt(d_k) attention
    scale, as the T5 demo's: exported with both folded into T5's weights (the export's own check,
    logits within 1e-4 and greedy/beam-4 outputs equal, passes), and imported again, the same logits."""
    need_extra("export", "transformers")
    import torch

    from transduce.interop import export_model
    from transduce.interop import import_hf

    model = _train(tmp_path / "run", 4, 200, "model.scale_embeddings=true", "model.scale_attention=true")
    report = export_model(model, "hf", tmp_path / "hf")
    assert report.checks["max_logit_diff"] <= 1e-4 and report.checks["greedy_differences"] == 0
    import_hf(tmp_path / "hf", tmp_path / "again")
    ours, again = load_model(model).eval(), load_model(tmp_path / "again").eval()
    assert (again.config.scale_embeddings, again.config.scale_attention) == (False, False)
    src, tgt = torch.tensor([[5, 9, 12, 7, 2]]), torch.tensor([[1, 8, 6, 11]])
    with torch.no_grad():
        assert (ours(src, tgt) - again(src, tgt)).abs().max().item() <= 1e-4


def test_a_scaled_embedding_with_a_tied_output_is_refused_in_one_line(tmp_path, capsys):
    need_extra("export", "transformers")
    model = _train(tmp_path / "run", 2, 200, "model.scale_embeddings=true", "model.tie_output=true")
    capsys.readouterr()
    assert main(["export", str(model), "--format", "hf", "--out", str(tmp_path / "hf")]) != 0
    err = capsys.readouterr().err.strip()
    assert "model.scale_embeddings=True with a tied output" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "hf").exists()
