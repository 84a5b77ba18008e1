"""What the CLI commands do: run the embedded stack, or talk to a running API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.markup import escape

from kortex.config import Settings, load_settings
from kortex.container import Kortex
from kortex.errors import KortexError, NotFound
from kortex.storage import chats, tenants
from kortex.storage.db import sync_url
from kortex.storage.migrate import prepare
from kortex.telemetry import scenarios
from kortex.text import one_line
from kortex.timeparse import utcnow
from kortex.turns import chat
from kortex.turns.cancel import cancel
from kortex_cli.render import EventPrinter

if TYPE_CHECKING:
    from kortex.keys import KeyInfo

DEMO_TENANT = "demo"
T = TypeVar("T")
E = TypeVar("E")


@contextlib.contextmanager
def embedded_stack(settings: Settings, *, worker: bool = True) -> Iterator[Kortex]:
    """Database schema, a container, and (embedded mode, unless ``worker`` is False) the
    in-process worker."""
    _prepare(settings.effective_database_url)
    k = Kortex.create(settings)
    running = None
    try:
        if settings.embedded and worker:
            from workers.app import app as celery_app
            from workers.embedded import EmbeddedWorker

            running = EmbeddedWorker(celery_app, settings=settings)
            running.start()  # inside: a start cut short still stops the worker thread it began
        yield k
    finally:
        if running is not None:
            running.stop()
        k.close()


def _prepare(url: str) -> None:
    """``prepare``, which a Ctrl-C does not cut short on a SQLite file: migrated as it is opened,
    its migrations are not all undone when stopped midway (its DDL commits as it goes), and the
    tables left with no version stamped failed every later command ("table tenants already
    exists"). The interrupt waits for the schema instead (seconds, once). A PostgreSQL schema is
    only read here, and a wait for an unreachable server may be cut short."""
    with _held_interrupt() if sync_url(url).get_backend_name() == "sqlite" else contextlib.nullcontext():
        prepare(url)


def _dispatch(handoff: Any) -> None:
    from workers.app import app as celery_app
    from workers.dispatch import dispatch

    dispatch(celery_app, handoff)


def _tenant_id(k: Kortex, name: str, *, create: bool) -> str:
    with k.db.begin() as conn:
        found = tenants.get_tenant_by_name(conn, name)
        if found is not None:
            return found.id
        if not create:
            raise NotFound(f"no tenant named {name!r}")
        return (tenants.create_tenant(conn, name)).id


def _seed(k: Kortex, tenant_id: str, scenario_name: str) -> dict[str, int]:
    scenario = scenarios.get_scenario(scenario_name)
    with k.db.begin() as conn:
        return scenarios.seed(conn, tenant_id, scenario, now=utcnow())


def describe_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)


class Interrupted(Exception):
    """The user stopped a command: Ctrl-C, or its output was closed (``| head -1``). A turn it
    had asked for was cancelled first (``outcome`` says how that went, or that nothing had been
    asked yet): left running, or queued at a server, it would be finished unseen by a worker,
    and billed."""

    def __init__(self, outcome: str, *, broken_pipe: bool) -> None:
        super().__init__(outcome)
        self.outcome, self.broken_pipe = outcome, broken_pipe


NOT_ASKED = "stopped before the question was asked"


@dataclass(slots=True)
class _Question:
    """What stopping an ``ask`` must undo: the turn, once there is one; else the session made
    for the question, if the command made one apart from its turn (``ask --url``)."""

    cancel: Callable[[str], object]  # cancels the turn with this id
    # The turn a post cut short made, if it made one (asking again to learn it); None if none.
    find: Callable[[], str | None] = lambda: None
    turn_id: str | None = None
    # The session made for the question, and how to delete it: stopped before a turn was
    # stored in it, it would be left empty, named after the question, in every listing.
    made: str | None = None
    delete_session: Callable[[str], object] = lambda session_id: None
    # The session a creation cut short made, if it made one (asking again to learn it); None if none.
    find_made: Callable[[], str | None] = lambda: None


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C anywhere in a command that asks: exit 130 with one line (``Interrupted``), before
    its turn exists too (left to Typer, that was "Aborted!" and 1, or in newer releases 130 and
    not a word). The first Ctrl-C is the only one: later ones, while the turn is cancelled and
    the command winds down (the embedded worker stopping, connections closing), would cut that
    short, the turn left running or its report lost. The handler is put back as the command
    ends."""
    if not _main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:  # not where SIGINT is ignored, nor a caller's own handler
        signal.signal(signal.SIGINT, _interrupt_once)
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(NOT_ASKED, broken_pipe=False) from None
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)


def _interrupt_once(signum: int, frame: object) -> None:
    _ignore_sigint()
    raise KeyboardInterrupt


