"""What every benchmark part stands on: a throwaway PostgreSQL database per Kortex stack, a
private Redis key prefix, processes started in their own sessions (so a prefork worker's children are found,
measured and killed with it), the fake LLM server, Kortex started with the README's default
commands, and CPU read from /proc.

Everything started here is registered with one ``Cleanup`` so that an exception, a part's
timeout or Ctrl-C (SIGINT, SIGTERM) leaves no process, database or Redis key behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kortex.testing import scratch

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KORTEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PYTHON = sys.executable
# `kortex` as the README runs it: the console script next to this interpreter (a venv's bin/).
_SCRIPT = Path(PYTHON).with_name("kortex")
KORTEX = [str(_SCRIPT)] if _SCRIPT.exists() else [PYTHON, "-c", "from kortex_cli.main import main; main()"]
TICK = os.sysconf("SC_CLK_TCK")


def raise_nofile(want: int = 65536) -> int:
    """1,000 SSE readers plus their Redis and HTTP connections pass the usual soft limit of
    1,024 descriptors; children inherit the raised limit too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


_T0 = time.monotonic()


def progress(message: str) -> None:
    """A line on stderr while a part runs, so a slow phase shows where the time goes."""
    print(f"   [{time.monotonic() - _T0:6.0f} s] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values (a part that finished nothing)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


# ---- processes ------------------------------------------------------------------------------


class Proc:
    """A child process in its own session, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logdir: Path,
                 stdin: int | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = logdir / f"{name}.log"
        self._file = self.log.open("wb")
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=stdin, stdout=self._file,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, ready: Callable[[], bool], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early ({self.proc.returncode}):\n{self.output()[-3000:]}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} was not ready after {timeout:.0f} s:\n{self.output()[-3000:]}")

    def stop(self, grace: float = 10) -> None:
        self.terminate()
        self.reap(time.monotonic() + grace)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # warm shutdown first: Celery's main process stops its children

    def reap(self, deadline: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # whatever is left in the session (a wedged child)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._file.close()


class Cleanup(contextlib.ExitStack):
    """One stack of everything to undo. SIGTERM is turned into KeyboardInterrupt so a killed
    bench unwinds exactly like a Ctrl-C one."""

    def __enter__(self) -> Cleanup:
        super().__enter__()
        with contextlib.suppress(ValueError):  # not the main thread (a test calling a part)
            signal.signal(signal.SIGTERM, _interrupt)
            # A shell starts background jobs with SIGINT ignored; Ctrl-C must still unwind.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return self


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def start(cleanup: contextlib.ExitStack | None, name: str, argv: list[str], env: dict[str, str], logdir: Path,
          stdin: int | None = None) -> Proc:
    proc = Proc(name, argv, env, logdir, stdin=stdin)
    if cleanup is not None:
        cleanup.callback(proc.stop)
    return proc


def stop_all(procs: list[Proc], grace: float = 10) -> None:
    """Warm shutdowns side by side: one grace period for the lot, not one each."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.reap(deadline)


# ---- PostgreSQL and Redis ---------------------------------------------------------------------


@contextlib.contextmanager
def throwaway_database() -> Iterator[tuple[str, str]]:
    """(url, name) of a new empty database, dropped on exit."""
    with scratch.throwaway_database(PG_ADMIN, prefix="kortex_bench") as made:
        yield made


@contextlib.contextmanager
def redis_prefix() -> Iterator[str]:
    """A private key prefix; every key under it (broker queues, streams, counters) is deleted on exit."""
    with scratch.throwaway_prefix(REDIS_URL, "kxbench") as prefix:
        yield prefix


def delete_keys(prefix: str) -> None:
    scratch.delete_prefixed(REDIS_URL, prefix)


# ---- CPU from /proc ---------------------------------------------------------------------------


def _stat(pid: str) -> tuple[str, list[str]] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class CpuMeter:
    """CPU seconds of named process groups, read from /proc before and after a measurement.

    ``sessions`` maps a label to session ids (each Proc leads its own session): every live
    member's utime+stime+cutime+cstime counts, so a prefork child is included while it lives and
    through its parent's cutime once reaped. ``postgres_db`` adds PostgreSQL's backends serving
    that database (its own connections only; other users of the server are left out), and Redis
    is counted whole: it is shared, so its figure includes whoever else uses it.
    """

    sessions: dict[str, list[int]] = field(default_factory=dict)
    postgres_db: str | None = None
    redis: bool = True

    def snapshot(self) -> dict[str, float]:
        by_session = {sid: label for label, sids in self.sessions.items() for sid in sids}
        out: dict[str, float] = dict.fromkeys(self.sessions, 0.0)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            got = _stat(pid)
            if got is None:
                continue
            comm, f = got
            ticks = int(f[11]) + int(f[12])
            label = by_session.get(int(f[3]))
            if label is not None:
                out[label] += (ticks + int(f[13]) + int(f[14])) / TICK
            elif self.postgres_db and comm == "postgres" and f" {self.postgres_db} " in _cmdline(pid):
                out["postgres"] = out.get("postgres", 0.0) + ticks / TICK
            elif self.redis and comm.startswith("redis-server"):
                out["redis (shared)"] = out.get("redis (shared)", 0.0) + ticks / TICK
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        # A PostgreSQL backend that went away takes its ticks with it: never report less than 0.
        return {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0)) for k in after}


