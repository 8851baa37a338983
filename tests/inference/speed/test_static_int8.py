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
from transduce.inference.placement import load_model_dir
from transduce.inference.quantize import calibrate
from transduce.inference.speed.static_int8 import (FILE, Int8Kernel, StaticInt8Linear, is_quantized, quantize_static,
                                              read_float_layers)

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


def int8_and_float(model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """The names of ``model``'s static int8 linear layers, and of its float ones."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return ({n for n, m in linears.items() if isinstance(m, StaticInt8Linear)},
            {n for n, m in linears.items() if not is_quantized(m)})


def test_every_linear_layer_but_the_vocabulary_projection_is_int8_and_greedy_stays_with_fp32(trained_dir, quantized):
    sources = [s for s, _ in toy_pairs(60, seed=3)]
    with load(trained_dir) as fp32, load(quantized) as int8:
        quantized_names, float_names = int8_and_float(int8.model)
        assert float_names == {"output_proj"} and len(quantized_names) > 1  # quantize.float_layers' default
        assert read_float_layers(quantized) == ("output_proj",)
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
        quantize_static(tr.model, absmax, keep_float=("output_proj",))
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
    from transduce.inference.speed.static_int8 import read_scales
    from transduce.model.io import load_model

    tok = load_tokenizer(trained_dir)
    pairs = [(tok.encode(s, "src"), tok.encode(t, "tgt")) for s, t in toy_pairs(24, seed=5)]
    rows = TokenPairs.from_rows([s for s, _ in pairs], [t for _, t in pairs], token_dtype(1000), length_dtype(100))

    def loss(model: torch.nn.Module) -> float:
        return heldout_loss(model.eval(), rows, "translation", 4096, 0, torch.device("cpu"))[1]

    loaded = load_model_dir(quantized)
    with load(quantized) as tr:  # what translate runs: the same layers
        assert int8_and_float(tr.model)[1] == {"output_proj"}
    int8 = quantize_static(load_model(trained_dir).eval(), read_scales(quantized), read_float_layers(quantized))
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


def test_float_layers_choose_which_layers_stay_float(trained_dir, calibration, tmp_path, capsys):
    """``--float-layers`` (``quantize.float_layers``): the layers it names stay float32 and compute
    exactly the float model's numbers (same kernels), every other one is int8; with no pattern,
    every layer is int8; a pattern naming no layer is a one-line error and writes nothing."""
    ffn = tmp_path / "ffn_float"
    assert main(["quantize", str(trained_dir), "--calibrate", str(calibration), "--out", str(ffn),
                 "--float-layers", "decoder_layers.*.ffn.fc2", "output_proj"]) == 0
    assert "in float32" in capsys.readouterr().out
    float_model = load_model_dir(trained_dir)
    model = load_model_dir(ffn)
    quantized_names, float_names = int8_and_float(model)
    want = {n for n, m in float_model.named_modules() if n.startswith("decoder_layers.") and n.endswith("ffn.fc2")}
    assert want and float_names == want | {"output_proj"} and quantized_names.isdisjoint(float_names)
    x = torch.randn(3, 5, model.output_proj.in_features)
    with torch.inference_mode():
        for name in float_names:
            layer, reference = model.get_submodule(name), float_model.get_submodule(name)
            y = torch.randn(3, 5, layer.in_features)
            assert torch.equal(layer(y), reference(y))
        assert not torch.equal(model.encoder_layers[0].ffn.fc1(x), float_model.encoder_layers[0].ffn.fc1(x))
    every = tmp_path / "all_int8"
    assert main(["quantize", str(trained_dir), "--calibrate", str(calibration), "--out", str(every),
                 "--float-layers"]) == 0
    assert read_float_layers(every) == () and int8_and_float(load_model_dir(every))[1] == set()
    assert main(["quantize", str(trained_dir), "--calibrate", str(calibration), "--out", str(tmp_path / "typo"),
                 "--float-layers", "output_projection"]) == 2
    assert "quantize.float_layers: 'output_projection' names no linear layer" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_a_scales_file_without_the_float_entry_is_all_int8(trained_dir, quantized, tmp_path):
    """Directories written before ``quantize.float_layers`` keep loading as they were made."""
    import shutil
    from transduce.inference.speed.static_int8 import SCHEME, read_scales
    from transduce.model.io import save_weights
    old = tmp_path / "old"
    shutil.copytree(quantized, old)
    save_weights({n: torch.tensor(v) for n, v in read_scales(quantized).items()}, old / FILE, {"scheme": SCHEME})
    assert read_float_layers(old) == () and int8_and_float(load_model_dir(old))[1] == set()


def test_where_int8_would_be_slower_the_model_decodes_in_float32_with_a_notice(trained_dir, quantized, monkeypatch,
                                                                              caplog):
    """On a CPU whose int8 product is no faster than float32's, a static int8 directory loads as
    its float model (the same translations) and says why in one line; where it is faster, in int8."""
    from transduce.inference.speed import static_int8
    monkeypatch.setenv(static_int8.INT8_ENV, "auto")
    sources = [s for s, _ in toy_pairs(20, seed=5)]
    monkeypatch.setattr(static_int8, "int8_gemm_speedup", lambda: 0.7)
    with caplog.at_level("WARNING"), load(quantized) as slow, load(trained_dir) as fp32:
        assert int8_and_float(slow.model)[0] == set()
        assert slow.translate(sources, beam=1) == fp32.translate(sources, beam=1)
    notice = [r.getMessage() for r in caplog.records if "static int8 would run slower" in r.getMessage()]
    assert len(notice) == 1 and "0.70x" in notice[0] and "TRANSDUCE_STATIC_INT8=always" in notice[0]
    monkeypatch.setattr(static_int8, "int8_gemm_speedup", lambda: static_int8.INT8_MIN_SPEEDUP)
    with load(quantized) as fast:
        assert len(int8_and_float(fast.model)[0]) > 1
    monkeypatch.setenv(static_int8.INT8_ENV, "sometimes")
    with pytest.raises(ConfigError, match="TRANSDUCE_STATIC_INT8: must be auto or always"):
        load(quantized)


def test_the_speedup_probe_sees_a_cpu_without_vnni(trained_dir, quantized):
    """oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA), as on a CPU without VNNI or AMX: the probe finds int8
    no faster than float32, and `transduce translate` of a static int8 model decodes in float32,
    saying so, with the float model's output."""
    import os
    import platform
    import subprocess
    import sys
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("ONEDNN_MAX_CPU_ISA=AVX2 describes an x86 CPU")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "TRANSDUCE_STATIC_INT8": "auto", "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "transduce", "translate", "--beam", "1"]
    text = "\n".join(s for s, _ in toy_pairs(10, seed=5)) + "\n"
    slow, fp32 = (subprocess.run(run + [str(d)], input=text, env=env, capture_output=True, text=True)
                  for d in (quantized, trained_dir))
    assert slow.returncode == fp32.returncode == 0, slow.stderr + fp32.stderr
    assert "static int8 would run slower than float32 on this CPU" in slow.stderr
    assert slow.stdout == fp32.stdout
