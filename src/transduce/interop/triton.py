"""``transduce export --format triton``: a Triton model repository serving translation end to end.

``REPO/NAME/config.pbtxt`` declares the model (Python backend; BYTES ``text`` in; ``translation``,
``score`` and ``error`` out, as :mod:`~transduce.inference.backends.triton` describes; dynamic
batching with preferred batch sizes and a maximum queue delay). ``REPO/NAME/1/model.py`` runs
transduce on the model directory copied beside it (``1/model_dir``), whose saved decoding settings
are the defaults a request's parameters replace. Exporting again with another ``--name`` adds a
model to the same repository (several language pairs, or checkpoints, in one server).

The Python backend runs the interpreter found on the server's ``PATH``: transduce must be
installed there.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .base import ExportError, staging_dir
from ..checksums import verify_all

MAX_BATCH = 64  # rows per batch at most, as the HTTP server's max_sentences
MAX_QUEUE_DELAY_US = 5000  # as the HTTP server's batch_wait_ms
MAX_CHARS = 2000  # the longest row, as the HTTP server's max_sentence_chars

MODEL_PY = '''"""Triton Python backend: transduce translating {name!r} (written by transduce export --format triton)."""

import json
import os
import sys

import triton_python_backend_utils as pb_utils

# The backend's stub starts Python without reading PYTHONPATH: read it as python would.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

from transduce.inference import load  # noqa: E402
from transduce.inference.backends.triton import TritonTranslate  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        model_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_dir")
        self.model = TritonTranslate(load(model_dir), max_chars={max_chars})

    def execute(self, requests):
        rows = [self.model.rows(pb_utils.get_input_tensor_by_name(r, "text").as_numpy(),
                                json.loads(r.parameters() or "{{}}")) for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in out.items()])
                for out in self.model.answer(rows)]

    def finalize(self):
        self.model.close()
'''


def preferred_batch_sizes(max_batch: int) -> list[int]:
    """Powers of two from 4 below ``max_batch``, and it: the batch sizes Triton waits to fill."""
    return [n for n in (4, 8, 16, 32, 64, 128, 256) if n < max_batch] + [max_batch]


def config_pbtxt(name: str, max_batch: int = MAX_BATCH, delay_us: int = MAX_QUEUE_DELAY_US) -> str:
    """The model's ``config.pbtxt`` (Triton's text protobuf ModelConfig)."""
    sizes = ", ".join(str(n) for n in preferred_batch_sizes(max_batch))
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [
  {{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }}
]
output [
  {{ name: "translation" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "score" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "error" data_type: TYPE_STRING dims: [ 1 ] }}
]
dynamic_batching {{
  preferred_batch_size: [ {sizes} ]
  max_queue_delay_microseconds: {delay_us}
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def export_triton(model_dir: str | os.PathLike, repo: str | os.PathLike, name: str = "translate",
                  force: bool = False) -> dict[str, object]:
    """Write ``repo/name`` (config.pbtxt, 1/model.py, 1/model_dir: the model directory's files,
    checked against its recorded checksums); other models in ``repo`` stay. Returns the checks."""

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ExportError(f"export.name: a Triton model name of letters, digits, '_', '.', '-'; got {name!r}")
    model_dir, repo = Path(model_dir), Path(repo)
    if repo.exists() and not repo.is_dir():
        raise ExportError(f"{repo}: exists and is not a directory (a model repository)")
    repo.mkdir(parents=True, exist_ok=True)
    with staging_dir(repo / name, force) as tmp:
        (tmp / "config.pbtxt").write_text(config_pbtxt(name), encoding="utf-8")
        version = tmp / "1"
        version.mkdir()
        (version / "model.py").write_text(MODEL_PY.format(name=name, max_chars=MAX_CHARS), encoding="utf-8")
        copy = version / "model_dir"
        copy.mkdir()
        files = [f for f in sorted(model_dir.iterdir()) if f.is_file()]  # checkpoints/, logs/: not served
        for f in files:
            shutil.copy2(f, copy / f.name)
        verify_all(copy)
    return {"model": name, "files": len(files), "max_batch_size": MAX_BATCH}
