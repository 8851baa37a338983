"""Byte-level BPE and WordPiece tokenizers (transduce.data.hf_tokenizer) against transformers'
AutoTokenizer: identical ids on 1,000 Multi30k lines and the hard cases, and the files' errors."""

from __future__ import annotations

import json
import pickle

import pytest
import yaml

from extra_helpers import need_extra
from hf_tokenizer_fixtures import HARD_CASES, byte_bpe_dir, multi30k_lines, wordpiece_dir

need_extra("pretrained", "tokenizers")
transformers = need_extra("export", "transformers")

from transduce.checksums import record  # noqa: E402
from transduce.data.hf_tokenizer import HFTokenizer  # noqa: E402
from transduce.data.tokenizer import Tokenizer, load_tokenizer, tokenizer_exists  # noqa: E402
from transduce.errors import CheckpointError, DataError  # noqa: E402

KINDS = {"gpt2": "byte_level_bpe", "roberta": "byte_level_bpe", "bert": "wordpiece"}


@pytest.fixture(scope="module")
def texts(multi30k_root) -> tuple[list[str], list[str]]:
    """(training lines, 1,000 other lines plus the hard cases)."""
    lines = multi30k_lines(3000)
    return lines[:2000], lines[2000:] + HARD_CASES


@pytest.fixture(scope="module", params=sorted(KINDS))
def hf_dir(request, texts, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param + "_")
    if request.param == "bert":
        return wordpiece_dir(out, texts[0])
    return byte_bpe_dir(out, texts[0], flavour=request.param)


def test_ids_and_text_identical_to_autotokenizer(hf_dir, texts, tmp_path):
    HFTokenizer.from_hf_dir(hf_dir).save(tmp_path)
    ours, hf = load_tokenizer(tmp_path), transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert isinstance(ours, HFTokenizer) and ours.kind == KINDS[hf_dir.name.split("_")[0]]
    assert ours.vocab_size == len(hf)
    lines = texts[1]
    want = [hf(t, add_special_tokens=False)["input_ids"] for t in lines]
    got = [ours.encode(t) for t in lines]
    assert [t for t, a, b in zip(lines, got, want) if a != b] == []
    assert ours.encode_batch(lines) == want
    flat, lengths = ours.encode_flat(lines)
    assert flat.tolist() == [i for row in want for i in row] and lengths.tolist() == [len(r) for r in want]
    decoded = [hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) for ids in want]
    assert [ours.decode(ids) for ids in got] == decoded
    if ours.kind == "byte_level_bpe":  # byte-level BPE loses nothing
        assert decoded == lines


def test_special_tokens_recorded_with_their_ids(hf_dir, tmp_path):
    hf = transformers.AutoTokenizer.from_pretrained(hf_dir)
    HFTokenizer.from_hf_dir(hf_dir).save(tmp_path)
    meta = __import__("yaml").safe_load((tmp_path / "tokenizer.yaml").read_text())
    for role, entry in meta["specials"].items():
        assert entry["id"] == hf.convert_tokens_to_ids(entry["token"]) == getattr(hf, f"{role}_token_id")
    tok = load_tokenizer(tmp_path)
    if hf.bos_token is not None:
        assert (tok.bos_id, tok.eos_id) == (hf.bos_token_id, hf.eos_token_id)
    else:  # BERT: a sequence begins with [CLS] and ends with [SEP]
        assert (tok.bos_id, tok.eos_id, tok.pad_id) == (hf.cls_token_id, hf.sep_token_id, hf.pad_token_id)
    assert tok.decode([tok.bos_id, *tok.encode("A dog."), tok.eos_id, *tok.encode("ignored")]) == \
        hf.decode(hf("A dog.", add_special_tokens=False)["input_ids"], clean_up_tokenization_spaces=False)


