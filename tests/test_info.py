"""``transduce info``: a model directory described from its files."""

import json
import shutil

import yaml

from transduce.config import AttentionConfig
from transduce.cli import main
from transduce.info import model_info
from transduce.model import load_model
from transduce.model.io import unique_state_dict


def _run_dir(trained_dir, tmp_path):
    """A run directory around the trained model: config.yaml and a metrics.jsonl whose last line
    was cut short (as by a crash)."""
    run = tmp_path / "run"
    shutil.copytree(trained_dir, run / "model")
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 400, "precision": "fp32"}}))
    records = [{"step": 100, "loss": 3.5, "lr": 1e-3}, {"step": 100, "val_loss": 3.0, "val_bleu": 12.5},
               {"step": 200, "loss": 2.25, "lr": 5e-4}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 3')
    return run


def test_describes_the_model_and_its_run(trained_dir, tmp_path):
    run = _run_dir(trained_dir, tmp_path)
    info = model_info(run / "model")
    model = load_model(trained_dir)
    assert info["parameters"] == sum(t.numel() for t in unique_state_dict(model).values())
    assert info["arch"] == "encoder_decoder" and info["task"] == "translation"
    assert info["shape"]["d_model"] == model.config.d_model
    assert info["shape"]["n_decoder_layers"] == model.config.n_decoder_layers
    assert "head_dim" not in info["shape"]  # unset: d_model / n_heads, not shown
    assert info["tokenizer"]["joint"] and info["tokenizer"]["type"] == "bpe"
    assert info["tokenizer"]["src_vocab_size"] == model.config.src_vocab_size
    assert info["decode"]["beam"] == 4
    assert info["train"]["max_steps"] == 400
    assert info["last_train"] == {"step": 200, "loss": 2.25, "lr": 5e-4}
    assert info["last_valid"]["val_bleu"] == 12.5


def test_shows_a_head_width_of_its_own(tmp_path):
    from transduce.config import ModelConfig
    from transduce.model import Transformer, save_model

    cfg = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, head_dim=12, d_ff=32,
                      n_encoder_layers=1, n_decoder_layers=1)
    save_model(Transformer(cfg), tmp_path / "m")
    shape = model_info(tmp_path / "m")["shape"]
    assert list(shape)[list(shape).index("n_heads") + 1] == "head_dim" and shape["head_dim"] == 12


def test_cli_text_and_json(trained_dir, tmp_path, capsys):
    run = _run_dir(trained_dir, tmp_path)
    assert main(["info", str(run / "model")]) == 0
    text = capsys.readouterr().out
    assert "encoder_decoder (translation)" in text and "val_bleu=12.5" in text
    assert main(["info", str(trained_dir), "--json"]) == 0  # no run around it
    info = json.loads(capsys.readouterr().out)
    assert "run_dir" not in info and info["parameters"] > 0


def test_missing_or_corrupt_model_is_one_line(trained_dir, tmp_path, capsys):
    assert main(["info", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    shutil.copytree(trained_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 10)
    assert main(["info", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "not a readable safetensors file" in err and err.count("\n") == 1


def test_a_reader_that_goes_away_ends_it_quietly(trained_dir):
    # `transduce info --json | head -1`: the pipe closes before the JSON is written; no traceback.
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "transduce", "info", str(trained_dir), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _config(**kw):
    from transduce.config import ModelConfig
    return ModelConfig(**{"src_vocab_size": 20, "tgt_vocab_size": 20, "d_model": 16, "n_heads": 2, "d_ff": 32,
                          "n_encoder_layers": 2, "n_decoder_layers": 1, "max_positions": 64, **kw})


def test_shows_the_attention_and_only_the_settings_it_reads():
    from transduce.info import attention_settings
    assert attention_settings(_config()) == {"kind": "full", "cross": "full"}
    assert attention_settings(_config(attention=AttentionConfig("local", window=8, global_tokens=2))) == {
        "kind": "local", "cross": "full", "window": 8, "global_tokens": 2}
    assert attention_settings(_config(attention=AttentionConfig(cross="local", window=5), attention_dropout=0.1)) == {
        "kind": "full", "cross": "local", "window": 5, "attention_dropout": 0.1}
    assert attention_settings(_config(attention=AttentionConfig("bigbird", block=4, random_blocks=1))) == {
        "kind": "bigbird", "cross": "full", "block": 4, "random_blocks": 1, "seed": 0}
    assert attention_settings(_config(attention=AttentionConfig("lsh", block=8, lsh_hashes=4, lsh_buckets=8),
                                      arch="decoder_only", n_encoder_layers=0)) == {
        "kind": "lsh", "block": 8, "lsh_hashes": 4, "lsh_buckets": 8, "seed": 0}
    assert attention_settings(_config(attention=AttentionConfig("linformer", linformer_k=16))) == {
        "kind": "linformer", "cross": "full", "linformer_k": 16}
    longformer = _config(arch="encoder_only", n_decoder_layers=0,
                         attention=AttentionConfig("local", windows=(4, 8), global_tokens=1, global_projections=True))
    assert attention_settings(longformer) == {"kind": "local", "windows": [4, 8], "global_tokens": 1,
                                              "global_projections": True}


def test_cli_shows_the_attention_and_rope(tmp_path, capsys):
    from transduce.model import Transformer, save_model
    save_model(Transformer(_config(attention=AttentionConfig("local", window=4, global_tokens=2), positions="rope")),
               tmp_path / "m")
    assert main(["info", str(tmp_path / "m")]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["attention"].split(None, 1)[1] == "kind=local, cross=full, window=4, global_tokens=2"
    assert "positions=rope" in lines["options"] and "rope_base=10000.0" in lines["options"]
    assert model_info(tmp_path / "m")["attention"]["global_tokens"] == 2