def _ignore_sigint() -> None:
    if _main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _held_interrupt() -> Iterator[None]:
    """A Ctrl-C during the block takes effect as it ends, for local writes that must not be cut
    in half: a commit whose outcome this process never learns (a turn stored, unknown, that a
    later run's watchdog would start), a migration. Further ones are ignored meanwhile. An
    error from the block goes out as it is: the command stops on it anyway."""
    previous = signal.getsignal(signal.SIGINT) if _main_thread() else None
    if not callable(previous):  # off the main thread, or SIGINT ignored: nothing to hold
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        previous(signal.SIGINT, None)  # as if it came now: raises KeyboardInterrupt


@contextlib.contextmanager
def _cancelled_if_stopped(question: _Question) -> Iterator[None]:
    """Raise Interrupted, once the question's turn (if it has one) is cancelled, when the user
    stops the command."""
    try:
        yield
    except (KeyboardInterrupt, BrokenPipeError, SystemExit) as exc:
        # Rich answers a closed stdout with SystemExit(1) (Console.on_broken_pipe); print() with
        # BrokenPipeError. A second Ctrl-C while the turn is cancelled would leave it running.
        _ignore_sigint()
        raise Interrupted(_undo(question), broken_pipe=not isinstance(exc, KeyboardInterrupt)) from None


def _undo(question: _Question) -> str:
    from kortex_cli.failures import describe

    turn_id = question.turn_id
    if turn_id is None:
        try:
            turn_id = question.find()
        except Exception as exc:
            return f"the question may have been asked, and its turn could not be found to cancel: {describe(exc)}"
    if turn_id is None:
        with contextlib.suppress(Exception):  # best effort: the report is the question's, not the session's
            made = question.made if question.made is not None else question.find_made()
            if made is not None:
                question.delete_session(made)
        return NOT_ASKED
    return _cancel(turn_id, question.cancel)


def _cancel(turn_id: str, cancel_turn: Callable[[str], object]) -> str:
    from kortex_cli.failures import describe

    try:
        cancel_turn(turn_id)
    except Exception as exc:
        if isinstance(exc, KortexError) and exc.code == "turn_finished":  # it ended as it was stopped
            return f"turn {turn_id} had already ended"
        return f"could not cancel turn {turn_id}: {describe(exc)}"
    return f"cancelled turn {turn_id}"


def report_interrupted(stopped: Interrupted, err: Console) -> int:
    """Say on stderr (while it still works) what became of the turn; the exit status is what a
    shell reports for the signal: 130 (SIGINT), or 141 (SIGPIPE) for a closed output."""
    if stopped.broken_pipe:
        _quiet_stdout()
    why = "its output was closed" if stopped.broken_pipe else "interrupted"
    with contextlib.suppress(OSError, ValueError):
        err.print(f"{stopped.outcome} ({why})", markup=False, highlight=False, soft_wrap=True)
    return 141 if stopped.broken_pipe else 130


