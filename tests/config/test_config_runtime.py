"""Generation, server and runtime settings: checked on creation, one-line errors naming the key."""

from __future__ import annotations

import pytest

from transduce.config import GenerationConfig, Runtime, ServeConfig, check_sampling
from transduce.errors import ConfigError


@pytest.mark.parametrize("kwargs,key", [
    (dict(port=70000), "serve.port"),
    (dict(port=-1), "serve.port"),
    (dict(max_body_bytes=0), "serve.max_body_bytes"),
    (dict(max_sentences=-3), "serve.max_sentences"),
    (dict(max_sentence_chars=0), "serve.max_sentence_chars"),
    (dict(max_queued=0), "serve.max_queued"),
    (dict(batch_wait_ms=-1), "serve.batch_wait_ms"),
    (dict(request_timeout_s=0), "serve.request_timeout_s"),
    (dict(api_key=" "), "serve.api_key"),
    (dict(max_per_client=0), "serve.max_per_client"),
])
def test_bad_serve_values_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"^{key}: ") as e:
        ServeConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_serve_defaults_and_the_key_kept_out_of_repr():
    cfg = ServeConfig(batch_wait_ms=1, api_key="s3cret")
    assert cfg.batch_wait_ms == 1.0 and isinstance(cfg.batch_wait_ms, float)
    assert "s3cret" not in repr(cfg)


@pytest.mark.parametrize("kwargs,key", [
    (dict(workers=-1), "runtime.workers"),
    (dict(workers=2, device="cuda"), "runtime.workers"),
    (dict(workers=2, worker_timeout_s=0), "runtime.worker_timeout_s"),
    (dict(threads=0), "runtime.threads"),
    (dict(threads="4"), "runtime.threads"),
    (dict(precision="fp8"), "runtime.precision"),
    (dict(int8=True, device="cuda:1"), "runtime.int8"),
])
def test_bad_runtime_values_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"^{key}: ") as e:
        Runtime(**kwargs)
    assert "\n" not in str(e.value)


def test_runtime_defaults():
    rt = Runtime(workers=2)
    assert rt.device == "auto" and rt.worker_timeout_s > 0 and rt.worker_threads == 1
    assert Runtime(workers=2, threads=3).worker_threads == 3


@pytest.mark.parametrize("kwargs,key", [
    (dict(max_new_tokens=0), "generation.max_new_tokens"),
    (dict(max_new_tokens=3, min_new_tokens=4), "generation.min_new_tokens"),
    (dict(min_new_tokens=-1), "generation.min_new_tokens"),
    (dict(batch_size=0), "generation.batch_size"),
    (dict(temperature=-1), "generation.temperature"),
    (dict(top_k=-1), "generation.top_k"),
    (dict(top_p=0), "generation.top_p"),
    (dict(top_p=1.5, temperature=0), "generation.top_p"),
    (dict(seed=1.5), "generation.seed"),
])
def test_bad_generation_values_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"^{key}: ") as e:
        GenerationConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_generation_is_positional_in_field_order_and_greedy_at_zero():
    gen = GenerationConfig(5, 0, 0, 1.0, None, 2, 1)  # the CLI builds it so
    assert (gen.max_new_tokens, gen.temperature, gen.batch_size, gen.min_new_tokens) == (5, 0.0, 2, 1)


def test_sampling_arguments_of_a_call_are_named_alone():
    with pytest.raises(ConfigError, match=r"^temperature: must be > 0; got 0$"):
        check_sampling(0, 0, 1.0)
    with pytest.raises(ConfigError, match=r"^top_k: must be >= 0"):
        check_sampling(1.0, -2, 1.0)
    check_sampling(0.5, 3, 0.9)


def test_quantize_config_float_layers_are_names():
    from transduce.config import QuantizeConfig
    assert QuantizeConfig().float_layers == ("output_proj",)
    assert QuantizeConfig(float_layers=["*.fc2"]).float_layers == ("*.fc2",)  # a YAML list
    for bad in (("",), (3,), "output_proj"):
        with pytest.raises(ConfigError, match="quantize.float_layers"):
            QuantizeConfig(float_layers=bad)
