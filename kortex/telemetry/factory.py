"""Build the telemetry sources a process uses from its settings: the embedded store for every
kind, with Prometheus (metrics) or Loki (logs) swapped in where configured."""

from __future__ import annotations

from kortex.config import Settings
from kortex.errors import ConfigError
from kortex.storage.db import Database
from kortex.telemetry.embedded import EmbeddedTelemetry
from kortex.telemetry.sources import TelemetrySources


def build_sources(settings: Settings, db: Database) -> TelemetrySources:
    """``db`` should bound its statements (see ``Database(statement_timeout=...)``): tools give
    up at their timeout, and the database must stop the query behind them too.

    A remote source must be scoped to the tenant asking (a label or X-Scope-OrgID) unless the
    configuration states it serves one tenant: otherwise ``ConfigError``, and nothing starts."""
    sources = EmbeddedTelemetry(db).sources()
    conf = settings.telemetry
    if conf.metrics == "prometheus":
        from kortex.telemetry.prometheus import PrometheusMetrics

        prom = conf.prometheus
        if not prom.url:
            raise ConfigError("telemetry.metrics = 'prometheus' needs telemetry.prometheus.url")
        sources.metrics = PrometheusMetrics(
            prom.url, product_label=prom.product_label, tenant_label=prom.tenant_label,
            org_id_from_tenant=prom.org_id_from_tenant, single_tenant=prom.single_tenant, timeout=prom.timeout,
            bearer_token=prom.bearer_token.get_secret_value() if prom.bearer_token else None)
    if conf.logs == "loki":
        from kortex.telemetry.loki import LokiLogs

        loki = conf.loki
        if not loki.url:
            raise ConfigError("telemetry.logs = 'loki' needs telemetry.loki.url")
        sources.logs = LokiLogs(
            loki.url, product_label=loki.product_label, level_label=loki.level_label, host_label=loki.host_label,
            trace_label=loki.trace_label, org_id_from_tenant=loki.org_id_from_tenant,
            single_tenant=loki.single_tenant, timeout=loki.timeout,
            bearer_token=loki.bearer_token.get_secret_value() if loki.bearer_token else None)
    return sources
