"""Commands on model directories themselves: export, import, info, rehash."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Adds this module's commands, in the order ``--help`` lists them."""
    _add_export(sub)
    _add_import(sub)
    _add_info(sub)
    _add_rehash(sub)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model to Hugging Face (Marian; GPT-2 for a language model), "
                       "CTranslate2 or ONNX (verified), or a Triton model repository")
    p.add_argument("model_dir", help="model directory (config.yaml, model.safetensors, tokenizer)")
    p.add_argument("--format", required=True, choices=["hf", "ctranslate2", "onnx", "triton", "tensorrt"],
                   help="target format (tensorrt: the ONNX graphs and their TensorRT engines, built on a CUDA GPU "
                        "for it; translate with --backend tensorrt --engines OUT)")
    p.add_argument("--out", required=True, help="directory to write (written atomically); --format triton: the "
                                                "model repository (created, or added to)")
    p.add_argument("--name", default=None, help="--format triton: the model's name in the repository (default: "
                                                "translate)")
    p.add_argument("--quantization", default=None, choices=["int8"], help="int8 weights (ctranslate2 only)")
    p.add_argument("--precision", default=None, choices=["fp32", "fp16", "bf16"],
                   help="--format tensorrt: the engines' precision (default: fp32; fp16/bf16 keep layer norms and "
                        "softmax in fp32)")
    p.add_argument("--max-batch", type=int, default=None, metavar="ROWS",
                   help="--format tensorrt: the most decoder rows (sentences x beam) an engine call takes; "
                        "larger batches are split (default: 128)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from ..interop import export_model  # lazy: start-up
    if args.name is not None and args.format != "triton":
        raise ConfigError("--name: is for --format triton")
    build = None
    if args.precision is not None or args.max_batch is not None:
        from ..interop.tensorrt import EngineBuild  # lazy: start-up
        given = {"precision": args.precision, "max_batch": args.max_batch}
        build = EngineBuild(**{k: v for k, v in given.items() if v is not None})
    report = export_model(args.model_dir, args.format, args.out, args.quantization, args.force,
                          args.name or "translate", build)
    print(report.summary())
    return 0


def _add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import a Hugging Face MarianMTModel (e.g. OPUS-MT), T5/mT5, GPT-2, BERT, "
                       "RoBERTa or Longformer directory, or a Hub repository by name, as a transduce model "
                       "(verified)")
    p.add_argument("hf_dir", metavar="DIR_OR_NAME",
                   help="local MarianMTModel directory: config.json, model.safetensors (or "
                   "pytorch_model.bin), source.spm, target.spm, vocab.json; or T5ForConditionalGeneration "
                   "directory (model_type t5 or mt5): config.json, weights, spiece.model; or GPT2LMHeadModel "
                   "directory (model_type gpt2): config.json, weights, tokenizer.json; or BertForMaskedLM, "
                   "BertForPreTraining, BertForSequenceClassification, RobertaForMaskedLM, "
                   "RobertaForSequenceClassification, LongformerForMaskedLM or LongformerModel: config.json, "
                   "weights, tokenizer.json; or, where no such directory exists, a Hugging Face repository "
                   "ORG/NAME[@REVISION] (a branch, tag or commit; from huggingface_hub's cache, HF_HOME or "
                   "HF_HUB_CACHE, or downloaded; HF_HUB_OFFLINE=1: the cache only), its repository and commit "
                   "recorded in config.yaml (origin)")
    p.add_argument("--out", required=True, help="model directory to write (written atomically)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_import)


def _cmd_import(args: argparse.Namespace) -> int:
    import json

    from ..interop import import_hf  # lazy: start-up
    checks = import_hf(args.hf_dir, args.out, args.force)
    print(json.dumps({"out": args.out, **checks}, indent=2))
    return 0


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what a model is: arch, shape, parameters, tokenizer, decoding and "
                       "training settings, last metrics")
    p.add_argument("model_dir", help="model directory (e.g. RUN/model or RUN/checkpoints/step_N)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_cmd_info)


def _cmd_info(args: argparse.Namespace) -> int:
    import json

    from ..info import format_info, model_info  # lazy: start-up
    info = model_info(args.model_dir)
    print(json.dumps(info, indent=2, ensure_ascii=False) if args.json else format_info(info))
    return 0


def _add_rehash(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rehash", help="accept an intentional edit of a model directory's config.yaml: record its "
                       "new sha256 (loading checks it)")
    p.add_argument("model_dir", help="model or checkpoint directory whose config.yaml you edited")
    p.set_defaults(func=_cmd_rehash)


def _cmd_rehash(args: argparse.Namespace) -> int:
    from ..checksums import EDITABLE, record  # lazy: start-up (hashlib, OpenSSL: 4 ms)
    from ..model.io import load_decode_config, load_model_config  # lazy: start-up
    directory = Path(args.model_dir)
    if not (directory / EDITABLE).is_file():
        raise ConfigError(f"{directory}: no {EDITABLE} here (give a model or checkpoint directory)")
    record(directory, [EDITABLE])
    load_model_config(directory)  # the edit must still be a valid config
    load_decode_config(directory)
    print(f"recorded the sha256 of {directory / EDITABLE}")
    return 0

