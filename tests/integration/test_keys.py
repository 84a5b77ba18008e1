"""Revoking a key and disabling a tenant from the command line stop them on a running API
process at once, though that process had just verified (and cached) the key."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from tests.conftest import Harness
from tests.integration.conftest import ROOT, service_env


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _cli(pg_url: str, redis_prefix: str, *args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "kortex_cli.main", "admin", *args],
                         env={**service_env(pg_url, redis_prefix), "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _refused_within(api_url: str, key: str, seconds: float) -> float:
    start = time.monotonic()
    while httpx.get(f"{api_url}/v1/tools", headers=auth(key)).status_code != 401:
        assert time.monotonic() - start < seconds, "the key still works"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_key_revoked_by_the_cli_is_refused_by_the_api_within_seconds(api_url, pg: Harness, pg_url,
                                                                      redis_prefix) -> None:
    tenant = pg.tenant("revocations")
    pg.api_key(tenant)  # the tenant's admin key stays
    key = pg.api_key(tenant, role="chat")
    assert httpx.get(f"{api_url}/v1/tools", headers=auth(key)).status_code == 200  # verified and cached
    listed = _cli(pg_url, redis_prefix, "list-keys", "revocations")
    assert key.split("_")[1] in listed and key.split("_")[2] not in listed
    _cli(pg_url, redis_prefix, "revoke-key", "revocations", key.split("_")[1])
    assert _refused_within(api_url, key, 5.0) < 5.0  # the cache holds keys for 30 s


def test_a_disabled_tenant_is_refused_and_an_enabled_one_works_again(api_url, pg: Harness, pg_url,
                                                                   redis_prefix) -> None:
    tenant = pg.tenant("disabled-later")
    key = pg.api_key(tenant, role="chat")
    assert httpx.get(f"{api_url}/v1/tools", headers=auth(key)).status_code == 200
    _cli(pg_url, redis_prefix, "disable-tenant", "disabled-later")
    _refused_within(api_url, key, 5.0)
    _cli(pg_url, redis_prefix, "enable-tenant", "disabled-later")
    assert httpx.get(f"{api_url}/v1/tools", headers=auth(key)).status_code == 200


def test_the_keys_of_open_streams_are_checked_in_one_query_on_postgresql(pg: Harness) -> None:
    from kortex import keys

    live, other = pg.tenant("stream-keys"), pg.tenant("stream-keys-off")
    pg.api_key(live)  # admin keys stay, so the revocations below are allowed
    pg.api_key(other)
    kept, revoked, disabled = pg.api_key(live, role="chat"), pg.api_key(live, role="chat"), pg.api_key(other, role="chat")
    keys.revoke_key(pg.k, live, revoked.split("_")[1], by="test")
    keys.set_tenant_disabled(pg.k, "stream-keys-off", True, by="test")
    asked = {kept.split("_")[1], revoked.split("_")[1], disabled.split("_")[1], "nosuchkey"}
    assert keys.valid_key_ids(pg.k, asked) == {kept.split("_")[1]}
    assert keys.valid_key_ids(pg.k, set()) == set()
