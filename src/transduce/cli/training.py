"""Commands that make models and their data: prepare, train, demo, average, plot, data."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import EXTEND_VOCAB, load_run_config
from ..errors import ConfigError
from .options import add_config


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Adds this module's commands, in the order ``--help`` lists them."""
    _add_prepare(sub)
    _add_train(sub)
    _add_demo(sub)
    _add_average(sub)
    _add_ablate(sub)
    _add_plot(sub)
    _add_data(sub)


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="encode a config's corpus once into token files that train opens")
    add_config(p, "run config (YAML; its data section is used); defaults if omitted")
    p.add_argument("--out", required=True, help="directory to create (written atomically)")
    p.add_argument("--workers", type=int, default=None, help="encoding processes (default: one per core)")
    p.set_defaults(func=_cmd_prepare)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from ..data.prepare import prepare_dataset  # lazy: start-up
    from ..model.io import saved_model_settings  # lazy: start-up
    cfg = load_run_config(args.config, args.overrides, saved_model_settings).with_init_tokenizer()
    data = prepare_dataset(cfg.data, args.out, args.workers, seed=cfg.train.seed)
    m = data.manifest
    for split, entry in m["splits"].items():
        f = entry["filter"]
        print(f"{split}: kept {entry['pairs']:,} of {sum(f.values()):,} pairs, "
              f"{entry['src_tokens']:,} + {entry['tgt_tokens']:,} tokens")
    print(f"prepared {args.out} in {m['seconds']:.1f} s; train on it with: --set data.prepared={args.out}")
    return 0


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a YAML config")
    add_config(p, "run config (YAML); defaults if omitted")
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--reverse", action="store_true",
                   help="train the other direction: swap the config's source and target (e.g. de->en)")
    p.add_argument("--init-from", default=None, metavar="MODEL_DIR",
                   help="start from a trained model's weights and tokenizer (same as --set train.init_from=MODEL_DIR)")
    p.add_argument("--extend-vocab", nargs="?", type=int, const=EXTEND_VOCAB, default=None, metavar="N",
                   help="with --init-from: add up to N subwords of the new training data the model's tokenizer "
                        f"lacks (default {EXTEND_VOCAB} per tokenizer model), keeping every existing id and "
                        "embedding; the grown tokenizer is written to OUT/tokenizer (same as --set "
                        "train.extend_vocab=N). Put it after CONFIG")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    return train_main(args.config, args.overrides, args.out, args.resume, args.reverse, args.init_from,
                      args.extend_vocab)


def default_run_dir(config_path: str | None, reverse: bool = False) -> Path:
    return Path("runs") / ((Path(config_path).stem if config_path else "run") + ("_reverse" if reverse else ""))


