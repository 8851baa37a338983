"""ONNX export: encoder + decoder-step graphs in ONNX Runtime give our logits, and the project's
greedy search over them (GraphModel) gives our greedy output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transduce.config import DecodeConfig

from transduce.interop import export_model
from transduce.errors import ConfigError
from transduce.interop import ExportError
from transduce.interop.onnx import onnx_graphs, verify_onnx
from transduce.interop.verify import search_ids
from transduce.inference.search import greedy_search
from transduce.inference.translator import Translator
from toy_model import toy_pairs
from transduce.model import load_model
from extra_helpers import need_extra
from verify_helpers import MAX_LEN, assert_each_difference_fails, corrupted, many_probes

need_extra("export", "onnx", "onnxruntime", "onnxscript")


@pytest.fixture(scope="module")
def onnx_dir(trained_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "model"
    report = export_model(trained_dir, "onnx", out)
    assert report.checks["max_logit_diff"] < 1e-4
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_a_corrupted_eager_model_fails_verification(onnx_dir, trained_dir, beam):
    """The graphs against the trained model with one output row times 1.5: the verification fails
    (at the logits), and so does each probe whose greedy or beam output over the graphs differs."""
    model = load_model(trained_dir).eval()
    src = many_probes(model)
    broken = corrupted(model, src)
    with pytest.raises(ExportError, match="verification failed"):
        verify_onnx(broken, onnx_dir)
    got = search_ids(onnx_graphs(model, onnx_dir, threads=1), src, beam, MAX_LEN)
    assert_each_difference_fails("ONNX", broken, src, search_ids(broken, src, beam, MAX_LEN), got, beam=beam > 1)


def _sources(tr: Translator, texts: list[str]) -> torch.Tensor:
    rows = [tr.tokenizer.encode(t, "src") + [2] for t in texts]
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


@pytest.mark.parametrize("n", [1, 7])
def test_greedy_matches_eager(onnx_dir, trained_dir, n):
    """Dynamic batch and lengths: batches of 1 and 7 padded sentences, new lengths each time."""
    tr = Translator.load(trained_dir)
    src = _sources(tr, [s for s, _ in toy_pairs(n, seed=n)])
    decode = DecodeConfig(max_len_a=0.0, max_len_b=25)
    with torch.no_grad():
        out = greedy_search(tr.model, src, decode)
        got = greedy_search(onnx_graphs(tr.model, onnx_dir, threads=1), src, decode)
    want = [out.hypothesis(i) for i in range(n)]
    assert [got.hypothesis(i) for i in range(n)] == want
    assert all(w and w[-1] == 2 for w in want)  # the trained model ends its outputs


@torch.no_grad()
def test_step_logits_match_teacher_forcing(onnx_dir, trained_dir):
    tr = Translator.load(trained_dir)
    src = _sources(tr, ["the red dog sleeps today", "a cat"])
    tgt = torch.tensor([[1] + tr.tokenizer.encode("der rot Hund schläft heute", "tgt")] * 2)
    want = tr.model(src, tgt)                                               # (B, T, V)
    graphs = onnx_graphs(tr.model, onnx_dir, threads=1)
    enc, cache = graphs.encode(src), graphs.new_cache()
    for t in range(tgt.shape[1]):
        logits = graphs.decode(tgt[:, t: t + 1], enc, cache).logits[:, 0]   # (B, V)
        np.testing.assert_allclose(logits.numpy(), want[:, t].numpy(), rtol=0, atol=1e-4)
        assert cache.self_kv[0].shape[2] == t + 1  # the cache grows by one position per step


def test_directory_contents(onnx_dir):
    names = {p.name for p in onnx_dir.iterdir()}
    assert {"encoder.onnx", "decoder.onnx", "onnx_config.json", "spm.model", "tokenizer.yaml"} <= names
    import onnx

    graph = onnx.load(str(onnx_dir / "decoder.onnx")).graph
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    assert isinstance(inputs["tokens"][0], str)           # dynamic batch
    assert isinstance(inputs["self_k_0"][2], str)         # dynamic cache length
    assert isinstance(inputs["cross_k_0"][2], str)        # dynamic source length


def test_source_longer_than_the_position_table_is_refused(onnx_dir, trained_dir):
    tr = Translator.load(trained_dir)
    graphs = onnx_graphs(tr.model, onnx_dir, threads=1)
    too_long = torch.full((1, tr.model.config.max_positions + 1), 5, dtype=torch.long)
    with pytest.raises(ConfigError, match=r"decode.max_input_len: a source of 65 tokens .* take \(64\)"):
        greedy_search(graphs, too_long, DecodeConfig(max_len_a=0.0, max_len_b=5))


def test_heads_of_another_width_export_and_verify(tmp_path, trained_dir):
    """model.head_dim != d_model / n_heads: the decoder step's cache inputs take the head width."""
    from transduce.config import ModelConfig
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import Transformer, save_model

    tok = Tokenizer.load(trained_dir)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=16,
                                    n_heads=2, head_dim=12, n_encoder_layers=1, n_decoder_layers=2, d_ff=32))
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    report = export_model(tmp_path / "m", "onnx", tmp_path / "out")
    assert report.checks["max_logit_diff"] < 1e-4


def test_relative_position_bias_exports_and_verifies(tmp_path, trained_dir):
    """The paper's model with T5's relative position bias (post-norm, scaled scores): the bias,
    bidirectional in the encoder graph and causal over the cache in the decoder step's, gives
    the eager logits step by step and the same greedy output."""
    from transduce.config import ModelConfig
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import Transformer, save_model

    tok = Tokenizer.load(trained_dir)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=16,
                                    n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32, positions="relative",
                                    relative_buckets=8, relative_max_distance=12))
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    report = export_model(tmp_path / "m", "onnx", tmp_path / "out")
    assert report.checks["max_logit_diff"] < 1e-4 and report.checks["greedy_differences"] == 0
