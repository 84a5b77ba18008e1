"""Log records written inside a turn's work name its tenant, session and turn; the JSON format
is one object a line and scrubbed like the text one."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from kortex import logcontext, logsafe
from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(logcontext.ContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Keep]:
    handler = Keep()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def test_a_record_written_in_a_turn_s_step_names_the_turn(harness_factory, kept: Keep,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with FakeLLM() as fake:
        fake.add("claude-opus-4-6", {"steps": [{"faults": [{"status": 400, "message": "bad request"}]}]})
        h = harness_factory(llm={"providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
                                 "default_provider": "anthropic"})
        tenant = h.tenant("acme")
        turn = h.ask(tenant, "why?")
    assert turn.status == "failed"
    inside = [r for r in kept.records if r.name.startswith("kortex.") and getattr(r, "kortex", {}).get("turn_id")]
    assert inside, [(r.name, r.getMessage()) for r in kept.records]
    assert all(r.kortex == {"tenant_id": tenant, "session_id": turn.session_id, "turn_id": turn.id}
               for r in inside)
    assert logcontext.current() == {}  # nothing leaks out of the step


def test_json_lines_carry_the_ids_and_are_scrubbed_message_and_traceback_alike() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("kortex.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logsafe.install(logger)
        logcontext.configure(logger, "json")
        with logcontext.bound(turn_id="t-1", request_id="r-1"):
            try:
                raise RuntimeError("connect failed: postgresql://kortex:hunter2@db/kortex")
            except RuntimeError:
                logger.exception("query with api_key=sk-live-abcdef1234567890abcd failed")
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{"))
    assert first["turn_id"] == "t-1" and first["request_id"] == "r-1" and first["level"] == "ERROR"
    assert "hunter2" not in json.dumps(first) and "sk-live-abcdef" not in json.dumps(first)
    assert "RuntimeError" in first["exc"] and first["logger"] == "kortex.test.json"
    assert "turn_id" not in second and second["message"] == "outside"


def test_the_api_echoes_a_request_id_or_makes_one(harness: Harness) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app
    with TestClient(create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        given = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
        assert given.headers["x-request-id"] == "abc-123"
        made = client.get("/healthz", headers={"X-Request-ID": "<script>"})
        assert made.headers["x-request-id"] != "<script>" and len(made.headers["x-request-id"]) == 32




def _text_logger(name: str, formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    return logger, stream


def test_text_lines_name_the_work_s_ids_before_the_traceback_and_only_once() -> None:
    logger, stream = _text_logger("kortex.test.text", logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logsafe.install(logger)
    logcontext.configure(logger, "text")
    logcontext.configure(logger, "text")  # every process calls it again after Celery or uvicorn set up
    with logcontext.bound(request_id="r-1", session_id="s-1", turn_id="t-1"):
        try:
            raise RuntimeError("connect failed: postgresql://kortex:hunter2@db/kortex")
        except RuntimeError:
            logger.exception("step failed")
    logger.warning("outside")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "ERROR kortex.test.text: step failed [turn=t-1 session=s-1 request=r-1]"
    assert lines[1].startswith("Traceback") and "hunter2" not in stream.getvalue()
    assert lines[-1] == "WARNING kortex.test.text: outside"  # no work, no brackets


def test_every_process_s_text_format_gets_the_ids() -> None:
    """The formats the processes write with: the API's and the CLI's (basicConfig), Celery's
    worker and task formats, uvicorn's; each keeps its own line and gains the ids."""
    from celery.app.log import TaskFormatter
    from celery.utils.log import ColorFormatter
    from uvicorn.logging import DefaultFormatter

    from workers.app import app

    formats = {
        "api/cli": logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"),
        "worker": ColorFormatter(app.conf.worker_log_format, use_color=False),
        "task": TaskFormatter(app.conf.worker_task_log_format, use_color=False),
        "uvicorn": DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False),
    }
    for name, formatter in formats.items():
        logger, stream = _text_logger(f"kortex.test.{name}", formatter)
        logcontext.configure(logger, "text")
        with logcontext.bound(task_id="k-1", tenant_id="a-1", turn_id="t-1"):
            logger.warning("the step was given back")
        assert stream.getvalue().rstrip("\n").endswith("the step was given back [turn=t-1 tenant=a-1 task=k-1]"), (
            name, stream.getvalue())


def test_the_api_s_text_log_lines_name_their_request(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from kortex.errors import StorageError
    from kortex.turns import chat

    def outage(*_: object, **__: object) -> None:
        raise StorageError("the database is down")

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)  # as basicConfig leaves it: create_app gives it the ids
    try:
        tenant = harness.tenant("acme")
        auth = {"Authorization": f"Bearer {harness.api_key(tenant)}", "X-Request-ID": "req-42"}
        monkeypatch.setattr(chat, "list_sessions", outage)
        with TestClient(create_app(harness.settings, dispatch=lambda _: None, embedded_worker=False)) as client:
            assert client.get("/v1/sessions", headers=auth).status_code == 503
    finally:
        root.removeHandler(handler)
    failed = [line for line in stream.getvalue().splitlines() if "GET /v1/sessions failed" in line]
    assert failed and failed[0].endswith(f"[tenant={tenant} request=req-42]"), stream.getvalue()
