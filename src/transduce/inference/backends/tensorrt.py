"""TensorRT engines of the exported graphs, run on torch CUDA tensors (:class:`TrtSteps`, the
:class:`~.onnx.Steps` of ``backend tensorrt``).

``transduce export --format tensorrt`` (:mod:`transduce.interop.tensorrt`) writes, beside the ONNX
graphs, ``encoder.plan`` and ``decoder.plan`` and ``tensorrt.json``: the TensorRT version and GPU
they were built with (a plan runs only there: :func:`plan_mismatch`), their precision and their
optimization profile (the largest batch, source and cache they take).

Each call binds torch tensors by address (``set_input_shape``, ``set_tensor_address``), allocates
the outputs as torch tensors of the shapes TensorRT infers, and enqueues the engine on torch's
current CUDA stream (``execute_async_v3``): no copies through the host, no pycuda.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from ...errors import CheckpointError, ConfigError, require

ENCODER_PLAN, DECODER_PLAN, PLAN_META = "encoder.plan", "decoder.plan", "tensorrt.json"
# trt.DataType names -> torch dtypes (the graphs' I/O: int64 ids, bool mask, float caches and logits)
_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT64": torch.int64,
           "INT32": torch.int32, "BOOL": torch.bool}


def load_tensorrt():
    """The ``tensorrt`` package, or a one-line error naming the extra that installs it."""
    return require("tensorrt", "tensorrt", "backend tensorrt")


def check_can_run(device: torch.device):
    """The ``tensorrt`` package, after one-line errors for a device that is not CUDA or no package."""
    if device.type != "cuda":
        raise ConfigError(f"runtime.backend: tensorrt runs on a CUDA device; got device {device}")
    return load_tensorrt()


def gpu_identity(device: torch.device) -> dict:
    """What a plan is tied to besides the TensorRT version: the GPU's name and compute capability."""
    major, minor = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "compute_capability": f"{major}.{minor}"}


def plan_mismatch(meta: dict, trt_version: str, gpu: dict) -> str | None:
    """Why plans described by ``meta`` (tensorrt.json) cannot run with TensorRT ``trt_version`` on
    ``gpu`` (:func:`gpu_identity`), or None when they can: a plan is specific to the TensorRT
    version that built it and to the GPU's compute capability."""
    if meta.get("tensorrt") != trt_version:
        return f"they were built by TensorRT {meta.get('tensorrt')}; this is TensorRT {trt_version}"
    if meta.get("compute_capability") != gpu["compute_capability"]:
        return (f"they were built for {meta.get('gpu')} (compute capability {meta.get('compute_capability')}); "
                f"this is {gpu['gpu']} ({gpu['compute_capability']})")
    return None


def read_plan_meta(root: Path) -> dict:
    """tensorrt.json of an engine directory, or a one-line error saying how to build one."""
    path = root / PLAN_META
    if not path.is_file():
        raise CheckpointError(f"{root}: no TensorRT engines ({PLAN_META}); build them with transduce export MODEL_DIR "
                              f"--format tensorrt --out {root}")
    return json.loads(path.read_text(encoding="utf-8"))


class TrtEngine:
    """One deserialised engine and its execution context; :meth:`run` maps named inputs to outputs."""

    def __init__(self, trt, runtime, path: Path, device: torch.device):
        self.runtime = runtime  # outlives the engine it deserialised
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise CheckpointError(f"{path}: TensorRT could not load this plan; rebuild it with transduce export "
                                  "--format tensorrt")
        self.context = self.engine.create_execution_context()
        self.device = device
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: _DTYPES[self.engine.get_tensor_dtype(n).name] for n in names}
        self._dummy = torch.empty(256, dtype=torch.uint8, device=device)  # an address for empty tensors

    def _address(self, t: Tensor) -> int:
        return t.data_ptr() if t.numel() else self._dummy.data_ptr()

    def run(self, feeds: dict[str, Tensor]) -> list[Tensor]:
        """Bind ``feeds`` (name -> CUDA tensor, cast to the engine's dtype), run on the current
        stream, return the outputs in the engine's order."""
        keep = []  # the bound inputs stay alive until the enqueue (stream order keeps their memory)
        for name, t in feeds.items():
            t = t.to(self.dtypes[name]).contiguous()
            keep.append(t)
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, self._address(t))
        outs = []
        for name in self.outputs:
            out = torch.empty(tuple(self.context.get_tensor_shape(name)), dtype=self.dtypes[name], device=self.device)
            self.context.set_tensor_address(name, self._address(out))
            outs.append(out)
        if not self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError("TensorRT failed to enqueue the engine (its log says why)")
        return outs


class TrtSteps:
    """The encoder and decoder engines of an engine directory (the :class:`~.onnx.Steps` of
    ``backend tensorrt``)."""

    def __init__(self, encoder: TrtEngine, decoder: TrtEngine, meta: dict):
        self.encoder, self.decoder = encoder, decoder
        self.max_rows, self.max_src, self.max_cache = meta["max_batch"], meta["max_src"], meta["max_cache"]

    @classmethod
    def open(cls, root: Path, device: torch.device, precision: str) -> "TrtSteps":
        """The engines in ``root`` on CUDA ``device``, after one-line errors for no CUDA, no
        ``tensorrt`` package, plans of another TensorRT version or GPU, or another precision."""
        trt = check_can_run(device)
        meta = read_plan_meta(root)
        why = plan_mismatch(meta, trt.__version__, gpu_identity(device))
        if why is not None:
            raise CheckpointError(f"{root}: the TensorRT engines cannot run here: {why}; rebuild them with "
                                  f"transduce export MODEL_DIR --format tensorrt --out DIR")
        if meta["precision"] != precision:
            raise ConfigError(f"runtime.precision: the engines in {root} were built for {meta['precision']}; got "
                              f"{precision} (use --precision {meta['precision']}, or build engines for {precision})")
        logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(logger)
        with torch.cuda.device(device):
            return cls(TrtEngine(trt, runtime, root / ENCODER_PLAN, device),
                       TrtEngine(trt, runtime, root / DECODER_PLAN, device), meta)

    def encode(self, src: Tensor) -> list[Tensor]:
        return self.encoder.run({"src": src})

    def step(self, feeds: dict[str, Tensor]) -> list[Tensor]:
        return self.decoder.run(feeds)
