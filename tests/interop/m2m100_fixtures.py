"""Local NLLB-200, M2M-100 and mBART-50 directories for the import tests: transformers'
M2M100ForConditionalGeneration and MBartForConditionalGeneration with random weights and tiny
shapes, a SentencePiece model (fairseq's kind: unk 0, bos 1, eos 2, no pad; BPE, or unigram for
mBART) trained on the embedded toy corpus (t5_fixtures.toy_lines), and the real tokenizer classes
over it (NllbTokenizer with a handful of language codes; M2M100Tokenizer with its WMT21 codes;
MBart50Tokenizer with its 52): no hub, no data directory."""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from t5_fixtures import N_TRAIN_PAIRS, TRAIN_SEED, toy_lines

NLLB_CODES = ["eng_Latn", "deu_Latn", "fra_Latn", "spa_Latn", "zho_Hans"]
SPM = "sentencepiece.bpe.model"


def train_bpe(out: Path, vocab_size: int = 500, model_type: str = "bpe") -> Path:
    """fairseq's kind of SentencePiece model (unk 0, bos 1, eos 2, no pad) on English and German lines."""
    import sentencepiece as spm

    lines = toy_lines("en", N_TRAIN_PAIRS, seed=TRAIN_SEED) + toy_lines("de", N_TRAIN_PAIRS, seed=TRAIN_SEED)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type=model_type, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    path = out / SPM
    path.write_bytes(buf.getvalue())
    return path


def _random_model(transformers, out: Path, n_rows: int, seed: int, tied: bool, kind: str = "M2M100"):
    """An M2M100ForConditionalGeneration (``kind`` "MBart": an MBartForConditionalGeneration, its
    embedding LayerNorms and output bias random too) of d_model 32 (3 encoder, 2 decoder layers, 4
    heads), weights spread wider than its init and cross-attention 3 times stronger, so that
    outputs depend on the input (rather than repeat a token), saved into ``out``."""
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=n_rows, d_model=32, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=128, init_std=0.5,
        tie_word_embeddings=tied, dropout=0.0, attention_dropout=0.0, scale_embedding=True, decoder_start_token_id=2)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".encoder_attn." in name and name.endswith("weight"):
                p.mul_(3.0)
            elif "layernorm_embedding" in name:
                p.add_(torch.randn_like(p) * 0.3)
        if kind == "MBart":
            model.final_logits_bias.normal_(0, 0.5)
        if not tied:
            model.lm_head.weight = torch.nn.Parameter(torch.randn(n_rows, 32) * 0.5)
    model.save_pretrained(out)
    return model


def hf_nllb_dir(transformers, spm_path: Path, out: Path, seed: int = 0, tied: bool = True) -> Path:
    """An NLLB-200 directory: NllbTokenizer's files (tokenizer.json, tokenizer_config.json and the
    SentencePiece model) for :data:`NLLB_CODES`, and a random model with two rows more than the
    tokenizer has ids (as NLLB's 256206 for 256204)."""
    out.mkdir(parents=True)
    (out / SPM).write_bytes(spm_path.read_bytes())
    tok = transformers.NllbTokenizer.from_pretrained(out, additional_special_tokens=NLLB_CODES, src_lang="eng_Latn")
    tok.save_pretrained(out)
    _random_model(transformers, out, len(tok) + 2, seed, tied)
    return out


def hf_m2m100_dir(transformers, spm_path: Path, out: Path, seed: int = 0) -> Path:
    """An M2M-100 directory: vocab.json (fairseq's specials, then the SentencePiece model's pieces),
    the SentencePiece model, M2M100Tokenizer with its WMT21 language codes (__en__, __de__, ...)
    and a random model with transformers' 8 made-up words' rows after them."""
    import sentencepiece as spm

    out.mkdir(parents=True)
    (out / SPM).write_bytes(spm_path.read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({sp.id_to_piece(i): i + 1 for i in range(3, sp.get_piece_size())})
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "M2M100Tokenizer",
                                                           "language_codes": "wmt21"}), encoding="utf-8")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    _random_model(transformers, out, len(vocab) + len(tok.lang_token_to_id) + 8, seed, tied=True)
    return out


def hf_mbart50_dir(transformers, spm_path: Path, out: Path, seed: int = 0) -> Path:
    """An mBART-50 directory: MBart50Tokenizer's files (its 52 language codes after the pieces,
    <mask> last) and a random MBartForConditionalGeneration of as many rows."""
    out.mkdir(parents=True)
    (out / SPM).write_bytes(spm_path.read_bytes())
    tok = transformers.MBart50Tokenizer.from_pretrained(out, src_lang="en_XX")
    tok.save_pretrained(out)
    _random_model(transformers, out, len(tok), seed, tied=True, kind="MBart")
    return out


def hf_family_dirs(transformers, root: Path) -> dict[str, Path]:
    """The four checkpoints the import and export tests share: NLLB tied and untied, M2M-100, mBART-50."""
    spm = train_bpe(root)
    (root / "unigram").mkdir()
    return {"nllb": hf_nllb_dir(transformers, spm, root / "nllb", seed=0),
            "nllb-untied": hf_nllb_dir(transformers, spm, root / "nllb-untied", seed=1, tied=False),
            "m2m": hf_m2m100_dir(transformers, spm, root / "m2m", seed=2),
            "mbart": hf_mbart50_dir(transformers, train_bpe(root / "unigram", model_type="unigram"), root / "mbart",
                                    seed=3)}
