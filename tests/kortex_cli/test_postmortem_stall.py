"""`kortex postmortem run --url` whose items nothing picks up (no `kortex worker --queues batch`,
which README's distributed list of processes leaves out) says so once on stderr, instead of a
bar at 0 for ever; a job that starts says nothing of the kind, nor does the embedded command."""

from __future__ import annotations

from typing import Any

import pytest

from kortex_cli import postmortem


class StuckJobs:
    """A job whose items sit on the queue for ``polls`` polls, then (``start``) run and end."""

    def __init__(self, polls: int, start: bool) -> None:
        self.polls, self.start, self.seen = polls, start, 0

    def status(self, job_id: str) -> dict[str, Any]:
        self.seen += 1
        counts = dict.fromkeys(("queued", "dispatched", "running", "done", "failed", "skipped", "cancelled"), 0)
        ended = self.seen > self.polls
        if self.start and self.seen > 1:
            counts["running" if not ended else "done"] = 2
        else:
            counts["dispatched"] = 2
        return {"id": job_id, "items": 2, "counts": counts, "spend_usd": 0.0, "status": "done" if ended else "running",
                "finished_at": "2026-01-01T00:00:00Z" if ended else None}


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postmortem, "POLL_S", 0.01)
    monkeypatch.setattr(postmortem, "STALL_HINT_S", 0.05)


def test_a_job_no_worker_takes_says_what_it_waits_for_once(capsys: pytest.CaptureFixture[str]) -> None:
    postmortem._progress(StuckJobs(polls=40, start=False), "job-1", postmortem.NO_BATCH_WORKER)  # type: ignore[arg-type]
    said = capsys.readouterr().err
    assert said.count("no item of job job-1 has started") == 1, said
    assert "kortex worker --queues batch" in said


def test_a_job_that_starts_says_nothing_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    postmortem._progress(StuckJobs(polls=40, start=True), "job-2", postmortem.NO_BATCH_WORKER)  # type: ignore[arg-type]
    assert "has started" not in capsys.readouterr().err


def test_run_gives_the_hint_with_url_only(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[str | None] = []

    def progress(jobs: object, job_id: str, stall_hint: str | None = None) -> dict[str, Any]:
        given.append(stall_hint)
        raise SystemExit(0)

    class Jobs:
        def __enter__(self) -> Jobs:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def submit(self, request: dict[str, Any]) -> str:
            return "job-3"

    monkeypatch.setattr(postmortem, "_progress", progress)
    monkeypatch.setattr(postmortem, "_jobs", lambda *a, **k: Jobs())
    for url in ("http://127.0.0.1:9", None):
        with pytest.raises(SystemExit):
            postmortem.run(since="30d", url=url, api_key="kx_x")
    assert given == [postmortem.NO_BATCH_WORKER, None]


def test_the_bar_counts_items_on_the_queue_as_waiting_not_running(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(postmortem, "console", Console(file=out, width=200, force_terminal=False))
    postmortem._progress(StuckJobs(polls=3, start=False), "job-4")  # type: ignore[arg-type]
    shown = out.getvalue()
    assert "running 0 · waiting 2" in shown, shown
