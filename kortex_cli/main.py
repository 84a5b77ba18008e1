"""The ``kortex`` command: demo, ask, api, worker, beat, migrate and admin tasks.

This is a shell like ``api/`` and ``workers/``: it parses arguments and calls into kortex/.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.markup import escape

from kortex import logcontext, logsafe
from kortex.config import Settings, load_settings
from kortex.config_values import LOG_LEVELS
from kortex.errors import KortexError
from kortex_cli.postmortem import app as postmortem_app
from kortex_cli.render import make_console

# "markdown": a docstring's paragraphs are rewrapped to the terminal's width; Typer's rich mode
# kept the source's line breaks, so a command's help broke off mid-sentence.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="Kortex: an LLM that investigates production problems with read-only tools and answers "
                       "with evidence.")
admin = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help="Tenants and API keys.")
app.add_typer(admin, name="admin")
app.add_typer(postmortem_app, name="postmortem")


console = make_console()
err = make_console(stderr=True)


#: The exit status of a usage error (a bad option or combination of options), as Click's own.
USAGE = 2
#: The levels --loglevel accepts (logging's and Celery's names for them; any case).
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # one line, however narrow the terminal
    raise typer.Exit(code)


def _metrics_multiprocess(service: str) -> None:
    """Processes of this service fork (uvicorn workers, prefork children): their metrics go to a
    directory of their own, emptied now and removed at exit, named before anything imports
    prometheus-client (it picks its mode at import; kortex/metrics.py)."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(os.environ.get("KORTEX_METRICS_DIR") or tempfile.gettempdir()) / f"kortex-metrics-{service}-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(base)
    atexit.register(shutil.rmtree, base, True)


def _preflight(settings: Settings, what: str, processes: int = 1, scaled_by: str | None = None) -> None:
    """A distributed process refuses to start on a database it cannot share or use: without
    ``KORTEX_DATABASE_URL`` each process would quietly open a SQLite file of its own, and on
    an unmigrated schema every request would fail. Then it warns, without refusing, when its
    ``processes`` pool sets (``scaled_by`` the option that multiplies them) could take more
    PostgreSQL connections than the server has free: otherwise that shows only under load."""
    if not settings.database_url:
        _fail(f"set KORTEX_DATABASE_URL to run {what} with KORTEX_REDIS_URL: the distributed processes share "
              "one PostgreSQL database (without it each would use a SQLite file of its own)")
    from kortex.storage.connections import warn_if_short
    from kortex.storage.migrate import require_schema

    require_schema(settings.database_url)
    _require_redis(settings.redis_url or "", what)
    warn_if_short(settings.database_url, settings.pools, processes, what=what, scaled_by=scaled_by)


def _require_redis(url: str, what: str) -> None:
    """Without Redis nothing moves (the broker, the event streams): a process started on one it
    cannot reach would only log its failures. One line naming Redis, never its password."""
    from urllib.parse import urlsplit

    import redis

    from kortex.redaction import scrub_text

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        parts = urlsplit(url)
        where = parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        _fail(scrub_text(f"cannot use Redis at {where} (KORTEX_REDIS_URL), which {what} needs: {reason}"))
    finally:
        client.close()


def _require_free_port(port: int) -> None:
    """A --metrics-port another process holds: refuse to start, rather than a worker running
    without its metrics or beat dying later on a bare "Address already in use"."""
    import socket

    with socket.socket() as probe:
        # As the metrics server binds (kortex/metrics.py: every address, SO_REUSEADDR).
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            _fail(f"--metrics-port {port}: cannot serve metrics on it ({exc.strerror or exc})")


def _require_writable(path: Path) -> None:
    """An --alive-file beat cannot write would fail every interval, and the health check with
    it: refuse to start. The file's age is left alone: only a sweep says beat is alive."""
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        _fail(f"--alive-file {path}: cannot write it ({exc.strerror or exc})", USAGE)
    if not existed:
        path.unlink(missing_ok=True)


