"""Static-shape decoding (inference/search/static_shapes.py) against the eager searches; its cache and
kept weights are tested in tests/inference/speed. On CPU the static step runs eagerly; capture
and replay are checked on a GPU by bench/gpu_checks.py's ``decode_checks``."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import EOS, EXACT, assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import SearchSpec, greedy_search, prepare_for_decoding, restore
from transduce.inference.search import static_shapes as static_module
from transduce.inference.speed import STATIC_SEARCHES
from transduce.inference.search.static_shapes import StaticSearch, static_search
from transduce.model.layers import DecoderLayer

LENGTHS = [3, 9, 1, 14, 6, 2, 11]  # sentences that finish at different steps


def _model(seed: int, positions: str = "sinusoidal", norm: str = "post"):
    """A tiny random model that ends some hypotheses early: a larger EOS logit row."""
    model = tiny_transformer(seed=seed, positions=positions, norm=norm, max_positions=64, tie_output=False)
    with torch.no_grad():
        model.output_proj.weight[EOS] *= 4.0
    return model


def _assert_same(eager, static) -> None:
    assert_same_search(eager, static, scores=(1e-5, 1e-5), log_probs=(1e-5, 1e-5))


MODELS = [(0, "sinusoidal", "post"), (1, "learned", "pre"), (2, "rope", "post"), (3, "rope", "pre"),
          (4, "sinusoidal", "pre"), (5, "relative", "pre")]


@pytest.mark.parametrize("seed,positions,norm", MODELS)
@pytest.mark.parametrize("min_len,max_len_a,max_len_b", [(0, 1.0, 4), (3, 0.5, 2), (0, 0.0, 30)])
def test_static_greedy_equals_eager(seed, positions, norm, min_len, max_len_a, max_len_b):
    model = _model(seed, positions, norm)
    src = random_sources(LENGTHS, seed=seed)
    decode = DecodeConfig(beam=1, min_len=min_len, max_len_a=max_len_a, max_len_b=max_len_b)
    with torch.inference_mode():
        _assert_same(SearchSpec(decode, static=False).run(model, src), SearchSpec(decode, static=True).run(model, src))


BEAMS = [  # beam, nbest, lenpen, stop, min_len, max_len_a, max_len_b
    (4, 1, 0.6, "k_finished", 0, 1.0, 4),
    (4, 3, 0.0, "best_finished", 0, 1.0, 4),
    (2, 2, 0.6, "best_finished", 2, 0.5, 3),
    (3, 2, 0.0, "k_finished", 0, 0.0, 25),
    (1, 1, 0.6, "k_finished", 1, 1.0, 2),
]


@pytest.mark.parametrize("seed,positions,norm", MODELS)
@pytest.mark.parametrize("beam,nbest,lenpen,stop,min_len,max_len_a,max_len_b", BEAMS)
def test_static_beam_search_equals_eager(seed, positions, norm, beam, nbest, lenpen, stop, min_len, max_len_a,
                                         max_len_b):
    model = _model(seed, positions, norm)
    src = random_sources(LENGTHS, seed=seed + 10)
    decode = DecodeConfig(beam=beam, nbest=nbest, lenpen=lenpen, stop=stop, min_len=min_len,
                          max_len_a=max_len_a, max_len_b=max_len_b)
    with torch.inference_mode():
        _assert_same(SearchSpec(decode, static=False).run(model, src), SearchSpec(decode, static=True).run(model, src))


def test_the_equivalence_cases_end_both_at_eos_and_at_the_length_limit():
    """Guards the tests above: some hypotheses end with EOS before their limit, others hit it."""
    model, src = _model(0), random_sources(LENGTHS, seed=10)
    decode = DecodeConfig(beam=4, max_len_a=1.0, max_len_b=4)
    with torch.inference_mode():
        out = SearchSpec(decode, static=True).run(model, src)
    limit = torch.tensor(LENGTHS) + 1 + 4
    ended = out.tokens[torch.arange(len(LENGTHS)), 0, out.lengths[:, 0] - 1] == EOS
    assert ended.any() and (out.lengths[:, 0] == limit).any()
    assert len(set(out.lengths[:, 0].tolist())) > 2  # sentences finish at different steps


@pytest.mark.parametrize("check_every", [1, 3, 100])
def test_checking_for_the_end_less_often_changes_nothing(check_every):
    model, src = _model(1), random_sources(LENGTHS, seed=3)
    decode = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=5)
    with torch.inference_mode():
        _assert_same(SearchSpec(decode, static=False).run(model, src),
                     static_search(model, src, decode, check_every=check_every))
        _assert_same(greedy_search(model, src, decode),
                     static_search(model, src, decode, greedy=True, check_every=check_every))


def test_model_decode_is_what_runs(monkeypatch):
    """No layer is written twice: each step of a static search calls the model's decoder layers."""
    model, src = _model(2, "rope", "pre"), random_sources(LENGTHS, seed=2)
    calls = []
    forward = DecoderLayer.forward

    def counted(self, *args, **kwargs):
        calls.append(type(kwargs.get("cache", args[3] if len(args) > 3 else None)).__name__)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(DecoderLayer, "forward", counted)
    decode = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=5)
    with torch.inference_mode():
        static_search(model, src, decode, greedy=True, check_every=100)
    assert calls == ["StaticLayerCache"] * (5 * len(model.decoder_layers))


