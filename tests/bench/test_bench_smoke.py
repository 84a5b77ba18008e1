"""The benchmark keeps working: its quickest part, at a tiny size, against the real services
produces figures on both sides. Only that numbers came out is checked, never what they are."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bench import __main__ as umbrella
from bench.report import Report, Row

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(110)
def test_the_latency_part_runs_end_to_end_and_reports_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "bench", "--only", "latency", "--samples", "2", "--throughput-turns", "3",
            "--part-timeout", "80", "--json", str(out)]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert not [n for n in report["notes"] if "FAILED" in n or "TIMED OUT" in n], report["notes"]
    rows = {r["measure"]: r for r in report["rows"] if r["part"] == "latency"}
    for measure in ("POST->first event p50", "throughput, 3 at once", "CPU per turn"):
        assert isinstance(rows[measure]["kortex"], float) and isinstance(rows[measure]["baseline"], float), rows
        assert rows[measure]["ratio"] is not None
    assert report["raw"]["latency_kortex"]["throughput_finished"] == 3
    assert report["raw"]["latency_kortex"]["events_per_turn"] > 1  # a turn, its tool call and its text came back


def test_the_sse_part_reports_what_bench_sse_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> dict[str, object]:
        seen.append(args)
        return {"streams": args.streams, "rate": args.rate, "floor": {"events_per_s": 1000.0, "live_s": 0.5},
                "hub": {"events_per_s": 900.0, "live_s": 2.0, "live_streams": args.streams}}

    monkeypatch.setitem(sys.modules, "bench.sse", types.SimpleNamespace(run=run))
    report = Report()
    umbrella.run_sse(None, report, umbrella.parse(["--only", "sse", "--quick"]))  # type: ignore[arg-type]
    assert (seen[0].streams, seen[0].rate) == (200, 5.0)
    delivered, live, _lag = report.rows
    assert delivered.ratio == pytest.approx(0.9) and delivered.met is True
    assert live.met is True  # an absolute goal: 2 s against 5 s


def test_goals_compare_ratios_or_absolute_figures() -> None:
    assert Row("p", "m", 3.0, 2.0, goal="<= 1.5x").met is True
    assert Row("p", "m", 4.0, 2.0, goal="<= 1.5x").met is False
    assert Row("p", "m", 0.4, 1.0, goal=">= 0.5x").met is False
    assert Row("p", "m", None, 1.0, goal="<= 2x").met is None
    assert Row("p", "m", 6.0, None, goal="<= 5").met is False


def test_the_steady_fairness_sampler_spreads_turns_over_the_flood_without_waiting_for_each() -> None:
    import asyncio
    import time

    from bench import fairness

    started: list[float] = []

    class SlowClient:
        async def turn(self, session_id: str, content: str, timing: object = None) -> None:
            started.append(time.perf_counter())
            await asyncio.sleep(1.0)  # a turn slower than the cadence: the next must not wait for it

    async def main() -> list[object]:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(1.1, stop.set)  # the flood ends
        t0 = time.perf_counter()
        timings = await fairness._b_steady(SlowClient(), [f"s{i}" for i in range(100)], stop, 5.0)  # type: ignore[arg-type]
        assert time.perf_counter() - t0 < 3.0  # waited for the turns in flight, then stopped
        return timings

    timings = asyncio.run(main())
    # one turn every 0.25 s for 1.1 s: five, each started before the one before it ended
    assert len(timings) == len(started) == 5
    gaps = [b - a for a, b in zip(started, started[1:], strict=False)]
    assert all(0.15 < g < 0.6 for g in gaps), gaps


def test_a_setting_to_compare_reaches_kortex_and_what_the_bench_owns_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.stack import overrides

    monkeypatch.setenv("KORTEX_BENCH_SET_TURN__LOOP_LAG_TARGET_MS", "20")
    assert overrides() == {"KORTEX_TURN__LOOP_LAG_TARGET_MS": "20"}
    monkeypatch.setenv("KORTEX_BENCH_SET_DATABASE_URL", "postgresql://elsewhere/db")
    with pytest.raises(SystemExit, match="KORTEX_DATABASE_URL itself"):
        overrides()
