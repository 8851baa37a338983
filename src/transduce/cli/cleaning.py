"""``transduce clean``: filter a parallel corpus (duplicates, the wrong language, copies, debris...)."""

from __future__ import annotations

import argparse

from ..config import load_run_config
from ..config.clean import check_language, clean_settings
from ..errors import ConfigError
from .options import add_config


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="filter a parallel corpus: duplicates, wrong language, copies, debris, "
                                     "length and ratio (one pass; data.clean's rules)")
    p.add_argument("src", help="source side (plain or gzip text, one sentence a line)")
    p.add_argument("tgt", help="target side, line-aligned with SRC")
    add_config(p, "run config (YAML) whose data.clean section sets the rules; every rule at its default if "
                  "omitted (e.g. --set 'data.clean={lang: false}')")
    p.add_argument("--out", required=True, help="directory to create (written atomically): kept.SRC_LANG, "
                                                "kept.TGT_LANG, removed.jsonl, summary.json")
    p.add_argument("--src-lang", default=None, help="the source's language code (default: data.src_lang)")
    p.add_argument("--tgt-lang", default=None, help="the target's language code (default: data.tgt_lang)")
    p.add_argument("--workers", type=int, default=None, help="judging processes (default: one per core)")
    p.set_defaults(func=_cmd_clean)


def _cmd_clean(args: argparse.Namespace) -> int:
    from ..data.clean import clean_files, output_names  # lazy: start-up
    from ..data.prepare import default_workers  # lazy: start-up
    data = load_run_config(args.config, args.overrides).data
    src_lang, tgt_lang = args.src_lang or data.src_lang, args.tgt_lang or data.tgt_lang
    check_language(src_lang, "--src-lang")
    check_language(tgt_lang, "--tgt-lang")
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        raise ConfigError(f"--workers: must be at least 1; got {workers}")
    report = clean_files(args.src, args.tgt, args.out, clean_settings(data.clean), src_lang, tgt_lang, workers)
    print(report.summary())
    names = output_names(src_lang, tgt_lang)
    print(f"wrote {args.out}/{names[0]}, {names[1]}, removed.jsonl and summary.json in {report.seconds:.1f} s")
    return 0
