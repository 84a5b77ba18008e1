"""What routing costs a step (issue 13): choosing the model with ``model: "auto"`` (the
catalog of every available provider's models, the task spec, the heuristic strategy, the
failover chain) against resolving a pinned model's chain, in one process, p50 over many steps.
Goal: routing adds <= 1 ms per step at p50. The latency figures it reads are cached per tenant
(one audit query per 30 s), so they are not part of a step's cost and not measured here."""

from __future__ import annotations

import statistics
import time

from bench.report import Report, Row
from kortex.config import Settings
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import plan
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.turns.routed import Router


def _history() -> list[object]:
    calls = tuple(ToolCall(id=f"call_{i}", name="get_logs", arguments={"product": "checkout"}) for i in range(3))
    return [UserMessage(content="Why is checkout slow since the deploy?"),
            AssistantMessage(content="Looking at the logs.", tool_calls=calls),
            *[ToolMessage(result=ToolResult(call_id=c.id, name=c.name, content={"lines": ["x" * 200] * 20}))
              for c in calls]]


def _p50_ms(fn: object, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run(report: Report, iterations: int = 3000) -> None:
    settings = Settings.model_validate({"llm": {"providers": {"anthropic": {"api_key": "bench"},
                                                              "openai": {"api_key": "bench"}}}})
    registry = ProviderRegistry(settings, BUILTIN_PROVIDERS)
    router = Router(settings)
    history = _history()

    def pinned() -> None:
        plan(registry, "anthropic:claude-sonnet-4-6")

    def routed() -> None:
        decision = router.decide(registry, history, {}, last_step=False)  # type: ignore[arg-type]
        router.candidates(registry, decision)

    for fn in (pinned, routed):  # warm: providers built, catalogues priced
        fn()
    pinned_ms, routed_ms = _p50_ms(pinned, iterations), _p50_ms(routed, iterations)
    report.raw["routing"] = {"pinned_p50_ms": pinned_ms, "routed_p50_ms": routed_ms, "iterations": iterations}
    report.add(Row("routing", "model choice per step p50 (auto vs pinned)", routed_ms, pinned_ms, "ms"),
               Row("routing", "routing's extra cost per step p50", routed_ms - pinned_ms, None, "ms", "<= 1",
                   f"{iterations} steps each"))
