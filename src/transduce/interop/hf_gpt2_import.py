"""Import a Hugging Face ``GPT2LMHeadModel`` directory as a transduce language model: the inverse
of :mod:`transduce.interop.hf_gpt2`, reached from :func:`~transduce.interop.hf_import.import_hf` when
config.json says ``model_type: gpt2``.

Weights. GPT-2 (Radford et al., 2019) is our :class:`~transduce.model.DecoderOnlyLM` with pre-LN
blocks, learned positions, the tanh GELU, biases, a tied output and unscaled embeddings. Its
``Conv1D`` layers store weights (in, out), the transpose of ``nn.Linear``, and its ``c_attn``
holds q, k and v side by side (width 3D): split and transposed back. GPT-2 options transduce
cannot express (an untied head, attention scaled by the inverse layer index, no scaling) are
one-line errors naming the key.

Tokenizer. GPT-2's byte-level BPE ``tokenizer.json`` is carried verbatim
(:class:`~transduce.data.hf_tokenizer.HFTokenizer`), and its ids are the model's: no reordering
(unlike Marian's). ``<|endoftext|>`` is bos, eos and pad at once, as in GPT-2. GPT-2's tokenizer
does not put it before a text (``add_bos_token`` false), so ``tokenizer.yaml`` records that and
:class:`~transduce.inference.Generator` prompts the import without it, as transformers does.

Verified before anything is written: logits within 1e-4 of transformers' on a probe batch, greedy
continuations identical on 100 prompts (through :func:`~transduce.inference.search.lm.generate_ids`,
the code ``transduce generate`` runs), ids identical to ``AutoTokenizer``'s on sample text, and
BOS first or not as ``AutoTokenizer`` puts it.

Legend: D d_model, V vocabulary, P max_positions.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor

from ..config import GenerationConfig, ModelConfig
from ..data.hf_tokenizer import HFTokenizer
from ..errors import ConfigError, DataError, require
from ..inference.search.lm import generate_ids
from ..model import DecoderOnlyLM, save_model
from ..model.io import load_state_checked
from .base import staging_dir, torch_threads
from .hf_gpt2 import GPT2_CONV1D, GPT2_NORMS, hf_tokenizer_differences, probe_prompts
from .hf_read import HFImportError, load_hf_model, read_weights, refuse_unsupported
from .verify import check_close

logger = logging.getLogger(__name__)

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "silu": "silu"}
# GPT2Config keys whose non-default values transduce cannot express, and the default.
REFUSED = {"scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "tie_word_embeddings": True,
           "add_cross_attention": False}


def import_gpt2(where: Path, config: dict, out, force: bool = False) -> dict[str, object]:
    """:func:`~transduce.interop.hf_import.import_hf` for a GPT2LMHeadModel directory ``where``
    whose config.json holds ``config``."""
    try:
        tokenizer = HFTokenizer.from_hf_dir(where)
    except DataError as e:
        raise HFImportError(str(e)) from None
    state = read_weights(where)
    cfg = gpt2_model_config(config, where, tokenizer)
    model = DecoderOnlyLM(cfg)
    load_state_checked(model, our_gpt2_state(state, cfg, where), f"{where} (mapped to transduce)")
    model.eval()
    with staging_dir(out, force) as tmp, torch_threads(1):
        save_model(model, tmp)
        tokenizer.save(tmp)
        checks = verify_gpt2_import(model, where, tokenizer)
    logger.info("imported %s into %s (%s)", where, out, ", ".join(f"{k}={v}" for k, v in checks.items()))
    return checks


def _key(config: dict, where: Path, name: str):
    if name not in config:
        raise HFImportError(f"{where / 'config.json'}: missing key {name!r}")
    return config[name]


def gpt2_model_config(config: dict, where: Path, tokenizer: HFTokenizer) -> ModelConfig:
    """The :class:`ModelConfig` of a GPT2Config dict; a one-line error for what we cannot express."""
    refuse_unsupported(config, where / "config.json", REFUSED, "transduce's GPT has")
    act = config.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise HFImportError(f"{where / 'config.json'}: activation_function={act!r} is not supported "
                            f"(one of {sorted(ACTIVATIONS)})")
    vocab, d = int(_key(config, where, "vocab_size")), int(_key(config, where, "n_embd"))
    if tokenizer.vocab_size > vocab:
        raise HFImportError(f"{where}: tokenizer.json has {tokenizer.vocab_size} tokens, more than the model's "
                            f"vocab_size={vocab}")
    eos = config.get("eos_token_id")
    eos = tokenizer.eos_id if eos is None else int(eos)
    bos = config.get("bos_token_id")
    pad = config.get("pad_token_id")
    try:
        return ModelConfig(
            arch="decoder_only", src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d,
            n_heads=int(_key(config, where, "n_head")), n_encoder_layers=0,
            n_decoder_layers=int(_key(config, where, "n_layer")), d_ff=int(config.get("n_inner") or 4 * d),
            max_positions=int(_key(config, where, "n_positions")), norm="pre", positions="learned",
            activation=ACTIVATIONS[act], scale_embeddings=False, tie_output=True, bias=True,
            dropout=float(config.get("resid_pdrop", 0.1)), attention_dropout=float(config.get("attn_pdrop", 0.1)),
            layer_norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
            bos_id=tokenizer.bos_id if bos is None else int(bos), eos_id=eos,
            pad_id=tokenizer.pad_id if pad is None else int(pad))
    except ConfigError as e:
        raise HFImportError(f"{where / 'config.json'}: not a shape transduce can build ({e})") from None


def _linear(state: dict[str, Tensor], name: str, ours: list[str], where: Path) -> dict[str, Tensor]:
    """A GPT-2 Conv1D (weight (in, out), bias (out,)) as nn.Linear(s) of equal widths: ``ours``
    are their names, side by side in the Conv1D's output columns."""
    try:
        weight, bias = state[f"{name}.weight"], state[f"{name}.bias"]
    except KeyError as e:
        raise HFImportError(f"{where}: GPT-2 weights lack tensor {e.args[0]}") from None
    if weight.dim() != 2 or weight.shape[1] % len(ours) or bias.shape != weight.shape[1:]:
        raise HFImportError(f"{where}: {name}.weight has shape {tuple(weight.shape)}, not (in, {len(ours)} x out)")
    out = {}
    for part, w, b in zip(ours, weight.t().chunk(len(ours)), bias.chunk(len(ours))):  # (out, in) each
        out[f"{part}.weight"], out[f"{part}.bias"] = w.contiguous(), b.contiguous()
    return out


