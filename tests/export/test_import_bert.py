"""`transduce import` of BERT and RoBERTa directories: locally built random tiny models of each
importable architecture give the same logits as transformers (ids mapped to our order), keep
their heads, survive an `export --format hf` round trip, and bad directories fail in one line
with nothing written."""

from __future__ import annotations

import json

import pytest
import torch

from transduce.cli import main
from transduce.errors import TransduceError
from transduce.export import export_model
from transduce.export.hf_bert_import import BertVocab
from transduce.export.hf_import import import_hf
from transduce.model import EncoderOnly, load_model
from extra_helpers import need_extra

transformers = need_extra("export", "transformers")

V = 50
SHAPE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
# BERT's specials away from our ids (so the reordering is exercised): [PAD] 0, [UNK] 5, [CLS] 6, [SEP] 7, [MASK] 8
BERT_TOKENS = ["[PAD]", "a", "b", "c", "d", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_TOKENS = ["<s>", "<pad>", "</s>", "<unk>"]  # and <mask> in the middle (id 20)
CASES = {
    "BertForMaskedLM": dict(type_vocab_size=2),
    "BertForMaskedLM-untied": dict(type_vocab_size=2, tie_word_embeddings=False),
    "BertForPreTraining": dict(type_vocab_size=2),
    "BertForSequenceClassification": dict(type_vocab_size=2, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                          label2id={"neg": 0, "neu": 1, "pos": 2}),
    "RobertaForMaskedLM": dict(type_vocab_size=1),
    "RobertaForSequenceClassification": dict(type_vocab_size=1, num_labels=2),
}


def build_hf(where, case: str, seed: int = 0):
    """A random tiny transformers model of ``case`` saved in ``where`` with a vocabulary file;
    LayerNorms and biases perturbed so that none is the identity. Returns the model (eval)."""
    arch = case.split("-")[0]
    roberta = arch.startswith("Roberta")
    options = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=42) if roberta \
        else dict(pad_token_id=0, max_position_embeddings=40)
    config = (transformers.RobertaConfig if roberta else transformers.BertConfig)(**SHAPE, **options, **CASES[case])
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(where)
    if roberta:
        vocab = {t: i for i, t in enumerate(ROBERTA_TOKENS + [f"w{i}" for i in range(4, V)])}
        vocab["<mask>"] = vocab.pop("w20")
        (where / "vocab.json").write_text(json.dumps(vocab))
    else:
        (where / "vocab.txt").write_text("\n".join(BERT_TOKENS + [f"w{i}" for i in range(9, V)]) + "\n")
    return model


