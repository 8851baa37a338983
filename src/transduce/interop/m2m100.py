"""M2M-100 (Fan et al., 2021, https://arxiv.org/abs/2010.11125) and NLLB-200 (NLLB Team, 2022,
https://arxiv.org/abs/2207.04672) as Hugging Face writes them: a ``model_type: m2m_100``
directory (``M2M100ForConditionalGeneration``: config.json, weights, sentencepiece.bpe.model and
the tokenizer's files, NLLB's ``NllbTokenizer`` or M2M-100's ``M2M100Tokenizer``) into our
:class:`~transduce.model.Transformer`: :data:`IMPORT`, which :func:`~transduce.interop.hf.import_family`
runs (export back is not written yet).

Both are fairseq's pre-LN Transformer with a final LayerNorm per stack (``model.norm: pre``),
ReLU, embeddings scaled by sqrt(d_model), one embedding for both stacks and the output (each its
own without ``tie_word_embeddings``), and fairseq's sinusoidal positions (``model.positions:
fairseq``: sines then cosines, positions counted from 2). The layers' parameters have Marian's
names (:func:`~.marian.marian_name_map`, with no channel permutation here: the position table is
fairseq's own); :data:`STACKS` names the rest. Options the config can carry are mapped
(``scale_embedding``, ``activation_function``, tied or untied embeddings) or refused with one
line naming the key.

Vocabulary. transduce fixes pad 0, bos 1, eos 2, unk 3; fairseq has <s> 0, <pad> 1, </s> 2,
<unk> 3 and starts decoding from </s> (``decoder_start_token_id`` 2). Our ids are theirs with
<s> and <pad> swapped (``order[i]``, the Hugging Face id of our id i), and the imported model's
decoder starts from eos (``model.bos_id: 2``), as theirs: no row is added. The tokenizer is
sentencepiece.bpe.model rewritten so that its piece ids are ours (NLLB: SentencePiece's ids + 1;
M2M-100: vocab.json's), the language codes (``fra_Latn``; ``__fr__``) kept as control pieces,
which text never segments to (:attr:`~transduce.data.tokenizer.Tokenizer.lang_codes`), and rows
of the embedding beyond the tokenizer as unused pieces.

Languages: the source's code first, then the text and </s> (the tokenizers' default;
``legacy_behaviour: true``, the code last, is refused), and the target's code forced as the first
output token (transformers' ``forced_bos_token_id``): ``decode.src_lang`` and ``decode.tgt_lang``
(``translate --src-lang eng_Latn --tgt-lang fra_Latn``; :func:`~transduce.data.multilingual.code_ids`).

Examples:
    >>> from transduce.interop import import_hf
    >>> checks = import_hf("nllb-200-distilled-600M", "runs/nllb")       # doctest: +SKIP
    >>> checks["max_logit_diff"] < 1e-4                                  # doctest: +SKIP
    True
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.tokenizer import LANG_CODE, Tokenizer
from ..errors import one_line, require
from .base import no_progress_bars
from .hf import HFImport, HFImportError, read_json, rewrite_spm
from .marian import marian_name_map

SPM = "sentencepiece.bpe.model"
LN_EPS = 1e-5  # nn.LayerNorm's default, which M2M100's layers use without a config key
# M2M100Config's activation_function -> ours
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
# M2M100Config keys whose other values transduce cannot express, and the value it maps
FIXED = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
         "is_encoder_decoder": True}
# Our parameters outside the layers -> M2M100ForConditionalGeneration's (the layers: marian_name_map)
STACKS = {f"{stack}_norm.{leaf}": f"model.{stack}.layer_norm.{leaf}"
          for stack in ("encoder", "decoder") for leaf in ("weight", "bias")}
# Texts whose ids the import checks against transformers' tokenizer: runs of spaces, tabs, accents,
# CJK, emoji, a control character, empty lines. None ends in whitespace: there NLLB's tokenizer in
# transformers (tokenizer.json) writes a lone "▁" piece that SentencePiece, which the model was
# trained with, drops (as ours does).
TOKENIZER_TEXTS = ["A dog runs across the grass.", "Zwei Männer  sitzen\tauf einer Bank.", "", "   leading spaces",
                   "Café naïve 東京 👍🏽 \x07 déjà-vu", "line one\n\nline three", "Ein Hund läuft über die Straße 🐕."]


def name_map(cfg: ModelConfig) -> dict[str, str]:
    """Every one of our parameters but the embeddings and output -> its M2M-100 name."""
    return {**{ours: theirs for ours, (theirs, _) in marian_name_map(cfg).items()}, **STACKS}


class M2MVocab:
    """The model's ids: the piece of each Hugging Face id (the tokenizer's; ``<unused_N>`` for
    the embedding's rows beyond it), ``order`` (the Hugging Face id of each of our ids: theirs
    with <s> and <pad> swapped), transformers' tokenizer (``hf``) and whether config.json ties the
    embeddings (``tied``)."""

    def __init__(self, where: Path, config: dict):
        if not (where / SPM).is_file():
            raise HFImportError(f"{where / SPM}: not found (the SentencePiece model of an NLLB, M2M-100 or "
                                "mBART-50 directory)")
        if not any((where / f).is_file() for f in ("tokenizer.json", "vocab.json")):
            raise HFImportError(f"{where}: no tokenizer.json (NLLB's, mBART-50's tokenizer) or vocab.json "
                                f"(M2M-100's) beside {SPM}")
        tok_config = where / "tokenizer_config.json"
        if tok_config.is_file() and read_json(tok_config).get("legacy_behaviour"):
            raise HFImportError(f"{tok_config}: legacy_behaviour=true (the language code after </s>) is not supported "
                                "(transduce puts the source's code first)")
        transformers = require("transformers", "export", "transduce import")
        try:
            with no_progress_bars(transformers):
                self.hf = transformers.AutoTokenizer.from_pretrained(where)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise HFImportError(f"{where}: transformers cannot load its tokenizer ({one_line(e)})") from None
        prefix, suffix = getattr(self.hf, "prefix_tokens", []), getattr(self.hf, "suffix_tokens", [])
        if len(prefix) != 1 or suffix != [2]:
            raise HFImportError(f"{where}: {type(self.hf).__name__} writes {prefix} + text + {suffix}; transduce reads "
                                "a source as its language code, the text and </s> (2)")
        n_rows = int(config["vocab_size"])
        ids = {**self.hf.get_vocab(), **getattr(self.hf, "lang_token_to_id", {})}  # (M2M100Tokenizer's codes)
        self.pieces = [f"<unused_{i}>" for i in range(n_rows)]
        for piece, i in ids.items():
            if not 0 <= i < n_rows:
                raise HFImportError(f"{where}: the tokenizer's {piece!r} has id {i}, beyond the model's "
                                    f"vocab_size={n_rows}")
            self.pieces[i] = piece
        if self.pieces[:4] != ["<s>", "<pad>", "</s>", "<unk>"]:
            raise HFImportError(f"{where}: the tokenizer's first ids are {self.pieces[:4]}, not fairseq's <s>, <pad>, "
                                "</s>, <unk>")
        self.order = torch.tensor([1, 0, 2, 3, *range(4, n_rows)])
        self.tied = bool(config.get("tie_word_embeddings", True))


def embeddings(state: dict[str, Tensor], tied: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The encoder's and decoder's embeddings and the output projection, as transformers reads
    them: with ``tie_word_embeddings`` (the default) all three are ``model.shared``; without, each
    its own tensor (transformers 5 unties them all; 4 wrote the shared one under each name)."""
    def get(*names: str) -> Tensor:
        for key in names:
            if key in state:
                return state[key]
        raise HFImportError(f"M2M-100 weights: missing tensor {names[0]}")

    if tied:
        shared = get("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
        return shared, shared, shared
    return (get("model.encoder.embed_tokens.weight", "model.shared.weight"),
            get("model.decoder.embed_tokens.weight", "model.shared.weight"), get("lm_head.weight"))


def fairseq_options(config: dict, where: Path, state: dict[str, Tensor], vocab: M2MVocab,
                    activation: str = "relu") -> dict[str, object]:
    """The ModelConfig keys a fairseq-style config (M2M100Config, MBartConfig, as a dict) gives:
    the shape, dropouts, activation (``activation`` unless set), sharing and tying as its weights
    are, and decoding from </s> (our ``bos_id`` 2, as theirs)."""
    name = where / "config.json"
    for ours, (enc, dec) in {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim")}.items():
        if config.get(enc) != config.get(dec):
            raise HFImportError(f"{name}: {enc}={config.get(enc)} and {dec}={config.get(dec)} differ "
                                f"(transduce has one model.{ours})")
    activation = config.get("activation_function", activation)
    if activation not in ACTIVATIONS:
        raise HFImportError(f"{name}: activation_function={activation!r} is not supported "
                            f"(one of {', '.join(ACTIVATIONS)})")
    src, tgt, head = embeddings(state, vocab.tied)
    return dict(
        src_vocab_size=len(vocab.order), tgt_vocab_size=len(vocab.order), d_model=int(config["d_model"]),
        n_heads=int(config["encoder_attention_heads"]), n_encoder_layers=int(config["encoder_layers"]),
        n_decoder_layers=int(config["decoder_layers"]), d_ff=int(config["encoder_ffn_dim"]),
        dropout=float(config.get("dropout", 0.1)), attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)), activation=ACTIVATIONS[activation],
        norm="pre", max_positions=int(config.get("max_position_embeddings", 1024)),
        share_embeddings=torch.equal(src, tgt), tie_output=torch.equal(head, tgt), layer_norm_eps=LN_EPS, bos_id=2)


