"""``transduce export`` and ``transduce import``: one entry point choosing the exporter by format
(:func:`export_model`), one choosing the Hugging Face importer by config.json's ``model_type``
(:func:`import_hf`, over :data:`IMPORTS`)."""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

from ..model.io import load_model_config
from .base import ExportError, ExportReport, staging_dir, torch_threads
from .ct2 import export_ctranslate2
from .ct2_family import export_ct2_family
from .hf import HFImportError, export_family, import_family, read_json
from .hub import origin_record, parse_name, snapshot
from .onnx import export_onnx, export_onnx_family
from .tensorrt import EngineBuild, export_tensorrt
from .triton import export_triton

logger = logging.getLogger(__name__)

FORMATS = ("hf", "ctranslate2", "onnx", "triton", "tensorrt")
QUANTIZATIONS = ("int8",)
# config.json's model_type -> (the family module that imports it, its description: an HFImport that
# hf.import_family runs); the import's error lists these keys, so what it names is what it dispatches
IMPORTS = {"marian": ("marian", "IMPORT"), "t5": ("t5", "IMPORT"), "mt5": ("t5", "IMPORT"),
           "gpt2": ("gpt2", "IMPORT"), "bert": ("bert", "IMPORT"), "roberta": ("bert", "IMPORT"),
           "longformer": ("longformer", "IMPORT"), "m2m_100": ("m2m100", "IMPORT"),
           "mbart": ("mbart", "IMPORT")}


def export_model(model_dir: str | os.PathLike, fmt: str, out: str | os.PathLike,
                 quantization: str | None = None, force: bool = False, name: str = "translate",
                 build: "EngineBuild | None" = None) -> ExportReport:
    """Export the model directory ``model_dir`` to format ``fmt`` in ``out``, verified: an
    :class:`ExportReport` of the verification's measurements.

    Args:
        model_dir: a directory written by ``save_model`` (+ tokenizer files).
        fmt: "hf" (MarianMTModel directory; T5ForConditionalGeneration for relative positions;
            GPT2LMHeadModel for a decoder_only model, BertForMaskedLM or BertForSequenceClassification
            for an encoder_only one), "ctranslate2", "onnx" (both also for decoder_only and encoder_only
            models: :mod:`~transduce.interop.ct2_family`, :mod:`~transduce.interop.onnx`) or "triton"
            (:mod:`~transduce.interop.triton`, translation models only) or "tensorrt" (the ONNX graphs and
            their TensorRT engines, :mod:`~transduce.interop.tensorrt`; on a CUDA GPU, translation models only).
        out: destination directory (must not exist unless ``force``); "triton": the repository.
        quantization: None or "int8" (CTranslate2, translation models only).
        force: replace an existing ``out`` (a Triton repository's model ``name``).
        build: "tensorrt": the engines' precision and largest batch (default: fp32, 128 rows).

    Raises:
        ExportError: unsupported format/option, missing package, or a failed verification.
    """
    if fmt not in FORMATS:
        raise ExportError(f"export.format: must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if quantization is not None and (fmt != "ctranslate2" or quantization not in QUANTIZATIONS):
        raise ExportError(f"export.quantization {quantization}: only 'int8' with export.format ctranslate2 is "
                          "supported")
    cfg = load_model_config(model_dir)
    arch, translates = cfg.arch, cfg.family.translates
    if build is not None and fmt != "tensorrt":
        raise ExportError(f"export.precision/export.max_batch: are for export.format tensorrt; got export.format {fmt}")
    if not translates and fmt in ("triton", "tensorrt"):
        raise ExportError(f"export.format {fmt}: exports encoder_decoder models; this one is {arch} (use export.format "
                          "hf, onnx or ctranslate2)")
    if not translates and quantization is not None:
        raise ExportError(f"export.quantization {quantization}: exports encoder_decoder models; this one is {arch}")
    if fmt == "triton":
        return ExportReport(fmt, Path(out) / name, export_triton(model_dir, out, name, force))
    with staging_dir(out, force) as tmp, torch_threads(1):
        if fmt == "tensorrt":
            checks = export_tensorrt(model_dir, tmp, build or EngineBuild())
        else:
            checks = _export_to(fmt, cfg, model_dir, tmp, quantization)
    report = ExportReport(fmt, Path(out), checks)
    logger.debug(report.summary())
    return report


def _export_to(fmt: str, cfg, model_dir, tmp: Path, quantization: str | None) -> dict:
    """The exporter of ``fmt`` for a model of ``cfg``'s kind, writing into ``tmp``: its checks."""
    fam = cfg.family
    if fmt == "hf":  # the family's description (an HFExport), written by hf.export_family; a translation
        # model by its positions and embedding LayerNorm: T5's relative bias, M2M-100/NLLB's fairseq table,
        # mBART's LayerNorm over the embedding sum, else Marian's
        module = ("gpt2" if fam.generates else "bert" if fam.masked_lm else "t5" if cfg.positions == "relative"
                  else "m2m100" if cfg.positions == "fairseq" else "mbart" if cfg.embed_norm else "marian")
        checks = export_family(model_dir, tmp, importlib.import_module(f".{module}", __package__).EXPORT)
    elif fmt == "onnx" and not fam.translates:
        checks = export_onnx_family(model_dir, tmp)
    elif fmt == "ctranslate2" and not fam.translates:
        checks = export_ct2_family(model_dir, tmp)
    elif fmt == "ctranslate2":
        checks = export_ctranslate2(model_dir, tmp, quantization)
    else:
        checks = export_onnx(model_dir, tmp)
    return checks


def import_hf(hf_dir: str | os.PathLike, out: str | os.PathLike, force: bool = False) -> dict[str, object]:
    """Convert the Hugging Face model directory ``hf_dir`` (MarianMTModel, e.g. OPUS-MT; T5 or mT5;
    GPT-2; BERT, RoBERTa or Longformer: :data:`IMPORTS`) into the transduce model directory ``out``
    (config.yaml, model.safetensors, tokenizer), verified against transformers on the family's
    probes; returns the verification's measurements. Nothing is written unless every check passes.

    ``hf_dir`` may name a Hugging Face repository instead, ``ORG/NAME`` or ``ORG/NAME@REVISION``
    (:mod:`~transduce.interop.hub`: its snapshot from huggingface_hub's cache, or downloaded), when no
    such directory exists; the import then records the repository and commit (config.yaml's ``origin``)."""

    where, origin = Path(hf_dir), None
    if not where.is_dir():
        named = parse_name(str(hf_dir))
        if named is None:
            raise HFImportError(f"{where}: not a directory")
        where = snapshot(str(hf_dir), *named)
        origin = origin_record(named[0], where)
    config = read_json(where / "config.json")
    kind = config.get("model_type")
    if kind not in IMPORTS:
        names = [repr(k) for k in IMPORTS]
        raise HFImportError(f"{where / 'config.json'}: model_type is {kind!r}, not {', '.join(names[:-1])} or "
                            f"{names[-1]} (the kinds transduce imports)")
    module, name = IMPORTS[kind]
    family = getattr(importlib.import_module(f".{module}", __package__), name)
    return import_family(where, config, out, force, family, origin)
