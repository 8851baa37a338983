"""Config validation, YAML round trips and overrides."""

from dataclasses import replace

import pytest

from transduce.config import (DecodeConfig, ModelConfig, RunConfig, TrainConfig, apply_overrides,
                              load_run_config, model_preset, save_yaml)
from transduce.errors import ConfigError


@pytest.mark.parametrize("kwargs,key", [
    (dict(d_model=500, n_heads=8), "model.d_model"),
    (dict(dropout=-0.1), "model.dropout"),
    (dict(activation="tanh"), "model.activation"),
    (dict(norm="middle"), "model.norm"),
    (dict(positions="alibi"), "model.positions"),
    (dict(d_model="big"), "model.d_model"),
    (dict(n_heads=0), "model.n_heads"),
    (dict(src_vocab_size=10, tgt_vocab_size=12), "model.share_embeddings"),
    (dict(bias="yes"), "model.bias"),
    (dict(arch="bert"), "model.arch"),
    (dict(type_vocab_size=2), "model.type_vocab_size"),
    (dict(arch="decoder_only", embed_norm=True), "model.embed_norm"),
    (dict(n_classes=3), "model.n_classes"),
    (dict(arch="encoder_only", n_classes=-1), "model.n_classes"),
    (dict(arch="encoder_only", type_vocab_size=-1), "model.type_vocab_size"),
    (dict(arch="encoder_only", n_encoder_layers=0), "model.n_encoder_layers"),
    (dict(arch="encoder_only", n_classes=1), "model.n_classes"),
    (dict(arch="decoder_only", output_bias=True), "model.output_bias"),
])
def test_invalid_model_values_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"^{key}:") as e:
        ModelConfig(**kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cls,kwargs,key", [
    (TrainConfig, dict(precision="fp8"), "train.precision"),
    (TrainConfig, dict(lr=1e-3), "train.lr"),  # noam (the default) would ignore it silently
    (TrainConfig, dict(label_smoothing=1.5), "train.label_smoothing"),
    (TrainConfig, dict(schedule="cosine"), "train.lr"),
    (TrainConfig, dict(grad_accum=0), "train.grad_accum"),
    (DecodeConfig, dict(beam=2, nbest=3), "decode.nbest"),
])
def test_invalid_other_values(cls, kwargs, key):
    with pytest.raises(ConfigError, match=rf"^{key}:"):
        cls(**kwargs)


def test_presets_and_int_to_float():
    cfg = model_preset("big")
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout) == (1024, 16, 4096, 0.3)
    assert ModelConfig(dropout=0).dropout == 0.0
    with pytest.raises(ConfigError, match="model.preset"):
        model_preset("huge")


def test_yaml_round_trip_and_overrides(tmp_path):
    cfg = RunConfig.from_dict({"model": {"preset": "tiny", "norm": "pre"}, "train": {"max_steps": 7}})
    assert cfg.model.d_model == 128 and cfg.model.norm == "pre" and cfg.train.max_steps == 7
    save_yaml(cfg.to_dict(), tmp_path / "c.yaml")
    again = load_run_config(tmp_path / "c.yaml", ["train.max_steps=9", "model.positions=rope"])
    assert again.train.max_steps == 9 and again.model.positions == "rope"
    assert again.model == cfg.model.__class__(**{**cfg.to_dict()["model"], "positions": "rope"})
    assert load_run_config(tmp_path / "c.yaml").to_dict() == cfg.to_dict()


@pytest.mark.parametrize("text,match", [
    ("model: {d_modl: 3}", "model: unknown key"),
    ("modle: {}", "config: unknown section"),
    ("model: [1, 2]", "model: expected a mapping"),
    ("model: {d_model: 64, n_heads: 5}", "model.d_model"),
    ("{{{", "not valid YAML"),
])
def test_bad_yaml_files(tmp_path, text, match):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_run_config(p)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"^override: expected section.key=value"):
        apply_overrides({}, ["max_steps=3"])


def test_shipped_configs_load():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "configs"
    found = sorted(root.glob("*.yaml"))
    assert found, "no configs/*.yaml"
    for path in found:
        load_run_config(path)
    assert load_run_config(root / "base.yaml").model.d_model == 512
    assert load_run_config(root / "big.yaml").model.d_model == 1024


def test_demo_config_is_the_shipped_file_as_the_readme_describes_it():
    from transduce.demo import demo_config
    demo = demo_config(steps=5)
    assert (demo.model.d_model, demo.model.n_encoder_layers, demo.model.n_decoder_layers) == (128, 2, 2)
    assert demo.data.corpus == "toy" and demo.train.max_steps == 5 and demo_config().train.max_steps == 800


def test_lm_demo_config_is_a_gpt2_shaped_language_model():
    from transduce.demo import demo_config
    from transduce.interop.gpt2 import gpt2_incompatibilities
    demo = demo_config(steps=5, task="lm")
    assert demo.task == "lm" and demo.model.arch == "decoder_only" and demo.train.max_steps == 5
    assert gpt2_incompatibilities(demo.model) == []  # what the demo trains exports to GPT-2


