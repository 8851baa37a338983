"""`transduce import` of BERT and RoBERTa directories: locally built random tiny models of each
importable architecture give the same logits as transformers (ids mapped to our order), keep
their heads, export with `--format hf` as the original checkpoint (its ids, its tokenizer files,
its logits on text), and bad directories fail in one line with nothing written."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from transduce.checksums import record
from transduce.cli import main
from transduce.errors import TransduceError
from transduce.interop import export_model
from transduce.interop.bert import vocab_order
from transduce.interop import import_hf
from transduce.model import EncoderOnly, load_model
from extra_helpers import need_extra
from bert_fixtures import CASES, bert_tokenizer_dirs, build_hf
from hf_tokenizer_fixtures import HARD_CASES, byte_bpe_dir, wordpiece_dir
from toy_model import toy_pairs
from transduce.data.toy import generate_pairs

need_extra("pretrained", "tokenizers")
transformers = need_extra("export", "transformers")

from transduce.data.hf_tokenizer import SIDE_FILES, HFTokenizer  # noqa: E402
from transduce.data.batch import pad  # noqa: E402
from transduce.data.tokenizer import load_tokenizer  # noqa: E402
from transduce.inference.classify import Classifier  # noqa: E402

@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    return bert_tokenizer_dirs(tmp_path_factory.mktemp("tokenizers"))


def _ours_vs_theirs(model: EncoderOnly, hf, order, seed: int = 7):
    """Our head's logits and transformers' (in our id order) on right-padded rows of our ids."""
    cfg, v = model.config, model.config.src_vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, v - 1, (3, 10), generator=g)
    ids[:, 0], ids[0, 4] = 1, v - 1  # BOS first; one [MASK]
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
def test_import_equals_transformers_and_exports_back(tmp_path, case, tokenizer_dirs):
    hf = build_hf(tmp_path / "hf", case, tokenizer_dirs)
    checks = import_hf(tmp_path / "hf", tmp_path / "ours")
    assert all(v < 1e-4 for k, v in checks.items() if k.startswith("max_")) and checks["tokenizer_differences"] == 0
    model = load_model(tmp_path / "ours")
    cfg = model.config
    assert (cfg.nsp, cfg.n_classes, cfg.tie_output) == ("PreTraining" in case, hf.config.num_labels * (
        "Classification" in case), "untied" not in case)
    if "Bert" in case and "Classification" in case:
        assert cfg.labels == ("neg", "neu", "pos")
    order = vocab_order(HFTokenizer.from_hf_dir(tmp_path / "hf"), cfg.src_vocab_size, tmp_path)
    assert order[:4].tolist() == ([0, 2, 3, 1] if "Bert" in case else [1, 0, 2, 3]) and order[-1] == 4  # [MASK] last
    for ours, theirs in _ours_vs_theirs(model, hf, order):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    report = export_model(tmp_path / "ours", "hf", tmp_path / "back")  # BERT in the original's ids
    back = transformers.AutoConfig.from_pretrained(tmp_path / "back").architectures[0]
    exported = getattr(transformers, back).from_pretrained(tmp_path / "back").eval()
    for (_, theirs), (_, again) in zip(_ours_vs_theirs(model, hf, order), _ours_vs_theirs(model, exported, order)):
        torch.testing.assert_close(again, theirs, rtol=0, atol=1e-4)  # the original's logits, round trip
    assert all(v < 1e-4 for k, v in report.checks.items() if k.startswith("max_"))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_carried_tokenizer_gives_autotokenizers_ids(tmp_path, family, tokenizer_dirs):
    case = "BertForMaskedLM" if family == "bert" else "RobertaForMaskedLM"
    build_hf(tmp_path / "hf", case, tokenizer_dirs)
    import_hf(tmp_path / "hf", tmp_path / "ours")
    ours, hf = load_tokenizer(tmp_path / "ours"), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    order = vocab_order(HFTokenizer.from_hf_dir(tmp_path / "hf"), load_model(tmp_path / "ours").config.src_vocab_size,
                        tmp_path)
    assert (ours.pad_id, ours.bos_id, ours.eos_id, ours.unk_id) == (0, 1, 2, 3)
    texts = [f"{en} {de}" for en, de in toy_pairs(300, 5)] + HARD_CASES
    for text in texts:
        want = hf(text, add_special_tokens=False)["input_ids"]
        assert order[ours.encode(text)].tolist() == want, text


@pytest.mark.parametrize("case", ["BertForSequenceClassification", "RobertaForSequenceClassification"])
def test_imported_classifier_reads_text_as_transformers(tmp_path, tokenizer_dirs, case):
    hf = build_hf(tmp_path / "hf", case, tokenizer_dirs, seed=3)
    import_hf(tmp_path / "hf", tmp_path / "ours")
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = [en for en, _ in toy_pairs(40, 9)] + ["Café 👍🏽 東京", "  two  spaces "]
    with torch.no_grad():
        enc = auto(texts, padding=True, return_tensors="pt")  # [CLS] text [SEP] / <s> text </s>
        want = hf(**enc).logits                                           # (B, K)
    with Classifier.load(tmp_path / "ours") as classifier:
        assert classifier.classify(texts) == [hf.config.id2label[int(k)] for k in want.argmax(-1)]
        model, tok = classifier.model, classifier.tokenizer
        ids = pad([tok.encode(t) for t in texts], 0, bos=True, eos=True)  # what classify feeds the model
        with torch.no_grad():
            got = model.classify(model(ids, torch.zeros_like(ids) if model.config.type_vocab_size else None))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    report = export_model(tmp_path / "ours", "hf", tmp_path / "back")  # with the carried tokenizer
    assert report.checks["tokenizer_differences"] == 0
    back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():  # text -> AutoTokenizer -> model, on the export: the original's logits
        enc = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")(texts, padding=True, return_tensors="pt")
        torch.testing.assert_close(back(**enc).logits, want, rtol=0, atol=1e-4)


# Real sentences (the toy grammar's, not in the tokenizers' training text) and what tokenizers get
# wrong first: accents, punctuation, runs of spaces, characters the vocabulary lacks.
ROUND_TRIP_LINES = [s for pair in generate_pairs(5, 99) for s in pair] + [
    "Café naïve résumé façade Ångström", "Straße ÄÖÜ äöü ß", "a  b   c    d", "  leading and trailing  ",
    "\ttab\tseparated\t", "", "Wait... what?! (Yes: \"no\") - 3.5% #1", "👍🏽 emoji 👨‍👩‍👧 family 🇩🇪 flag",
    "東京で寿司を食べた。", "control\x00\x01\x07\x1b chars ﬁ ™ ½"]


@pytest.fixture(scope="module")
def sentence_tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tokenizers as a user trains them on real text (the toy grammar's English and German): BERT's
    WordPiece cased (AutoTokenizer takes ``do_lower_case`` from tokenizer_config.json) and RoBERTa's
    byte-level BPE."""
    root = tmp_path_factory.mktemp("sentence_tokenizers")
    lines = [s for pair in generate_pairs(800, 1) for s in pair] + HARD_CASES
    return {"bert": wordpiece_dir(root / "bert", lines, vocab_size=400, lowercase=False),
            "roberta": byte_bpe_dir(root / "roberta", lines, flavour="roberta", vocab_size=400)}


