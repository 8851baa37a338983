"""bench/soak.py on the tiny model: a short soak with a worker killed loses no request, hangs
none and answers no 5xx but 503; and its report tells the failures it must catch."""

import importlib.util
import json
import sys
from pathlib import Path

from extra_helpers import need_extra

need_extra("serve", "fastapi", "uvicorn")
need_extra("web-test", "httpx")  # the client that talks to the test server

_PATH = Path(__file__).resolve().parents[1] / "bench" / "soak.py"
_spec = importlib.util.spec_from_file_location("bench_soak", _PATH)
soak = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = soak  # its dataclass looks its module up there
_spec.loader.exec_module(soak)


def test_a_short_soak_with_a_killed_and_a_hung_worker_loses_nothing(trained_dir, tmp_path, capsys):
    out = tmp_path / "soak.json"
    code = soak.main(["--model", str(trained_dir), "--minutes", "0.4", "--clients", "4", "--kill-every", "20",
                      "--hang-at", "2", "--worker-timeout", "3", "--timeout", "45", "--out", str(out)])
    result = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == result
    totals, goal = result["totals"], result["goal"]
    assert totals["kills"] >= 1 and totals["restarts"] >= 1, result["kills"]
    assert totals["stops"] == 1 and totals["hangs_replaced"] >= 1 and goal["hung_worker_replaced"]["pass"], result
    assert totals["lost"] == 0 and totals["hung"] == 0, totals["failures"]
    assert goal["no_5xx_but_503"]["pass"], goal
    assert totals["by_kind"]["valid"].get("200", 0) > 0
    assert set(totals["by_kind"]["oversized"]) <= {"413"} and set(totals["by_kind"]["malformed"]) <= {"422"}
    assert totals["processes_left"] == 0 and result["server_log"]["tracebacks"] == 0 and not totals["monitor_errors"]
    assert code == 0 and result["pass"]


def _outcome(t, kind="valid", status=200, failure=""):
    return soak.Outcome(t, kind, status, 0.1, failure)


def _sample(t, rss_mb, restarts=1):
    return {"t": t, "main": {"rss_kb": int(rss_mb * 1024), "threads": 4, "fds": 20}, "health_ok": True,
            "workers_rss_kb": {}, "restarts": restarts}


def test_the_report_fails_a_lost_request_a_500_and_growing_memory():
    outcomes = [_outcome(10), _outcome(70, status=None, failure="lost: ReadError"), _outcome(130, status=500),
                _outcome(150, "malformed", 200), _outcome(170, status=None, failure="hung")]
    samples = [_sample(59, 300), _sample(119, 300), _sample(179, 330)]
    result = soak.report(outcomes, samples, [{"t": 60, "pid": 1, "killed": True}], 3, 0)
    goal = result["goal"]
    assert not result["pass"]
    assert goal["no_lost_or_hung"] == {"pass": False, "lost": 1, "hung": 1}
    assert goal["no_5xx_but_503"]["other_5xx"] == {"500": 1}
    assert goal["rss_flat"]["pass"] is False and goal["rss_flat"]["spread_pct"] == 10.0
    assert [r["requests"] for r in result["minutes"]] == [1, 1, 3]
    assert result["totals"]["unexpected"] == 2  # a 500 to a valid request, a 200 to a malformed one


def test_the_report_passes_503s_and_flat_memory():
    outcomes = [_outcome(t) for t in (5, 65, 125)] + [_outcome(66, status=503), _outcome(67, "oversized", 413)]
    samples = [_sample(59, 300), _sample(119, 301), _sample(179, 303)]
    result = soak.report(outcomes, samples, [{"t": 60, "pid": 1, "killed": True}], 3, 0)
    assert result["pass"] and result["goal"]["rss_flat"]["pass"]
    assert result["minutes"][1]["by_status"] == {"200": 1, "413": 1, "503": 1}
