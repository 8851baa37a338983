"""The runtime section: where and how a model runs, for every way in (CLI, server, Python)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, one_of, typecheck

# A batch a decoding worker leaves unanswered this long means a hung worker (inference/pool.py
# gives a large batch more once it has measured the model's speed).
WORKER_TIMEOUT_S = 120.0

PRECISIONS = ("fp32", "bf16", "fp16")
# What runs the model's encoder and decoder step: PyTorch, or the exported graphs in ONNX Runtime (CPU)
# or as TensorRT engines (CUDA), built by ``transduce export --format onnx|tensorrt``.
BACKENDS = ("torch", "onnx", "tensorrt")


@dataclass(frozen=True)
class Runtime:
    """Where and how a model runs (:func:`transduce.inference.load` takes it), as CTranslate2's
    Translator, Generator and Encoder share one set of runtime arguments; checked on creation."""

    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA if available)."""
    precision: str = "fp32"
    """``fp32``, or ``bf16``/``fp16`` autocast (fp16 on CUDA only)."""
    int8: bool = False
    """Dynamic int8 quantisation of the linear layers (CPU only)."""
    compile: bool = False
    """CPU: greedy search runs the static-shape search with its step compiled by ``torch.compile``
    (Inductor's C++ kernels; needs a C++ compiler). The first batches compile (seconds to a
    minute, a few times while the batch shapes vary), so it pays on long jobs and servers. Beam
    search (measured no faster compiled) and the searches the static search cannot run (sampling,
    prefixes, constraints, streaming, attention maps, shortlists) run eagerly. On CUDA the static
    search's CUDA graphs do this already."""
    workers: int = 0
    """Decode in this many CPU worker processes, each with its own copy of the model and each
    call's batches spread over them; 0: in this process."""
    threads: int | None = None
    """Torch threads; with ``workers``, per worker (None: 1); without, None: torch's choice."""
    worker_timeout_s: float = WORKER_TIMEOUT_S
    """With ``workers``: a batch not answered within this many seconds (more for large batches
    once the workers' speed is measured) counts as a hung worker, replaced and retried once."""
    backend: str = "torch"
    """What runs the encoder and the decoder step (one of ``BACKENDS``): ``torch``, or with
    ``engines`` the exported graphs in ONNX Runtime (``onnx``, CPU) or TensorRT (``tensorrt``, CUDA);
    the searches are the same."""
    engines: str | None = None
    """With ``backend`` onnx or tensorrt: the directory ``transduce export --format onnx|tensorrt``
    wrote for the model."""

    def __post_init__(self) -> None:
        typecheck(self, "runtime")
        one_of(self.precision, "runtime.precision", PRECISIONS)
        check(self.workers >= 0, "runtime.workers", f"must be >= 0; got {self.workers}")
        check(self.threads is None or self.threads >= 1, "runtime.threads", f"must be >= 1; got {self.threads}")
        check(self.worker_timeout_s > 0, "runtime.worker_timeout_s",
              f"must be > 0 seconds; got {self.worker_timeout_s:g}")
        check(not self.workers or self.device in ("cpu", "auto"), "runtime.workers",
              f"worker processes decode on the CPU; got device {self.device!r}")
        check(not self.int8 or self.device in ("cpu", "auto"), "runtime.int8",
              f"dynamic int8 quantisation runs on the CPU; got device {self.device!r}")
        check(not self.compile or self.device in ("cpu", "auto"), "runtime.compile",
              f"compiles the CPU decoding step (CUDA captures it as a graph already); got device {self.device!r}")
        check(not (self.compile and self.int8), "runtime.compile",
              "compiles float models; drop int8 (dynamic int8 runs eagerly)")
        one_of(self.backend, "runtime.backend", BACKENDS)
        check((self.backend == "torch") == (self.engines is None), "runtime.engines",
              f"names the exported graphs of backend onnx or tensorrt; got backend {self.backend!r} with engines "
              f"{self.engines!r}")
        check(self.backend == "torch" or not (self.workers or self.int8 or self.compile), "runtime.backend",
              f"{self.backend} runs in this process on its own weights; drop workers, int8 and compile")

    @property
    def worker_threads(self) -> int:
        """Torch threads of each worker process."""
        return self.threads or 1
