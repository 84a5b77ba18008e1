"""`kortex postmortem run` and `export` write every document of a job, whose documents the API
and the domain serve a page at a time: both the embedded and the remote reader follow the pages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kortex import keys
from kortex.postmortems import jobs
from kortex_cli import postmortem
from tests.api.test_postmortem_documents import WRITTEN, Done, finished_job
from tests.conftest import Harness


@pytest.fixture
def done(harness: Harness) -> Iterator[Done]:
    with finished_job(harness) as job:
        yield job


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postmortem, "DOCUMENTS_PAGE", 2)  # five documents: three pages


def _tenant_of(done: Done, harness: Harness) -> str:
    return keys.authenticate(harness.k, done.key["Authorization"].removeprefix("Bearer ")).tenant.id


@pytest.mark.usefixtures("small_pages")
def test_the_remote_reader_writes_every_page_of_documents(done: Done, tmp_path: Path) -> None:
    remote = postmortem.RemoteJobs("http://testserver", "unused")
    done.client.headers.update(done.key)
    asked: list[str] = []
    done.client.event_hooks["request"] = [lambda request: asked.append(str(request.url))]
    remote._client = done.client  # type: ignore[assignment]  # the API in this process, through httpx too
    written = postmortem._write(remote, done.job_id, [], tmp_path / "out", "md")
    assert sorted(written) == sorted(WRITTEN)
    assert all(path.read_text().startswith("# Post-mortem: ") for path in written.values())
    assert sum("/documents" in url for url in asked) == 3


@pytest.mark.usefixtures("small_pages")
def test_the_embedded_reader_writes_every_page_of_documents(done: Done, harness: Harness, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pages: list[int] = []
    real = jobs.postmortems_of

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        pages.append(len(found))
        return found

    monkeypatch.setattr(jobs, "postmortems_of", counted)
    embedded = postmortem.EmbeddedJobs(harness.k, _tenant_of(done, harness))
    written = postmortem._write(embedded, done.job_id, [], tmp_path / "out", "json")
    assert sorted(written) == sorted(WRITTEN) and pages == [2, 2, 1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(f"{ref}.json" for ref in WRITTEN)