def our_gpt2_state(state: dict[str, Tensor], cfg: ModelConfig, where: Path) -> dict[str, Tensor]:
    """GPT2LMHeadModel (or GPT2Model) weights under our parameter names."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    head = state.pop("lm_head.weight", None)
    if head is not None and "wte.weight" in state and not torch.equal(head, state["wte.weight"]):
        raise HFImportError(f"{where}: lm_head.weight differs from transformer.wte.weight (an untied head is "
                            "not supported)")
    ours = {"tgt_embed.tokens.weight": state.get("wte.weight"), "tgt_embed.positions.weight": state.get("wpe.weight"),
            "decoder_norm.weight": state.get("ln_f.weight"), "decoder_norm.bias": state.get("ln_f.bias")}
    missing = [k for k, v in ours.items() if v is None]
    if missing:
        raise HFImportError(f"{where}: GPT-2 weights lack the tensor for {missing[0]}")
    for i in range(cfg.n_decoder_layers):  # the export's table (hf_gpt2), read the other way
        p, q = f"h.{i}", f"decoder_layers.{i}"
        for theirs, mine in GPT2_NORMS.items():
            for kind in ("weight", "bias"):
                ours[f"{q}.{mine}.{kind}"] = state.get(f"{p}.{theirs}.{kind}")
        for theirs, parts in GPT2_CONV1D.items():
            ours.update(_linear(state, f"{p}.{theirs}", [f"{q}.{part}" for part in parts], where))
    missing = [k for k, v in ours.items() if v is None]
    if missing:
        raise HFImportError(f"{where}: GPT-2 weights lack the tensor for {missing[0]}")
    extra = sorted(k for k in state if k.startswith("h.") and int(k.split(".")[1]) >= cfg.n_decoder_layers)
    if extra:
        raise HFImportError(f"{where}: weights hold {extra[0]}, beyond the config's n_layer={cfg.n_decoder_layers}")
    return ours


@torch.no_grad()
def verify_gpt2_import(model: DecoderOnlyLM, where: Path, tokenizer: HFTokenizer, atol: float = 1e-4,
                       n_prompts: int = 100) -> dict[str, object]:
    """Our model against transformers' on ``where``: logits within ``atol`` on a probe batch,
    identical greedy continuations of ``n_prompts`` prompts, and identical tokenization (BOS first
    or not included)."""
    transformers = require("transformers", "export", "transduce import")
    hf = load_hf_model(transformers.GPT2LMHeadModel, where)
    cfg = model.config
    length = max(2, min(7, cfg.max_positions - 1))
    probe = probe_prompts(cfg, length=length)                                      # (B, T)
    got = hf(input_ids=probe, attention_mask=torch.ones_like(probe)).logits        # (B, T, V)
    checks: dict[str, object] = {"max_logit_diff": check_close("GPT-2 logits", got, model(probe), atol)}
    prompts = probe_prompts(cfg, batch=n_prompts, length=max(2, min(5, cfg.max_positions - 1)), seed=1)
    new = min(12, cfg.max_positions - prompts.shape[1])
    want = generate_ids(model, prompts, GenerationConfig(max_new_tokens=new, temperature=0))
    gen = hf.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                      do_sample=False, num_beams=1, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
                      suppress_tokens=list(cfg.never_generated) or None)
    rows = [row[prompts.shape[1]:].tolist() for row in gen]
    theirs = [r[:r.index(cfg.eos_id)] if cfg.eos_id in r else r for r in rows]
    differences = sum(a != b for a, b in zip(theirs, want))
    if differences:
        raise HFImportError(f"verification failed: greedy output differs from transformers' in {differences} of "
                            f"{len(want)} prompts")
    checks["greedy_differences"], checks["greedy_prompts"] = differences, len(want)
    checks["tokenizer_differences"] = hf_tokenizer_differences(tokenizer, where, HFImportError)
    checks["add_bos_token"] = check_bos_first(tokenizer, where)
    return checks


def check_bos_first(tokenizer: HFTokenizer, where: Path) -> bool:
    """``tokenizer.add_bos_token``, checked against whether ``AutoTokenizer`` on ``where`` puts BOS
    before a text (a one-line HFImportError if they differ: our prompts would not be transformers')."""
    auto = require("transformers", "export", "transduce import").AutoTokenizer.from_pretrained(where)
    theirs = auto("a")["input_ids"][:1] == [tokenizer.bos_id]
    if theirs != tokenizer.add_bos_token:
        raise HFImportError(f"verification failed: AutoTokenizer on {where} {'puts' if theirs else 'does not put'} "
                            f"BOS before a text, unlike ours (add_bos_token={tokenizer.add_bos_token})")
    return theirs

