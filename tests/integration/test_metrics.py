"""One turn on the real stack, as Prometheus sees it: a real Prometheus scrapes the API's
/metrics and the prefork worker's metrics port (its children's samples added up by the parent)
and the turn's increments come back from its query API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, update

from kortex.storage.schema import turns
from tests.conftest import Harness
from tests.integration import promproc
from tests.integration.sse import read_events

pytestmark = pytest.mark.timeout(180)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def prometheus(api_url: str, worker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("prometheus-scrape")
    api = api_url.split("://", 1)[1]
    config = ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
              f"  - job_name: api\n    static_configs: [{{targets: ['{api}']}}]\n"
              f"  - job_name: worker\n    static_configs: [{{targets: ['127.0.0.1:{worker.metrics_port}']}}]\n")
    with promproc.prometheus(root, config, f"--storage.tsdb.path={root / 'data'}") as url:
        yield url


def _query(prometheus: str, expr: str) -> dict[str, float]:
    """Each series of ``expr`` by its job, as Prometheus has it now."""
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert body["status"] == "success", body
    return {r["metric"].get("job", ""): float(r["value"][1]) for r in body["data"]["result"]}


def _settled(prometheus: str, expr: str, want: float, timeout: float = 30) -> float:
    """Wait for Prometheus to have scraped ``expr`` at ``want`` (or more); returns what it has."""
    deadline = time.monotonic() + timeout
    got = 0.0
    while time.monotonic() < deadline:
        got = sum(_query(prometheus, expr).values())
        if got >= want:
            return got
        time.sleep(0.5)
    return got


def _steady(prometheus: str, exprs: tuple[str, ...], scrapes: int = 3, timeout: float = 30) -> dict[str, float]:
    """The values of ``exprs`` once unchanged over ``scrapes`` scrape intervals (1 s): turns of
    earlier tests that ended after the last scrape are counted before ours starts, not in it."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, float]] = []
    while time.monotonic() < deadline:
        seen = [*seen[-scrapes:], {e: sum(_query(prometheus, e).values()) for e in exprs}]
        if len(seen) > scrapes and all(s == seen[-1] for s in seen):
            return seen[-1]
        time.sleep(1.0)
    raise AssertionError(f"metrics still moving after {timeout:.0f} s: {seen}")


def _end_leftover_turns(pg: Harness) -> None:
    """Earlier tests on this stack store turns they never hand to a worker; the watchdog re-runs
    such a turn once it has waited ``requeue_after``, at any moment, and the worker's counters
    would count it beside this test's one. Ended here, none of them can run any more."""
    with pg.k.db.begin() as conn:
        conn.execute(update(turns).where(turns.c.status.in_(("queued", "running", "waiting_tools")))
                     .values(status="cancelled", finished_at=func.now()))


def _targets_up(prometheus: str) -> dict[str, str]:
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    return {t["labels"]["job"]: t["health"] for t in targets}


def test_one_turn_shows_up_in_prometheus_from_the_api_and_the_prefork_worker(
        api_url: str, pg: Harness, prometheus: str) -> None:
    deadline = time.monotonic() + 30
    while _targets_up(prometheus) != {"api": "up", "worker": "up"}:
        assert time.monotonic() < deadline, _targets_up(prometheus)
        time.sleep(0.5)
    _end_leftover_turns(pg)
    finished = 'sum(kortex_turns_finished_total{status="done"})'
    tools = 'sum(kortex_tool_duration_seconds_count{tool="get_recent_deploys",outcome="ok"})'
    calls = 'sum(kortex_llm_calls_total{provider="scripted",model="two_tools",outcome="ok"})'
    before = _steady(prometheus, (finished, tools, calls))

    tenant = pg.tenant("metrics")
    pg.seed(tenant)
    key = pg.api_key(tenant)
    sid = httpx.post(f"{api_url}/v1/sessions", json={"model": "scripted:two_tools"}, headers=auth(key)).json()["id"]
    posted = httpx.post(f"{api_url}/v1/sessions/{sid}/messages", json={"content": "why?"}, headers=auth(key)).json()
    events = read_events(api_url + posted["events_url"], key)
    assert events[-1].event == "done" and events[-1].data["status"] == "done"

    assert _settled(prometheus, finished, before[finished] + 1) == before[finished] + 1
    assert _settled(prometheus, tools, before[tools] + 1) == before[tools] + 1
    assert _settled(prometheus, calls, before[calls] + 2) == before[calls] + 2  # two steps, two calls
    # the work ran in the worker's prefork children; the API saw the stream
    assert _query(prometheus, 'sum by (job) (kortex_turns_finished_total{status="done"})').keys() == {"worker"}
    assert _settled(prometheus, "sum(kortex_stream_lag_seconds_count)", 1) >= 1
