"""Generation with a decoder-only LM: greedy vs an uncached argmax loop, batching, sampling, errors."""

import subprocess
import sys

import pytest
import torch

from transduce.config import GenerationConfig, model_preset
from transduce.data.tokenizer import Tokenizer
from transduce.errors import ConfigError, DataError
from transduce.inference import Generator, Translator
from transduce.inference.speed import is_prepared
from transduce.inference.search.lm import generate_ids
from transduce.model import DecoderOnlyLM, load_model, save_model

SENTENCES = ["der hund sieht den ball", "die katze hat einen hut", "ein mann will das haus",
             "das kind mag den roten ball", "eine frau sieht die katze"]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    tok = Tokenizer.train(SENTENCES * 3, SENTENCES * 3, root, vocab_size=60)
    torch.manual_seed(3)
    cfg = model_preset("tiny", arch="decoder_only", src_vocab_size=tok.tgt_vocab_size,
                       tgt_vocab_size=tok.tgt_vocab_size, d_model=32, n_heads=4, n_encoder_layers=0,
                       n_decoder_layers=2, d_ff=64, dropout=0.0, max_positions=24, norm="pre", positions="learned")
    save_model(DecoderOnlyLM(cfg), root)
    return root


def _uncached_greedy(model, ids, n):
    out = []
    for _ in range(n):
        logits = model(ids)[:, -1].float()
        logits[:, [model.config.pad_id, model.config.bos_id]] = -float("inf")
        token = logits.argmax(-1)
        out.append(int(token))
        if out[-1] == model.config.eos_id:
            return out[:-1]
        ids = torch.cat([ids, token[:, None]], dim=1)
    return out


def test_greedy_matches_an_uncached_argmax_loop(lm_dir):
    model = load_model(lm_dir)
    prompts = torch.tensor([[1, 5, 9, 7]])
    got = generate_ids(model, prompts, GenerationConfig(max_new_tokens=12, temperature=0))
    assert got == [_uncached_greedy(model, prompts, 12)]


def test_the_generator_prepares_its_model_and_close_restores_it(lm_dir):
    """A Generator decodes with the model prepared as a Translator's (oneDNN on CPU): the same
    greedy ids as the plain model; leaving the block hands back the plain model."""
    model, prompts = load_model(lm_dir), torch.tensor([[1, 5, 9, 7], [1, 8, 6, 5]])
    greedy = GenerationConfig(max_new_tokens=12, temperature=0)
    want = generate_ids(model, prompts, greedy)
    with Generator(model, Tokenizer.load(lm_dir)) as gen:
        assert is_prepared(gen.model)
        assert generate_ids(gen.model, prompts, greedy) == want
    assert not is_prepared(model)


def test_generation_stops_at_max_positions(lm_dir):
    model = load_model(lm_dir)
    got = generate_ids(model, torch.tensor([[1, 5, 9]]), GenerationConfig(max_new_tokens=100, temperature=1, seed=0),
                       torch.Generator().manual_seed(0))
    assert len(got[0]) <= model.config.max_positions - 3


def test_generate_ids_draws_from_its_seed_not_the_global_rng(lm_dir):
    model = load_model(lm_dir)
    prompts, gen = torch.tensor([[1, 5, 9], [1, 7, 2]]), GenerationConfig(max_new_tokens=10, seed=2)
    state = torch.get_rng_state()
    first = generate_ids(model, prompts, gen)
    assert torch.equal(torch.get_rng_state(), state)  # (a private generator)
    assert generate_ids(model, prompts, gen) == first
    assert generate_ids(model, prompts, gen, torch.Generator().manual_seed(2)) == first


def test_batched_prompts_match_one_at_a_time(lm_dir):
    gen = Generator.load(lm_dir)
    prompts = ["der hund", "die katze hat", "", "der hund", "ein mann will das"]
    greedy = GenerationConfig(max_new_tokens=8, temperature=0, batch_size=2)
    assert gen.generate(prompts, greedy) == [gen.generate([p], greedy)[0] for p in prompts]
    assert gen.generate(["der hund"], greedy)[0].startswith("der hund")


