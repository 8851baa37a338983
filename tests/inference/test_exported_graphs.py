"""Search over exported graphs (``--backend onnx``): the same searches over the ONNX graphs in ONNX
Runtime give eager PyTorch's translations; batches beyond an engine's max rows are split; the
adapter's errors are one line."""

from __future__ import annotations

import math

import pytest
import torch

from transduce.config import Runtime
from transduce.errors import CheckpointError, ConfigError
from transduce.interop import export_model
from transduce.inference import load
from transduce.inference.backends.onnx import GraphCache, GraphModel
from toy_model import toy_pairs
from extra_helpers import need_extra

need_extra("export", "onnx", "onnxruntime", "onnxscript")


@pytest.fixture(scope="module")
def onnx_dir(trained_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("graphs") / "onnx"
    export_model(trained_dir, "onnx", out)
    return out


@pytest.fixture(scope="module")
def translators(trained_dir, onnx_dir, one_thread):
    eager = load(trained_dir, Runtime(device="cpu"))
    graphs = load(trained_dir, Runtime(device="cpu", backend="onnx", engines=str(onnx_dir), threads=1))
    yield eager, graphs
    eager.close()
    graphs.close()


def _texts() -> list[str]:
    return [s for s, _ in toy_pairs(12, seed=3)] + ["", "the dog"]


def test_the_model_is_the_graphs(translators):
    _, graphs = translators
    assert isinstance(graphs.model, GraphModel)


@pytest.mark.parametrize("settings", [dict(beam=1), dict(beam=4, nbest=4), dict(beam=4, lenpen=0.0, nbest=2),
                                      dict(beam=4, stop="best_finished", batch_tokens=40)],
                         ids=["greedy", "beam4-nbest4", "beam4-lenpen0", "beam4-small-batches"])
def test_same_translations_as_eager(translators, settings):
    """Greedy and beam search (n-best lists, length penalty, batches that lose finished sentences)
    give the eager model's hypotheses, token for token, with its scores up to float rounding."""
    eager, graphs = translators
    want = eager.translate_detailed(_texts(), **settings)
    got = graphs.translate_detailed(_texts(), **settings)
    assert [[h.tokens for h in t.hypotheses] for t in got] == [[h.tokens for h in t.hypotheses] for t in want]
    assert all(h.tokens for t in want[:-2] for h in t.hypotheses[:1])  # the trained model says something
    for t_got, t_want in zip(got, want):
        for a, b in zip(t_got.hypotheses, t_want.hypotheses):
            assert math.isclose(a.score, b.score, abs_tol=1e-3)


def test_prefix_runs_over_the_graphs(translators):
    eager, graphs = translators
    texts, prefix = _texts()[:4], ["der", "", "die", ""]
    assert graphs.translate(texts, beam=4, prefix=prefix) == eager.translate(texts, beam=4, prefix=prefix)


def test_cache_reorder_keeps_rows_of_sentences():
    """Cross entries are kept per decoder row: a permutation of beams (cross=False, same rows)
    keeps them; growing to beams or dropping sentences selects them with the rows."""
    mask = torch.tensor([[True, False], [True, True]])
    cross = [torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 2, 1)]
    cache = GraphCache([torch.zeros(2, 1, 1, 1)], mask, cross, 1)
    grown = cache.reorder(torch.tensor([0, 0, 1, 1]), cross=False)       # first step: k = 1 -> 2 beams
    assert grown.cross[0][:, 0, 0, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    same = grown.reorder(torch.tensor([1, 0, 3, 2]), cross=False)        # beams swapped within sentences
    assert same.cross is grown.cross
    dropped = same.reorder(torch.tensor([2, 3]), cross=torch.tensor([1]))  # sentence 0 done
    assert dropped.cross[0][:, 0, 0, 0].tolist() == [1.0, 1.0] and dropped.mask.tolist() == [[True, True]] * 2


def test_graphs_do_not_score(translators):
    _, graphs = translators
    with pytest.raises(ConfigError, match="runtime.backend: the exported graphs decode one token a step"):
        graphs.score(["the dog"], ["der Hund"])


def test_graphs_of_another_model_are_refused(tmp_path, trained_dir, onnx_dir):
    import json
    import shutil
    other = tmp_path / "other"
    shutil.copytree(onnx_dir, other)
    meta = json.loads((other / "onnx_config.json").read_text())
    (other / "onnx_config.json").write_text(json.dumps({**meta, "n_heads": meta["n_heads"] * 2}))
    with pytest.raises(CheckpointError, match="the graphs are of another model"):
        load(trained_dir, Runtime(device="cpu", backend="onnx", engines=str(other)))
    with pytest.raises(CheckpointError, match="no exported graphs .* transduce export MODEL_DIR --format onnx"):
        load(trained_dir, Runtime(device="cpu", backend="onnx", engines=str(tmp_path)))


def test_onnx_takes_cpu_fp32_only(trained_dir, onnx_dir):
    with pytest.raises(ConfigError, match="runtime.precision: the ONNX graphs compute in fp32"):
        load(trained_dir, Runtime(device="cpu", precision="bf16", backend="onnx", engines=str(onnx_dir)))
    with pytest.raises(ConfigError, match="ensembles and draft models run with backend torch"):
        load([trained_dir, trained_dir], Runtime(device="cpu", backend="onnx", engines=str(onnx_dir)))


class _FewRows:
    """The ONNX Runtime steps behind an engine-like limit of ``max_rows`` rows a call (as a
    TensorRT profile's max batch), recording the largest call."""

    def __init__(self, steps, max_rows: int):
        self.steps, self.max_rows, self.seen = steps, max_rows, 0
        self.max_src, self.max_cache = steps.max_src, steps.max_cache

    def _record(self, rows: int) -> None:
        assert rows <= self.max_rows, f"a call of {rows} rows; the engines take {self.max_rows}"
        self.seen = max(self.seen, rows)

    def encode(self, src):
        self._record(src.shape[0])
        return self.steps.encode(src)

    def step(self, feeds):
        self._record(feeds["tokens"].shape[0])
        return self.steps.step(feeds)


@pytest.mark.parametrize("settings", [dict(beam=1), dict(beam=4, nbest=2)], ids=["greedy", "beam4"])
def test_batches_larger_than_the_engines_take_are_split(trained_dir, onnx_dir, one_thread, settings):
    """More rows (sentences x beam) than the engines' max batch: decoded in chunks of at most
    that many rows, with what one call of them all gives."""
    runtime = Runtime(device="cpu", backend="onnx", engines=str(onnx_dir), threads=1)
    with load(trained_dir, runtime) as whole, load(trained_dir, runtime) as split:
        split.model.steps = limited = _FewRows(split.model.steps, max_rows=3)
        want = whole.translate_detailed(_texts(), **settings)
        got = split.translate_detailed(_texts(), **settings)
    assert limited.seen == 3  # the batches were larger and were split
    assert [[h.tokens for h in t.hypotheses] for t in got] == [[h.tokens for h in t.hypotheses] for t in want]
    for t_got, t_want in zip(got, want):  # ONNX Runtime may pick other kernels for fewer rows: rounding apart
        assert all(math.isclose(a.score, b.score, abs_tol=1e-4) for a, b in zip(t_got.hypotheses, t_want.hypotheses))
