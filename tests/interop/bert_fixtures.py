"""Random tiny Hugging Face BERT and RoBERTa directories with their tokenizers, as from the hub (no
hub access here): for the import tests and the classify demo on an import."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from hf_tokenizer_fixtures import HARD_CASES, byte_bpe_dir, wordpiece_dir
from toy_model import toy_pairs

CASES = {
    "BertForMaskedLM": dict(type_vocab_size=2),
    "BertForMaskedLM-untied": dict(type_vocab_size=2, tie_word_embeddings=False),
    "BertForPreTraining": dict(type_vocab_size=2),
    "BertForSequenceClassification": dict(type_vocab_size=2, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                          label2id={"neg": 0, "neu": 1, "pos": 2}),
    "RobertaForMaskedLM": dict(type_vocab_size=1),
    "RobertaForSequenceClassification": dict(type_vocab_size=1, num_labels=2),
}
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def bert_tokenizer_dirs(root: Path) -> dict[str, Path]:
    """BERT's WordPiece and RoBERTa's byte-level BPE trained on toy English (specials first:
    [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4; <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 4)."""
    lines = [en for en, _ in toy_pairs(600, 0)] + HARD_CASES
    return {"bert": wordpiece_dir(root / "bert", lines, vocab_size=300),
            "roberta": byte_bpe_dir(root / "roberta", lines, flavour="roberta", vocab_size=320)}


def build_hf(where: Path, case: str, tokenizer_dirs: dict[str, Path], seed: int = 0):
    """A random tiny transformers model of ``case`` saved in ``where`` with its tokenizer files;
    LayerNorms and biases perturbed so that none is the identity. Returns the model (eval)."""
    import transformers
    from transduce.data.hf_tokenizer import HFTokenizer

    arch = case.split("-")[0]
    family = "roberta" if arch.startswith("Roberta") else "bert"
    shutil.copytree(tokenizer_dirs[family], where)
    tok = HFTokenizer.from_hf_dir(where)
    options = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=42) \
        if family == "roberta" else dict(pad_token_id=0, max_position_embeddings=40)
    config = (transformers.RobertaConfig if family == "roberta" else transformers.BertConfig)(
        vocab_size=tok.vocab_size, **SHAPE, **options, **CASES[case])
    torch.manual_seed(seed)
    return perturbed_and_saved(getattr(transformers, arch)(config).eval(), where)


def perturbed_and_saved(model, where: Path):
    """``model`` (a transformers model, freshly initialised) with its LayerNorms and biases
    perturbed so that none is the identity or zero, saved in ``where``; returns it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(where)
    return model


