"""TranslatorPool / SearchPool: searches in worker processes give the Translator's results."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from inference_helpers import assert_same_search
from transduce.errors import CheckpointError, ConfigError
from transduce.config import DecodeConfig
from transduce.inference import (AttentionChoice, Runtime, SearchPool, SearchSpec, Translator, TranslatorPool,
                                 spread_batches)

TEXTS = ["the cat sat on the mat", "", "a dog runs", "we walk to the river with a child today",
         "tea", "", "the bird sings a song", "a cat", "the dog and the cat sit by the river"]

pytestmark = pytest.mark.slow  # starts worker processes (a few seconds each)


@pytest.fixture(scope="module")
def pool(model_dir):
    with TranslatorPool.load(model_dir, Runtime(workers=2)) as p:
        yield p


@pytest.fixture(scope="module")
def translator(model_dir) -> Translator:
    return Translator.load(model_dir)


def _same(a, b) -> None:
    """Two lists of Translations agree on every hypothesis (texts, ids, scores, attention)."""
    assert [t.source_tokens for t in a] == [t.source_tokens for t in b]
    for x, y in zip(a, b):
        assert [h.tokens for h in x.hypotheses] == [h.tokens for h in y.hypotheses]
        assert [h.text for h in x.hypotheses] == [h.text for h in y.hypotheses]
        assert [h.ended for h in x.hypotheses] == [h.ended for h in y.hypotheses]
        assert [h.score for h in x.hypotheses] == pytest.approx([h.score for h in y.hypotheses], rel=1e-5)
        for hx, hy in zip(x.hypotheses, y.hypotheses):
            if hx.attention is not None or hy.attention is not None:
                torch.testing.assert_close(hx.attention, hy.attention, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("beam,nbest", [(1, 1), (4, 3)])
def test_pool_gives_the_translators_results_in_input_order(pool, translator, beam, nbest):
    kwargs = dict(beam=beam, nbest=nbest, max_len_b=6, attention=AttentionChoice())
    got = pool.translate_detailed(TEXTS, **kwargs)
    # The pool spreads the one batch over its 2 workers; search results do not depend on how
    # sentences are batched (test_translator), so the Translator's one batch must agree.
    want = translator.translate_detailed(TEXTS, **kwargs)
    _same(got, want)
    assert got[1].best.text == "" and got[5].best.text == ""
    assert pool.translate(TEXTS, beam=beam, max_len_b=6) == [t.best.text for t in got]


def test_pool_answers_a_request_with_nothing_to_search(pool, translator):
    # empty sentences only (found by bench/soak.py: it was a ValueError, a 500 from the server)
    assert pool.translate(["", ""]) == ["", ""] == translator.translate(["", ""])
    assert pool.translate([]) == []


def test_pool_forces_prefixes_as_the_translator_does(pool, translator):
    prefixes = ["the", "", "a dog", "", "", "", "", "", "we"]
    got = pool.translate_detailed(TEXTS, beam=4, max_len_b=8, prefix=prefixes)
    _same(got, translator.translate_detailed(TEXTS, beam=4, max_len_b=8, prefix=prefixes))


def test_pool_constrains_and_controls_repetition_as_the_translator_does(pool, translator):
    constraints = [["THE"], [], ["A DOG", "CAT"], [], [], [], [], [], ["WE"]]
    kwargs = dict(beam=3, nbest=2, max_len_b=10, no_repeat_ngram_size=2, constraints=constraints)
    _same(pool.translate_detailed(TEXTS, **kwargs), translator.translate_detailed(TEXTS, **kwargs))


def test_pool_sampling_matches_the_translator_batch_for_batch(pool, translator):
    """A seed seeds each batch's generator, so the same batches give the same samples."""
    batches = pool._batches([len(pool.encode_source(t)[0]) + 1 for t in TEXTS if t], 4096)
    assert len(batches) == 2
    widest = max(len(b) * max(len(pool.encode_source(t)[0]) + 1 for t in TEXTS if t) for b in batches)
    got = pool.sample(TEXTS, temperature=1.3, seed=5, max_len_b=5)
    want = translator.sample(TEXTS, temperature=1.3, seed=5, max_len_b=5, batch_tokens=widest)
    assert [t.best.tokens for t in got] == [t.best.tokens for t in want]


def test_pool_truncates_overlong_input_with_a_warning(model_dir, caplog):
    with TranslatorPool.load(model_dir, Runtime(workers=1)) as short, \
            caplog.at_level(logging.WARNING, logger="transduce.inference.translation"):
        result = short.translate_detailed(["the cat sat on the mat", "tea"], beam=2, max_len_b=3, max_input_len=4)
    assert result[0].truncated and len(result[0].source_tokens) == 4
    assert "truncated" in caplog.text


