"""Import a Hugging Face BERT or RoBERTa directory (``BertForMaskedLM``, ``BertForPreTraining``,
``BertForSequenceClassification``, ``RobertaForMaskedLM``, ``RobertaForSequenceClassification``:
config.json, model.safetensors or pytorch_model.bin, and a vocabulary) as a transduce
encoder_only model, verified against transformers before anything is written.

The architecture is config.json's ``architectures[0]``. BERT and RoBERTa are our encoder_only
model with BERT's options (:mod:`~transduce.export.hf_bert`, whose name table :func:`bert_names`
this reads backwards); BertForPreTraining keeps its next-sentence head (``model.nsp``). RoBERTa
differs in three places, each mapped exactly:

- its position ids start at ``pad_token_id + 1`` (``create_position_ids_from_input_ids``): for
  right-padded rows, position i reads row ``pad + 1 + i``, so our table is RoBERTa's from that row
  (``max_positions`` that many fewer);
- its classification head is dropout, dense, tanh, dropout, out_proj on ``<s>``: BERT's pooler
  and classifier with the dropouts elsewhere (the same function when not training);
- its special ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3): reordered, below.

Vocabulary. transduce fixes its special ids (pad 0, bos 1, eos 2, unk 3) and an encoder_only
model's [MASK] is its last id. Our ids are the original's reordered::

    ours 0 = pad   1 = [CLS] / <s>   2 = [SEP] / </s>   3 = [UNK] / <unk>
    ours 4.. = every other id in order   ours V-1 = [MASK] / <mask>

(:attr:`BertVocab.order` holds the original id of each of ours). The special tokens' ids are read
from the directory's tokenizer.json, vocab.txt (BERT) or vocab.json (RoBERTa).

The tokenizer itself (WordPiece, byte-level BPE) is not carried yet: transduce's tokenizers are
SentencePiece. The imported directory holds the weights and config; commands that tokenize text
refuse it with a one-line error, ``export --format hf`` and training from ids work.

Not supported (one-line errors): another ``hidden_act`` than ``gelu``, relative position
embeddings, a decoder (``is_decoder``), an attention width that does not divide into the heads.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..errors import ConfigError, one_line, require
from ..model import EncoderOnly, save_model
from ..model.io import load_state_checked
from .base import staging_dir, torch_threads
from .hf_bert import bert_names, probe_inputs
from .hf_read import HFImportError, load_hf_model, read_weights
from .verify import check_close

logger = logging.getLogger(__name__)

# architecture -> (family, head): what an importable config.json names
ARCHITECTURES = {"BertForMaskedLM": ("bert", "mlm"), "BertForPreTraining": ("bert", "nsp"),
                 "BertForSequenceClassification": ("bert", "classify"),
                 "RobertaForMaskedLM": ("roberta", "mlm"), "RobertaForSequenceClassification": ("roberta", "classify")}
SPECIALS = {"bert": ("[CLS]", "[SEP]", "[UNK]", "[MASK]"), "roberta": ("<s>", "</s>", "<unk>", "<mask>")}


def bert_architecture(config: dict, where: Path) -> tuple[str, str, str]:
    """(architecture, family, head) of a BERT or RoBERTa config.json; a one-line error otherwise."""
    names = config.get("architectures") or []
    arch = names[0] if names else None
    if arch not in ARCHITECTURES:
        raise HFImportError(f"{where / 'config.json'}: architectures={names or None} is not importable for "
                            f"model_type={config.get('model_type')} (supported: {', '.join(ARCHITECTURES)})")
    return (arch, *ARCHITECTURES[arch])


class BertVocab:
    """The special ids of a BERT or RoBERTa vocabulary and ``order``: the original id of each of
    our ids (see the module docstring)."""

    def __init__(self, where: Path, family: str, n_rows: int, pad: int):
        tokens = _token_ids(where)
        cls, sep, unk, mask = SPECIALS[family]
        missing = [t for t in (cls, sep, unk, mask) if t not in tokens]
        if missing:
            raise HFImportError(f"{where}: the vocabulary lacks {', '.join(missing)}")
        ids = [tokens[t] for t in (cls, sep, unk, mask)]
        if max(ids + [pad]) >= n_rows or len({pad, *ids}) < 5:
            raise HFImportError(f"{where}: special ids pad={pad} {cls}={ids[0]} {sep}={ids[1]} {unk}={ids[2]} "
                                f"{mask}={ids[3]} are not distinct ids below vocab_size={n_rows}")
        first = [pad, *ids[:3]]
        rest = [i for i in range(n_rows) if i not in first and i != ids[3]]
        self.order = torch.tensor(first + rest + [ids[3]])


def _token_ids(where: Path) -> dict[str, int]:
    """Token -> id from tokenizer.json (its vocabulary and added tokens), vocab.txt or vocab.json."""
    try:
        if (where / "tokenizer.json").is_file():
            data = json.loads((where / "tokenizer.json").read_text(encoding="utf-8"))
            vocab = dict(data.get("model", {}).get("vocab") or {})
            return {**vocab, **{t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}}
        if (where / "vocab.txt").is_file():
            lines = (where / "vocab.txt").read_text(encoding="utf-8").split("\n")
            return {t: i for i, t in reversed(list(enumerate(lines))) if t}
        if (where / "vocab.json").is_file():
            return {t: int(i) for t, i in json.loads((where / "vocab.json").read_text(encoding="utf-8")).items()}
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError) as e:
        raise HFImportError(f"{where}: unreadable vocabulary ({one_line(e)})") from None
    raise HFImportError(f"{where}: no tokenizer.json, vocab.txt or vocab.json (the special tokens' ids come "
                        "from the vocabulary)")


def _check_supported(config: dict, name: Path) -> None:
    for key, want in (("hidden_act", "gelu"), ("position_embedding_type", "absolute"), ("is_decoder", False)):
        if config.get(key, want) != want:
            raise HFImportError(f"{name}: {key}={config[key]!r} is not supported (transduce maps {key}={want!r})")


def _model_config(config: dict, where: Path, family: str, head: str, tied: bool) -> tuple[ModelConfig, int]:
    """Our ModelConfig for a BertConfig / RobertaConfig (as a dict), and the first position row."""
    name = where / "config.json"
    _check_supported(config, name)
    try:
        offset = int(config["pad_token_id"]) + 1 if family == "roberta" else 0
        labels = ()
        if head == "classify":
            id2label = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}
            labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
        return ModelConfig(
            arch="encoder_only", src_vocab_size=int(config["vocab_size"]), tgt_vocab_size=int(config["vocab_size"]),
            d_model=int(config["hidden_size"]), n_heads=int(config["num_attention_heads"]),
            n_encoder_layers=int(config["num_hidden_layers"]), n_decoder_layers=0,
            d_ff=int(config["intermediate_size"]), dropout=float(config.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
            max_positions=int(config["max_position_embeddings"]) - offset, norm="post", positions="learned",
            activation="gelu", embed_norm=True, scale_embeddings=False,
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            type_vocab_size=int(config.get("type_vocab_size", 2)), n_classes=len(labels), labels=labels,
            nsp=head == "nsp", tie_output=tied, share_embeddings=True), offset
    except KeyError as e:
        raise HFImportError(f"{name}: missing key {e.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as e:
        raise HFImportError(f"{name}: does not map to a valid transduce config ({one_line(e)})") from None


def _is_tied(state: dict[str, Tensor], family: str, head: str) -> bool:
    """Whether the masked-LM decoder is the token embedding: absent, or equal."""
    if head == "classify":
        return True
    decoder = state.get("lm_head.decoder.weight" if family == "roberta" else "cls.predictions.decoder.weight")
    embedding = state.get(f"{family}.embeddings.word_embeddings.weight")
    return decoder is None or (embedding is not None and torch.equal(decoder, embedding))


def our_bert_state(state: dict[str, Tensor], cfg: ModelConfig, family: str, order: Tensor,
                   offset: int) -> dict[str, Tensor]:
    """The original's tensors under our names: vocabulary rows in our order, positions from row
    ``offset``; a tied decoder is the embedding (not loaded twice)."""
    ours = {}
    for name, theirs in bert_names(cfg, family).items():
        if name == "mlm_head.decoder.weight" and cfg.tie_output:
            continue
        if theirs not in state and theirs.endswith(".decoder.bias"):  # saved once, as the tied-to bias
            theirs = theirs.replace(".decoder.bias", ".bias")
        if theirs not in state:
            raise HFImportError(f"{family} weights lack tensor {theirs}")
        t = state[theirs]
        if name in ("embed.tokens.weight", "mlm_head.decoder.weight", "mlm_head.bias"):
            if t.shape[0] != len(order):
                raise HFImportError(f"{family} weights: {theirs} has {t.shape[0]} rows, but config.json's "
                                    f"vocab_size is {len(order)}")
            t = t[order]
        elif name == "embed.positions.weight":
            t = t[offset:]
        ours[name] = t.contiguous()
    return ours


def import_bert(where: Path, config: dict, out, force: bool = False) -> dict[str, object]:
    """:func:`~transduce.export.hf_import.import_hf` for a BERT or RoBERTa directory ``where``
    whose config.json holds ``config``."""
    arch, family, head = bert_architecture(config, where)
    state = read_weights(where)
    cfg, offset = _model_config(config, where, family, head, _is_tied(state, family, head))
    vocab = BertVocab(where, family, cfg.src_vocab_size, int(config.get("pad_token_id", 0)))
    model = EncoderOnly(cfg)
    load_state_checked(model, our_bert_state(state, cfg, family, vocab.order, offset), f"{where} (mapped to transduce)")
    model.eval()
    with staging_dir(out, force) as tmp, torch_threads(1):
        transformers = require("transformers", "export", "transduce import")
        checks = verify_bert_import(model, load_hf_model(getattr(transformers, arch), where), vocab.order)
        save_model(model, tmp)
    checks["tokenizer"] = "not carried (WordPiece / byte-level BPE not supported yet)"
    logger.info("imported %s (%s) into %s (%s)", where, arch, out, ", ".join(f"{k}={v}" for k, v in checks.items()))
    return checks


@torch.no_grad()
def verify_bert_import(model: EncoderOnly, hf, order: Tensor, atol: float = 1e-4) -> dict[str, object]:
    """The imported model against the transformers model on padded probes with token types: the
    heads' logits (masked-LM ones in our id order, at the non-pad positions) within ``atol``."""
    cfg = model.config
    ids, types = probe_inputs(cfg)                                       # (B, T) our ids
    keep = ids != cfg.pad_id                                             # (B, T)
    out = hf(input_ids=order[ids], attention_mask=keep.long(), token_type_ids=types)
    states = model(ids, types)
    if cfg.n_classes:
        return {"max_class_logit_diff": check_close("imported class logits", model.classify(states), out.logits,
                                                    atol)}
    mlm = out.prediction_logits if cfg.nsp else out.logits
    checks: dict[str, object] = {"max_logit_diff": check_close(
        "imported masked-LM logits", model.mlm_logits(states)[keep], mlm[..., order][keep], atol)}
    if cfg.nsp:
        checks["max_nsp_logit_diff"] = check_close("imported next-sentence logits",
                                                   model.next_sentence_logits(states), out.seq_relationship_logits,
                                                   atol)
    return checks
