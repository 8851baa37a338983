"""The one dispatcher (inference.search.dispatch.SearchSpec): which search runs for which settings."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference.search import AttentionChoice, SearchSpec, Speculation, dispatch


@pytest.fixture
def calls(monkeypatch):
    """Each search the dispatcher may call, replaced by one that records its name."""
    seen: list[str] = []
    for name in ("greedy_search", "beam_search", "sample", "static_search", "speculative_search"):
        monkeypatch.setattr(dispatch, name, lambda *a, _name=name, **k: seen.append(_name))
    return seen


@pytest.mark.parametrize("spec, expected", [
    (SearchSpec(DecodeConfig(beam=1)), "greedy_search"),
    (SearchSpec(DecodeConfig(beam=4)), "beam_search"),
    (SearchSpec(DecodeConfig(beam=4), temperature=0.7), "sample"),
    (SearchSpec(DecodeConfig(beam=1), static=True), "static_search"),
    (SearchSpec(DecodeConfig(beam=4), static=True), "static_search"),
    (SearchSpec(DecodeConfig(beam=4), static=False), "beam_search"),
])
def test_each_setting_runs_its_search(calls, spec, expected):
    spec.run(tiny_transformer(), random_sources([3, 5]))
    assert calls == [expected]


def test_a_draft_model_runs_speculative_decoding(calls):
    model = tiny_transformer()
    SearchSpec(DecodeConfig(beam=1)).run(model, random_sources([3]), speculation=Speculation(model))
    assert calls == ["speculative_search"]


def test_static_is_chosen_by_default_only_on_cuda():
    model, src = tiny_transformer(), random_sources([3, 5])
    assert not SearchSpec().uses_static(model, src)  # a CPU batch stays eager
    assert not SearchSpec(static=False).uses_static(model, src)
    assert SearchSpec(static=True).uses_static(model, src)
    model.train()
    with pytest.raises(ConfigError, match="eval-mode"):
        SearchSpec(static=True).uses_static(model, src)


def test_a_forced_prefix_keeps_the_eager_search(calls):
    SearchSpec(DecodeConfig(beam=4), static=True).run(tiny_transformer(), random_sources([3]),
                                                     prefix=torch.tensor([[5]]))
    assert calls == ["beam_search"]


@pytest.mark.parametrize("spec, match", [
    (SearchSpec(attention=AttentionChoice(), static=True), "static decoding records no attention maps"),
    (SearchSpec(DecodeConfig(beam=4)), "decode.beam: speculative decoding is greedy"),
    (SearchSpec(DecodeConfig(beam=1), attention=AttentionChoice()), "speculative decoding records no attention"),
])
def test_settings_a_search_cannot_do_get_one_line_errors(spec, match):
    model = tiny_transformer()
    speculation = Speculation(model) if spec.static is None else None
    with pytest.raises(ConfigError, match=match):
        spec.run(model, random_sources([3]), speculation=speculation)


def test_sampling_and_speculation_refuse_a_prefix():
    model, src, prefix = tiny_transformer(), random_sources([3]), torch.tensor([[5]])
    with pytest.raises(ConfigError, match="not sampling"):
        SearchSpec(temperature=1.0).run(model, src, prefix=prefix)
    with pytest.raises(ConfigError, match="without a draft model"):
        SearchSpec().run(model, src, prefix=prefix, speculation=Speculation(model))
