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
from transduce.inference.speed.static import FILE, Int8Kernel, StaticInt8Linear, quantize_static

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


def test_heldout_loss_of_a_quantised_directory_is_the_int8_models(trained_dir, quantized):
    """Every loader goes through one function (``load_model_dir``), so a held-out score of a
    quantised directory is the int8 model's, the one ``translate`` runs: not the float model's."""
    import torch.nn.functional as F
    from transduce.data.batch import Specials, collate
    from transduce.data.prepared import TokenPairs, length_dtype, token_dtype
    from transduce.data.tokenizer import load_tokenizer
    from transduce.evaluation.heldout import heldout_loss
    from transduce.inference.placement import load_model_dir
    from transduce.inference.speed.static import read_scales
    from transduce.model.io import load_model

    tok = load_tokenizer(trained_dir)
    pairs = [(tok.encode(s, "src"), tok.encode(t, "tgt")) for s, t in toy_pairs(24, seed=5)]
    rows = TokenPairs.from_rows([s for s, _ in pairs], [t for _, t in pairs], token_dtype(1000), length_dtype(100))

    def loss(model: torch.nn.Module) -> float:
        return heldout_loss(model.eval(), rows, "translation", 4096, 0, torch.device("cpu"))[1]

    loaded = load_model_dir(quantized)
    with load(quantized) as tr:  # what translate runs: the same layers
        assert {type(m) for m in tr.model.modules() if isinstance(m, torch.nn.Linear)} == {StaticInt8Linear}
    int8 = quantize_static(load_model(trained_dir).eval(), read_scales(quantized))
    batch = collate(pairs, Specials.of(int8.config))
    with torch.no_grad():  # the direct computation: one batch, the int8 model's logits
        logits = int8(batch.src, batch.tgt_in)  # (B, T, V)
        direct = float(F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),
                                       ignore_index=int8.config.label_pad_id, reduction="sum"))
    float_loss = loss(load_model(trained_dir))
    # batching differs (one batch vs a token budget): float rounding only
    assert loss(loaded) == pytest.approx(direct, rel=1e-5)
    assert abs(loss(loaded) - float_loss) > 1e-4 * float_loss  # int8 rounding moves the loss


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_int8_kernel_gives_torchaos_linear(rows):
    """The fast path (``torch._int_mm`` on the stored int8 weight and scales) against torchao's own
    linear over the same weight: the same int8 codes and exact int32 sums, so only the order of
    two float scalings differs (a last-bit rounding); a rounding or clamping of the input that
    differed by one code would show as an error of about scale x weight, far above the tolerance."""
    import torch.nn.functional as F
    torch.manual_seed(rows)
    model = torch.nn.Sequential(torch.nn.Linear(48, 40))
    quantize_static(model, {"0": 3.0})
    layer = model[0]
    x = torch.randn(rows, 5, 48) * 1.5                                   # some beyond 3.0: clamped
    x.view(-1)[:12] = (torch.arange(12) - 5.5) * (3.0 / 127.5)          # at rounding halves
    with torch.inference_mode():
        got = layer(x)
        want = F.linear(x.reshape(-1, 48), layer.weight, layer.bias).view_as(got)  # torchao's Int8Tensor linear
    assert isinstance(layer, StaticInt8Linear)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_projections_side_by_side_give_each_layers_numbers():
    """Q/K/V calibrated on one input share its scale and run as one int8 matmul: integer sums
    and per-column scalings are the same as each layer's own, so the outputs are identical."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({n: torch.nn.Linear(32, 24) for n in ("q", "k", "v", "other")})
    quantize_static(model, {"q": 2.0, "k": 2.0, "v": 2.0, "other": 1.0})
    x = torch.randn(3, 4, 32)
    with torch.inference_mode():
        fused = Int8Kernel.side_by_side([model["q"], model["k"], model["v"]])(x)                # (3, 4, 72)
        assert torch.equal(fused, torch.cat([model[n](x) for n in ("q", "k", "v")], dim=-1))
    assert Int8Kernel.side_by_side([model["q"], model["other"]]) is None  # another input scale
