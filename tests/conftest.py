"""Fixtures shared across test directories (the directories are not packages)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch


def _helper_module(name: str, directory: str):
    """tests/DIRECTORY/NAME.py, registered in ``sys.modules`` by path so ``from NAME import ...``
    works under any pytest import mode and from any test directory."""
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / directory / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# Static int8 runs as int8 in the tests on any CPU, so they test its arithmetic where it would
# not pay (a CPU without VNNI or AMX: inference/speed/static_int8.py); tests of that choice set
# "auto" themselves. Set before any test starts a process, so theirs inherit it.
os.environ.setdefault("TRANSDUCE_STATIC_INT8", "always")


def pytest_configure(config):
    """``TRANSDUCE_TEST_MKLDNN=0``: run without oneDNN kernels, as on a machine without them
    (CONTRIBUTING.md, "Tests that hold on any CPU")."""
    if os.environ.get("TRANSDUCE_TEST_MKLDNN") == "0":
        torch.backends.mkldnn.enabled = False
    _share_the_cores()


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker gets its share of the cores (at least one thread), and so
    do the processes its tests start (OMP_NUM_THREADS): n workers of torch's default, one thread
    per core each, would oversubscribe the machine n times, and OpenMP's spin-waiting makes
    every op slower. A test that needs more threads sets them itself. ``TRANSDUCE_TEST_THREADS=0``
    keeps torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or os.environ.get("TRANSDUCE_TEST_THREADS") == "0":
        return
    share = max(1, (os.cpu_count() or 1) // workers)
    torch.set_num_threads(share)
    os.environ["OMP_NUM_THREADS"] = str(share)


# CI runs the suite once (CONTRIBUTING.md, "CI"): its README job, with no extra installed, writes
# the tests that skipped for want of one to $TRANSDUCE_EXTRA_SKIPS_OUT; its full job, with every
# extra, runs only those ($TRANSDUCE_EXTRA_SKIPS_IN). A skip is an extra's when its reason is
# need_extra's (tests/extra_helpers.py), so the mark is made where the skip is decided.
EXTRA_SKIP_REASON = "needs the '"


def _skipped_for_an_extra(report) -> bool:
    longrepr = report.longrepr
    return bool(report.skipped and isinstance(longrepr, tuple) and EXTRA_SKIP_REASON in str(longrepr[2]))


def _record_extra_skip(report) -> None:
    out = os.environ.get("TRANSDUCE_EXTRA_SKIPS_OUT")
    # under pytest-xdist the controller sees every worker's reports: only it writes
    if out and "PYTEST_XDIST_WORKER" not in os.environ and _skipped_for_an_extra(report):
        with open(out, "a", encoding="utf-8") as f:  # one short line an append
            f.write(report.nodeid + "\n")


def pytest_runtest_logreport(report):
    _record_extra_skip(report)


def pytest_collectreport(report):
    _record_extra_skip(report)  # a module skipped whole (need_extra at module level)


def pytest_collection_modifyitems(config, items):
    """With $TRANSDUCE_EXTRA_SKIPS_IN, keep only the tests it lists, or whose module it lists."""
    listed = os.environ.get("TRANSDUCE_EXTRA_SKIPS_IN")
    if not listed:
        return
    wanted = set(Path(listed).read_text(encoding="utf-8").split("\n")) - {""}
    keep = [item.nodeid in wanted or item.nodeid.split("::")[0] in wanted for item in items]
    config.hook.pytest_deselected(items=[item for item, k in zip(items, keep) if not k])
    items[:] = [item for item, k in zip(items, keep) if k]


extra_helpers = _helper_module("extra_helpers", ".")
toy_model = _helper_module("toy_model", ".")
inference_helpers = _helper_module("inference_helpers", "inference")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny untrained model directory with a trained tokenizer (inference and CLI tests)."""
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import save_model

    root = tmp_path_factory.mktemp("model")
    sentences = inference_helpers.SENTENCES
    tok = Tokenizer.train(sentences * 3, [s.upper() for s in sentences] * 3, root, vocab_size=60)
    save_model(inference_helpers.tiny_transformer(vocab=tok.src_vocab_size, seed=1), root)
    return root


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    """A small trained model directory (config.yaml, model.safetensors, tokenizer files),
    trained once per session and shared by every test that needs a trained model."""
    return toy_model.toy_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine OpenMP spin-waiting
    makes each op much slower. Restores the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def multi30k_root() -> Path:
    """Multi30k's raw files: $TRANSDUCE_MULTI30K, else ../shared/data/multi30k beside the
    repository (never copied into it); the test is skipped where neither exists."""
    from extra_helpers import multi30k_dir
    root = multi30k_dir()
    if not (root / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {root} (set TRANSDUCE_MULTI30K to its directory)")
    return root