@pytest.mark.parametrize("case", ["BertForMaskedLM", "BertForSequenceClassification", "RobertaForMaskedLM"])
def test_export_of_an_import_is_the_original_checkpoint(tmp_path, sentence_tokenizer_dirs, case):
    """import then export --format hf: AutoTokenizer on the export gives the original's input_ids,
    and AutoModel on the export the original's logits on real text, each side read by its own
    AutoTokenizer."""
    assert len(ROUND_TRIP_LINES) == 20
    original = build_hf(tmp_path / "hf", case, sentence_tokenizer_dirs, seed=4)
    import_hf(tmp_path / "hf", tmp_path / "ours")
    export_model(tmp_path / "ours", "hf", tmp_path / "back")
    auto = {side: transformers.AutoTokenizer.from_pretrained(tmp_path / side) for side in ("hf", "back")}
    for text in ROUND_TRIP_LINES:
        assert auto["back"](text)["input_ids"] == auto["hf"](text)["input_ids"], text
    head = transformers.AutoModelForSequenceClassification if "Classification" in case \
        else transformers.AutoModelForMaskedLM
    exported = head.from_pretrained(tmp_path / "back").eval()
    enc = {side: auto[side](ROUND_TRIP_LINES, padding=True, truncation=True, max_length=32, return_tensors="pt")
           for side in auto}  # (B, T); 32 tokens: within both position tables
    with torch.no_grad():
        want, got = original(**enc["hf"]).logits, exported(**enc["back"]).logits   # (B, K) or (B, T, V)
    if want.dim() == 3:  # masked-LM logits at the text's tokens (RoBERTa's pad rows are not BERT's)
        keep = enc["hf"]["attention_mask"].bool()
        want, got = want[keep], got[keep]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def _edit_tokenizer_yaml(model_dir: Path, edit) -> None:
    """``edit`` the tokenizer.yaml mapping of ``model_dir`` in place, its checksum recorded again."""
    meta = yaml.safe_load((model_dir / "tokenizer.yaml").read_text(encoding="utf-8"))
    edit(meta)
    (model_dir / "tokenizer.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, allow_unicode=True),
                                              encoding="utf-8")
    record(model_dir, ["tokenizer.yaml"])