def _ours_vs_theirs(model: EncoderOnly, hf, order, seed: int = 7):
    """Our head's logits and transformers' (in our id order) on right-padded rows of our ids."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V - 1, (3, 10), generator=g)
    ids[:, 0], ids[0, 4] = 1, V - 1  # BOS first; one [MASK]
    for row, n in enumerate((10, 6, 3)):
        ids[row, n - 1], ids[row, n:] = 2, 0
    types = torch.randint(cfg.type_vocab_size, ids.shape, generator=g)
    keep = ids != 0
    with torch.no_grad():
        out = hf(input_ids=order[ids], attention_mask=keep.long(), token_type_ids=types)
        states = model(ids, types)
    if cfg.n_classes:
        return [(model.classify(states), out.logits)]
    mlm = out.prediction_logits if cfg.nsp else out.logits
    pairs = [(model.mlm_logits(states)[keep], mlm[..., order][keep])]
    if cfg.nsp:
        pairs.append((model.next_sentence_logits(states), out.seq_relationship_logits))
    return pairs


@pytest.mark.parametrize("case", list(CASES))
def test_import_equals_transformers_and_exports_back(tmp_path, case):
    hf = build_hf(tmp_path / "hf", case)
    checks = import_hf(tmp_path / "hf", tmp_path / "ours")
    assert all(v < 1e-4 for k, v in checks.items() if k.startswith("max_"))
    model = load_model(tmp_path / "ours")
    cfg = model.config
    assert (cfg.nsp, cfg.n_classes, cfg.tie_output) == ("PreTraining" in case, hf.config.num_labels * (
        "Classification" in case), "untied" not in case)
    if "Bert" in case and "Classification" in case:
        assert cfg.labels == ("neg", "neu", "pos")
    order = BertVocab(tmp_path / "hf", "roberta" if "Roberta" in case else "bert", V, hf.config.pad_token_id).order
    assert order[0] == hf.config.pad_token_id and order[-1] in (8, 20)  # [MASK] / <mask> is our last id
    for ours, theirs in _ours_vs_theirs(model, hf, order):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    report = export_model(tmp_path / "ours", "hf", tmp_path / "back")  # BERT with our ids
    back = transformers.AutoConfig.from_pretrained(tmp_path / "back").architectures[0]
    exported = getattr(transformers, back).from_pretrained(tmp_path / "back").eval()
    for (_, theirs), (again, _) in zip(_ours_vs_theirs(model, hf, order), _ours_vs_theirs(model, exported,
                                                                                          torch.arange(V))):
        torch.testing.assert_close(again, theirs, rtol=0, atol=1e-4)  # the original's logits, round trip
    assert all(v < 1e-4 for k, v in report.checks.items() if k.startswith("max_"))


def test_roberta_positions_start_after_the_padding_row(tmp_path):
    hf = build_hf(tmp_path / "hf", "RobertaForMaskedLM")
    import_hf(tmp_path / "hf", tmp_path / "ours")
    model = load_model(tmp_path / "ours")
    assert model.config.max_positions == 42 - 2
    table = hf.roberta.embeddings.position_embeddings.weight
    torch.testing.assert_close(model.embed.positions.weight, table[2:], rtol=0, atol=0)


def _refused(tmp_path, match: str, edit=None, case: str = "BertForMaskedLM") -> None:
    build_hf(tmp_path / "hf", case)
    if edit is not None:
        edit(tmp_path / "hf")
    with pytest.raises(TransduceError, match=match) as e:
        import_hf(tmp_path / "hf", tmp_path / "ours")
    assert "\n" not in str(e.value) and not (tmp_path / "ours").exists()


def _config_edit(**changes):
    def edit(where):
        config = json.loads((where / "config.json").read_text())
        (where / "config.json").write_text(json.dumps({**config, **changes}))
    return edit


@pytest.mark.parametrize("changes, match", [
    (dict(architectures=["BertModel"]), "BertModel.*not importable"),
    (dict(hidden_act="gelu_new"), "hidden_act='gelu_new' is not supported"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(vocab_size=V + 5), "has 50 rows, but config.json.s vocab_size is 55"),
    (dict(intermediate_size=48), "does not match the model config|shape"),
    (dict(num_attention_heads=5), "valid transduce config.*model.d_model"),
])
def test_unsupported_or_mismatched_configs_fail_in_one_line(tmp_path, changes, match):
    _refused(tmp_path, match, _config_edit(**changes))


def test_missing_vocabulary_or_weights_fail_in_one_line(tmp_path):
    _refused(tmp_path, "no tokenizer.json, vocab.txt or vocab.json", lambda w: (w / "vocab.txt").unlink())
    _refused(tmp_path / "b", r"lacks \[SEP\], \[UNK\], \[MASK\]", lambda w: (w / "vocab.txt").write_text("[PAD]\n[CLS]\n"))
    _refused(tmp_path / "c", "no model.safetensors", lambda w: (w / "model.safetensors").unlink())


def test_cli_imports_a_bert_pretraining_directory(tmp_path, capsys):
    build_hf(tmp_path / "hf", "BertForPreTraining")
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_nsp_logit_diff"] < 1e-4 and load_model(tmp_path / "ours").config.nsp
