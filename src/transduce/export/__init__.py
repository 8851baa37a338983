"""Ship a trained model to other runtimes: Hugging Face Marian, CTranslate2, ONNX.

Every exporter writes into a temporary directory beside the destination, checks the exported
model against the eager one on a fixed probe set (:mod:`.verify`), and only then renames the
directory into place, so a failed export leaves nothing behind. The heavy packages
(transformers, ctranslate2, onnx, onnxruntime) are imported inside the functions that use
them; ``pip install 'transduce[export]'`` installs them all.
"""

from __future__ import annotations

from .base import ExportError, ExportReport
from .dispatch import FORMATS, export_model

__all__ = ["FORMATS", "ExportError", "ExportReport", "export_model"]
