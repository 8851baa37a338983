"""mBART-50 (Tang et al., 2020, https://arxiv.org/abs/2008.00401) as Hugging Face writes it: a
``model_type: mbart`` directory (``MBartForConditionalGeneration``: config.json, weights,
sentencepiece.bpe.model and ``MBart50Tokenizer``'s files) into our
:class:`~transduce.model.Transformer`: :data:`IMPORT`, which
:func:`~transduce.interop.hf.import_family` runs, and back: :data:`EXPORT`, which
:func:`~transduce.interop.hf.export_family` runs for an encoder-decoder with ``model.embed_norm``.

mBART is BART's pre-LN Transformer (a final LayerNorm per stack) with a LayerNorm over each
stack's embedding sum (``model.embed_norm``), GELU, learned positions (a table per stack;
transformers keeps two rows before position 0, its offset 2, which the import leaves out) and a
``final_logits_bias`` (``model.output_bias``). Its layers have Marian's parameter names, and its
vocabulary, tokenizer and languages are NLLB's (:mod:`.m2m100`): fairseq's ids with <s> and
<pad> swapped, the language codes (``fr_XX``) control pieces, the source's code first and the
target's forced as the first output token (``decode.src_lang``/``decode.tgt_lang``).

The export reads the same tables the other way (:mod:`.m2m100`'s export, with :data:`EXTRA`):
the position tables get back their two rows before position 0, as zeros (the import does not keep
them, and transformers never reads them: positions start at row 2 whatever the padding), so an
imported model exports to the tensors it came from, bit for bit, those four rows aside; a model
without ``output_bias`` exports a zero ``final_logits_bias``.

Not supported (one-line errors): mBART-25's tokenizer (``MBartTokenizer``: the code after </s>,
and decoding from the target's code), a decoder that starts from another token than </s>.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from .hf import HFExport, HFImport, HFImportError
from .m2m100 import (FIXED, TIED, M2MVocab, fairseq_hf_config, fairseq_incompatibilities, fairseq_options,
                     fairseq_order, fairseq_tokenizer_checks, fairseq_tokenizer_problem, m2m_state_dict, m2m_tokenizer,
                     our_m2m_state, write_fairseq_tokenizer)

# Our parameters that M2M-100 lacks -> mBART's, and the rows of theirs that are ours
OFFSET = 2  # transformers' two rows before position 0
EXTRA = {f"{ours}_embed.{part}": f"model.{stack}.{theirs}"
         for ours, stack in (("src", "encoder"), ("tgt", "decoder"))
         for part, theirs in (("norm.weight", "layernorm_embedding.weight"), ("norm.bias", "layernorm_embedding.bias"),
                              ("positions.weight", "embed_positions.weight"))}


def mbart_model_config(config: dict, where: Path, state: dict[str, Tensor], vocab: M2MVocab) -> ModelConfig:
    """Our ModelConfig for an MBartConfig (as a dict)."""
    return ModelConfig(**fairseq_options(config, where, state, vocab, activation="gelu"), positions="learned",
                       embed_norm=True, output_bias=True, scale_embeddings=bool(config.get("scale_embedding", False)))


def our_mbart_state(state: dict[str, Tensor], cfg: ModelConfig, vocab: M2MVocab, where: Path) -> dict[str, Tensor]:
    """mBART's tensors under our names: M2M-100's (:func:`~.m2m100.our_m2m_state`) and
    :data:`EXTRA` (the position tables from row :data:`OFFSET`), the output bias in our order."""
    missing = [theirs for theirs in EXTRA.values() if theirs not in state]
    if missing:
        raise HFImportError(f"{where}: mBART weights lack tensor {missing[0]}")
    ours = our_m2m_state(state, cfg, vocab, where)
    ours.update({k: state[theirs][OFFSET:] if k.endswith("positions.weight") else state[theirs]
                 for k, theirs in EXTRA.items()})
    bias = state.get("final_logits_bias")
    ours["output_proj.bias"] = bias[0][vocab.order] if bias is not None else ours["src_embed.tokens.weight"].new_zeros(
        cfg.tgt_vocab_size)
    return {k: v.contiguous() for k, v in ours.items()}


IMPORT = HFImport(M2MVocab, mbart_model_config, our_mbart_state, m2m_tokenizer,
                  lambda vocab: "MBartForConditionalGeneration", lambda vocab: (vocab.order, vocab.order), FIXED,
                  "transduce maps fairseq's special ids, decoding from </s>")


def mbart_state_dict(model: nn.Module, order: Tensor) -> dict[str, Tensor]:
    """Our weights under MBartForConditionalGeneration's names: M2M-100's
    (:func:`~.m2m100.m2m_state_dict`), :data:`EXTRA` with :data:`OFFSET` zero rows before each
    position table, and the output bias (or zeros) as ``final_logits_bias``, in the exported order."""
    cfg, ours = model.config, model.state_dict()
    state = m2m_state_dict(model, order)
    for k, theirs in EXTRA.items():
        t = ours[k].detach().float()
        state[theirs] = torch.cat([t.new_zeros(OFFSET, cfg.d_model), t]) if k.endswith("positions.weight") else t
    bias = model.output_proj.bias.detach().float()[torch.argsort(order)] if cfg.output_bias else torch.zeros(
        cfg.tgt_vocab_size)
    state["final_logits_bias"] = bias[None]
    return {k: v.contiguous() for k, v in state.items()}


EXPORT = HFExport("mBART", lambda cfg: "MBartForConditionalGeneration",
                  lambda cfg: fairseq_incompatibilities(cfg, "mBART", {"positions": "learned", "embed_norm": True}),
                  lambda cfg, order: fairseq_hf_config(cfg, "MBart"), mbart_state_dict, write_fairseq_tokenizer,
                  fairseq_tokenizer_problem, lambda cfg, tok: fairseq_order(cfg.tgt_vocab_size), tied=TIED,
                  checks=fairseq_tokenizer_checks)