@app.command()
def demo(
    question: Annotated[str | None, typer.Option(help="What to ask (default: the scenario's question)")] = None,
    scenario: Annotated[str, typer.Option(help="Telemetry scenario to seed (kortex seed --list)")] =
    "checkout-deploy-regression",
    model: Annotated[str | None, typer.Option(help="provider:model (default: the configured one)")] = None,
) -> None:
    """Seed a realistic incident and ask about it through the real turn pipeline."""
    from kortex_cli.runner import Interrupted, report_interrupted, run_demo

    if question is not None and not question.strip():
        _fail("--question is empty: ask something, or leave it out for the scenario's question", USAGE)
    try:
        ok = run_demo(console, question=question, scenario=scenario, model=model)
    except KortexError as exc:
        _fail(str(exc))
    except Interrupted as stopped:
        raise typer.Exit(report_interrupted(stopped, err)) from None
    raise typer.Exit(0 if ok else 1)  # a demo whose turn failed must not look like a success


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question")],
    model: Annotated[str | None, typer.Option(help="provider:model, e.g. anthropic:claude-sonnet-4-6")] = None,
    url: Annotated[str | None, typer.Option(envvar="KORTEX_API_URL", help="A running Kortex API; embedded if unset")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="KORTEX_API_KEY", help="API key for --url")] = None,
    session: Annotated[str | None, typer.Option(help="Continue this session (its id, as an earlier ask printed it)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON lines")] = False,
    tenant: Annotated[str, typer.Option(help="Tenant whose telemetry to use (embedded mode)")] = "demo",
) -> None:
    """Ask a question and stream the answer (against --url, or embedded). The session's id is
    printed first (with --json, on the done line): pass it as --session to ask a follow-up in
    the same conversation. Ctrl-C cancels the turn."""
    from kortex_cli.runner import Interrupted, ask_embedded, ask_remote, report_interrupted

    if not question.strip():
        _fail("the question is empty", USAGE)
    if url and not api_key:
        _fail("--api-key (or KORTEX_API_KEY) is required with --url", USAGE)
    try:
        if url:
            ok = ask_remote(console, url, api_key or "", question, model=model, session_id=session, as_json=as_json)
        else:
            ok = ask_embedded(console, question, model=model, as_json=as_json, tenant=tenant, session_id=session)
    except KortexError as exc:
        _fail(str(exc))
    except Interrupted as stopped:
        raise typer.Exit(report_interrupted(stopped, err)) from None
    raise typer.Exit(0 if ok else 1)


@app.command()
def models(
    url: Annotated[str | None, typer.Option(envvar="KORTEX_API_URL",
                                            help="A running Kortex API; local config if unset")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="KORTEX_API_KEY", help="API key for --url")] = None,
) -> None:
    """List LLM providers, their models (tier, context, price) and whether they can be used."""
    from kortex_cli.runner import list_models

    if url and not api_key:
        _fail("--api-key (or KORTEX_API_KEY) is required with --url", USAGE)
    try:
        list_models(console, url, api_key)
    except KortexError as exc:
        _fail(str(exc))


#: API processes when --workers is not given in the distributed mode: the compose layout, and
#: what a 2-core host needs (bench: 1,000 turns at once finished in 32 s with two, 42 s with one,
#: the single process spending 3.8 ms of CPU a POST while it also streamed every turn). More
#: is a sizing decision: each adds its pools to the connection budget (README, "Sizing").
DEFAULT_API_PROCESSES = 2
#: Seconds an idle keep-alive connection stays open. Longer than what clients and proxies keep
#: idle connections for (aiohttp 15 s, nginx and cloud load balancers 60 s): with uvicorn's 5 s
#: the server closed connections a client was just reusing, and its next request failed with
#: "connection reset" or "server disconnected" (the fairness bench lost a turn in most runs).
KEEP_ALIVE = 75


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port")] = 8000,
    workers: Annotated[int | None, typer.Option(
        min=1, help=f"Worker processes (default: {DEFAULT_API_PROCESSES} with KORTEX_REDIS_URL, 1 embedded)")] = None,
    access_log: Annotated[bool, typer.Option(
        envvar="KORTEX_ACCESS_LOG",
        help="Log every request (off by default: a line per request was 5% of the API's CPU; "
             "a proxy in front usually logs them)")] = False,
) -> None:
    """Run the HTTP API (embedded mode also runs an in-process worker)."""
    import uvicorn

    settings = load_settings()
    if settings.embedded and workers not in (None, 1):
        _fail("the embedded mode runs in one process; use --workers 1 or set KORTEX_REDIS_URL", USAGE)
    _check_configuration(settings)
    if workers is None:
        workers = 1 if settings.embedded else DEFAULT_API_PROCESSES
    if not settings.embedded:
        _preflight(settings, "the API", processes=workers, scaled_by="--workers")  # each process its pools
    if workers > 1:
        _metrics_multiprocess("api")  # /metrics adds up every worker process
    config = uvicorn.Config("api.main:create_app", factory=True, host=host, port=port, workers=workers,
                            log_level=settings.log_level.lower(), access_log=access_log, proxy_headers=True,
                            timeout_keep_alive=KEEP_ALIVE, timeout_graceful_shutdown=10)
    _serve(config)


