"""``transduce info MODEL_DIR``: what a model is, read from its files without building it.

The model directory gives the architecture, shape and options (``config.yaml``; with the Hugging Face
repository and commit of a model imported by name, its ``origin``), the parameter
count (the safetensors header: shapes only, no weights read) and the tokenizer; the run directory
around it, when there is one (``RUN/model``, ``RUN/best``, ``RUN/checkpoints/step_N``), gives the
training config and the last training and validation figures of ``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from .config import ModelConfig, model_task, read_yaml
from .data.spm_model import model_type
from .data.tokenizer import load_tokenizer, tokenizer_exists
from .errors import CheckpointError, one_line
from .model.io import CONFIG, WEIGHTS, load_decode_config, load_model_config


def model_info(model_dir: str | os.PathLike) -> dict:
    """A JSON-able description of the model directory ``model_dir`` (see the module docstring)."""
    root = Path(model_dir)
    cfg = load_model_config(root)
    info: dict = {"model_dir": str(root), "arch": cfg.arch, "task": model_task(cfg),
                  "shape": _shape(cfg), "options": _options(cfg), "attention": attention_settings(cfg),
                  "parameters": parameter_count(root / WEIGHTS), "tokenizer": _tokenizer(root)}
    if cfg.family.translates:
        info["decode"] = dataclasses.asdict(load_decode_config(root))
    if cfg.labels:
        info["labels"] = list(cfg.labels)
    origin = read_yaml(root / CONFIG).get("origin")  # a Hugging Face repository imported by name
    if isinstance(origin, dict):
        info["origin"] = origin
    run = _run_dir(root)
    if run is not None:
        info["run_dir"] = str(run)
        info["train"] = read_yaml(run / CONFIG).get("train", {})
        info.update(_last_metrics(run / "metrics.jsonl"))
    return info


def parameter_count(weights: Path) -> int:
    """Parameters stored in a safetensors file (tied matrices are stored once), from its header."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{weights}: not a readable safetensors file ({one_line(e)})") from None


def format_info(info: dict) -> str:
    """The description as aligned ``key: value`` lines for a terminal."""
    lines = [f"{info['model_dir']}: {info['arch']} ({info['task']}), {info['parameters']:,} parameters"]
    rows = [("shape", _pairs(info["shape"])), ("options", _pairs(info["options"])),
            ("attention", _pairs(info["attention"])),
            ("tokenizer", _pairs(info["tokenizer"]))]
    for key in ("labels",):
        if key in info:
            rows.append((key, ", ".join(info[key])))
    if "origin" in info:
        rows.append(("origin", _pairs(info["origin"])))
    if "decode" in info:
        rows.append(("decode", _pairs(info["decode"])))
    if "run_dir" in info:
        rows.append(("run", info["run_dir"]))
        train = info["train"]
        rows.append(("train", _pairs({k: train[k] for k in ("max_steps", "lr_scale", "lr", "warmup_steps",
                                                             "label_smoothing", "precision") if k in train})))
    for key in ("last_train", "last_valid"):
        if key in info:
            rows.append((key.replace("_", " "), _pairs(info[key])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(lines + [f"  {k:<{width}}  {v}" for k, v in rows])


def _shape(cfg: ModelConfig) -> dict:
    fam = cfg.family
    keys = [*fam.layers, "d_model", "n_heads", "d_ff", "max_positions", *fam.vocab_sizes]
    if cfg.head_dim is not None:
        keys.insert(len(fam.layers) + 2, "head_dim")
    if cfg.n_classes:
        keys.append("n_classes")
    return {k: getattr(cfg, k) for k in keys}


def _options(cfg: ModelConfig) -> dict:
    """The options that differ between Transformer variants (norm, positions, activation...)."""
    keys = ["norm", "positions", "activation", "bias", "share_embeddings", "tie_output", "scale_embeddings",
            "dropout", *cfg.family.options]
    if cfg.positions == "relative":
        keys += ["relative_buckets", "relative_max_distance"]
    if cfg.positions == "rope":
        keys.append("rope_base")
    # T5's options, shown where they differ from the paper's
    keys += [k for k, plain in (("norm_kind", "layer"), ("scale_attention", True), ("scale_output", False))
             if getattr(cfg, k) != plain]
    return {k: getattr(cfg, k) for k in keys}


# The settings of each kind of attention (model.attention.kind / .cross), shown with it
_KIND_KEYS = {"local": ("window",), "linformer": ("linformer_k",),
              "bigbird": ("block", "random_blocks", "seed"),
              "lsh": ("block", "lsh_hashes", "lsh_buckets", "seed")}


def attention_settings(cfg: ModelConfig) -> dict:
    """The attention a model runs: its self-attention kind and, for an encoder-decoder, its
    cross-attention kind, each with the settings that kind reads (a window, blocks, hashes...),
    Longformer's global tokens and per-layer windows where set, and attention dropout if any."""
    a = cfg.attention
    out: dict = {"kind": a.kind}
    keys = list(_KIND_KEYS.get(a.kind, ()))
    if a.kind == "local":
        if a.windows:
            keys = ["windows"]
        keys += [k for k in ("global_tokens", "global_projections") if getattr(a, k)]
    if cfg.family.translates:
        out["cross"] = a.cross
        if a.cross == "local" and "window" not in keys:
            keys.append("window")
    out.update({k: getattr(a, k) for k in keys})
    if a.windows:
        out["windows"] = list(a.windows)
    if cfg.attention_dropout:
        out["attention_dropout"] = cfg.attention_dropout
    return out


def _tokenizer(root: Path) -> dict:
    if not tokenizer_exists(root):
        return {"present": False}
    tok = load_tokenizer(root)
    if not hasattr(tok, "protos"):  # a Hugging Face tokenizer (byte-level BPE, WordPiece)
        return {"joint": True, "type": tok.kind, "src_vocab_size": tok.vocab_size,
                "tgt_vocab_size": tok.vocab_size, "specials": tok.ids}
    kinds = {model_type(proto) for proto in tok.protos if proto is not None}
    return {"joint": tok.joint, "type": "/".join(sorted(kinds)), "src_vocab_size": tok.src_vocab_size,
            "tgt_vocab_size": tok.tgt_vocab_size}


def _run_dir(model_dir: Path) -> Path | None:
    """The run directory a model directory sits in (one or two levels up), if any."""
    for candidate in (model_dir.parent, model_dir.parent.parent):
        if (candidate / "metrics.jsonl").is_file() and (candidate / CONFIG).is_file():
            return candidate
    return None


def _last_metrics(path: Path) -> dict:
    """The last training record and the last validation record of a metrics.jsonl."""
    out: dict = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash: skip it
        if not isinstance(record, dict):
            continue
        kind = "last_valid" if any(k.startswith("val_") for k in record) else "last_train"
        out[kind] = {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}
    return out


def _pairs(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())
