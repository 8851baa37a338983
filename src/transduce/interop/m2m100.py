"""M2M-100 (Fan et al., 2021, https://arxiv.org/abs/2010.11125) and NLLB-200 (NLLB Team, 2022,
https://arxiv.org/abs/2207.04672) as Hugging Face writes them: a ``model_type: m2m_100``
directory (``M2M100ForConditionalGeneration``: config.json, weights, sentencepiece.bpe.model and
the tokenizer's files, NLLB's ``NllbTokenizer`` or M2M-100's ``M2M100Tokenizer``) into our
:class:`~transduce.model.Transformer`: :data:`IMPORT`, which :func:`~transduce.interop.hf.import_family`
runs, and back (:data:`EXPORT`, which :func:`~transduce.interop.hf.export_family` runs for a model
with ``model.positions: fairseq``).

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

Export. The same tables read the other way, the vocabulary rows put back in fairseq's order, and
the tokenizer written again as the original's kind, chosen by how the language codes are spelled
(:data:`TOKENIZER_CLASSES`): sentencepiece.bpe.model in fairseq's layout (<unk>, <s>, </s>, then
the text's pieces with their scores), M2M-100's vocab.json, and the files transformers' own class
writes over them (tokenizer.json, tokenizer_config.json naming the codes), checked to give every
id of ours back (:func:`fairseq_tokenizer_checks`). An imported model exports to the tensors it
was imported from, bit for bit, but for two that transformers never reads and the import drops:
mBART's two position rows before position 0 (zeros, :mod:`.mbart`) and, without
``tie_word_embeddings``, ``model.shared`` (written as the encoder's embedding, as transformers 4
wrote it; transformers 5 keeps a tensor of its own there, unused). Options these models cannot
express (post-LN, biases off, a decoder start other than </s>, a tokenizer without language codes)
are refused with one line naming the option.

Examples:
    >>> from transduce.interop import import_hf
    >>> checks = import_hf("nllb-200-distilled-600M", "runs/nllb")       # doctest: +SKIP
    >>> checks["max_logit_diff"] < 1e-4                                  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..data.tokenizer import LANG_CODE, Tokenizer
from ..errors import one_line, require
from .base import ExportError, head_width_problems, no_progress_bars
from .hf import HFExport, HFImport, HFImportError, read_json, rewrite_spm
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


def fairseq_order(n_rows: int) -> Tensor:
    """The Hugging Face (fairseq) id of each of our ids: <s> and <pad> swapped, the rest the same
    (its own inverse)."""
    return torch.tensor([1, 0, 2, 3, *range(4, n_rows)])


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
        self.order = fairseq_order(n_rows)
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


# ---- export ---------------------------------------------------------------------------------------

# Our FFN activations under M2M100Config's and MBartConfig's names
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu"}
# The options both families have (our ModelConfig's key -> its only value there)
FAIRSEQ_OPTIONS = {"arch": "encoder_decoder", "norm": "pre", "norm_kind": "layer", "bias": True,
                   "scale_attention": True, "scale_output": False, "bos_in_softmax": True, "layer_norm_eps": LN_EPS,
                   "pad_id": 0, "bos_id": 2, "eos_id": 2}
# The tokenizer class an export writes, by how the model's language codes are spelled (LANG_CODE's
# groups, in order: __fr__, fra_Latn, fr_XX)
TOKENIZER_CLASSES = ("M2M100Tokenizer", "NllbTokenizer", "MBart50Tokenizer")
# The embeddings transformers ties to model.shared.weight under tie_word_embeddings (the export writes them all)
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def fairseq_incompatibilities(cfg: ModelConfig, family: str, wants: dict[str, object]) -> list[str]:
    """The options of ``cfg`` that ``family`` ("M2M-100", "mBART") cannot express, one phrase each:
    :data:`FAIRSEQ_OPTIONS` and the family's own ``wants`` (key -> its only value there)."""
    problems = [f"model.{k}={getattr(cfg, k)} ({family} has {k}={v})" for k, v in {**FAIRSEQ_OPTIONS, **wants}.items()
                if getattr(cfg, k) != v]
    if cfg.activation not in HF_ACTIVATIONS:
        problems.append(f"model.activation={cfg.activation} ({family}'s FFN is {', '.join(HF_ACTIVATIONS)})")
    if cfg.src_vocab_size != cfg.tgt_vocab_size:
        problems.append(f"model.src_vocab_size={cfg.src_vocab_size} and tgt_vocab_size={cfg.tgt_vocab_size} differ "
                        f"({family} has one vocabulary)")
    return problems + head_width_problems(cfg, family)


