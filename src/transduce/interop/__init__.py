"""Models in and out, both directions: ``transduce import`` brings Hugging Face checkpoints in
(Marian/OPUS-MT, T5/mT5, GPT-2, BERT, RoBERTa, Longformer: ``hf_*_import``), ``transduce export``
ships a model to Hugging Face, CTranslate2, ONNX, TensorRT or a Triton model repository.

Every exporter and importer writes into a temporary directory beside the destination, checks
the result against the eager model (and an import against transformers' own) on a fixed probe
set (:mod:`.verify`), and only then renames the directory into place, so a failed export or
import leaves nothing behind. The heavy packages (transformers, ctranslate2, onnx, onnxruntime)
are imported inside the functions that use them; ``pip install 'transduce[export]'`` installs
them all.
"""

from __future__ import annotations

from .base import ExportError, ExportReport
from .dispatch import FORMATS, export_model

__all__ = ["FORMATS", "ExportError", "ExportReport", "export_model"]