def _quiet_stdout() -> None:
    """Python flushes stdout once more at exit, and into a closed pipe that prints a warning."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush into a pipe
        pass


def _follow(printer: EventPrinter, events: Iterable[tuple[str, dict[str, Any]]], session_id: str,
            turn_id: str) -> bool:
    """Print the turn's events; whether it ended ``done``. The session is named, so the next
    question can continue it (``--session``): first, or with ``--json`` beside the status on the
    ``done`` line (``session_id``, ``turn_id``), where a script reads the outcome."""
    if not printer.as_json:
        printer.console.print(f"[dim]· session {session_id} · turn {turn_id}[/dim]", soft_wrap=True)
    ok = False
    for event, data in events:
        if event == "done":
            ok = data.get("status") == "done"
            if printer.as_json:
                data = {**data, "session_id": session_id, "turn_id": turn_id}
        printer.show(event, data)
    return ok


def _post(k: Kortex, tenant_id: str, question: str, model: str | None, session_id: str | None) -> chat.PostedTurn:
    """The question as the first turn of a new session, made in the same transaction (a refused
    question leaves no session behind), or as the next turn of ``session_id``."""
    if session_id is None:
        model = chat.check_model(k, model)
        name = chat.session_name(one_line(question)[:80], "untitled")
        return chat.start_session(k, tenant_id, lambda conn: chats.create_session(conn, tenant_id, name, model).id,
                                  question, model=model)[1]
    unknown = NotFound(f"no session {session_id!r} in this tenant")
    try:
        session_id = str(uuid.UUID(session_id))
    except ValueError:
        raise unknown from None  # session ids are UUIDs: anything else cannot exist
    try:
        return chat.post_message(k, tenant_id, session_id, question, model=model)
    except NotFound:
        raise unknown from None


def _ask(k: Kortex, tenant_id: str, question: str, model: str | None, printer: EventPrinter,
         session_id: str | None = None) -> bool:
    asked = _Question(cancel=lambda turn_id: cancel(k, tenant_id, turn_id, by="cli"))
    with _cancelled_if_stopped(asked):
        with _held_interrupt():  # until the turn is known to be stored, or not
            posted = _post(k, tenant_id, question, model, session_id)
            asked.turn_id = posted.turn.id
        turn = posted.turn
        _dispatch(posted.handoff)
        events = ((e.type, json.loads(e.data)) for e in k.events.follow(
            turn.id, idle_timeout=k.settings.turn.deadline + 30))
        return _follow(printer, events, turn.session_id, turn.id)


def _check_model(settings: Settings, model: str | None) -> None:
    """An unusable model is reported before the embedded stack starts, or anything is seeded:
    as the API checks it (``auto`` included), on a registry of this configuration."""
    if model:
        from kortex.llm.providers import BUILTIN_PROVIDERS
        from kortex.llm.registry import ProviderRegistry
        from kortex.turns.routed import Router

        chat.usable_model(ProviderRegistry(settings, BUILTIN_PROVIDERS), Router(settings), model)


def run_demo(console: Console, *, question: str | None, scenario: str, model: str | None) -> bool:
    with _interruptible():
        settings = load_settings()
        _check_model(settings, model)  # seeding replaces the demo tenant's telemetry: not for a demo that cannot run
        picked = scenarios.get_scenario(scenario)
        mode = "embedded (SQLite + in-process worker)" if settings.embedded else "distributed"
        console.print(f"[bold]Kortex demo[/bold] · mode: {mode}")
        with embedded_stack(settings) as k:
            tenant_id = _tenant_id(k, DEMO_TENANT, create=True)
            counts = _seed(k, tenant_id, scenario)
            question = question or picked.question
            console.print(f"seeded scenario [cyan]{scenario}[/cyan]: {picked.title} ({describe_counts(counts)})")
            console.print(f"\n[bold]Q:[/bold] {question}\n")
            return _ask(k, tenant_id, question, model, EventPrinter(console))


def ask_embedded(console: Console, question: str, *, model: str | None, as_json: bool,
                 tenant: str = DEMO_TENANT, session_id: str | None = None) -> bool:
    with _interruptible():
        settings = load_settings()
        _check_model(settings, model)
        with embedded_stack(settings) as k:
            tenant_id = _tenant_id(k, tenant, create=tenant == DEMO_TENANT)
            return _ask(k, tenant_id, question, model, EventPrinter(console, as_json=as_json), session_id)


def list_models(console: Console, url: str | None, api_key: str | None) -> None:
    """The providers as ``GET /v1/llm/providers`` describes them, from a running API or from
    this machine's configuration."""
    from rich.table import Table

    if url:
        from kortex_cli.remote import RemoteClient

        with RemoteClient(url, api_key or "") as client:
            listing = client.providers()
    else:
        listing = _local_providers(load_settings())
    fallback = ", ".join(listing["fallback_providers"])
    console.print(f"mode [bold]{listing['mode']}[/bold] · default [bold]{listing['default_provider']}[/bold]"
                  + (f" · fallback {fallback}" if fallback else ""))
    table = Table("model", "tier", "context", "$/Mtok in", "$/Mtok out", box=None, pad_edge=False)
    for provider in listing["providers"]:
        for model in provider["models"] if provider["available"] else ():
            table.add_row(f"{provider['name']}:{model['id']}", model["tier"], f"{model['context_tokens']:,}",
                          f"{model['input_usd_per_mtok']:g}", f"{model['output_usd_per_mtok']:g}")
    console.print(table)
    for provider in listing["providers"]:
        if not provider["available"]:
            console.print(f"[dim]{provider['name']}: unavailable ({escape(provider['reason'] or '')})[/dim]")
        for problem in provider.get("problems") or ():
            console.print(f"[yellow]{provider['name']}: {escape(problem)}[/yellow]")


def _local_providers(settings: Settings) -> dict[str, Any]:
    import asyncio

    from kortex.llm.providers import BUILTIN_PROVIDERS
    from kortex.llm.registry import ProviderRegistry

    registry = ProviderRegistry(settings, BUILTIN_PROVIDERS)

    async def probe() -> dict[str, str]:
        try:
            return await registry.probe()
        finally:
            await registry.aclose()

    statuses = registry.status(asyncio.run(probe()))
    llm = settings.llm
    return {"mode": "local-only" if llm.local_only else llm.mode, "default_provider": llm.default_provider,
            "fallback_providers": llm.fallback_providers,
            "providers": [{"name": s.name, "available": s.available, "reason": s.reason,
                           "problems": list(s.problems), "models": [m.model_dump() for m in s.models]}
                          for s in statuses]}


