"""A multilingual run (data.pairs on Multi30k, pairs drawn with a temperature) stopped at step 6 and
resumed equals a straight 12-step run bit for bit: the pair draws are a function of seed and epoch."""

from __future__ import annotations

from transduce.config import DataConfig, RunConfig
from transduce.data.prepare import prepare_dataset
from transduce.model import Transformer
from resume_helpers import assert_resume_exact_and_average

PAIRS = ["en-de", "en-fr", "en-cs"]


def test_a_multilingual_run_resumes_exactly(multi30k_root, tmp_path, one_thread):
    prepared = tmp_path / "prepared"
    prepare_dataset(DataConfig(corpus="multi30k", root=str(multi30k_root), pairs=PAIRS, vocab_size=300,
                               tokenizer_sentences=3000), prepared, workers=1)

    def cfg(**train):
        return RunConfig.from_dict({
            "model": {"preset": "tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1,
                      "n_decoder_layers": 1},
            "data": {"corpus": "multi30k", "pairs": PAIRS, "pair_temperature": 3.0, "prepared": str(prepared),
                     "max_tokens": 300, "valid_max_sentences": 6},
            "train": {"max_steps": 12, "save_every": 6, "eval_every": 1000, "warmup_steps": 2, "num_threads": 1,
                      "eval_bleu": False, **train}})

    assert_resume_exact_and_average(cfg, tmp_path / "runs", Transformer, "encoder_layers.0.ffn.fc1.weight")