def fairseq_hf_config(cfg: ModelConfig, kind: str):
    """The M2M100Config or MBartConfig (``kind`` "M2M100", "MBart") of ``cfg``'s shape, in fairseq's
    special ids (:data:`FIXED`), all embeddings tied or none (``tie_word_embeddings``)."""
    transformers = require("transformers", "export")
    return getattr(transformers, f"{kind}Config")(
        vocab_size=cfg.tgt_vocab_size, d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers, encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=HF_ACTIVATIONS[cfg.activation],
        max_position_embeddings=cfg.max_positions, scale_embedding=cfg.scale_embeddings, dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
        tie_word_embeddings=cfg.share_embeddings and cfg.tie_output, **FIXED)


def m2m_state_dict(model: nn.Module, order: Tensor) -> dict[str, Tensor]:
    """Our weights under M2M100ForConditionalGeneration's names (:func:`name_map` read the other
    way), vocabulary rows in the exported order (``order``: the exported id of each of ours); the
    three embeddings each under its name and ``model.shared`` as the encoder's (transformers ties
    them all to it with ``tie_word_embeddings``)."""
    ours = model.state_dict()
    rows = torch.argsort(order)  # our id of each exported id
    src, tgt = model.src_embed.tokens.weight[rows], model.tgt_embed.tokens.weight[rows]
    state = {theirs: ours[k] for k, theirs in name_map(model.config).items()}
    state.update({"model.shared.weight": src, "model.encoder.embed_tokens.weight": src,
                  "model.decoder.embed_tokens.weight": tgt, "lm_head.weight": model.output_proj.weight[rows]})
    return {k: v.detach().float().contiguous() for k, v in state.items()}


def _codes(tok: Tokenizer) -> list[tuple[int, str, str]]:
    """The tokenizer's language codes, in id order: (our id, piece, name: ``fra_Latn``, ``fr``, ``fr_XX``)."""
    named = sorted((i, name) for name, i in tok.lang_codes.items())
    return [(i, piece, name) for (i, name), piece in zip(named, tok.pieces([i for i, _ in named]))]


def _tokenizer_classes(tok: Tokenizer) -> set[str]:
    """The tokenizer classes whose codes ``tok`` holds (:data:`TOKENIZER_CLASSES`): one, or none or mixed."""
    return {TOKENIZER_CLASSES[LANG_CODE.fullmatch(piece).lastindex - 1] for _, piece, _ in _codes(tok)}


def fairseq_tokenizer_problem(tok, cfg: ModelConfig) -> str | None:
    """Why ``tok`` cannot be written as an NLLB, M2M-100 or mBART-50 tokenizer, or None."""
    if not isinstance(tok, Tokenizer) or not tok.joint or tok.src_vocab_size != cfg.tgt_vocab_size:
        return (f"the tokenizer must be one SentencePiece model of the model's {cfg.tgt_vocab_size} ids (as an "
                "imported NLLB, M2M-100 or mBART-50 has)")
    classes = _tokenizer_classes(tok)
    if len(classes) != 1:
        return ("the tokenizer holds " + ("no language codes" if not classes else "language codes of several kinds")
                + " (transduce writes NLLB's fra_Latn, M2M-100's __fr__ or mBART-50's fr_XX as their tokenizers)")
    return None


def fairseq_spm(tok: Tokenizer, order: Tensor) -> bytes:
    """Our SentencePiece model in fairseq's layout: <unk>, <s>, </s>, then the text's pieces (not the
    language codes, <mask> or unused rows) in the exported ids' order, with their scores, types and
    the normalizer; fairseq's special ids (no pad)."""
    pb = require("sentencepiece.sentencepiece_model_pb2", "export")
    ours = pb.ModelProto()
    ours.ParseFromString(tok.protos[0])
    kind = pb.ModelProto.SentencePiece
    out = pb.ModelProto()
    out.CopyFrom(ours)
    del out.pieces[:]
    for piece, ptype in (("<unk>", kind.UNKNOWN), ("<s>", kind.CONTROL), ("</s>", kind.CONTROL)):
        out.pieces.add(piece=piece, score=0.0, type=ptype)
    text = (kind.NORMAL, kind.USER_DEFINED, kind.BYTE)
    out.pieces.extend(p for p in (ours.pieces[i] for i in torch.argsort(order).tolist()) if p.type in text)
    spec = out.trainer_spec
    spec.vocab_size = len(out.pieces)
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = 0, 1, 2, -1
    spec.unk_piece, spec.bos_piece, spec.eos_piece, spec.pad_piece = "<unk>", "<s>", "</s>", "<pad>"
    return out.SerializeToString()


