"""Importing a Hugging Face GPT2LMHeadModel (a random tiny one, with a byte-level BPE tokenizer
trained on the embedded toy corpus, English and German, or on its German side alone): same
logits, greedy continuations and tokens as transformers, ``generate`` on the import equal to
transformers' on the prompt as a user passes it, the export round trip, and one-line errors with
nothing written for bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from transduce.cli import main
from transduce.config import GenerationConfig
from transduce.data.tokenizer import load_tokenizer
from transduce.data.toy import generate_pairs
from transduce.interop import export_model
from transduce.interop import import_hf
from transduce.inference import Generator
from transduce.model import load_model
from extra_helpers import need_extra
from gpt2_fixtures import random_gpt2
from hf_tokenizer_fixtures import HARD_CASES

transformers = need_extra("export", "transformers")
need_extra("pretrained", "tokenizers")

# The first words of toy German sentences, and a few that tokenizers get wrong first.
PROMPTS = [" ".join(de.split()[:3]) for _, de in generate_pairs(7, seed=7)] + ["Café", "  two  spaces", "Ein"]
GREEDY = GenerationConfig(temperature=0, max_new_tokens=15)


@pytest.fixture(scope="module")
def lines():
    """2000 toy sentences, English and German in turn (text that ships with transduce)."""
    return [line for pair in generate_pairs(1000, seed=3) for line in pair]


@pytest.fixture(scope="module")
def hf_dir(lines, tmp_path_factory):
    return random_gpt2(tmp_path_factory.mktemp("gpt2") / "hf", lines)


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("imported") / "model"
    checks = import_hf(hf_dir, out)
    assert checks["max_logit_diff"] < 1e-4
    assert checks["greedy_differences"] == 0 and checks["greedy_prompts"] == 100
    return out


def _hf_ids(auto, texts):
    return [auto(t, add_special_tokens=False)["input_ids"] for t in texts]


@torch.no_grad()
def test_logits_of_real_text_equal_transformers(hf_dir, imported, lines):
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    ours, tok = load_model(imported), load_tokenizer(imported)
    assert ours.config.bos_id == ours.config.eos_id == ours.config.pad_id == tok.eos_id
    for text in lines[-8:]:
        ids = torch.tensor([[tok.bos_id, *tok.encode(text)]])[:, :48]                # (1, T)
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, rtol=0, atol=1e-4)


def test_tokenizer_equals_autotokenizer(hf_dir, imported, lines):
    auto, tok = transformers.AutoTokenizer.from_pretrained(hf_dir), load_tokenizer(imported)
    texts = lines[1000:2000] + HARD_CASES
    assert [tok.encode(t) for t in texts] == _hf_ids(auto, texts)


@pytest.fixture(scope="module")
def toy_hf_dir(tmp_path_factory):
    """A random GPT-2 over a tokenizer trained on the toy corpus's German side; ``<|endoftext|>``
    is the last id, as GPT-2's 50256 is."""
    lines = [de for _, de in generate_pairs(2000, seed=0)]
    return random_gpt2(tmp_path_factory.mktemp("gpt2_toy") / "hf", lines, eot_last=True)


def _bos_first(hf_dir, where):
    """``hf_dir`` with a tokenizer that puts ``<|endoftext|>`` before a text, as one saved from
    ``AutoTokenizer.from_pretrained(..., add_bos_token=True)`` does (its post-processor's template)."""
    from tokenizers import Tokenizer, processors

    shutil.copytree(hf_dir, where)
    tok = Tokenizer.from_file(str(where / "tokenizer.json"))
    eot = ("<|endoftext|>", tok.token_to_id("<|endoftext|>"))
    tok.post_processor = processors.TemplateProcessing(single=f"{eot[0]} $A", pair=f"{eot[0]} $A {eot[0]} $B:1",
                                                       special_tokens=[eot])
    tok.save(str(where / "tokenizer.json"))
    return where


