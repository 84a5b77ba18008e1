"""Per-process runtime of a worker: one Kortex container, created in the process that uses it
(after the prefork fork, never before) and closed when the process exits."""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from kortex import heap, logcontext, logsafe, tracing
from kortex.config import Settings
from kortex.container import Kortex
from kortex.errors import ConfigError
from kortex.turns.handoff import Handoff

log = logging.getLogger(__name__)

T = TypeVar("T")

_kortex: Kortex | None = None
_pid: int | None = None
_lock = threading.Lock()


def kortex(settings: Settings) -> Kortex:
    """This process's container, rebuilt after a fork or when the settings object changes."""
    global _kortex, _pid
    with _lock:
        if _kortex is None or _pid != os.getpid() or _kortex.settings is not settings:
            if _kortex is not None and _pid == os.getpid():
                _kortex.close()  # settings swapped in this process (embedded mode): release the old one
            _kortex = Kortex.create(settings)
            _pid = os.getpid()
            tracing.setup_from(settings, "worker")  # after a fork: the exporter's thread is this process's
            from workers.app import app
            from workers.dispatch import warm

            warm(app)  # before the engine's threads hand steps on
            log.info("kortex container ready in process %s", _pid)
        return _kortex


def run(settings: Settings, work: Callable[[Kortex], T]) -> T:
    return work(kortex(settings))


def close() -> None:
    """Close this process's container (its pools, threads and provider HTTP clients). Steps
    its engine held and will not finish go back to the turns queue first."""
    global _kortex
    with _lock:
        if _kortex is not None and _pid == os.getpid():
            try:
                left = _kortex.close_engine()
                if left:
                    from workers.app import app
                    from workers.dispatch import dispatch

                    dispatch(app, Handoff(steps=tuple(left)))
            except Exception:  # their leases lapse and the watchdog hands them on
                log.warning("could not hand back the steps of this process", exc_info=True)
            try:
                _kortex.close()
            except Exception:  # shutting down anyway
                pass
            _kortex = None


@worker_process_shutdown.connect
@worker_shutdown.connect
def _close(**_: Any) -> None:
    close()


@worker_init.connect
def _import_llm_client(**_: Any) -> None:
    """The providers' HTTP client (aiohttp and all), which the first LLM call would import:
    imported once, before a prefork pool forks, so its children have it too."""
    importlib.import_module("kortex.llm.transport")


@worker_ready.connect
def _build_on_start(sender: Any = None, **_: Any) -> None:
    """The process that runs the tasks builds its container as the worker starts, not when the
    first message arrives: a fresh stack's first turn (after a deploy, say) waited for the
    pools, the engine and Celery's backend lookup (first event 346-354 ms, done 530-561 ms;
    since, 89-129 and 246-313 ms; later turns 24-100 ms). A prefork parent runs no task: its
    children build theirs once forked (worker_process_init). Either way the heap is settled
    once the process has what it keeps (kortex/heap.py)."""
    if type(getattr(sender, "pool", None)).__module__ == "celery.concurrency.prefork":
        from workers.app import app

        try:
            check(app.conf.kortex_settings)  # a child's refusal would only have it replaced
        except ConfigError as exc:
            refuse(exc)
            return
        _settle(app.conf.kortex_settings)  # its pool and consumer, built since worker_init
        return
    _build_soon()


@worker_process_init.connect
def _build_in_child(**_: Any) -> None:
    _build_soon()


def _build_soon() -> None:
    """On a thread of its own: the worker takes messages meanwhile (a task that comes first
    waits for this build under ``kortex``'s lock rather than making its own), and a prefork
    child reports itself up at once, as billiard wants within 4 s (sixteen children building
    at once on two cores could take longer)."""
    threading.Thread(target=build, name="kortex-build", daemon=True).start()


def _settle(settings: Settings) -> None:
    if settings.settle_heap:
        heap.settle()


def check(settings: Settings) -> None:
    """Raise the ConfigError ``Kortex.create`` would, without connecting to anything or starting
    a thread: a process refuses such a configuration before it serves (``kortex api``,
    ``kortex worker``, a prefork parent), where the container's own build happens too late."""
    from kortex.llm.providers import BUILTIN_PROVIDERS
    from kortex.llm.registry import ProviderRegistry
    from kortex.storage.db import Database
    from kortex.telemetry.factory import build_sources

    ProviderRegistry(settings, BUILTIN_PROVIDERS)
    db = Database(settings.effective_database_url, pool_size=1)  # an engine: it connects on first use only
    try:
        build_sources(settings, db).close()
    finally:
        db.dispose()


def refuse(exc: ConfigError) -> None:
    """Stop this worker with a failure: every task would fail on this configuration, and a
    worker that reports ready on it hides that from whoever started it."""
    from celery.platforms import EX_FAILURE
    from celery.worker import state

    log.error("cannot run with this configuration: %s", exc)
    state.should_stop = EX_FAILURE  # the consumer's loop stops the worker, which exits with it


def build() -> None:
    """Build this process's container now, then settle the heap with it. A configuration it
    refuses stops the worker; if the build fails otherwise (the database is down, say), the
    first task tries again and reports what is wrong."""
    from workers.app import app

    settings: Settings = app.conf.kortex_settings
    try:
        kortex(settings)
    except ConfigError as exc:
        refuse(exc)
        return
    except Exception:
        log.warning("could not build this process's Kortex container at start; its first task will try again",
                    exc_info=True)
    _settle(settings)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _scrub_logs(logger: Any = None, **_: Any) -> None:
    logsafe.install()  # the root logger's handlers: where kortex.* records end up
    logcontext.configure()
    if logger is not None:
        logsafe.install(logger)
        logcontext.configure(logger)


_task_ids: dict[str, list[Any]] = {}


@task_prerun.connect
def _bind_task(task_id: str | None = None, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    """A task's records carry its id and the ids its arguments name (never anything else of them)."""
    if task_id is None:
        return
    given = kwargs or {}
    _task_ids[task_id] = logcontext.bind(task_id=task_id, tenant_id=given.get("tenant_id"),
                                         turn_id=given.get("turn_id"))


@task_postrun.connect
def _unbind_task(task_id: str | None = None, **_: Any) -> None:
    tokens = _task_ids.pop(task_id, None) if task_id is not None else None
    if tokens:
        try:
            logcontext.unbind(tokens)
        except ValueError:  # set in another context (a retried delivery): it ends with its thread
            pass
