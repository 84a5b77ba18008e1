"""OpenTelemetry spans for a turn: the HTTP request that posted it, each step (a Celery task and
the engine's run of it), each LLM call inside a step, each tool call; one trace per turn, its
context carried from hand-off to hand-off in the task headers (``Handoff.traced``) and kept on
the turn's and each tool call's row (``traceparent``), for the work the watchdog hands on again.

Off by default, and then nothing here does more than a flag check. ``[tracing] enabled = true``
exports OTLP over HTTP to ``endpoint`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT``). Spans carry ids, names, counts and outcomes; never prompts,
answers, tool arguments or results, which may hold what telemetry held.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

log = logging.getLogger(__name__)

_enabled = False
tracer = trace.get_tracer("kortex")


def enabled() -> bool:
    return _enabled


def setup(*, service: str, endpoint: str | None = None, service_name: str = "kortex", sample_ratio: float = 1.0,
          exporter: Any = None) -> None:
    """Install the SDK for this process (once; the shells call it at start). ``exporter`` is
    for tests (the SDK's in-memory one); otherwise OTLP/HTTP to ``endpoint``."""
    global _enabled, tracer
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(resource=Resource.create({"service.name": service_name, "kortex.process": service}),
                              sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if url is None and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            url = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url) if url else OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("kortex")
    _enabled = True


def setup_from(settings: Any, service: str) -> None:
    """``setup`` from ``[tracing]`` when it is enabled (every process calls this at start)."""
    config = settings.tracing
    if config.enabled and not _enabled:
        setup(service=service, endpoint=config.endpoint, service_name=config.service_name,
              sample_ratio=config.sample_ratio)


def carrier() -> tuple[tuple[str, str], ...]:
    """The current span's context as header pairs for a hand-off (empty when off)."""
    if not _enabled:
        return ()
    headers: dict[str, str] = {}
    inject(headers)
    return tuple(sorted(headers.items()))


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` (None when off or outside any span). A turn's and
    a tool call's rows keep it: the watchdog hands their work on again from the database, where
    no span is current, and the re-run must still join the turn's trace."""
    value = dict(carrier()).get("traceparent")
    return value if value is not None and len(value) <= 64 else None  # the columns' width (version 00: 55)


@contextlib.contextmanager
def span(name: str, *, parent: Mapping[str, str] | tuple[tuple[str, str], ...] | None = None,
         kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A span, current while the block runs, child of ``parent`` (a carrier) or of the current
    span; None and no work at all when tracing is off. An exception marks it failed."""
    if not _enabled:
        yield None
        return
    ctx = extract(dict(parent)) if parent else None
    with tracer.start_as_current_span(name, context=ctx, kind=kind, attributes=dict(attributes or {}),
                                      record_exception=True, set_status_on_exception=True) as current:
        yield current


def start(name: str, attributes: Mapping[str, Any] | None = None) -> Span | None:
    """A span not made current (for work that yields, such as a streamed LLM call); ``finish`` ends it."""
    if not _enabled:
        return None
    return tracer.start_span(name, context=otel_context.get_current(), kind=SpanKind.CLIENT,
                             attributes=dict(attributes or {}))


def finish(current: Span | None, *, error: str | None = None, **attributes: Any) -> None:
    if current is None:
        return
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(key, value)
    if error:
        current.set_status(Status(StatusCode.ERROR, error))
    current.end()


__all__ = ["carrier", "enabled", "finish", "setup", "setup_from", "span", "start", "traceparent"]