def m2m_model_config(config: dict, where: Path, state: dict[str, Tensor], vocab: M2MVocab) -> ModelConfig:
    """Our ModelConfig for an M2M100Config (as a dict)."""
    options = fairseq_options(config, where, state, vocab)
    return ModelConfig(**{**options, "attention_dropout": float(config.get("attention_dropout", 0.1))},
                       positions="fairseq", scale_embeddings=bool(config.get("scale_embedding", True)))


def our_m2m_state(state: dict[str, Tensor], cfg: ModelConfig, vocab: M2MVocab, where: Path) -> dict[str, Tensor]:
    """M2M-100's tensors under our names (:func:`name_map`), vocabulary rows in our order."""
    missing = [theirs for theirs in name_map(cfg).values() if theirs not in state]
    if missing:
        raise HFImportError(f"{where}: M2M-100 weights lack tensor {missing[0]}")
    ours = {k: state[theirs] for k, theirs in name_map(cfg).items()}
    src, tgt, head = embeddings(state, vocab.tied)
    ours["src_embed.tokens.weight"] = src[vocab.order]
    if not cfg.share_embeddings:
        ours["tgt_embed.tokens.weight"] = tgt[vocab.order]
    if not cfg.tie_output:
        ours["output_proj.weight"] = head[vocab.order]
    return {k: v.contiguous() for k, v in ours.items()}


