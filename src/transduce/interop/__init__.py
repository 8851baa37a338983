"""Models in and out, both directions: ``transduce import`` brings Hugging Face checkpoints in
(Marian/OPUS-MT, T5/mT5, GPT-2, BERT, RoBERTa, Longformer), ``transduce export`` ships a model
to Hugging Face, CTranslate2, ONNX, TensorRT or a Triton model repository.

One module per family (:mod:`.marian`, :mod:`.gpt2`, :mod:`.bert` with :mod:`.bert_vocab` and
:mod:`.longformer`, :mod:`.t5`) holds what the family is, read both ways: the transformers classes,
the config mapping to and from Hugging Face's, the one parameter-name table (with its transforms:
transpose, permute, fold a scale), the vocabulary order, the tokenizer files, what it refuses, its
probes: its export and import descriptions (``EXPORT``, ``IMPORT``), which :mod:`.hf`'s two skeletons
run. :mod:`.hf` is what they share; :mod:`.dispatch` picks the exporter by format and the importer
by ``model_type`` (:mod:`.hub` resolves a Hub repository named instead of a directory);
:mod:`.ct2`, :mod:`.onnx`, :mod:`.tensorrt` and :mod:`.triton` are the other formats. Adding a
family is one module and a line in :data:`~transduce.interop.dispatch.IMPORTS` (and in
:func:`~transduce.interop.dispatch.export_model` for its export).

Every exporter and importer writes into a temporary directory beside the destination, checks
the result against the eager model (and an import against transformers' own) on a fixed probe
set (:func:`~.verify.check_against`, the one check), and only then renames the directory into
place, so a failed export or import leaves nothing behind. The heavy packages (transformers,
ctranslate2, onnx, onnxruntime) are imported inside the functions that use them; ``pip install
'transduce[export]'`` installs them all.
"""

from __future__ import annotations

from .base import ExportError, ExportReport
from .dispatch import FORMATS, export_model, import_hf

__all__ = ["FORMATS", "ExportError", "ExportReport", "export_model", "import_hf"]
