"""bench/soak.py's record of one request (:class:`Outcome`), the request mix, and its report:
a row per minute (answers by status, lost and hung requests, latency, the server's RSS, threads
and file descriptors), the totals, and the goal's checks."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

RSS_TOLERANCE = 0.05  # the goal: RSS within 5% from minute 2 to the last minute
KINDS = {"valid": 0.8, "oversized": 0.1, "malformed": 0.1}
EXPECTED = {"valid": {200, 503, 504}, "oversized": {413}, "malformed": {422}}


@dataclass(frozen=True)
class Outcome:
    """One request: when it was sent (s since the start), its kind, and its answer or failure."""

    t: float
    kind: str
    status: int | None  # None: lost or hung
    latency: float
    failure: str = ""  # "lost: ReadError", "hung", or ""


def percentile_ms(values: list[float], q: int) -> float | None:
    if len(values) < 2:
        return round(1000 * values[0], 1) if values else None
    return round(1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def minute_row(minute: int, outcomes: list[Outcome], samples: list[dict]) -> dict:
    answered = [o for o in outcomes if o.status is not None]
    valid_ok = [o.latency for o in answered if o.kind == "valid" and o.status == 200]
    last = samples[-1] if samples else {}
    workers = last.get("workers_rss_kb", {})
    return {"minute": minute, "requests": len(outcomes), "answered": len(answered),
            "by_status": dict(sorted(Counter(str(o.status) for o in answered).items())),
            "lost": sum(o.failure.startswith("lost") for o in outcomes),
            "hung": sum(o.failure == "hung" for o in outcomes),
            "unexpected": sum(o.status not in EXPECTED[o.kind] for o in answered),
            "valid_p50_ms": percentile_ms(valid_ok, 50), "valid_p99_ms": percentile_ms(valid_ok, 99),
            "main_rss_mb": round(last.get("main", {}).get("rss_kb", 0) / 1024, 1),
            "main_threads": last.get("main", {}).get("threads"), "main_fds": last.get("main", {}).get("fds"),
            "workers_rss_mb": [round(v / 1024, 1) for v in workers.values()],
            "restarts": last.get("restarts")}


def rss_check(rows: list[dict]) -> dict:
    """The main process's RSS at the end of minutes 2..last: (max - min) / min <= 5%."""
    values = [r["main_rss_mb"] for r in rows[1:] if r["main_rss_mb"]]
    if len(values) < 2:
        return {"pass": None, "note": "needs at least 3 minutes"}
    spread = (max(values) - min(values)) / min(values)
    return {"pass": spread <= RSS_TOLERANCE, "min_mb": min(values), "max_mb": max(values),
            "spread_pct": round(100 * spread, 2)}


def report(outcomes: list[Outcome], samples: list[dict], kills: list[dict], minutes: float, left: int,
           monitor_errors: tuple[str, ...] = ()) -> dict:
    n_minutes = max(1, -(-int(round(minutes * 60)) // 60))
    rows = []
    for m in range(n_minutes):
        last = m == n_minutes - 1
        in_m = [o for o in outcomes if int(o.t // 60) == m or (last and o.t >= 60 * m)]
        rows.append(minute_row(m + 1, in_m, [s for s in samples if last or int(s["t"] // 60) <= m]))
    answered = [o for o in outcomes if o.status is not None]
    codes = Counter(o.status for o in answered)
    bad_5xx = {str(c): n for c, n in codes.items() if c >= 500 and c != 503}
    restarts = max((s["restarts"] or 0 for s in samples), default=0)
    lost, hung = sum(r["lost"] for r in rows), sum(r["hung"] for r in rows)
    valid_ok = [o.latency for o in answered if o.kind == "valid" and o.status == 200]
    totals = {"requests": len(outcomes), "answered": len(answered), "lost": lost, "hung": hung,
              "by_status": {str(c): n for c, n in sorted(codes.items())},
              "by_kind": {k: dict(sorted(Counter(str(o.status) for o in outcomes if o.kind == k).items()))
                          for k in KINDS},
              "unexpected": sum(r["unexpected"] for r in rows),
              "failures": dict(Counter(o.failure for o in outcomes if o.failure)),
              "valid_p50_ms": percentile_ms(valid_ok, 50), "valid_p99_ms": percentile_ms(valid_ok, 99),
              "kills": sum(k["killed"] for k in kills), "stops": sum(k.get("stopped", False) for k in kills),
              "restarts": restarts, "hangs_replaced": max((s.get("hangs") or 0 for s in samples), default=0),
              "health_failures": sum(not s["health_ok"] for s in samples), "processes_left": left,
              "monitor_errors": list(monitor_errors)}
    goal = {"no_lost_or_hung": {"pass": lost == 0 and hung == 0, "lost": lost, "hung": hung},
            "no_5xx_but_503": {"pass": not bad_5xx, "other_5xx": bad_5xx, "503": codes.get(503, 0)},
            "rss_flat": rss_check(rows),
            "workers_restarted": {"pass": restarts >= 1 or not totals["kills"], "kills": totals["kills"],
                                  "restarts": restarts},
            "hung_worker_replaced": {"pass": totals["hangs_replaced"] >= totals["stops"], "stopped": totals["stops"],
                                     "replaced": totals["hangs_replaced"]}}
    return {"minutes": rows, "totals": totals, "kills": kills, "goal": goal,
            "pass": all(g["pass"] is not False for g in goal.values())}