def test_mlm_demo_config_is_a_bert_shaped_masked_lm():
    from transduce.demo import demo_config
    from transduce.interop.bert import bert_incompatibilities
    demo = demo_config(steps=5, task="mlm")
    assert demo.task == "mlm" and demo.model.arch == "encoder_only" and demo.train.max_steps == 5
    assert bert_incompatibilities(demo.model) == []  # what the demo trains exports to BERT


def test_classify_demo_config_is_the_mlm_demos_model_with_a_head():
    from transduce.demo import demo_config
    from transduce.interop.bert import bert_incompatibilities
    mlm, cls = demo_config(task="mlm"), demo_config(steps=5, task="classify", data={"train_src": "t.tsv"},
                                                    init_from="m")
    assert cls.task == "classify" and cls.model.n_classes == 4 and cls.train.max_steps == 5
    assert cls.model == replace(mlm.model, n_classes=4)  # what --init-from requires of the masked LM
    assert cls.train.init_from == "m" and cls.data.train_src == "t.tsv" and bert_incompatibilities(cls.model) == []
    assert demo_config(task="classify", data={"train_src": "t.tsv", "tokenizer": "m"}).train.max_steps == 300


def test_wmt14_configs_are_the_papers_recipes_and_fail_clearly_without_their_prepared_corpus(tmp_path, monkeypatch,
                                                                                            capsys):
    """configs/wmt14_en_de_{base,big}.yaml: the paper's models, ~25k-token steps (padded budget x
    accumulation), 100k / 300k steps, bf16, checkpoint averaging, reading a prepared corpus;
    training without that corpus stops with one line naming the directory and how to make it."""
    from pathlib import Path

    from transduce.cli import main
    root = Path(__file__).resolve().parents[1] / "configs"
    for name, d_model, steps, avg in (("base", 512, 100_000, 5), ("big", 1024, 300_000, 20)):
        cfg = load_run_config(root / f"wmt14_en_de_{name}.yaml")
        assert (cfg.model.d_model, cfg.train.max_steps, cfg.train.average_last) == (d_model, steps, avg)
        assert cfg.train.precision == "bf16" and cfg.train.label_smoothing == 0.1
        assert 20_000 <= cfg.data.max_tokens * cfg.train.grad_accum <= 26_000
        assert cfg.data.prepared and cfg.data.corpus == "files"
    monkeypatch.chdir(tmp_path)  # data/wmt14_en_de is relative: absent here
    assert main(["train", str(root / "wmt14_en_de_base.yaml"), "--out", str(tmp_path / "run"),
                 "--set", "train.device=cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data/wmt14_en_de" in err[0] and "transduce prepare" in err[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_numbers_yaml_reads_as_strings_are_floats_where_a_float_is_expected():
    """PyYAML (YAML 1.1) reads 3e-4 as the string "3e-4": a float field takes it as 0.0003, from
    a file and from --set; a real string stays an error, and an int field does not take it."""
    from transduce.config import RunConfig, TrainConfig
    import yaml
    assert yaml.safe_load("lr: 3e-4") == {"lr": "3e-4"}
    assert TrainConfig(**yaml.safe_load("lr: 3e-4\nschedule: constant")).lr == 3e-4
    cfg = RunConfig.from_dict(apply_overrides({}, ["train.lr=5E-3", "train.schedule=constant"]))
    assert cfg.train.lr == 5e-3
    with pytest.raises(ConfigError, match="train.lr"):
        TrainConfig(lr="fast", schedule="constant")
    with pytest.raises(ConfigError, match="train.max_steps"):
        TrainConfig(max_steps="1e3")


def test_translation_with_learned_positions_needs_room_for_eos_and_bos():
    """A source of max_len tokens + EOS (and a target of BOS + max_len tokens) must fit the
    learned position table: caught at config time, not as an index error mid-training."""
    from transduce.config import RunConfig
    model = {"positions": "learned", "max_positions": 64}
    RunConfig.from_dict({"model": model, "data": {"max_len": 63}})
    with pytest.raises(ConfigError, match=r"^data.max_len: must be at most model.max_positions - 1 \(63\)"):
        RunConfig.from_dict({"model": model, "data": {"max_len": 64}})
    RunConfig.from_dict({"model": {"max_positions": 64}, "data": {"max_len": 250}})  # sinusoidal: no table


def test_init_from_supplies_the_model_keys_the_config_does_not_give(tmp_path):
    from transduce.model.io import saved_model_settings
    init = tmp_path / "init"
    save_yaml({"model": {"d_model": 48, "n_heads": 4, "dropout": 0.1, "activation": "gelu"}}, init / "config.yaml")
    cfg = load_run_config(None, ["train.init_from=" + str(init), "model.dropout=0.3"], saved_model_settings)
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.activation, cfg.model.dropout) == (48, 4, "gelu", 0.3)
    with pytest.raises(ConfigError, match="missing is not a transduce model directory"):
        load_run_config(None, [f"train.init_from={tmp_path / 'missing'}"], saved_model_settings)
    # a resumed run's config names the model itself: its starting model may be gone
    kept = load_run_config(None, [f"train.init_from={tmp_path / 'missing'}", "model.arch=encoder_decoder"],
                           saved_model_settings)
    assert kept.model.d_model == 512