def test_bos_first_as_autotokenizer_puts_it(hf_dir, tmp_path):
    """``add_bos_token`` is what AutoTokenizer does (GPT-2 no BOS; RoBERTa's <s>, BERT's [CLS] first),
    kept by save/load and pickling; a tokenizer.yaml written before it was recorded loads as BOS
    first, as those directories were prompted."""
    hf = transformers.AutoTokenizer.from_pretrained(hf_dir)
    tok = HFTokenizer.from_hf_dir(hf_dir)
    assert tok.add_bos_token is (hf("A dog.")["input_ids"][0] == tok.bos_id) is not hf_dir.name.startswith("gpt2")
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).add_bos_token is tok.add_bos_token
    assert pickle.loads(pickle.dumps(tok)).add_bos_token is tok.add_bos_token
    meta = yaml.safe_load((tmp_path / "tokenizer.yaml").read_text())
    del meta["add_bos_token"]
    _rewrite_meta(tmp_path, meta)
    assert load_tokenizer(tmp_path).add_bos_token is True
    _rewrite_meta(tmp_path, {**meta, "add_bos_token": "yes"})
    with pytest.raises(DataError, match="add_bos_token"):
        load_tokenizer(tmp_path)


def _rewrite_meta(directory, meta):
    (directory / "tokenizer.yaml").write_text(yaml.safe_dump(meta))
    record(directory, ["tokenizer.yaml"])  # as if written so, not altered afterwards


def test_factory_opens_either_kind(toy_tokenizer, hf_dir, tmp_path):
    toy_tokenizer.save(tmp_path / "spm")
    HFTokenizer.from_hf_dir(hf_dir).save(tmp_path / "hf")
    assert isinstance(load_tokenizer(tmp_path / "spm"), Tokenizer)
    assert isinstance(load_tokenizer(tmp_path / "hf"), HFTokenizer)
    assert tokenizer_exists(tmp_path / "spm") and tokenizer_exists(tmp_path / "hf")
    assert not tokenizer_exists(tmp_path)
    spm = load_tokenizer(tmp_path / "spm")
    assert (spm.pad_id, spm.bos_id, spm.eos_id, spm.unk_id) == (0, 1, 2, 3)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("damage", ["missing_json", "missing_yaml", "corrupt_json", "unsupported", "bad_special"])
def test_bad_tokenizer_files_are_one_line_errors(texts, tmp_path, damage):
    hf_dir = byte_bpe_dir(tmp_path / "hf", texts[0][:300], vocab_size=300)
    HFTokenizer.from_hf_dir(hf_dir).save(tmp_path)
    if damage == "missing_json":
        (tmp_path / "tokenizer.json").unlink()
        with pytest.raises(DataError) as err:
            HFTokenizer.from_hf_dir(tmp_path)
        assert "tokenizer.json" in _one_line(err)
        return
    if damage == "missing_yaml":
        (tmp_path / "tokenizer.yaml").unlink()
        with pytest.raises(DataError) as err:
            load_tokenizer(tmp_path)
        assert "tokenizer.yaml" in _one_line(err)
        return
    raw = json.loads((tmp_path / "tokenizer.json").read_text())
    if damage == "corrupt_json":
        data = (tmp_path / "tokenizer.json").read_bytes()[:-40]
    elif damage == "unsupported":
        raw["model"] = {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}
        data = json.dumps(raw).encode()
    else:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|no such token|>"}))
        with pytest.raises(DataError) as err:
            HFTokenizer.from_hf_dir(tmp_path)
        assert "<|no such token|>" in _one_line(err)
        return
    (tmp_path / "tokenizer.json").write_bytes(data)
    with pytest.raises(CheckpointError):  # the recorded checksum catches it first
        load_tokenizer(tmp_path)
    with pytest.raises(DataError) as err:
        HFTokenizer(data, {"eos": "<|endoftext|>"}, name="x")
    assert ("corrupt" if damage == "corrupt_json" else "unsupported") in _one_line(err)
