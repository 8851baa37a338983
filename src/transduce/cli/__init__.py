"""Command-line interface: parses arguments and calls the library; nothing else.

One module per group of commands (:mod:`.training`, :mod:`.decoding`, :mod:`.models`,
:mod:`.serving`), the options they share in :mod:`.options`, and the parser and ``main`` in
:mod:`.parser`. User errors (:class:`~transduce.errors.TransduceError`) are printed as one line on
stderr and exit with status 2.
"""

from .options import decode_overrides, runtime_of
from .parser import build_parser, main
from .training import default_run_dir, train_main

__all__ = ["build_parser", "decode_overrides", "default_run_dir", "main", "runtime_of", "train_main"]
