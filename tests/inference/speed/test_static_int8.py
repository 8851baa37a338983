"""Static int8 (``transduce quantize``): close to the float model, the same after a save and load,
and one-line errors for bad input."""

from __future__ import annotations

import pytest
import torch

from extra_helpers import need_extra
from toy_model import toy_pairs
from transduce.cli import main
from transduce.config import Runtime
from transduce.errors import ConfigError
from transduce.inference import Translator, load
from transduce.inference.quantize import calibrate
from transduce.inference.speed.static import FILE, StaticInt8Linear, quantize_static

need_extra("quant", "torchao")


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("calibration") / "sample.en"
    path.write_text("\n".join(s for s, _ in toy_pairs(40, seed=11)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def quantized(trained_dir, calibration, tmp_path_factory):
    out = tmp_path_factory.mktemp("static") / "int8"
    assert main(["quantize", str(trained_dir), "--calibrate", str(calibration), "--out", str(out)]) == 0
    return out


def test_every_linear_layer_is_int8_and_greedy_stays_with_fp32(trained_dir, quantized):
    sources = [s for s, _ in toy_pairs(60, seed=3)]
    with load(trained_dir) as fp32, load(quantized) as int8:
        kinds = {type(m) for m in int8.model.modules() if isinstance(m, torch.nn.Linear)}
        assert kinds == {StaticInt8Linear}
        want, got = fp32.translate(sources, beam=1), int8.translate(sources, beam=1)
        # int8 rounding flips a near-tie now and then; a broken scale garbles every sentence
        assert sum(g == w for g, w in zip(got, want)) >= 0.85 * len(want)
        src = torch.tensor([fp32.tokenizer.encode("the red dog sleeps", "src") + [2]])
        tgt = torch.tensor([[1] + fp32.tokenizer.encode("der rot Hund", "tgt")])
        with torch.inference_mode():
            a, b = fp32.model(src, tgt), int8.model(src, tgt)
    # per-tensor int8 inputs and per-row int8 weights: a few percent of the logits' range
    assert (a - b).abs().max() < 0.1 * a.abs().max()


def test_saved_model_is_the_one_calibrated_in_memory(trained_dir, quantized, calibration):
    sources = [s for s, _ in toy_pairs(30, seed=4)]
    with Translator.load(trained_dir) as tr:
        absmax = calibrate(tr, calibration.read_text(encoding="utf-8").splitlines())
        quantize_static(tr.model, absmax)
        in_memory = tr.translate(sources, beam=4)
    with load(quantized) as loaded:  # same kernels on both sides: identical
        assert loaded.translate(sources, beam=4) == in_memory
    assert (quantized / FILE).is_file() and (quantized / "model.safetensors").is_file()


def test_bad_inputs_are_one_line_errors(trained_dir, quantized, tmp_path, capsys):
    assert main(["quantize", str(quantized), "--calibrate", str(tmp_path / "x"), "--out", str(tmp_path / "q")]) == 2
    assert "already a static int8 model" in capsys.readouterr().err
    (tmp_path / "empty.en").write_text("\n  \n", encoding="utf-8")
    assert main(["quantize", str(trained_dir), "--calibrate", str(tmp_path / "empty.en"),
                 "--out", str(tmp_path / "q")]) == 2
    assert "no sentences to calibrate on" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()  # nothing partial
    with pytest.raises(ConfigError, match="already static int8"):
        load(quantized, Runtime(int8=True))


def test_calibration_text_in_another_script_still_works(trained_dir, tmp_path):
    (tmp_path / "other.txt").write_text("Собака спит.\n犬が寝ている。\n", encoding="utf-8")
    out = tmp_path / "int8"
    assert main(["quantize", str(trained_dir), "--calibrate", str(tmp_path / "other.txt"), "--out", str(out)]) == 0
    with load(out) as tr:
        assert all(tr.translate(["the red dog sleeps", "a big cat"], beam=1))