def _serve(config: Any) -> None:
    """What uvicorn.run does, keeping hold of what ran: with several processes that failed to
    start, its supervisor stopped them and returned as from a clean stop (the API exited 0
    having served nothing)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    server = uvicorn.Server(config)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()]) if config.workers > 1 else None
    try:
        if supervisor is not None:
            supervisor.run()
        else:
            server.run()
    except KeyboardInterrupt:
        pass
    if supervisor is not None and any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) or (
            supervisor is None and not server.started):
        _fail("the API did not start; the log above says why")


def _check_configuration(settings: Settings) -> None:
    """What the container refuses when a process builds it (unscoped telemetry, an unknown
    provider), refused before the process starts: one line, not a server's traceback, and not
    a worker that reports ready and fails every task."""
    from kortex.errors import ConfigError
    from workers.runtime import check

    try:
        check(settings)
    except ConfigError as exc:
        _fail(str(exc))


#: The most --concurrency a worker takes: a worker is one process per core (README), whose slots
#: only hand turn steps over (the engine streams them on its event loop whatever the slots) or run
#: one tool call each, waiting on I/O. A few hundred cover any of that; more is a typo (16000
#: threads, or as many prefork children with their pools and memory) or a sizing better met by
#: more workers.
MAX_CONCURRENCY = 256


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues: turns, tools, batch (post-mortem jobs)")] = "turns,tools",
    concurrency: Annotated[int | None, typer.Option(
        min=1, help=f"Task slots (default: 8 for turns alone, else 16; at most {MAX_CONCURRENCY}); LLM steps do "
                    "not hold one")] = None,
    # Not gevent or eventlet: they would need monkey-patching before anything is imported, and
    # the step engine already multiplexes LLM streams on its own event loop.
    pool: Annotated[Literal["threads", "prefork", "solo"], typer.Option(
        case_sensitive=False, help="threads (default), prefork or solo")] = "threads",
    loglevel: Annotated[LogLevel, typer.Option(case_sensitive=False, help="Log level")] = "INFO",
    task_logs: Annotated[bool, typer.Option(
        help="A log line per task received and finished (Flower shows tasks without them)")] = False,
    max_memory_per_child: Annotated[int | None, typer.Option(
        min=1, help="prefork: replace a child once its resident memory passes this many MiB (after its task)")] = None,
    max_tasks_per_child: Annotated[int | None, typer.Option(
        min=1, help="prefork: replace a child after this many tasks")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=1, max=65535, help="Serve Prometheus metrics on this port (off by default)")] = None,
) -> None:
    """Run a Celery worker for the given queues (distributed mode).

    One process per core: a turns worker streams up to ``turn.max_inflight_steps`` LLM steps at
    once on its event loop whatever its slots, so its slots only hand steps over; a tools
    worker runs one tool call per slot."""
    from workers.queues import Queue

    names = [q.strip() for q in queues.split(",") if q.strip()]
    known = [q.value for q in Queue]
    bad = [q for q in names if q not in known]
    if bad or not names:
        # An empty name would have Celery consume a queue called "" that nothing is sent to.
        _fail(f"--queues: {'unknown queue(s) ' + ', '.join(map(repr, bad)) if bad else 'no queue given'}; "
              f"use one or more of: {', '.join(known)}", USAGE)
    if (max_memory_per_child or max_tasks_per_child) and pool != "prefork":
        _fail("--max-memory-per-child and --max-tasks-per-child recycle prefork children: add --pool prefork", USAGE)
    if concurrency is not None and concurrency > MAX_CONCURRENCY:
        _fail(f"--concurrency {concurrency}: at most {MAX_CONCURRENCY} slots per worker. A worker is one process "
              "per core whose slots hand turn steps over or run one tool call each; for more, start more "
              "workers (README \"Sizing\")", USAGE)
    if concurrency is None:
        concurrency = 8 if names == [Queue.TURNS.value] else 16
    settings = load_settings()
    if settings.embedded:
        _fail("set KORTEX_REDIS_URL (and KORTEX_DATABASE_URL) to run workers; the embedded mode needs none")
    _check_configuration(settings)
    port = metrics_port if settings.metrics.enabled else None
    if port is not None:
        _require_free_port(port)
    from kortex.storage.connections import worker_processes

    _preflight(settings, "a worker", processes=worker_processes(pool, concurrency),
               scaled_by="--concurrency" if pool == "prefork" else None)
    if port is not None:
        os.environ["KORTEX_METRICS_PORT"] = str(port)  # workers/app.py serves it at worker_init
        if pool == "prefork":
            _metrics_multiprocess("worker")
    from workers.app import app as celery_app

    if not task_logs:
        # Celery writes two INFO lines per task; at hundreds of hand-offs a second they cost
        # more CPU than the hand-off itself (py-spy: 4% of a busy turns worker) and bury the
        # lines that matter. Failures are still logged: they are warnings and errors.
        for name in ("celery.app.trace", "celery.worker.strategy"):
            logging.getLogger(name).setLevel(logging.WARNING)
    # Task events stay off (Flower switches them on while it watches; see workers/app.py).
    argv = ["worker", "-Q", ",".join(names), "-P", pool, "-l", loglevel, "-n", f"kortex-{'-'.join(names)}@%h",
            "-c", str(concurrency)]
    if max_memory_per_child:
        argv += ["--max-memory-per-child", str(max_memory_per_child * 1024)]  # Celery counts KiB
    if max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(max_tasks_per_child)]
    celery_app.worker_main(argv)


@app.command()
def beat(
    loglevel: Annotated[LogLevel, typer.Option(case_sensitive=False, help="Log level")] = "INFO",
    alive_file: Annotated[Path | None, typer.Option(
        help="Touch this file after every watchdog interval that reached the database (for health checks)")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=1, max=65535, help="Serve Prometheus metrics (watchdog actions, queue depths) on this port")] = None,
) -> None:
    """Run the watchdog process: fails expired turns and re-enqueues lost work. Safe to run
    more than one: one leads at a time, another takes over when it dies."""
    if alive_file is not None:
        _require_writable(alive_file)
    settings = load_settings()
    if settings.embedded:
        _fail("set KORTEX_REDIS_URL to run beat; the embedded mode runs the watchdog itself")
    port = metrics_port if settings.metrics.enabled else None
    if port is not None:
        _require_free_port(port)
    _preflight(settings, "beat")
    from workers import beat as watchdog

    logging.getLogger().setLevel(loglevel)  # main() set up the handler (scrubbed)
    watchdog.run(settings, alive_file=alive_file, metrics_port=port)


@app.command()
def migrate() -> None:
    """Create or upgrade the database schema."""
    import sqlalchemy.exc

    from kortex.storage.migrate import upgrade
    from kortex_cli.failures import debugging, describe

    settings = load_settings()
    try:
        before = upgrade(settings.effective_database_url)
    except sqlalchemy.exc.SQLAlchemyError as exc:
        if debugging():
            raise
        _fail(describe(exc, migrating=True))  # not main()'s line: it advises migrating for a refused query
    if before.current is None:
        console.print(f"database schema created (at {before.head})")
    elif before.at_head:
        console.print(f"database is up to date (schema at {before.head})")
    else:
        console.print(f"database migrated from {before.current} to {before.head}")


@app.command()
def seed(
    scenario: Annotated[str, typer.Argument(help="Scenario name")] = "checkout-deploy-regression",
    tenant: Annotated[str, typer.Option(help="Tenant name")] = "demo",
    list_: Annotated[bool, typer.Option("--list", help="List the scenarios and exit")] = False,
) -> None:
    """Load a scenario's telemetry into the embedded store of a tenant (replacing its telemetry)."""
    from kortex.telemetry.scenarios import SCENARIOS
    from kortex_cli.runner import seed_scenario

    if list_:
        for item in SCENARIOS.values():
            console.print(f"[cyan]{item.name}[/cyan]: {item.title}\n    ask: {item.question!r}")
        return
    try:
        counts = seed_scenario(tenant, scenario)
    except KortexError as exc:
        _fail(str(exc))
    console.print(f"seeded {scenario!r} for tenant {tenant!r}: {json.dumps(counts)}")
    from kortex.telemetry.scenarios import get_scenario

    console.print(f"try: kortex ask {get_scenario(scenario).question!r}"
                  + (f" --tenant {tenant!r}" if tenant != "demo" else ""))