@torch.no_grad()
@pytest.mark.parametrize("bos_first", [False, True])
def test_generate_equals_transformers_generate_on_the_prompt_as_given(toy_hf_dir, tmp_path, capsys, bos_first):
    """Greedy continuations of 10 prompts equal ``generate`` on ``tokenizer(prompt)``: GPT-2's
    tokenizer puts no ``<|endoftext|>`` first, so neither do we; one whose tokenizer does gets it
    on both sides. An empty prompt, which transformers' tokenizer leaves empty, is continued as
    ``generate()`` continues no input: from BOS."""
    hf_dir = _bos_first(toy_hf_dir, tmp_path / "hf") if bos_first else toy_hf_dir
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    auto = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert (auto("a")["input_ids"][0] == auto.bos_token_id) is bos_first

    def theirs(**inputs):
        out = hf.generate(**inputs, max_new_tokens=15, do_sample=False, pad_token_id=auto.eos_token_id)
        return auto.decode(out[0], skip_special_tokens=True, clean_up_tokenization_spaces=False)
    want = [theirs(**auto(p, return_tensors="pt")) for p in PROMPTS]
    if not bos_first:  # the test can fail: <|endoftext|> first changes the continuations
        first = [theirs(input_ids=torch.tensor([[auto.bos_token_id, *auto(p)["input_ids"]]])) for p in PROMPTS]
        assert sum(a != b for a, b in zip(want, first)) >= len(PROMPTS) // 2
    checks = import_hf(hf_dir, tmp_path / "model")
    assert checks["add_bos_token"] is bos_first is load_tokenizer(tmp_path / "model").add_bos_token
    with Generator.load(tmp_path / "model") as gen:
        assert gen.generate(PROMPTS, GREEDY) == want
        assert gen.generate([""], GREEDY) == [theirs()]
    assert main(["generate", str(tmp_path / "model"), "--prompt", PROMPTS[0], "--temperature", "0",
                 "--max-new-tokens", "15"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == want[0]


@torch.no_grad()
def test_export_round_trip(hf_dir, imported, lines, tmp_path):
    report = export_model(imported, "hf", tmp_path / "again")
    assert report.checks["max_logit_diff"] < 1e-4 and report.checks["tokenizer_differences"] == 0
    original = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "again").eval()
    ids = torch.randint(0, original.config.vocab_size, (4, 20), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(again(input_ids=ids).logits, original(input_ids=ids).logits, rtol=0, atol=1e-4)
    texts = lines[:300] + HARD_CASES
    want = _hf_ids(transformers.AutoTokenizer.from_pretrained(hf_dir), texts)
    assert _hf_ids(transformers.AutoTokenizer.from_pretrained(tmp_path / "again"), texts) == want


def _damage(hf_dir, where, how):
    shutil.copytree(hf_dir, where)
    config = json.loads((where / "config.json").read_text())
    if how == "no_config":
        (where / "config.json").unlink()
    elif how == "no_weights":
        (where / "model.safetensors").unlink()
    elif how == "no_tokenizer":
        (where / "tokenizer.json").unlink()
    elif how == "corrupt_tokenizer":
        (where / "tokenizer.json").write_text((where / "tokenizer.json").read_text()[:-100])
    elif how in ("wrong_width", "wrong_layers", "unknown_type", "inverse_layer_scaling"):
        key, value = {"wrong_width": ("n_embd", 48), "wrong_layers": ("n_layer", 3),
                      "unknown_type": ("model_type", "gpt_neox"),
                      "inverse_layer_scaling": ("scale_attn_by_inverse_layer_idx", True)}[how]
        (where / "config.json").write_text(json.dumps({**config, key: value}))
    return where


@pytest.mark.parametrize("how, named", [
    ("no_config", "config.json"), ("no_weights", "no model.safetensors or pytorch_model.bin"),
    ("no_tokenizer", "tokenizer.json"), ("corrupt_tokenizer", "corrupt tokenizer file"),
    ("wrong_width", "has shape"), ("wrong_layers", "lack"), ("unknown_type", "'gpt_neox'"),
    ("inverse_layer_scaling", "scale_attn_by_inverse_layer_idx=True is not supported")])
def test_bad_input_is_one_line_and_writes_nothing(hf_dir, tmp_path, capsys, how, named):
    bad = _damage(hf_dir, tmp_path / "bad", how)
    assert main(["import", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad"]  # no staging directory left either


def test_info_names_the_tokenizer(imported, capsys):
    assert main(["info", str(imported), "--json"]) == 0
    tokenizer = json.loads(capsys.readouterr().out)["tokenizer"]
    assert tokenizer["type"] == "byte_level_bpe" and tokenizer["specials"]["eos"] == load_tokenizer(imported).eos_id
