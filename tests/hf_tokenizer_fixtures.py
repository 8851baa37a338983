"""Hugging Face tokenizer directories trained on Multi30k with the ``tokenizers`` library, as a
pretrained checkpoint ships them (``tokenizer.json``, ``tokenizer_config.json`` naming the
transformers class, ``special_tokens_map.json``): GPT-2's and RoBERTa's byte-level BPE, BERT's
WordPiece. Small vocabularies, so training takes well under a second.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from extra_helpers import multi30k_dir

# Text that tokenizers get wrong first: accents (composed and combining), emoji with modifiers and
# joiners, CJK, Arabic, control characters, runs of spaces and tabs, empty and blank lines.
HARD_CASES = [
    "", " ", "   ", "\n", "\n\n", "a  b   c    d", "  leading and trailing  ", "\ttab\tseparated\t",
    "Café naïve résumé façade Ångström", "e\u0301 combining acute", "Straße ÄÖÜ äöü ß",
    "👍🏽 emoji 👨‍👩‍👧 family 🇩🇪 flag", "東京で寿司を食べた。", "中文字符和标点，测试。", "한국어 문장",
    "مرحبا بالعالم", "control\x00\x01\x07\x1b chars", "carriage\r\nreturn", "zero\u200bwidth\u200djoiner",
    "non\u00a0breaking space", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ", "ﬁ ligature ™ ½", "Ünïcödé ẞ Ǆ",
    "A dog runs.  Two men sit.\n", "line one\nline two\n\nline four", "\u2028\u2029\x85",
]


def multi30k_lines(n: int) -> list[str]:
    """The first ``n`` lines of Multi30k's English and German training text, interleaved."""
    root = multi30k_dir()
    sides = []
    for lang in ("en", "de"):
        with gzip.open(root / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append([next(f).rstrip("\n") for _ in range(n // 2 + 1)])
    return [line for pair in zip(*sides) for line in pair][:n]


def have_multi30k() -> bool:
    return (multi30k_dir() / "train.en.gz").is_file()


def _write(tok, out: Path, config: dict, specials: dict[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({**config, **{f"{r}_token": t for r, t in specials.items()}}))
    (out / "special_tokens_map.json").write_text(json.dumps({f"{r}_token": t for r, t in specials.items()}))
    return out


def byte_bpe_dir(out: Path, lines: list[str], flavour: str = "gpt2", vocab_size: int = 400,
                 eot_last: bool = False) -> Path:
    """A GPT-2 (``flavour="gpt2"``) or RoBERTa (``"roberta"``) byte-level BPE tokenizer directory;
    ``eot_last``: GPT-2's ``<|endoftext|>`` added after training, as the last id (GPT-2's is 50256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if flavour == "gpt2":
        names = {"bos": "<|endoftext|>", "eos": "<|endoftext|>", "unk": "<|endoftext|>"}
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "model_max_length": 1024}
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        names = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "cls": "<s>", "sep": "</s>",
                 "mask": "<mask>"}
        config = {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": False, "model_max_length": 512}
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    specials = list(dict.fromkeys(names.values()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[] if eot_last else specials,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    if eot_last:
        tok.add_special_tokens(specials)
    return _write(tok, out, config, names)


def wordpiece_dir(out: Path, lines: list[str], vocab_size: int = 400, lowercase: bool = True) -> Path:
    """A BERT WordPiece tokenizer directory (BERT's normaliser, pre-tokeniser and post-processor)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    names = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(names.values()),
                                        show_progress=False)
    tok.train_from_iterator(lines, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "model_max_length": 512}
    return _write(tok, out, config, names)