def m2m_tokenizer(where: Path, vocab: M2MVocab) -> tuple[Tokenizer, dict[str, object]]:
    """sentencepiece.bpe.model rewritten so that its ids are ours, the language codes control
    pieces; checked against transformers' tokenizer on :data:`TOKENIZER_TEXTS` (a one-line error
    naming a text it reads into other ids; the language code and </s> aside)."""
    pb = require("sentencepiece.sentencepiece_model_pb2", "export", "transduce import")
    rewritten, _ = rewrite_spm(where / SPM, vocab)
    proto = pb.ModelProto()
    proto.ParseFromString(rewritten)
    kind = pb.ModelProto.SentencePiece
    for piece in proto.pieces:
        if piece.type == kind.UNUSED and LANG_CODE.fullmatch(piece.piece):
            piece.type = kind.CONTROL
    tok = Tokenizer(proto.SerializeToString(), name=str(where))
    for text in TOKENIZER_TEXTS:
        if [int(vocab.order[i]) for i in tok.encode(text, "src")] != vocab.hf(text, add_special_tokens=False)[
                "input_ids"]:
            raise HFImportError(f"verification failed: {where}'s tokenizer splits {text!r} otherwise than its "
                                f"{SPM} rewritten for transduce")
    return tok, {"tokenizer_differences": 0}


IMPORT = HFImport(M2MVocab, m2m_model_config, our_m2m_state, m2m_tokenizer,
                  lambda vocab: "M2M100ForConditionalGeneration", lambda vocab: (vocab.order, vocab.order), FIXED,
                  "transduce maps fairseq's special ids, decoding from </s>")
