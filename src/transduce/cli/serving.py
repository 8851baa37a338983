"""``transduce serve``: the HTTP server."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from .options import (add_decode_options, add_model_dirs, add_runtime_options, check_worker_timeout, decode_overrides,
                      runtime_of)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Adds this module's commands, in the order ``--help`` lists them."""
    _add_serve(sub)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="HTTP translation server with dynamic batching and a demo page")
    add_model_dirs(p, "model directory (config.yaml, model.safetensors, tokenizer)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--engine", choices=("transduce", "triton"), default="transduce",
                   help="transduce: this package's FastAPI server (the 'serve' extra); triton: a Triton Inference "
                        "Server with a model 'translate', KServe v2 HTTP on --port and gRPC on --grpc-port "
                        "(the 'triton' extra; docs/guides/triton.md)")
    p.add_argument("--grpc-port", type=int, default=None, help="--engine triton: the gRPC port (default: --port + 1)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long to gather concurrent requests into one batch (default: 5)")
    p.add_argument("--batching", choices=("none", "request", "continuous"), default="request",
                   help="request: concurrent requests gathered into batches that run to the end (default); "
                        "continuous: each sentence of a plain /translate joins the running batch at the next "
                        "decoding step (greedy, beam, one model; docs/guides/continuous-batching.md); "
                        "none: each request on its own")
    p.add_argument("--no-batching", dest="batching", action="store_const", const="none",
                   help="the older spelling of --batching none")
    p.add_argument("--api-key-file", default=None,
                   help="a file holding the API key that POST requests must send as 'Authorization: Bearer KEY' "
                        "(default: $TRANSDUCE_API_KEY if set, else no key)")
    p.add_argument("--max-per-client", type=int, default=None,
                   help="requests one client address may have in flight; more are answered 429 (default: no limit)")
    add_decode_options(p)
    add_runtime_options(p)
    p.set_defaults(func=_cmd_serve)


def _api_key(path: str | None) -> str | None:
    """The key of --api-key-file, else of $TRANSDUCE_API_KEY, else None."""
    import os

    if path is None:
        return os.environ.get("TRANSDUCE_API_KEY") or None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file: cannot read {path} ({e.__class__.__name__})") from None
    if not key:
        raise ConfigError(f"--api-key-file: {path} is empty")
    return key


def _cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import ServeConfig, serve, serve_triton  # lazy: start-up
    check_worker_timeout(args)
    _check_engine(args)
    if args.batching == "continuous" and args.engine == "triton":
        raise ConfigError("--batching continuous: is for --engine transduce")
    cfg = ServeConfig(host=args.host, port=args.port, batch_wait_ms=args.batch_wait_ms, batching=args.batching,
                      api_key=_api_key(args.api_key_file), max_per_client=args.max_per_client,
                      grpc_port=args.grpc_port)
    run = serve_triton if args.engine == "triton" else serve
    run([args.model_dir, *args.ensemble], cfg, runtime_of(args), args.draft, decode_overrides(args))
    return 0


def _check_engine(args: argparse.Namespace) -> None:
    """The options of one engine are an error with the other."""
    if args.engine == "triton":
        for flag, given in (("--api-key-file", args.api_key_file is not None),
                            ("--max-per-client", args.max_per_client is not None)):
            if given:
                raise ConfigError(f"{flag}: is for --engine transduce (Triton has no API key or per-client limit; "
                                  "put it behind your gateway)")
    elif args.grpc_port is not None:
        raise ConfigError("--grpc-port: is for --engine triton")