def test_our_lm_reads_bos_first(lm_dir):
    """Our language models are trained with BOS first (batch.pad), so every prompt starts with it;
    an imported GPT-2's do not (tests/interop/test_import_hf_gpt2.py)."""
    gen = Generator.load(lm_dir)
    assert gen.tokenizer.add_bos_token
    assert gen.encode(["der hund", ""]) == [[gen.config.bos_id, *gen.tokenizer.encode("der hund", "tgt")],
                                            [gen.config.bos_id]]


def test_sampling_is_seeded_and_top_k_1_is_greedy(lm_dir):
    gen = Generator.load(lm_dir)
    prompts = ["der hund", "die katze"]
    a = gen.generate(prompts, GenerationConfig(max_new_tokens=10, seed=1))
    assert a == gen.generate(prompts, GenerationConfig(max_new_tokens=10, seed=1))
    draws = {tuple(gen.generate(prompts, GenerationConfig(max_new_tokens=10, seed=s))) for s in range(2, 8)}
    assert len(draws) > 1
    assert gen.generate(prompts, GenerationConfig(max_new_tokens=10, top_k=1, seed=5)) == \
        gen.generate(prompts, GenerationConfig(max_new_tokens=10, temperature=0))


def test_min_new_tokens_forbids_eos_until_then(lm_dir):
    """A model made to say EOS at once ends every row immediately, unless ``min_new_tokens``
    forbids EOS for that many tokens; the generation is then left as a plain model's."""
    model = load_model(lm_dir)
    eos = model.config.eos_id
    with torch.no_grad():  # the final state is always the (enlarged) EOS row of the tied output
        model.output_proj.weight[eos] *= 5
        model.decoder_norm.weight.zero_()
        model.decoder_norm.bias.copy_(model.output_proj.weight[eos])
    prompts = torch.tensor([[1, 5, 9], [1, 7, 8]])

    def lengths(least):
        gen = GenerationConfig(max_new_tokens=6, min_new_tokens=least, temperature=0)
        return [len(row) for row in generate_ids(model, prompts, gen)]
    assert lengths(0) == [0, 0]
    assert lengths(4) == [4, 4]
    assert lengths(6) == [6, 6]
    assert not is_prepared(model)  # generation prepared the model for its own duration only
    with pytest.raises(ConfigError, match="min_new_tokens"):
        GenerationConfig(max_new_tokens=3, min_new_tokens=4)


def test_bad_settings_and_inputs(lm_dir, model_dir):
    with pytest.raises(ConfigError, match="temperature"):
        GenerationConfig(temperature=-1)
    with pytest.raises(ConfigError, match="top_p"):
        GenerationConfig(top_p=0)
    with pytest.raises(DataError, match="max_positions"):
        Generator.load(lm_dir).generate(["der hund " * 20])
    with pytest.raises(ConfigError, match="decoder_only"):
        Generator.load(model_dir)  # an encoder-decoder model
    with pytest.raises(ConfigError, match="generate"):
        Translator.load(lm_dir)


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "transduce", *args], capture_output=True, text=True, timeout=120,
                          input=stdin)


def test_cli_generate(lm_dir, model_dir, tmp_path):
    done = _cli("generate", str(lm_dir), "--prompt", "der hund", "--prompt", "die katze", "--temperature", "0",
                "--max-new-tokens", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("der hund")
    piped = _cli("generate", str(lm_dir), "--temperature", "0", "--max-new-tokens", "5", stdin="der hund\ndie katze\n")
    assert piped.stdout == done.stdout
    bad = _cli("generate", str(lm_dir), "--prompt", "x", "--max-new-tokens", "2", "--min-new-tokens", "3")
    assert bad.returncode == 2 and "min_new_tokens" in bad.stderr
    for args in (("generate", str(model_dir), "--prompt", "x"),
                 ("generate", str(lm_dir), "--prompt", "der hund " * 20)):
        bad = _cli(*args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
