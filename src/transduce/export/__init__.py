"""Ship a trained model to other runtimes: Hugging Face Marian, CTranslate2, ONNX; int8 on CPU.

Every exporter writes into a temporary directory beside the destination, checks the exported
model against the eager one on a fixed probe set (:mod:`.verify`), and only then renames the
directory into place, so a failed export leaves nothing behind. The heavy packages
(transformers, ctranslate2, onnx, onnxruntime) are imported inside the functions that use
them; ``pip install 'transduce[export]'`` installs them all.
"""

from __future__ import annotations

from .base import FORMATS, ExportError, ExportReport, export_model
from .quantize import quantize_dynamic_int8, quantize_translator

__all__ = [
    "FORMATS", "ExportError", "ExportReport", "export_model", "quantize_dynamic_int8", "quantize_translator",
]