@admin.command("create-tenant")
def create_tenant(name: Annotated[str, typer.Argument(help="Tenant name")]) -> None:
    """Create a tenant and print its first API key (shown once)."""
    from kortex_cli.runner import create_tenant_with_key

    try:
        tenant_id, key = create_tenant_with_key(name)
    except KortexError as exc:
        _fail(str(exc))
    console.print(f"tenant {name!r} created (id {tenant_id})")
    console.print("API key (shown once, store it now):")
    print(key)


@admin.command("create-key")
def create_key(
    name: Annotated[str, typer.Argument(help="Tenant name")],
    role: Annotated[str, typer.Option(help="chat (the default: ask and read), operator (chat and decide on "
                                           "proposals), ingest, or admin (everything)")] = "chat",
) -> None:
    """Issue another API key for an existing tenant, with a role that bounds what it may do."""
    from kortex.access import valid_role
    from kortex.errors import InvalidInput
    from kortex_cli.runner import issue_key

    try:
        valid_role(role)  # kortex/access.py: the roles are data there
    except InvalidInput as exc:
        _fail(f"--role: {exc}", USAGE)
    try:
        key = issue_key(name, role)
    except KortexError as exc:
        _fail(str(exc))
    print(key)


@admin.command("list-keys")
def list_keys(name: Annotated[str, typer.Argument(help="Tenant name")]) -> None:
    """List a tenant's API keys (ids, names, roles; never a secret)."""
    from kortex_cli.runner import list_keys as listed

    for info in listed(name):
        state = f"revoked {info.revoked_at:%Y-%m-%d %H:%M}" if info.revoked_at else "active"
        console.print(f"{info.key_id}  {info.role:<8}  {state:<24}  {escape(info.name)}")  # a name is not markup


