"""Fine-tuning an imported GPT-2 (``transduce train CONFIG --init-from IMPORTED``): continued
language-model training on the user's text with the model's own byte-level BPE tokenizer and its
special ids (``<|endoftext|>`` is BOS, EOS and PAD at once, and here the last id, not our PAD 0),
then ``generate``, ``evaluate`` (perplexity) and ``export --format hf`` on the result."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from transduce.cli import main
from transduce.data.tokenizer import load_tokenizer
from transduce.evaluation.heldout import perplexity
from transduce.interop import export_model
from transduce.interop import import_hf
from transduce.model import load_model
from extra_helpers import need_extra
from gpt2_fixtures import random_gpt2
from hf_tokenizer_fixtures import HARD_CASES
from toy_model import toy_pairs

transformers = need_extra("export", "transformers")
need_extra("pretrained", "tokenizers")

# Four lines with distinct first words, repeated: a tiny model learns them by heart.
TEXT = ["A man in a red shirt rides a bike.", "Two dogs play in the snow.", "Ein Kind spielt im Park.",
        "Café au lait, s'il vous plaît."]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2ft")
    hf = random_gpt2(root / "hf", [en for en, _ in toy_pairs(600, 0)] + TEXT + HARD_CASES, eot_last=True)
    import_hf(hf, root / "imported")
    return hf, root / "imported"


@pytest.fixture(scope="module")
def finetuned(imported, tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    (root / "train.txt").write_text("\n".join(TEXT * 30) + "\n", encoding="utf-8")
    config = {"data": {"corpus": "files", "train_tgt": str(root / "train.txt"), "max_tokens": 400, "max_len": 40},
              "train": {"task": "lm", "schedule": "constant", "lr": 3e-3, "warmup_steps": 5, "max_steps": 80,
                        "log_every": 40, "eval_every": 80, "save_every": 80, "seed": 0}}
    (root / "ft.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(root / "ft.yaml"), "--out", str(root / "run"), "--init-from", str(imported[1])]) == 0
    return root / "run" / "model", root / "train.txt"


@torch.no_grad()
def _eos_probabilities(model_dir) -> list[float]:
    """p(EOS | BOS + line) for each line of TEXT: whether a model has learned where its lines end."""
    model, tok = load_model(model_dir).eval(), load_tokenizer(model_dir)
    out = []
    for line in TEXT:
        ids = torch.tensor([[tok.bos_id, *tok.encode(line)]])                         # (1, T)
        out.append(model(ids)[0, -1].softmax(-1)[tok.eos_id].item())
    return out


def test_finetuning_learns_the_text_and_its_ends(imported, finetuned):
    model_dir, text = finetuned
    assert load_tokenizer(model_dir).digest() == load_tokenizer(imported[1]).digest()  # no new tokenizer
    # trained with <|endoftext|> first (as every transduce LM), so prompted with it, unlike the import
    assert load_tokenizer(model_dir).add_bos_token and not load_tokenizer(imported[1]).add_bos_token
    assert load_model(model_dir).config.eos_id == load_tokenizer(model_dir).eos_id != 0
    before, after = perplexity(imported[1], text)["perplexity"], perplexity(model_dir, text)["perplexity"]
    # A random 400-token model starts near 400 (it was ~1600 when tried); four memorised lines end
    # far below 4: a margin no seed or CPU's rounding closes.
    assert before > 50 and after < 4, (before, after)
    # EOS is a label like any other (not skipped as padding): the model learns where lines end.
    assert min(_eos_probabilities(model_dir)) > 0.5 > max(_eos_probabilities(imported[1]))


def test_generate_and_evaluate_the_finetuned_model(finetuned, capsys):
    model_dir, text = finetuned
    assert main(["generate", str(model_dir), "--prompt", "Two dogs", "--temperature", "0",
                 "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == TEXT[1]
    assert main(["evaluate", str(model_dir), "--ref", str(text)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "lm" and report["perplexity"] == pytest.approx(perplexity(model_dir, text)["perplexity"])


@torch.no_grad()
def test_export_of_the_finetuned_model_is_a_gpt2_with_its_logits_and_tokens(imported, finetuned, tmp_path):
    model_dir, _ = finetuned
    report = export_model(model_dir, "hf", tmp_path / "hf")
    assert report.checks["max_logit_diff"] < 1e-4 and report.checks["tokenizer_differences"] == 0
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ours = load_model(model_dir).eval()
    ids = torch.randint(0, hf.config.vocab_size, (4, 30), generator=torch.Generator().manual_seed(1))  # (B, T)
    torch.testing.assert_close(hf(input_ids=ids).logits, ours(ids), rtol=0, atol=1e-4)
    texts = TEXT + HARD_CASES + [en for en, _ in toy_pairs(50, 3)]
    original = transformers.AutoTokenizer.from_pretrained(imported[0])
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert [again(t, add_special_tokens=False)["input_ids"] for t in texts] == \
        [original(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert again.eos_token_id == original.eos_token_id == hf.config.eos_token_id


@pytest.mark.parametrize("what", ["empty", "hf"])
def test_init_from_a_directory_that_is_not_a_model_is_one_line(imported, finetuned, tmp_path, capsys, what):
    where = imported[0] if what == "hf" else tmp_path / "empty"
    where.mkdir(exist_ok=True)
    (tmp_path / "ft.yaml").write_text(yaml.safe_dump({"data": {"corpus": "files", "train_tgt": str(finetuned[1])},
                                                      "train": {"task": "lm", "max_steps": 2}}))
    assert main(["train", str(tmp_path / "ft.yaml"), "--out", str(tmp_path / "run"), "--init-from", str(where)]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.init_from" in err and "is not a transduce model directory" in err
    assert "\n" not in err and "Traceback" not in err and not (tmp_path / "run").exists()
    assert ("transduce import" in err) == (what == "hf")
