"""``runtime.compile``: the static search's step compiled by torch.compile on the CPU
(inference/search/static_shapes.py), against the eager searches; its one-line errors. Compiling needs
a C++ compiler (Inductor's CPU kernels): those tests are skipped without one, saying so."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from extra_helpers import need_extra
from inference_helpers import SENTENCES, assert_same_search, random_sources, tiny_transformer
from transduce.cli.parser import build_parser
from transduce.cli.options import runtime_of
from transduce.config import DecodeConfig, Runtime
from transduce.errors import ConfigError
from transduce.inference import SearchSpec, Translator, prepare_for_decoding, restore
from transduce.inference.placement import prepared_for
from transduce.inference.search import static_shapes as static_module
from transduce.inference.speed import COMPILED_STEP, compile_step, compiles_step
from transduce.inference.speed.cpu import OneDNNLinear, onednn_available
from transduce.inference.speed.static_int8 import linear_names, quantize_static

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                                    reason="torch.compile's CPU kernels need a C++ compiler (g++, or CXX)")
LENGTHS = [3, 9, 1, 14, 6, 2, 11]


@pytest.fixture
def fresh_compiler():
    """No compiled step left from another test (each test counts the graphs it compiles)."""
    torch._dynamo.reset()
    static_module._compiled_step.cache_clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()
    static_module._compiled_step.cache_clear()


def _compiled_model(seed: int, **overrides):
    return compile_step(prepare_for_decoding(tiny_transformer(seed=seed, max_positions=64, n_encoder_layers=1,
                                                              n_decoder_layers=1, **overrides)))


@needs_compiler
def test_compiled_greedy_equals_eager_over_batch_shapes(fresh_compiler):
    """Greedy search on a compiled model runs the compiled static step by default and gives the
    eager search's tokens and scores, for batches of other sizes too (dynamic shapes)."""
    model = _compiled_model(0, positions="rope", norm="pre")
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=4)
    with torch.inference_mode():
        for lengths, seed in ((LENGTHS, 0), (LENGTHS[:3] + [20, 5], 1), (LENGTHS * 3, 2)):
            src = random_sources(lengths, seed=seed)
            assert SearchSpec(decode).uses_static(model, src)
            assert_same_search(SearchSpec(decode, static=False).run(model, src), SearchSpec(decode).run(model, src),
                               scores=(1e-5, 1e-5), log_probs=(1e-5, 1e-5))
    assert fresh_compiler["stats"]["unique_graphs"] >= 1  # it compiled (not a silent eager fallback)
    rows = {key[0][0] for key in static_module._searches(model)}
    assert rows >= {7, 5, 21}  # a kept search per batch, at its own size (and smaller ones it went on in)


@needs_compiler
def test_compiled_greedy_goes_on_with_its_live_sentences_in_a_smaller_search(fresh_compiler, monkeypatch):
    """When at most half of a compiled greedy search's sentences are live at a check, it goes on
    with them alone in a smaller search (the finished ones' outputs kept): the eager search's
    output all the same, over sentences that end at many different steps (their limits)."""
    model = _compiled_model(4, positions="rope")
    lengths = [1, 2, 3, 5, 8, 13, 21, 4, 2, 1, 6, 30]
    src = random_sources(lengths, seed=5)
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=1)
    made = []
    make = static_module._search_for
    monkeypatch.setattr(static_module, "_search_for", lambda model, shape, *a: made.append(shape[0]) or
                        make(model, shape, *a))
    with torch.inference_mode():
        eager = SearchSpec(decode, static=False).run(model, src)
        compacted = static_module.static_search(model, src, decode, greedy=True, check_every=2)
    assert_same_search(eager, compacted, scores=(1e-5, 1e-5), log_probs=(1e-5, 1e-5))
    assert len(made) >= 3 and made[1:] == sorted(made[1:], reverse=True) and made[-1] < made[0] / 2, made


@needs_compiler
def test_compiled_beam_search_equals_eager(fresh_compiler):
    """Beam search stays eager on a compiled model by default; asked for (static=True), its compiled
    step gives the eager search's hypotheses (the cache's rows gathered as the beams continue)."""
    model = _compiled_model(1)
    src = random_sources(LENGTHS, seed=3)
    decode = DecodeConfig(beam=3, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=6)
    with torch.inference_mode():
        assert not SearchSpec(decode).uses_static(model, src)
        assert_same_search(SearchSpec(decode, static=False).run(model, src),
                           SearchSpec(decode, static=True).run(model, src), scores=(1e-5, 1e-5),
                           log_probs=(1e-5, 1e-5))
    assert fresh_compiler["stats"]["unique_graphs"] >= 1