@admin.command("revoke-key")
def revoke_key(
    name: Annotated[str, typer.Argument(help="Tenant name")],
    key_id: Annotated[str, typer.Argument(help="The key's id (list-keys; the part after kx_)")],
) -> None:
    """Revoke an API key: it stops working at once (API processes drop it within a second)."""
    from kortex_cli.runner import revoke_key as revoke

    info = revoke(name, key_id)
    console.print(f"key {info.key_id} ({info.role}) revoked")


@admin.command("rotate-key")
def rotate_key(
    name: Annotated[str, typer.Argument(help="Tenant name")],
    key_id: Annotated[str, typer.Argument(help="The key's id (list-keys)")],
) -> None:
    """Replace a key with a new one of the same name and role; the old one stops working."""
    from kortex_cli.runner import rotate_key as rotate

    info, key = rotate(name, key_id)
    console.print(f"key {key_id} revoked; its replacement {info.key_id} ({info.role}), shown once:")
    print(key)


@admin.command("disable-tenant")
def disable_tenant(name: Annotated[str, typer.Argument(help="Tenant name")]) -> None:
    """Disable a tenant: all its keys stop working; its data and audit trail stay."""
    from kortex_cli.runner import set_tenant_disabled

    set_tenant_disabled(name, True)
    console.print(f"tenant {name!r} disabled")


@admin.command("enable-tenant")
def enable_tenant(name: Annotated[str, typer.Argument(help="Tenant name")]) -> None:
    """Enable a disabled tenant again."""
    from kortex_cli.runner import set_tenant_disabled

    set_tenant_disabled(name, False)
    console.print(f"tenant {name!r} enabled")


@admin.command("prune")
def prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would go; delete nothing")] = False,
) -> None:
    """Delete now, in short batches, every row the `[retention]` settings no longer keep (README
    "Retention"): what `kortex beat` does once per `retention.every`, here until none is left."""
    from kortex.storage.db import Database
    from kortex.storage.migrate import prepare
    from kortex.storage.retention import prune as prune_rows
    from kortex.timeparse import utcnow

    settings = load_settings()
    try:
        prepare(settings.effective_database_url)
        db = Database(settings.effective_database_url, pool_size=1)
        try:
            report = prune_rows(db, settings.retention, now=utcnow(), dry_run=dry_run, until_done=True)
        finally:
            db.dispose()
    except KortexError as exc:
        _fail(str(exc))
    for table, n in report.rows.items():
        console.print(f"{table:<20} {n:>10}")
    console.print(f"{report.total} row{'' if report.total == 1 else 's'} "
                  f"{'would be deleted (dry run)' if dry_run else 'deleted'}")


def main(argv: list[str] | None = None) -> Any:
    level = os.environ.get("KORTEX_LOG_LEVEL", "WARNING").upper()
    if level not in LOG_LEVELS:  # logging would raise on it before any command could say so
        err.print(f"[red]error:[/red] invalid configuration: log_level (KORTEX_LOG_LEVEL): use one of "
                  f"{', '.join(name.lower() for name in LOG_LEVELS)} (any case)", soft_wrap=True)
        sys.exit(1)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logsafe.install()
    logcontext.configure()  # KORTEX_LOG_FORMAT=json: one JSON object a line, with the work's ids
    try:
        return app(argv)
    except Exception as exc:  # Click's own errors and exits never get here: it handled them
        from kortex_cli.failures import debugging, describe

        if debugging():
            raise
        err.print(f"[red]error:[/red] {escape(describe(exc))}", markup=True, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