def test_search_pool_runs_specs_on_id_batches(model_dir):
    from transduce.model import load_model

    model = load_model(model_dir)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    spec = SearchSpec(DecodeConfig(beam=3, nbest=2, max_len_b=5))
    with SearchPool(model_dir, Runtime(workers=1, threads=1)) as pool:
        outs = list(pool.map([src, src[:1]], spec))
    with torch.inference_mode():
        want = spec.run(model, src)
    assert_same_search(want, outs[0], scores=(1.3e-6, 1e-5))  # assert_close's float32 defaults
    assert torch.equal(outs[1].tokens[0], want.tokens[0][..., : outs[1].tokens.shape[-1]])


def test_pool_errors_are_one_line(model_dir, tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        TranslatorPool.load(tmp_path / "missing")
    with pytest.raises(ConfigError, match="runtime.workers"):
        TranslatorPool.load(model_dir, Runtime(workers=0))
    with pytest.raises(ConfigError, match="runtime.worker_timeout_s"):
        Runtime(workers=2, worker_timeout_s=0)
    with pytest.raises(ConfigError, match="runtime.precision"):
        Runtime(workers=2, precision="fp8")
    # A model directory whose weights are damaged: the workers' load error reaches the caller.
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        TranslatorPool.load(broken, Runtime(workers=2))


def test_spread_batches_splits_the_costliest_until_every_worker_has_one():
    lengths = [5, 9, 7, 3, 8, 2]
    batches = spread_batches([[1, 4, 2, 0, 3, 5]], lengths, parts=3)
    assert len(batches) == 3
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert [i for b in batches for i in b] == [1, 4, 2, 0, 3, 5]  # order kept
    assert spread_batches([[0], [1]], lengths, parts=4) == [[0], [1]]  # nothing left to split
    assert spread_batches([[1, 4], [2, 0]], lengths, parts=2) == [[1, 4], [2, 0]]
    assert spread_batches([], lengths, parts=2) == []


def test_pool_scores_aligns_and_keeps_markup_as_the_translator_does(pool, translator):
    # forced decoding (score, jsonl's log-probabilities and alignments, markup) runs in a worker
    # (before, a pool refused it with an error that named `score`, whatever the command)
    from transduce.inference.text.alignment import translate_markup
    from transduce.inference.scoring import score_pairs

    targets = [t.upper() for t in TEXTS]
    decode = translator.settings(max_len_b=6)
    got, want = score_pairs(pool, TEXTS, targets, decode), score_pairs(translator, TEXTS, targets, decode)
    assert [g.pieces for g in got] == [w.pieces for w in want]
    for g, w in zip(got, want):
        assert g.token_log_probs == pytest.approx(w.token_log_probs, rel=1e-5, abs=1e-6)
        assert g.score == pytest.approx(w.score, rel=1e-5)
    aligned = [pool.translate_detailed(TEXTS, alignment=True, max_len_b=6),
               translator.translate_detailed(TEXTS, alignment=True, max_len_b=6)]
    assert [t.best.alignment for t in aligned[0]] == [t.best.alignment for t in aligned[1]]
    assert any(t.best.alignment for t in aligned[0])
    marked = ["the <b>cat</b> sat", "a {name} runs", "tea"]
    assert translate_markup(pool, marked, decode) == translate_markup(translator, marked, decode)


def test_cli_workers_write_what_one_process_writes(model_dir, tmp_path, capsys):
    from transduce.cli import main

    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    fast = ["--beam", "3", "--max-len-b", "5", "--nbest", "2", "--input", str(src)]
    outs = []
    for extra in ([], ["--workers", "2"]):
        dst = tmp_path / f"out{len(outs)}.txt"
        assert main(["translate", str(model_dir), *fast, "--output", str(dst), *extra]) == 0
        outs.append(dst.read_text(encoding="utf-8").split("\n"))
    texts = [[row.split("\t", 1)[1] for row in out if row] for out in outs]
    assert len(texts[0]) == 2 * len(TEXTS) and texts[0] == texts[1]
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(t.upper() for t in TEXTS) + "\n", encoding="utf-8")
    reports = []
    for extra in ([], ["--workers", "2", "--threads", "1"]):
        assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--max-len-b", "5",
                     *extra]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0]["bleu"] == reports[1]["bleu"] and reports[0]["chrf"] == reports[1]["chrf"]


@pytest.mark.parametrize("argv,message", [(["--workers", "-1"], "runtime.workers: must be >= 0"),
                                          (["--workers", "2", "--device", "cuda"], "decode on the CPU"),
                                          (["--workers", "1", "--threads", "0"], "runtime.threads: must be >= 1"),
                                          (["--workers", "1", "--worker-timeout", "0"], "must be > 0 seconds"),
                                          (["--worker-timeout", "5"], "--worker-timeout: is for --workers")])