@needs_compiler
def test_weights_changed_after_compiling_are_decoded_with(fresh_compiler):
    """The compiled step reads the weights as the eager one does: changed in place (an output
    projection doubled, a fused q/k/v projection's source weight) or replaced, the next search
    gives what the eager search gives with the new weights, without compiling again."""
    model = _compiled_model(2)
    src, decode = random_sources(LENGTHS[:4]), DecodeConfig(beam=1, max_len_a=1.0, max_len_b=4)
    with torch.no_grad():
        before = SearchSpec(decode).run(model, src)
        graphs = fresh_compiler["stats"]["unique_graphs"]
        model.output_proj.weight.mul_(-1.5)
        model.decoder_layers[0].self_attn.q_proj.weight.mul_(3.0)
        fc1 = model.decoder_layers[0].ffn.fc1
        fc1.weight = torch.nn.Parameter(torch.randn_like(fc1.weight))
        after = SearchSpec(decode).run(model, src)
        assert not torch.equal(after.tokens, before.tokens)
        assert_same_search(SearchSpec(decode, static=False).run(model, src), after, scores=(1e-5, 1e-5),
                           log_probs=(1e-5, 1e-5))
    assert fresh_compiler["stats"]["unique_graphs"] == graphs


@needs_compiler
def test_the_translator_with_compile_translates_as_without(model_dir, fresh_compiler):
    with Translator.load(model_dir, Runtime(device="cpu")) as eager, \
            Translator.load(model_dir, Runtime(device="cpu", compile=True)) as compiled:
        assert compiled.translate(SENTENCES, beam=1) == eager.translate(SENTENCES, beam=1)
        assert compiled.translate(SENTENCES[:2], beam=3) == eager.translate(SENTENCES[:2], beam=3)  # (eager)


def test_prepared_for_compile_marks_the_model_and_keeps_onednn_out_of_the_traced_step():
    """A compiled model is prepared as an eager one (the encoder runs eagerly on oneDNN linears,
    where this build has them); in the step torch.compile traces, they are F.linear (the packed
    op does not trace): the compiled greedy search gives the eager search's output."""
    model = prepared_for(tiny_transformer(), torch.device("cpu"), Runtime(device="cpu", compile=True))
    assert compiles_step(model)
    onednn = any(isinstance(m, OneDNNLinear) for m in model.modules())
    assert onednn == onednn_available()
    if shutil.which(os.environ.get("CXX") or "g++") is not None:
        src, decode = random_sources(LENGTHS[:3]), DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
        with torch.inference_mode():
            assert_same_search(SearchSpec(decode, static=False).run(model, src), SearchSpec(decode).run(model, src),
                               scores=(1e-5, 1e-5), log_probs=(1e-5, 1e-5))
    restore(model)
    assert COMPILED_STEP not in model.__dict__ and not compiles_step(model)


@pytest.mark.parametrize("kwargs,message", [
    (dict(device="cuda"), "runtime.compile: compiles the CPU decoding step"),
    (dict(int8=True), "runtime.compile: compiles float models; drop int8"),
    (dict(backend="onnx", engines="graphs"), "drop workers, int8 and compile"),
])
def test_runtime_refuses_compile_where_it_cannot_run(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Runtime(compile=True, **kwargs)


def test_compile_refuses_a_static_int8_model():
    need_extra("quant", "torchao")
    model = tiny_transformer()
    quantize_static(model, {name: 1.0 for name in linear_names(model)})
    with pytest.raises(ConfigError, match="runtime.compile: compiles float models; this one is static int8"):
        prepared_for(model, torch.device("cpu"), Runtime(device="cpu", compile=True))


def test_compile_refuses_other_models_and_a_missing_compiler(monkeypatch):
    cpu, runtime = torch.device("cpu"), Runtime(device="cpu", compile=True)
    with pytest.raises(ConfigError, match="one translation model"):
        prepared_for(tiny_transformer(arch="decoder_only"), cpu, runtime)
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="need a C\\+\\+ compiler; no-such-compiler not found"):
        prepared_for(tiny_transformer(), cpu, runtime)


def test_the_command_line_flag_sets_runtime_compile(model_dir):
    args = build_parser().parse_args(["translate", str(model_dir), "--compile", "--device", "cpu"])
    assert runtime_of(args).compile
    assert not runtime_of(build_parser().parse_args(["translate", str(model_dir)])).compile
