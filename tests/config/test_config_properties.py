"""Property tests (hypothesis): any YAML value for any config key, in a file or as an override,
builds a config or is one ConfigError of one line naming where: never a traceback.

100 generated cases per property in the quick tier, 1,000 in the slow one."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from extra_helpers import need_extra

need_extra("test", "hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from transduce.config import (DataConfig, DecodeConfig, GenerationConfig, ModelConfig, Runtime,  # noqa: E402
                              ServeConfig, TrainConfig, from_dict, load_run_config)
from transduce.errors import ConfigError  # noqa: E402

TIERS = [100, pytest.param(1000, marks=pytest.mark.slow)]
SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "decode": DecodeConfig}
OTHERS = {"serve": ServeConfig, "runtime": Runtime, "generation": GenerationConfig}

# What YAML can hold: scalars of every kind (NaN and infinities too), nested lists and mappings.
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=12), st.sampled_from(["1e3", "yes", "~", "-0", ".inf", "[", "a: b"]))
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3), max_leaves=6)


def _keys(klass) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([f.name for f in dataclasses.fields(klass)]), st.text(max_size=8))


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _one_line_config_error(build) -> None:
    try:
        build()
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)


SECTION_VALUES = st.sampled_from(sorted(SECTIONS)).flatmap(
    lambda s: st.tuples(st.just(s), st.dictionaries(_keys(SECTIONS[s]), VALUE, max_size=3)))


@pytest.mark.parametrize("examples", TIERS)
def test_any_yaml_in_a_run_config_file_is_a_config_or_one_line(tmp_path, examples):
    path = tmp_path / "run.yaml"

    @_settings(examples)
    @given(st.lists(SECTION_VALUES, max_size=3), st.one_of(st.none(), VALUE))
    def prop(sections, junk):
        doc = {name: values for name, values in sections}
        if junk is not None:
            doc["model"] = junk if not doc.get("model") else doc["model"]
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
        _one_line_config_error(lambda: load_run_config(path))

    prop()


@pytest.mark.parametrize("examples", TIERS)
def test_any_override_is_a_config_or_one_line(examples):
    @_settings(examples)
    @given(st.lists(st.tuples(st.sampled_from(sorted(SECTIONS) + ["nope", ""]), st.text(max_size=10),
                              st.text(max_size=12)), max_size=3))
    def prop(items):
        _one_line_config_error(lambda: load_run_config(None, [f"{s}.{k}={v}" for s, k, v in items]))

    prop()


@pytest.mark.parametrize("examples", TIERS)
def test_any_text_as_a_config_file_is_a_config_or_one_line(tmp_path, examples):
    path = tmp_path / "run.yaml"

    @_settings(examples)
    @given(st.one_of(st.text(max_size=60), st.binary(max_size=40).map(lambda b: b.decode("latin-1"))))
    def prop(text):
        path.write_text(text, encoding="utf-8")
        _one_line_config_error(lambda: load_run_config(path))

    prop()


@pytest.mark.parametrize("examples", TIERS)
@pytest.mark.parametrize("section", sorted(OTHERS))
def test_any_values_for_the_other_sections_are_a_config_or_one_line(section, examples):
    klass = OTHERS[section]

    @_settings(examples)
    @given(st.dictionaries(_keys(klass), VALUE, max_size=3))
    def prop(values):
        _one_line_config_error(lambda: from_dict(klass, values, section))

    prop()