def seed_scenario(tenant: str, scenario: str) -> dict[str, int]:
    def work(k: Kortex) -> dict[str, int]:
        return _seed(k, _tenant_id(k, tenant, create=tenant == DEMO_TENANT), scenario)

    return _with_container(work)


def create_tenant_with_key(name: str) -> tuple[str, str]:
    from kortex import keys

    def work(k: Kortex) -> tuple[str, str]:
        tenant, _, secret = keys.create_tenant(k, name, by="cli")
        return tenant.id, secret

    return _with_container(work)


def issue_key(name: str, role: str = "admin") -> str:
    from kortex import keys

    return _with_container(lambda k: keys.create_key(k, keys.tenant_by_name(k, name).id, role=role, by="cli")[1])


def list_keys(name: str) -> list[KeyInfo]:
    from kortex import keys

    return _with_container(lambda k: keys.list_keys(k, keys.tenant_by_name(k, name).id))


def revoke_key(name: str, key_id: str) -> Any:
    from kortex import keys

    return _with_container(lambda k: keys.revoke_key(k, keys.tenant_by_name(k, name).id, key_id, by="cli"))


def rotate_key(name: str, key_id: str) -> Any:
    from kortex import keys

    return _with_container(lambda k: keys.rotate_key(k, keys.tenant_by_name(k, name).id, key_id, by="cli"))


def set_tenant_disabled(name: str, disabled: bool) -> Any:
    from kortex import keys

    return _with_container(lambda k: keys.set_tenant_disabled(k, name, disabled, by="cli"))


def _with_container(work: Callable[[Kortex], T]) -> T:
    settings = load_settings()
    _prepare(settings.effective_database_url)
    k = Kortex.create(settings)
    try:
        return work(k)
    finally:
        k.close()


def ask_remote(console: Console, url: str, api_key: str, question: str, *, model: str | None,
               session_id: str | None, as_json: bool) -> bool:
    from kortex_cli.remote import RemoteClient

    printer = EventPrinter(console, as_json=as_json)
    with _interruptible(), RemoteClient(url, api_key) as client:
        asked = _Question(cancel=client.cancel_turn, delete_session=client.delete_session)
        # From the session's making on, a Ctrl-C deletes it unless a turn was stored in it (a
        # session whose answer a Ctrl-C cut off is asked for again, under the same
        # Idempotency-Key, to learn its id).
        with _cancelled_if_stopped(asked):
            if session_id is None:
                making = client.new_session(one_line(question)[:80], model)
                asked.find_made = making.made_if_asked
                # Stored as the call returns (Python takes a signal at a call or a loop, not at a store).
                session_id = asked.made = making.create()
            posting = client.question(session_id, question, model)
            asked.find = posting.turn_if_asked
            try:
                turn = posting.post()
            except Exception:
                if asked.made is not None:  # the question was refused: the session made for it goes too
                    with contextlib.suppress(Exception):
                        client.delete_session(asked.made)
                raise
            asked.turn_id = str(turn["turn_id"])
            events = client.events(turn["events_url"], on_break=_say_resuming)
            return _follow(printer, hint_if_quiet(events, QUIET_HINT_S, _say_still_queued),
                           str(turn["session_id"]), asked.turn_id)


#: Seconds without a first event before ``ask --url`` says what the turn may be waiting for.
QUIET_HINT_S = 15.0


def hint_if_quiet(events: Iterable[E], after: float, say: Callable[[float], None]) -> Iterator[E]:
    """``events``, and once, if none has come within ``after`` seconds, ``say(after)``: the
    first event is the worker's, so a turn no worker takes showed nothing but a still cursor."""
    timer = threading.Timer(after, say, args=(after,))
    timer.daemon = True
    timer.start()
    try:
        for event in events:
            timer.cancel()
            yield event
    finally:
        timer.cancel()


def _say_still_queued(after: float) -> None:
    from kortex_cli.render import make_console

    make_console(stderr=True).print(
        f"[yellow]! the turn has not started after {after:.0f}s: it waits in the turns queue (a busy server, "
        "or no `kortex worker --queues turns` running)[/yellow]", soft_wrap=True)


def _say_resuming(why: str) -> None:
    """On stderr, beside the answer: the stream broke (an API restarting) and is read again
    from the last event, so what follows is no second answer."""
    from kortex.redaction import scrub_text
    from kortex_cli.render import make_console

    make_console(stderr=True).print(f"[yellow]! the event stream broke ({escape(scrub_text(why))}); resuming from "
                                    "the last event read[/yellow]", soft_wrap=True)


__all__ = ["Interrupted", "ask_embedded", "ask_remote", "create_tenant_with_key", "issue_key", "list_models",
           "report_interrupted", "run_demo", "seed_scenario"]