def train_main(config_path: str | None, overrides: list[str], out: str | None, resume: bool,
               reverse: bool = False, init_from: str | None = None, extend_vocab: int | None = None) -> int:
    """``transduce train``: returns the process exit status."""
    from ..model.io import saved_model_settings  # lazy: start-up
    from ..training import loop  # lazy: start-up

    run_dir = Path(out) if out else default_run_dir(config_path, reverse)
    if resume and config_path is None and (run_dir / "config.yaml").is_file():
        config_path = str(run_dir / "config.yaml")  # resume with the run's own config
    if reverse:  # idempotent: a reversed run's own config already says so
        overrides = [*overrides, "data.reverse=true"]
    if init_from is not None:
        overrides = [*overrides, f"train.init_from={init_from}"]
    if extend_vocab is not None:
        overrides = [*overrides, f"train.extend_vocab={extend_vocab}"]
    loop.run_training(load_run_config(config_path, overrides, saved_model_settings), run_dir, resume)
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train and evaluate on the embedded toy language pair (no download)")
    p.add_argument("--task", default="translation", choices=["translation", "lm", "mlm", "classify", "t5"],
                   help="translation (en->de), lm: a small GPT on the German side, mlm: a small BERT on the "
                        "English side, classify: that BERT fine-tuned to tell the tense of a sentence, against "
                        "the same classifier from scratch, or t5: a small T5 pretrained by span corruption, then "
                        "fine-tuned text-to-text to translate and to tell the tense (default: translation)")
    p.add_argument("--out", default=None, help="run directory (default: runs/demo, or runs/demo_TASK)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: the demo's own); for classify and t5, of each of their runs")
    p.add_argument("--init-from", default=None, metavar="MODEL_DIR",
                   help="classify: fine-tune this masked LM (a finished `demo --task mlm` model) instead of "
                        "training one into OUT/mlm")
    p.add_argument("--nsp", action="store_true",
                   help="mlm: also BERT's next-sentence prediction, on the toy sentences as documents of one "
                        "tense (the model exports as BertForPreTraining)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_classify_demo, run_demo, run_lm_demo, run_mlm_demo  # lazy: start-up
    if args.init_from is not None and args.task != "classify":
        raise ConfigError("--init-from: only demo --task classify starts from a trained model")
    if args.nsp and args.task != "mlm":
        raise ConfigError("--nsp: next-sentence prediction is an option of demo --task mlm")
    from ..demo_t5 import run_t5_demo  # lazy: start-up
    run, out, options = {"translation": (run_demo, "runs/demo", {}), "lm": (run_lm_demo, "runs/demo_lm", {}),
                         "mlm": (run_mlm_demo, "runs/demo_mlm", {"nsp": args.nsp}),
                         "classify": (run_classify_demo, "runs/demo_classify", {"init_from": args.init_from}),
                         "t5": (run_t5_demo, "runs/demo_t5", {})}[args.task]
    print(run(args.out or out, steps=args.steps, **options).report())
    return 0


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the weights of checkpoints (Sec. 6.1)")
    p.add_argument("checkpoints", nargs="+", help="checkpoint or model directories of one config")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--ema", action="store_true",
                   help="average the checkpoints' moving averages of the weights (train.ema_decay runs)")
    p.set_defaults(func=_cmd_average)


def _cmd_average(args: argparse.Namespace) -> int:
    from ..model.io import WEIGHTS  # lazy: start-up
    from ..training.checkpoint import average_checkpoints  # lazy: start-up
    from ..training.ema import EMA_WEIGHTS  # lazy: start-up
    out = average_checkpoints([Path(c) for c in args.checkpoints], Path(args.out), EMA_WEIGHTS if args.ema else WEIGHTS)
    print(f"averaged {len(args.checkpoints)} checkpoints into {out}")
    return 0


def _add_ablate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="the paper's Table 3: train every model variation of a config for the same "
                                      "budget, print validation perplexity and BLEU per row (resumable)")
    add_config(p, "base run config (YAML)")
    p.add_argument("--out", required=True, help="directory of the rows' runs and table3.md / table3.json")
    p.add_argument("--dry", action="store_true", help="every row for a few steps (a smoke test)")
    p.add_argument("--no-plot", action="store_true", help="no table3.png (which needs the plot extra, matplotlib)")
    p.set_defaults(func=_cmd_ablate)


def _cmd_ablate(args: argparse.Namespace) -> int:
    from ..training.ablate import ablate, format_table  # lazy: start-up
    results = ablate(args.config, Path(args.out), args.overrides, args.dry, not args.no_plot)
    print(format_table(results), end="")
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw a run's learning curves to PNG (needs matplotlib)")
    p.add_argument("run_dir", help="run directory (reads metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    p.set_defaults(func=_cmd_plot)


def _cmd_plot(args: argparse.Namespace) -> int:
    from ..viz.curves import plot_run  # lazy: start-up
    print(plot_run(args.run_dir, args.out))
    return 0


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="fetch a public corpus")
    corpora = p.add_subparsers(dest="corpus", required=True, metavar="CORPUS")
    m = corpora.add_parser("multi30k", help="Multi30k task 1 (en, de, fr, cs), checksum-verified")
    m.add_argument("--dest", required=True, help="directory for the .gz files")
    m.add_argument("--url", default=None, help="base URL (default: the dataset's GitHub repository)")
    m.set_defaults(func=_cmd_data_multi30k)


def _cmd_data_multi30k(args: argparse.Namespace) -> int:
    from ..data import multi30k  # lazy: start-up
    paths = multi30k.download(args.dest, base_url=args.url or multi30k.DEFAULT_URL)
    print(f"{len(paths)} files verified in {args.dest}; use them with: --set data.corpus=multi30k "
          f"--set data.root={args.dest}  (or export TRANSDUCE_MULTI30K={args.dest})")
    return 0