def test_cli_worker_options_are_checked(model_dir, capsys, argv, message):
    from transduce.cli import main

    assert main(["translate", str(model_dir), *argv]) == 2
    assert message in capsys.readouterr().err


def test_workers_end_when_their_parent_is_killed(model_dir, tmp_path):
    """A parent killed without closing the pool (kill -9; uvicorn re-raising SIGTERM) must not
    leave its workers waiting for ever, each holding a copy of the model."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from transduce.inference import Runtime, SearchPool\n"
        "if __name__ == '__main__':\n"
        "    pool = SearchPool(sys.argv[1], Runtime(workers=2))\n"
        "    print(' '.join(map(str, pool.pids)), flush=True)\n"
        "    time.sleep(600)\n", encoding="utf-8")
    parent = subprocess.Popen([sys.executable, str(script), str(model_dir)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    assert os.getpid() not in pids


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited orphan is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("t", [torch.empty(0, 3), torch.randn(4, 5).t(), torch.tensor([[True, False]]),
                               torch.arange(10)[2:7], torch.randn(2, 3).to(torch.bfloat16)])
def test_tensors_cross_processes_as_bytes_and_back(t):
    from transduce.inference.workers import TensorBytes

    back = TensorBytes.of(t).tensor()
    assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)


def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    """Poll ``condition`` until it holds (the timeout only ends a test that would hang)."""
    import time

    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.02)


def test_a_killed_worker_is_replaced_alone_while_the_other_keeps_answering(model_dir):
    """Two workers; one holds a batch (it stalls on it) and is SIGKILLed: its batch is searched
    by a live worker, only it is replaced, and the other answered throughout, before and after
    the kill, without waiting for the replacement. Asserted on the pool's events, not on time."""
    import os
    import signal
    import threading

    from inference_helpers import StallingSpec
    from transduce.model import load_model

    decode = DecodeConfig(beam=2, max_len_b=5)
    batches = [torch.tensor([[5 + i % 7, 6, 7, 2], [8, 9 + i % 3, 2, 0]]) for i in range(12)]
    model = load_model(model_dir)
    with torch.inference_mode():
        want = [SearchSpec(decode).run(model, src).tokens for src in batches]
    with SearchPool(model_dir, Runtime(workers=2, worker_timeout_s=600.0)) as pool:
        victim, survivor = pool.pids
        got: list = []
        mapper = threading.Thread(target=lambda: got.extend(pool.map(batches, StallingSpec(decode, stall_pid=victim))))
        mapper.start()
        # The survivor keeps answering while the victim holds its batch.
        _wait_for(lambda: sum(e[1:] == ("answered", survivor) for e in list(pool.events)) >= 3, "3 answers")
        os.kill(victim, signal.SIGKILL)
        mapper.join(120)
        assert not mapper.is_alive()
        events = [e[1:] for e in pool.events]
        assert [torch.equal(g.tokens, w) for g, w in zip(got, want)] == [True] * 12
        died = events.index(("died", victim))
        assert ("answered", victim) not in events  # it held one batch till the end: the retry answered it
        after = [pid for what, pid in events[died:] if what == "answered"]
        assert after and set(after) <= set(pool.pids) | {survivor}
        assert pool.restarts == 1 and pool.hangs == 0 and survivor in pool.pids and victim not in pool.pids
        started = [pid for what, pid in events if what == "started"]
        assert len(started) == 3  # two at the start, one replacement: the survivor was never restarted


def test_a_model_that_fails_to_load_on_restart_is_given_up_with_its_error(model_dir, tmp_path):
    """The only worker dies and its replacement cannot load the model (the file is gone): one
    line naming the file, no restart loop."""
    import os
    import shutil
    import signal

    from transduce.inference.pool import WorkerLost

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    src = torch.tensor([[5, 6, 7, 2]])
    with SearchPool(copy, Runtime(workers=1)) as pool:
        (copy / "model.safetensors").unlink()
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(WorkerLost, match="no decoding worker is left: .*model.safetensors") as err:
            list(pool.map([src], SearchSpec(DecodeConfig(max_len_b=3))))
        assert "\n" not in str(err.value)
        assert [e[1] for e in pool.events].count("started") == 2 and pool.restarts == 1