# ---- the fake LLM server ----------------------------------------------------------------------


def fake_server(cleanup: contextlib.ExitStack, scripts: dict[str, dict[str, Any]], logdir: Path) -> tuple[Proc, str]:
    """``python -m kortex.testing.fakellm`` in its own process (its CPU is nobody's), serving
    ``scripts`` by model name."""
    folder = logdir / "scripts"
    folder.mkdir(exist_ok=True)
    for name, script in scripts.items():
        (folder / f"{name}.json").write_text(json.dumps(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = start(cleanup, "fakellm", [PYTHON, "-m", "kortex.testing.fakellm", "--scripts", str(folder)], env, logdir)
    proc.wait_for(lambda: "listening on " in proc.output(), timeout=30)
    url = proc.output().split("listening on ", 1)[1].split()[0]
    return proc, url


# ---- Kortex, as the README runs it ------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Tenant limits the load needs (not engine tuning): N turns of one tenant at once."""

    concurrent_turns: int = 1000
    streams: int = 100_000

    def env(self) -> dict[str, str]:
        return {
            "KORTEX_LLM__BUDGET__MAX_CONCURRENT_TURNS_PER_TENANT": str(self.concurrent_turns),
            "KORTEX_LLM__BUDGET__TURNS_PER_MINUTE": "1000000",
            "KORTEX_LLM__BUDGET__SESSIONS_PER_MINUTE": "1000000",
            "KORTEX_LLM__BUDGET__DAILY_USD_LIMIT": "1000000",
            "KORTEX_TURN__MAX_STREAMS_PER_TENANT": str(self.streams),
        }


SET_PREFIX = "KORTEX_BENCH_SET_"
# what the bench owns and removes on exit: not for KORTEX_BENCH_SET_ to move
_OWN = ("DATABASE_URL", "REDIS_URL", "REDIS_PREFIX", "HOME")


def overrides() -> dict[str, str]:
    """``KORTEX_BENCH_SET_<NAME>=v``: the stack runs with ``KORTEX_<NAME>=v`` (a setting to
    compare with its default). The database, Redis and home the bench makes and removes are
    its own."""
    found = {"KORTEX_" + k[len(SET_PREFIX):]: v for k, v in os.environ.items() if k.startswith(SET_PREFIX)}
    owned = sorted(k for k in found if k[len("KORTEX_"):] in _OWN)
    if owned:
        raise SystemExit(f"bench: the bench makes and removes {', '.join(owned)} itself; {SET_PREFIX} cannot set it")
    return found


def kortex_env(pg_url: str, prefix: str, fake_url: str, home: Path, limits: Limits) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update({
        "KORTEX_DATABASE_URL": pg_url,
        "KORTEX_REDIS_URL": REDIS_URL,
        "KORTEX_REDIS_PREFIX": prefix,
        "KORTEX_HOME": str(home),
        "KORTEX_LOG_LEVEL": "INFO",
        # The real Anthropic adapter against the fake server: the wire format a deployment parses.
        "KORTEX_LLM__DEFAULT_PROVIDER": "anthropic",
        "KORTEX_LLM__PROVIDERS__ANTHROPIC__BASE_URL": fake_url,
        "KORTEX_LLM__PROVIDERS__ANTHROPIC__API_KEY": "bench",
        "KORTEX_LLM__PROVIDERS__ANTHROPIC__MODEL": "bench-zero",
        # Sessions name the fake's scripts as models (anthropic:bench-paced, ...); unlisted
        # models are free, so no budget gets in the way.
        "KORTEX_LLM__PROVIDERS__ANTHROPIC__ALLOW_UNLISTED_MODELS": "true",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(limits.env())
    env.update(overrides())
    return env


def _extra_queues() -> list[str]:
    """Queues beyond turns and tools (a watchdog queue, say) get a worker of their own, as the
    README's layout would; read from the code so the bench follows the engine's changes."""
    try:
        from workers.queues import Queue
    except Exception:  # the bench must still run if the layout moves
        return []
    return [q.value for q in Queue if q.value not in ("turns", "tools")]


@dataclass
class KortexStack:
    """The distributed stack started with the README's default commands, no tuning flags."""

    url: str
    env: dict[str, str]
    procs: dict[str, Proc]
    pg_db: str
    keys: dict[str, str] = field(default_factory=dict)  # tenant role -> API key

    def meter(self) -> CpuMeter:
        return CpuMeter({name: [p.pid] for name, p in self.procs.items()}, postgres_db=self.pg_db)


def create_tenant(env: dict[str, str], name: str, seed: bool) -> str:
    """The tenant's first API key, as an operator makes one (``kortex admin create-tenant``),
    and with ``seed`` telemetry for the tools to read, so a tool call returns a realistic result."""
    out = cli(["admin", "create-tenant", name], env)
    keys = [line.strip() for line in out.splitlines() if line.strip().startswith("kx_")]
    if not keys:
        raise RuntimeError(f"no API key in: {out!r}")
    if seed:
        cli(["seed", "checkout-deploy-regression", "--tenant", name], env)
    return keys[-1]


def cli(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    """Run ``kortex <args>``; its output, or an error carrying what it printed."""
    done = subprocess.run([*KORTEX, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"kortex {' '.join(args)} failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return done.stdout


def migrate(env: dict[str, str]) -> None:
    cli(["migrate"], env)


def kortex_stack(cleanup: contextlib.ExitStack, env: dict[str, str], logdir: Path, pg_db: str,
                 tenants: dict[str, tuple[str, bool]]) -> KortexStack:
    """``kortex api``, ``kortex worker --queues turns``, ``kortex worker --queues tools`` and
    ``kortex beat``, exactly as the README lists them, waited on until each is ready.
    ``tenants`` (role -> (name, seeded)) are created meanwhile: they need only the database."""
    import httpx

    port = free_port()
    commands = {
        "api": [*KORTEX, "api", "--port", str(port)],
        "turns worker": [*KORTEX, "worker", "--queues", "turns"],
        "tools worker": [*KORTEX, "worker", "--queues", "tools"],
        **{f"{q} worker": [*KORTEX, "worker", "--queues", q] for q in _extra_queues()},
        "beat": [*KORTEX, "beat"],
    }
    progress("starting Kortex: " + ", ".join(commands))
    procs: dict[str, Proc] = {}
    cleanup.callback(lambda: stop_all(list(procs.values())))
    for name, argv in commands.items():
        procs[name] = start(None, name.replace(" ", "-"), argv, env, logdir)
    url = f"http://127.0.0.1:{port}"
    pool = cleanup.enter_context(ThreadPoolExecutor(max(1, len(tenants))))
    pending = {role: pool.submit(create_tenant, env, name, seed) for role, (name, seed) in tenants.items()}

    def api_ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    for name, proc in procs.items():
        if name == "api":
            proc.wait_for(api_ready)
        else:
            mark = "watchdog process started" if name == "beat" else " ready."
            proc.wait_for(functools.partial(_says, proc, mark))
    keys = {role: job.result(timeout=180) for role, job in pending.items()}
    profile(cleanup, procs)
    progress("Kortex is ready")
    return KortexStack(url=url, env=env, procs=procs, pg_db=pg_db, keys=keys)


def _says(proc: Proc, mark: str) -> bool:
    return mark in proc.output()


def profile(cleanup: contextlib.ExitStack, procs: dict[str, Proc]) -> None:
    """``KORTEX_BENCH_PYSPY=<folder>``: attach py-spy to each ready process and its children,
    sampling the thread that holds the GIL (CPU, not waits), and write
    ``<folder>/<process>-<pid>.speedscope`` when the stack stops (py-spy writes on SIGINT).
    ``KORTEX_BENCH_PYSPY_PROCS`` narrows it to some processes (comma-separated names, e.g.
    ``api,turns worker``)."""
    folder = os.environ.get("KORTEX_BENCH_PYSPY")
    if not folder:
        return
    spy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(spy).exists():
        progress("KORTEX_BENCH_PYSPY is set but py-spy is not installed (pip install py-spy): no profiles")
        return
    wanted = [n.strip() for n in os.environ.get("KORTEX_BENCH_PYSPY_PROCS", "").split(",") if n.strip()]
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, proc in procs.items():
        if wanted and name not in wanted:
            continue
        out = Path(folder) / f"{name.replace(' ', '-')}-{proc.pid}.speedscope"
        spier = subprocess.Popen([spy, "record", "--pid", str(proc.pid), "--subprocesses", "--gil",
                                  "--rate", "200", "--format", "speedscope", "-o", str(out)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def stop(spier: subprocess.Popen[bytes] = spier) -> None:
            spier.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spier.wait(30)

        cleanup.callback(stop)  # registered after the processes' stop, so it runs before it (LIFO)
    progress(f"py-spy writing to {folder}")


@contextlib.contextmanager
def logs_dir(keep: bool = False) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kortex-bench-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


# ---- one benchmark run's shared setup -----------------------------------------------------------


@dataclass
class BenchEnv:
    """What the parts share: the fake LLM, the log folder and the root prefix. Each Kortex
    stack gets a database and a prefix of its own, so one part's leftovers never load the next
    (a backlog of queued turns cut off by a time limit would be re-enqueued by the next
    stack's watchdog, which sweeps the whole database)."""

    cleanup: contextlib.ExitStack
    logdir: Path
    fake_url: str
    prefix: str
    limits: Limits
    _count: int = 0

    def new_prefix(self) -> str:
        self._count += 1
        return f"{self.prefix}-{self._count}"

    def kortex(self, local: contextlib.ExitStack, tenants: dict[str, bool]) -> KortexStack:
        """A fresh Kortex stack, stopped (and its keys deleted) when ``local`` closes, with a new
        tenant for each role in ``tenants`` (True: seeded with a scenario's telemetry); their
        API keys are in ``stack.keys[role]``."""
        prefix = self.new_prefix()
        # Entered before the processes start, so undone after they stop.
        pg_url, pg_db = local.enter_context(throwaway_database())
        local.callback(delete_keys, prefix)
        logs = self.logdir / prefix
        logs.mkdir()
        env = kortex_env(pg_url, prefix, self.fake_url, logs, self.limits)
        migrate(env)
        names = {role: (f"bench-{role}", seed) for role, seed in tenants.items()}
        return kortex_stack(local, env, logs, pg_db, names)


@contextlib.contextmanager
def bench_env(cleanup: contextlib.ExitStack, scripts: dict[str, dict[str, Any]], limits: Limits,
              keep_logs: bool = False) -> Iterator[BenchEnv]:
    logdir = cleanup.enter_context(logs_dir(keep_logs))
    prefix = cleanup.enter_context(redis_prefix())
    _fake, fake_url = fake_server(cleanup, scripts, logdir)
    yield BenchEnv(cleanup, logdir, fake_url, prefix, limits)