@pytest.mark.parametrize("beam", [1, 3])
def test_kept_casts_give_what_autocast_gives(beam):
    """Under autocast, a model prepared with ``cast=`` reads its kept bf16 weights: bit for bit
    the search autocast's own casts give, also after the weights change in place."""
    plain, cast = _model(6, "rope", "pre"), prepare_for_decoding(_model(6, "rope", "pre"), cast=torch.bfloat16)
    src = random_sources(LENGTHS, seed=6)
    decode = DecodeConfig(beam=beam, nbest=1, max_len_a=1.0, max_len_b=4)
    for scale in (1.0, 1.5):
        with torch.no_grad():
            for model in (plain, cast):
                model.decoder_layers[0].ffn.fc1.weight.mul_(scale)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            want = static_search(plain, src, decode, greedy=beam == 1)
            got = static_search(cast, src, decode, greedy=beam == 1)
        assert_same_search(want, got, scores=EXACT)
    assert any("_cast" in m.__dict__ for m in cast.modules())


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("beam,stop", [(0, "k_finished"), (4, "k_finished"), (3, "best_finished")])
def test_a_step_never_reads_a_device_value_on_the_host(positions, beam, stop):
    """What a CUDA graph needs: meta tensors have no values, so ``bool()``, ``.item()``,
    ``nonzero`` or a boolean index anywhere in the step would raise here."""
    model = prepare_for_decoding(tiny_transformer(positions=positions, norm="pre").to("meta"))
    decode = DecodeConfig(beam=max(beam, 1), nbest=1, stop=stop, min_len=2)
    search = StaticSearch(model, 8, beam, 16, 16, torch.float32, decode, torch.device("meta"))
    search.load([], torch.ones(8, 1, 1, 16, dtype=torch.bool, device="meta"), torch.ones(8, dtype=torch.long,
                                                                                           device="meta"))
    with torch.inference_mode():
        search._step()
        search._step()
    with pytest.raises(RuntimeError):
        search.all_done()  # the host's one read, between steps


def test_graph_capture_code_is_there():
    """The CUDA-graph path imports and is wired in (it runs only on a GPU: bench/gpu_checks.py)."""
    assert callable(StaticSearch.capture)
    assert callable(static_module._search_for)
    assert static_module.CHECK_EVERY > 1 and static_module.GRAPHS_KEPT >= 1


def test_restore_drops_the_kept_searches():
    model = prepare_for_decoding(_model(0))
    static_module._searches(model)["shape"] = "a captured search"
    restore(model)
    assert STATIC_SEARCHES not in model.__dict__
