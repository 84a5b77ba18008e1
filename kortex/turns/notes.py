"""What a step notes about itself beyond its text and tool calls: the routing decision, the
anomalies its checks found and the recoveries that ran, each as a stream event (``route``,
``anomaly``, ``recovery``) and an audit row written with the step's other rows."""

from __future__ import annotations

from kortex.config import AnomalySettings
from kortex.events import AnomalyEvent, RecoveryEvent, RouteEvent
from kortex.llm.routing import RoutingDecision
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.stream.store import StepPublisher
from kortex.turns.anomalies import Action, Anomaly, Escalated, check_context


class Notes:
    def __init__(self, turn: TurnRecord, step: int) -> None:
        self.turn, self.step = turn, step
        self.entries: list[AuditEntry] = []
        self.retries = 0  # this step's recovery retries

    def _audit(self, kind: str, subject: str, payload: dict[str, object], ok: bool = True) -> None:
        self.entries.append(AuditEntry(tenant_id=self.turn.tenant_id, kind=kind, subject=subject[:200], ok=ok,
                                       payload={"step": self.step, **payload}, session_id=self.turn.session_id,
                                       turn_id=self.turn.id))

    def route(self, decision: RoutingDecision) -> RouteEvent:
        task = decision.task
        event = RouteEvent(step=self.step, model=decision.chosen.spec, tier=decision.chosen.tier,
                           reason=decision.reason, estimated_cost_usd=round(decision.estimated_cost_usd, 6),
                           fallback=decision.fallback.spec if decision.fallback else None,
                           complexity=task.complexity if task else "unknown",
                           position=task.position if task else "unknown")
        self._audit("route", decision.chosen.spec, {
            "model": event.model, "tier": event.tier, "reason": event.reason,
            "estimated_cost_usd": event.estimated_cost_usd, "fallback": event.fallback,
            "complexity": event.complexity, "position": event.position, "excluded": dict(decision.excluded)})
        return event

    def anomaly(self, found: Anomaly, publisher: StepPublisher) -> None:
        publisher.emit(AnomalyEvent(step=self.step, kind=found.kind, severity=found.severity, message=found.message,
                                    recommended=found.action))
        self._audit("anomaly", found.kind, {"severity": found.severity, "message": found.message,
                                            "recommended": found.action}, ok=False)

    def recovery(self, action: Action, anomaly: str, message: str, publisher: StepPublisher,
                 model: str | None = None) -> None:
        publisher.emit(RecoveryEvent(step=self.step, action=action, anomaly=anomaly, message=message, model=model))
        self._audit("recovery", action, {"anomaly": anomaly, "message": message, "model": model})

    def noted(self, found: Anomaly, publisher: StepPublisher) -> None:
        """An anomaly whose recovery is to carry on or to end the turn (what the kinds found
        outside the step's answer can take, kortex/turns/anomalies.py ACTIONS): recorded, and
        what ran said. ``escalate`` raises ``Escalated``; the step fails the turn."""
        self.anomaly(found, publisher)
        if found.action == "escalate":
            self.recovery("escalate", found.kind, "the turn ends here", publisher)
            raise Escalated(found)
        self.recovery("continue", found.kind, "recorded; the step goes on", publisher)

    def context(self, loaded: int, total: int, policy: AnomalySettings, publisher: StepPublisher, *,
                routed: bool) -> None:
        if checked(policy, routed):
            for found in check_context(loaded, total, policy):
                self.noted(found, publisher)


def checked(policy: AnomalySettings, routed: bool) -> bool:
    """Whether a step is checked for anomalies (``[llm.anomalies] scope``)."""
    return policy.scope == "all" or (policy.scope == "routed" and routed)


__all__ = ["Notes", "checked"]