def test_a_worker_that_keeps_crashing_while_loading_is_given_up(model_dir, tmp_path, monkeypatch):
    """Every replacement dies as its interpreter starts (a sitecustomize that exits once the flag
    file exists): restarted after a growing pause, given up after MAX_FAILED_STARTS deaths in a
    row, while the other worker answers every batch."""
    import os
    import signal

    from transduce.inference.pool import MAX_FAILED_STARTS

    flag = tmp_path / "crash"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import os\nif os.path.exists({str(flag)!r}):\n    os._exit(3)\n",
                                           encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    spec = SearchSpec(DecodeConfig(max_len_b=3))
    batches = [torch.tensor([[5, 6, 7, 2]])] * 4
    with SearchPool(model_dir, Runtime(workers=2)) as pool:
        victim, survivor = pool.pids
        flag.write_text("", encoding="utf-8")
        os.kill(victim, signal.SIGKILL)
        def given_up() -> bool:  # each call's batches are answered (by the survivor) meanwhile
            assert len(list(pool.map(batches, spec))) == 4
            return any(s.given_up for s in pool._slots)

        _wait_for(given_up, "the crashing slot given up")
        given_up = next(str(s.given_up) for s in pool._slots if s.given_up)
        assert given_up.startswith("a decoding worker died (exit code 3) while loading")
        assert f"{MAX_FAILED_STARTS} times in a row; not restarted" in given_up
        assert len(list(pool.map(batches, spec))) == 4 and pool.pids == [survivor]
        assert pool.restarts == 1 + MAX_FAILED_STARTS


def test_a_hung_worker_is_replaced_and_its_batches_answered(model_dir, translator):
    """SIGSTOP the worker: its batch is not answered within the deadline, so the pool kills it
    (without waiting on it), starts a new one and resubmits: the Translator's results, and the
    next call is served."""
    import os
    import signal

    from transduce.inference.pool import SLOW_FACTOR

    want = translator.translate(TEXTS, beam=2, max_len_b=6)
    with TranslatorPool.load(model_dir, Runtime(workers=1, worker_timeout_s=1.5)) as p:
        assert p.pool._deadline(1e9) == 1.5  # no speed measured yet
        assert p.translate(TEXTS, beam=2, max_len_b=6) == want
        # A slow but healthy worker is not taken for a hung one: a batch's deadline grows with
        # its size (searched positions) at SLOW_FACTOR times the slowest speed measured.
        rate = p.pool.speeds.rate(1e9)
        assert rate > 0 and p.pool._deadline(1e9) == pytest.approx(SLOW_FACTOR * rate * 1e9)
        stopped = p.pool.pids[0]
        os.kill(stopped, signal.SIGSTOP)
        assert p.translate(TEXTS, beam=2, max_len_b=6) == want
        assert (p.pool.restarts, p.pool.hangs) == (1, 1) and not _alive(stopped)
        assert p.translate(TEXTS, beam=2, max_len_b=6) == want
        assert p.pool.restarts == 1
        last = p.pool.pids[0]
        os.kill(last, signal.SIGSTOP)  # close() kills a stopped worker after the deadline: never waits for ever
    assert not _alive(last)


@pytest.mark.parametrize("positions,rate", [(100, 0.01), (150, 0.01), (300, 0.001), (10_000, 0.001),
                                            (50_000, 0.0005), (10**6, 0.0005)])
def test_a_batch_is_judged_by_the_speed_of_batches_of_its_size(positions, rate):
    """A small batch's fixed cost makes its seconds per position high; it must not set the
    deadline of a large batch (that made a hung worker stall a loaded server for minutes)."""
    from transduce.inference.pool import Speeds

    speeds = Speeds()
    assert speeds.rate(positions) == 0.0
    speeds.record(100, 1.0)        # 0.01 s a position: a one-sentence batch
    speeds.record(120, 0.6)        # the same size class, faster: the slowest is kept
    speeds.record(8_000, 8.0)      # 0.001
    speeds.record(40_000, 20.0)    # 0.0005
    assert speeds.rate(positions) == pytest.approx(rate)


def test_a_batch_that_hangs_the_new_worker_too_is_lost_not_waited_on(model_dir):
    """A batch whose search never ends hangs the restarted worker as well: WorkerLost (a 503 in
    the server), the stuck worker is replaced, and the next call is served."""
    from inference_helpers import HangingSpec
    from transduce.inference.pool import WorkerLost

    src = torch.tensor([[5, 6, 7, 2]])
    spec = SearchSpec(DecodeConfig(beam=2, max_len_b=4))
    with SearchPool(model_dir, Runtime(workers=1, worker_timeout_s=1.0)) as pool:
        with pytest.raises(WorkerLost, match="did not answer within 1 s twice on the same batch"):
            list(pool.map([src], HangingSpec()))
        assert (pool.restarts, pool.hangs) == (2, 2)
        got = next(pool.map([src], spec))
    from transduce.model import load_model

    with torch.inference_mode():
        assert torch.equal(got.tokens, spec.run(load_model(model_dir), src).tokens)