def _m2m_code_list(names: list[str]) -> str:
    """M2M100Tokenizer's ``language_codes`` ("m2m100", "wmt21") whose list is ``names``, in order."""
    lists = require("transformers.models.m2m_100.tokenization_m2m_100", "export").FAIRSEQ_LANGUAGE_CODES
    for key, codes in lists.items():
        if list(codes) == names:
            return key
    raise ExportError(f"the model's {len(names)} M2M-100 language codes ({', '.join(names[:3])}, ...) are not "
                      f"M2M100Tokenizer's {' or '.join(lists)} list")


def write_fairseq_tokenizer(model_dir: Path, tok: Tokenizer, out: Path, cfg: ModelConfig, order: Tensor) -> None:
    """The original's kind of tokenizer (:data:`TOKENIZER_CLASSES`, by the codes' spelling):
    sentencepiece.bpe.model in fairseq's layout (:func:`fairseq_spm`), M2M-100's vocab.json (each
    exported id's piece up to the first code), then the files transformers' class writes over them,
    naming the language codes."""
    transformers = require("transformers", "export")
    (name,), codes = _tokenizer_classes(tok), _codes(tok)
    names = [code for _, _, code in codes]
    (out / SPM).write_bytes(fairseq_spm(tok, order))
    options: dict[str, object] = {"src_lang": next((c for c in ("eng_Latn", "en", "en_XX") if c in names), names[0])}
    if name == "M2M100Tokenizer":
        first = int(order[codes[0][0]])
        pieces = tok.pieces(torch.argsort(order)[:first].tolist())
        (out / "vocab.json").write_text(json.dumps(dict(zip(pieces, range(first))), ensure_ascii=False, indent=1),
                                        encoding="utf-8")
        options["language_codes"] = _m2m_code_list(names)
    elif name == "NllbTokenizer":
        options["additional_special_tokens"] = [piece for _, piece, _ in codes]
    with no_progress_bars(transformers):
        getattr(transformers, name).from_pretrained(out, **options).save_pretrained(out)


def fairseq_tokenizer_checks(model, tok: Tokenizer, out: Path, hf, order: Tensor) -> dict[str, object]:
    """AutoTokenizer on ``out`` against ours (``order``: the exported id of each of ours): each of its
    ids has our piece of that id; :data:`TOKENIZER_TEXTS` get our ids, with the source's code first
    and </s> last. ``tokenizer_differences`` 0, or a one-line ExportError naming the first difference."""
    auto = require("transformers", "export").AutoTokenizer.from_pretrained(out)
    pieces = tok.pieces(torch.argsort(order).tolist())
    wrong = sorted((i, piece) for piece, i in auto.get_vocab().items()
                   if not 0 <= i < len(pieces) or pieces[i] != piece)
    if wrong:
        raise ExportError(f"verification failed: AutoTokenizer on {out} has {wrong[0][1]!r} at id {wrong[0][0]}, "
                          "not transduce's piece of that id")
    code, _, lang = _codes(tok)[0]
    auto.src_lang = lang
    for text in TOKENIZER_TEXTS:
        want = order[[code, *tok.encode(text, "src"), model.config.eos_id]].tolist()
        if auto(text)["input_ids"] != want:
            raise ExportError(f"verification failed: AutoTokenizer on {out} reads {text!r} into other ids than ours")
    return {"tokenizer_differences": 0}


EXPORT = HFExport("M2M-100", lambda cfg: "M2M100ForConditionalGeneration",
                  lambda cfg: fairseq_incompatibilities(cfg, "M2M-100", {"positions": "fairseq", "embed_norm": False,
                                                                         "output_bias": False}),
                  lambda cfg, order: fairseq_hf_config(cfg, "M2M100"), m2m_state_dict, write_fairseq_tokenizer,
                  fairseq_tokenizer_problem, lambda cfg, tok: fairseq_order(cfg.tgt_vocab_size), tied=TIED,
                  checks=fairseq_tokenizer_checks)
