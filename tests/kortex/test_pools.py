"""Connection budgets: every pool is sized from settings, waits instead of raising, and the
compose file's processes add up (with the start-up check's arithmetic) to less than PostgreSQL's
default 100 connections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redis import BlockingConnectionPool

from kortex.config import PoolSettings, Settings
from kortex.container import Kortex
from kortex.storage.connections import per_process, worker_processes

ROOT = Path(__file__).resolve().parents[2]
PG = "postgresql://kortex@127.0.0.1:5432/never_connected"


def _settings(tmp_path: Path, **pools: Any) -> Settings:
    return Settings(database_url=PG, redis_url="redis://127.0.0.1:6379/0", home=tmp_path, pools=pools)


def test_pools_come_from_settings_and_the_redis_pool_blocks(tmp_path: Path) -> None:
    k = Kortex.create(_settings(tmp_path, db_pool_size=3, db_max_overflow=2, telemetry_pool_size=1,
                                telemetry_max_overflow=0, redis_max_connections=7, redis_pool_timeout=1.5))
    try:
        # PostgreSQL keeps every connection it opens up to pool + overflow (no reconnect churn)
        assert (k.db.engine.pool.size(), k.db.engine.pool._max_overflow) == (5, 0)  # type: ignore[attr-defined]
        assert k.db.max_connections == 5
        telemetry = k.sources.metrics.db  # type: ignore[attr-defined]
        assert (telemetry.engine.pool.size(), telemetry.engine.pool._max_overflow) == (1, 0)
        pool = k.redis.connection_pool
        assert isinstance(pool, BlockingConnectionPool)
        assert (pool.max_connections, pool.timeout) == (7, 1.5)
    finally:
        k.close()


def _per_process(env: dict[str, str]) -> int:
    p = PoolSettings(**{k.removeprefix("KORTEX_POOLS__").lower(): v for k, v in env.items()
                        if k.startswith("KORTEX_POOLS__")})
    return per_process(p)


def _processes(command: list[str]) -> int:
    """Pool sets a compose service's command runs, as the start-up check counts them."""
    from kortex_cli.main import DEFAULT_API_PROCESSES

    def option(name: str, default: str) -> str:
        return command[command.index(name) + 1] if name in command else default

    if command[:2] == ["kortex", "api"]:
        return int(option("--workers", str(DEFAULT_API_PROCESSES)))
    if command[:2] == ["kortex", "worker"]:
        return worker_processes(option("--pool", "threads"), int(option("--concurrency", "16")))
    return 1


def test_the_compose_file_stays_under_postgres_default_100_connections() -> None:
    import yaml
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    kortex = {name: s for name, s in services.items() if s.get("command", [None])[0] == "kortex"
              and s["command"][1] != "migrate"}  # migrate runs before the others and exits
    assert sorted(kortex) == ["api", "beat", "worker-batch", "worker-tools", "worker-turns"]
    processes = {name: _processes(s["command"]) for name, s in kortex.items()}
    assert processes == {"api": 2, "worker-turns": 1, "worker-tools": 8, "worker-batch": 1, "beat": 1}
    total = sum(n * _per_process(kortex[name].get("environment") or {}) for name, n in processes.items())
    assert "KORTEX_DATABASE_URL" in str(services["flower"])  # Flower builds no container: no pool
    assert total == 89 < 100  # the figure README "Sizing" and the compose header state
    assert "at most 89 PostgreSQL" in (ROOT / "docker-compose.yml").read_text()
    assert "**89** of PostgreSQL's default 100" in (ROOT / "README.md").read_text()
    assert "--appendonly" in services["redis"]["command"]
    assert services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1] == "yes"


def test_compose_gives_the_turns_worker_time_to_hand_its_steps_on_when_stopped() -> None:
    """docker stop sends SIGTERM, then SIGKILL after the grace period (10 s unless set): the turns
    worker needs turn.shutdown_grace to let steps finish, and a few seconds more to release the
    rest to another worker; killed sooner, they wait out their leases."""
    import re

    import yaml

    from kortex.config import TurnSettings

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    given = re.fullmatch(r"(\d+)s", str(services["worker-turns"].get("stop_grace_period", "10s")))
    assert given is not None and int(given.group(1)) >= TurnSettings().shutdown_grace + 15
