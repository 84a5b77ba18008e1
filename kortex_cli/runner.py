"""What the CLI commands do: run the embedded stack, or talk to a running API."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.markup import escape

from kortex.config import Settings, load_settings
from kortex.container import Kortex
from kortex.errors import NotFound
from kortex.storage import tenants
from kortex.storage.migrate import upgrade
from kortex.telemetry import scenarios
from kortex.timeparse import utcnow
from kortex.turns import chat
from kortex_cli.render import EventPrinter

if TYPE_CHECKING:
    from kortex.keys import KeyInfo

DEMO_TENANT = "demo"
T = TypeVar("T")


@contextlib.contextmanager
def embedded_stack(settings: Settings, *, worker: bool = True) -> Iterator[Kortex]:
    """Database schema, a container, and (embedded mode, unless ``worker`` is False) the
    in-process worker."""
    upgrade(settings.effective_database_url)
    k = Kortex.create(settings)
    running = None
    if settings.embedded and worker:
        from workers.app import app as celery_app
        from workers.embedded import EmbeddedWorker

        running = EmbeddedWorker(celery_app, settings=settings)
        running.start()
    try:
        yield k
    finally:
        if running is not None:
            running.stop()
        k.close()


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


def _ask(k: Kortex, tenant_id: str, question: str, model: str | None, printer: EventPrinter) -> bool:
    session = chat.create_session(k, tenant_id, name=question[:80], model=model)
    posted = chat.post_message(k, tenant_id, session.id, question)
    _dispatch(posted.handoff)
    ok = False
    for entry in k.events.follow(posted.turn.id, idle_timeout=k.settings.turn.deadline + 30):
        printer.show(entry.type, json.loads(entry.data))
        if entry.type == "done":
            ok = json.loads(entry.data).get("status") == "done"
    return ok


def run_demo(console: Console, *, question: str | None, scenario: str, model: str | None) -> bool:
    settings = load_settings()
    mode = "embedded (SQLite + in-process worker)" if settings.embedded else "distributed"
    console.print(f"[bold]Kortex demo[/bold] · mode: {mode}")
    with embedded_stack(settings) as k:
        tenant_id = _tenant_id(k, DEMO_TENANT, create=True)
        counts = _seed(k, tenant_id, scenario)
        picked = scenarios.get_scenario(scenario)
        question = question or picked.question
        console.print(f"seeded scenario [cyan]{scenario}[/cyan]: {picked.title} ({describe_counts(counts)})")
        console.print(f"\n[bold]Q:[/bold] {question}\n")
        return _ask(k, tenant_id, question, model, EventPrinter(console))


def ask_embedded(console: Console, question: str, *, model: str | None, as_json: bool,
                 tenant: str = DEMO_TENANT) -> bool:
    settings = load_settings()
    if model:  # an unusable model is reported before the embedded stack starts
        from kortex.llm.providers import BUILTIN_PROVIDERS
        from kortex.llm.registry import ProviderRegistry

        ProviderRegistry(settings, BUILTIN_PROVIDERS).resolve(model)
    with embedded_stack(settings) as k:
        tenant_id = _tenant_id(k, tenant, create=tenant == DEMO_TENANT)
        return _ask(k, tenant_id, question, model, EventPrinter(console, as_json=as_json))


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
    def work(k: Kortex) -> tuple[str, str]:
        with k.db.begin() as conn:
            tenant = tenants.create_tenant(conn, name)
            issued = tenants.issue_api_key(conn, tenant.id)
        return tenant.id, issued.key

    return _with_container(work)


def issue_key(name: str, role: str = "admin") -> str:
    def work(k: Kortex) -> str:
        with k.db.begin() as conn:
            tenant = tenants.get_tenant_by_name(conn, name)
            if tenant is None:
                raise NotFound(f"no tenant named {name!r}")
            return (tenants.issue_api_key(conn, tenant.id, role=role)).key

    return _with_container(work)


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
    upgrade(settings.effective_database_url)
    k = Kortex.create(settings)
    try:
        return work(k)
    finally:
        k.close()


def ask_remote(console: Console, url: str, api_key: str, question: str, *, model: str | None,
               session_id: str | None, as_json: bool) -> bool:
    from kortex_cli.remote import RemoteClient

    printer = EventPrinter(console, as_json=as_json)
    with RemoteClient(url, api_key) as client:
        if session_id is None:
            session_id = client.create_session(question[:80], model)
        turn = client.post_message(session_id, question, model)
        ok = False
        for event, data in client.events(turn["events_url"]):
            printer.show(event, data)
            if event == "done":
                ok = data.get("status") == "done"
        return ok


__all__ = ["ask_embedded", "ask_remote", "create_tenant_with_key", "issue_key", "list_models", "run_demo",
           "seed_scenario"]