def test_export_of_an_import_kept_without_its_origin_reads_as_ours(tmp_path, sentence_tokenizer_dirs):
    """An import saved before the tokenizer kept its origin exports in our ids with our
    tokenizer.json, read verbatim by AutoTokenizer: the cased WordPiece stays cased."""
    build_hf(tmp_path / "hf", "BertForMaskedLM", sentence_tokenizer_dirs, seed=4)
    import_hf(tmp_path / "hf", tmp_path / "ours")
    tok = load_tokenizer(tmp_path / "ours")
    assert tok.origin.files == {name: (tmp_path / "hf" / name).read_text() for name in SIDE_FILES}
    assert pickle.loads(pickle.dumps(tok)).origin == tok.origin          # as a worker process gets it
    _edit_tokenizer_yaml(tmp_path / "ours", lambda meta: meta.pop("origin"))
    report = export_model(tmp_path / "ours", "hf", tmp_path / "back")
    assert report.checks["tokenizer_differences"] == 0 and report.checks["max_text_logit_diff"] < 1e-4
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    for text in ROUND_TRIP_LINES:
        assert auto(text)["input_ids"] == [1, *load_tokenizer(tmp_path / "ours").encode(text), 2], text


def test_export_refuses_a_tokenizer_autotokenizer_reads_otherwise(tmp_path, sentence_tokenizer_dirs):
    """The export's own check reads text through AutoTokenizer on the export: an origin claiming
    the cased WordPiece lower-cases fails it in one line, and nothing is written."""
    build_hf(tmp_path / "hf", "BertForMaskedLM", sentence_tokenizer_dirs, seed=4)
    import_hf(tmp_path / "hf", tmp_path / "ours")

    def lower_cased(meta):
        files = meta["origin"]["files"]
        files["tokenizer_config.json"] = json.dumps({**json.loads(files["tokenizer_config.json"]),
                                                     "do_lower_case": True})
    _edit_tokenizer_yaml(tmp_path / "ours", lower_cased)
    with pytest.raises(TransduceError, match=r"^verification failed: AutoTokenizer on .* reads 'A dog runs") as e:
        export_model(tmp_path / "ours", "hf", tmp_path / "back")
    assert "\n" not in str(e.value) and not (tmp_path / "back").exists()


def test_roberta_positions_start_after_the_padding_row(tmp_path, tokenizer_dirs):
    hf = build_hf(tmp_path / "hf", "RobertaForMaskedLM", tokenizer_dirs)
    import_hf(tmp_path / "hf", tmp_path / "ours")
    model = load_model(tmp_path / "ours")
    assert model.config.max_positions == 42 - 2
    table = hf.roberta.embeddings.position_embeddings.weight
    torch.testing.assert_close(model.embed.positions.weight, table[2:], rtol=0, atol=0)


def _refused(where: Path, tokenizer_dirs, match: str, edit=None, case: str = "BertForMaskedLM") -> None:
    build_hf(where / "hf", case, tokenizer_dirs)
    if edit is not None:
        edit(where / "hf")
    with pytest.raises(TransduceError, match=match) as e:
        import_hf(where / "hf", where / "ours")
    assert "\n" not in str(e.value) and not (where / "ours").exists()


def _config_edit(**changes):
    def edit(where):
        config = json.loads((where / "config.json").read_text())
        (where / "config.json").write_text(json.dumps({**config, **changes}))
    return edit


@pytest.mark.parametrize("changes, match", [
    (dict(architectures=["BertModel"]), "BertModel.*not importable"),
    (dict(hidden_act="gelu_new"), "hidden_act='gelu_new' is not supported"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(vocab_size=500), "rows, but config.json.s vocab_size is 500"),
    (dict(intermediate_size=48), "does not match the model config|shape"),
    (dict(num_attention_heads=5), "valid transduce config.*model.d_model"),
])
def test_unsupported_or_mismatched_configs_fail_in_one_line(tmp_path, tokenizer_dirs, changes, match):
    _refused(tmp_path, tokenizer_dirs, match, _config_edit(**changes))


def _drop_mask(where: Path) -> None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config = json.loads((where / name).read_text())
        config.pop("mask_token")
        (where / name).write_text(json.dumps(config))


@pytest.mark.parametrize("edit, match", [
    (lambda w: (w / "tokenizer.json").unlink(), "no tokenizer.json"),
    (lambda w: (w / "tokenizer.json").write_text("{not json"), "corrupt tokenizer file"),
    (_drop_mask, "names no mask token"),
    (lambda w: (w / "model.safetensors").unlink(), "no model.safetensors"),
])
def test_missing_or_corrupt_files_fail_in_one_line(tmp_path, tokenizer_dirs, edit, match):
    _refused(tmp_path, tokenizer_dirs, match, edit)


def test_cli_imports_a_bert_pretraining_directory(tmp_path, capsys, tokenizer_dirs):
    build_hf(tmp_path / "hf", "BertForPreTraining", tokenizer_dirs)
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_nsp_logit_diff"] < 1e-4 and load_model(tmp_path / "ours").config.nsp
