"""The config package's shared parts: the one builder, YAML round trips, overrides, its layer,
and the field docstrings the configuration reference is generated from."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import transduce.config as config
from transduce.config import (DataConfig, DecodeConfig, GenerationConfig, ModelConfig, RunConfig, ServeConfig,
                              TrainConfig, apply_overrides, from_dict, load_run_config, save_yaml)
from transduce.errors import ConfigError

PACKAGE = Path(config.__file__).parent
SECTIONS = [(ModelConfig, "model"), (DataConfig, "data"), (TrainConfig, "train"), (DecodeConfig, "decode"),
            (GenerationConfig, "generation"), (ServeConfig, "serve")]


@pytest.mark.parametrize("klass,section", SECTIONS)
def test_the_builder_rejects_unknown_keys_naming_the_section(klass, section):
    with pytest.raises(ConfigError, match=rf"^{section}: unknown key\(s\) bogus, zz$"):
        from_dict(klass, {"zz": 1, "bogus": 2}, section)
    with pytest.raises(ConfigError, match=rf"^{section}: expected a mapping, got list$"):
        from_dict(klass, [1, 2], section)
    assert from_dict(klass, {}, section) == klass()


@pytest.mark.parametrize("klass,section,key,value", [
    (ModelConfig, "model", "d_model", "big"),
    (DataConfig, "data", "vocab_size", 8.5),
    (TrainConfig, "train", "compile", "yes"),
    (DecodeConfig, "decode", "beam", True),
    (GenerationConfig, "generation", "seed", "7"),
    (ServeConfig, "serve", "port", "8000"),
    (ServeConfig, "serve", "host", None),
])
def test_the_builder_rejects_wrong_types_naming_section_and_key(klass, section, key, value):
    with pytest.raises(ConfigError, match=rf"^{section}\.{key}: must ") as e:
        from_dict(klass, {key: value}, section)
    assert "\n" not in str(e.value)


def test_a_run_config_survives_a_yaml_round_trip(tmp_path):
    cfg = RunConfig.from_dict({
        "model": {"preset": "tiny", "arch": "encoder_only", "n_classes": 2, "labels": ["neg", "pos"],
                  "share_embeddings": False, "src_vocab_size": 300, "tgt_vocab_size": 200},
        "data": {"corpus": "files", "train_src": "t.tsv", "tokenizer": "tok", "max_ratio": 2},
        "train": {"betas": [0.9, 0.95], "schedule": "cosine", "lr": 3e-4, "patience": 3},
        "decode": {"beam": 2, "stop": "best_finished"},
    })
    assert cfg.model.labels == ("neg", "pos") and cfg.train.betas == (0.9, 0.95) and cfg.data.max_ratio == 2.0
    save_yaml(cfg.to_dict(), tmp_path / "run.yaml")
    assert load_run_config(tmp_path / "run.yaml") == cfg
    assert load_run_config(None) == RunConfig()


def test_overrides_are_yaml_scalars_and_a_bad_one_names_what_is_wrong():
    d = apply_overrides({"train": {"max_steps": 3}}, ["train.max_steps=9", "train.lr=1e-3", "data.root=", "x.y=[1"])
    assert d == {"train": {"max_steps": 9, "lr": "1e-3"}, "data": {"root": None}, "x": {"y": "[1"}}
    with pytest.raises(ConfigError, match=r"^override: expected section.key=value, got 'train'$"):
        apply_overrides({}, ["train"])
    with pytest.raises(ConfigError, match=r"^train.max_steps: section is not a mapping$"):
        apply_overrides({"train": 3}, ["train.max_steps=1"])


def test_init_model_keys_come_from_the_reader_given():
    """load_run_config reads no model directory itself: the reader (model.io's) is an argument."""
    seen = []

    def reader(directory):
        seen.append(directory)
        return {"d_model": 64, "n_heads": 2, "dropout": 0.2}
    cfg = load_run_config(None, ["train.init_from=somewhere", "model.dropout=0.3"], reader)
    assert seen == ["somewhere"] and (cfg.model.d_model, cfg.model.n_heads, cfg.model.dropout) == (64, 2, 0.3)
    assert load_run_config(None, ["train.init_from=somewhere"]).model.d_model == 512  # no reader: none read
    assert load_run_config(None, ["model.d_model=64", "model.n_heads=2"], reader).model.dropout == 0.1
    assert seen == ["somewhere"]  # no train.init_from: not asked


def test_config_is_the_bottom_layer():
    """config imports nothing of transduce but errors and atomic (model, data... import it)."""
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                assert node.module in ("errors", "atomic"), (path.name, node.module)
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith("transduce"), (path.name, node.module)


def _field_docstrings(klass: type) -> dict[str, str]:
    """Each field's attribute docstring (a string right after it in the class body), as griffe
    and mkdocstrings read them."""
    tree = ast.parse((PACKAGE / f"{klass.__module__.rsplit('.', 1)[1]}.py").read_text(encoding="utf-8"))
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == klass.__name__).body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = after.value.value
    return docs


@pytest.mark.parametrize("klass", [k for k, _ in SECTIONS] + [RunConfig])
def test_every_field_has_a_docstring(klass):
    docs = _field_docstrings(klass)
    missing = [f.name for f in dataclasses.fields(klass) if not docs.get(f.name, "").strip()]
    assert not missing, f"{klass.__name__}: fields without a docstring: {missing}"
