"""Per-step model routing (``model: "auto"``): a catalog of the models the deployment can call,
each with its tier, prices, context window, capabilities and *measured* latency; a ``TaskSpec``
built from the step; and a strategy that picks the step's model and a fallback.

The built-in ``HeuristicRoutingStrategy`` is rules, no learned weights (routing-checkpoints-
recovery): filter out models that break the task's constraints (cost ceiling, latency SLA,
capabilities), pick by the task's complexity (simple: the cheapest fast model; moderate: the
cheapest balanced one; complex: the most capable powerful one; the nearest tier when one is
empty), and keep the next-best by cost as the fallback. A deployment can name its own class in
``[llm.routing] strategy`` ("module:Class"); it implements ``RoutingStrategy``.

Models are keyed ``provider::model`` so two providers' models of one name never collide.
"""

from __future__ import annotations

import difflib
import importlib
import json
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kortex.errors import ConfigError, InvalidInput, ProviderUnavailable
from kortex.llm.base import CHARS_PER_TOKEN, ModelInfo, Tier
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage

CAPABILITIES = ("reasoning", "analysis", "code_generation", "content_generation", "vision", "audio",
                "quality_assurance", "data_processing", "planning", "research", "testing")
ALIASES = {
    "writing": "content_generation", "write": "content_generation", "summarization": "content_generation",
    "coding": "code_generation", "code": "code_generation", "programming": "code_generation",
    "review": "quality_assurance", "qa": "quality_assurance", "reasoning_heavy": "reasoning", "math": "reasoning",
    "analytics": "analysis", "data": "data_processing", "etl": "data_processing", "plan": "planning",
    "search": "research", "test": "testing", "image": "vision", "images": "vision", "speech": "audio",
}
#: what a model of each tier is taken to do when its configuration does not say
TIER_CAPABILITIES: dict[Tier, frozenset[str]] = {
    "fast": frozenset({"analysis", "data_processing", "content_generation"}),
    "balanced": frozenset({"reasoning", "analysis", "code_generation", "content_generation", "data_processing",
                           "planning", "research"}),
    "powerful": frozenset({"reasoning", "analysis", "code_generation", "content_generation", "data_processing",
                           "planning", "research", "quality_assurance", "testing"}),
}
TIER_ORDER: tuple[Tier, ...] = ("fast", "balanced", "powerful")
Complexity = Literal["simple", "moderate", "complex"]
TIER_FOR: dict[Complexity, Tier] = {"simple": "fast", "moderate": "balanced", "complex": "powerful"}
Position = Literal["plan", "digest", "answer"]
_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,39}::[\x21-\x7e]{1,200}\Z")


def canonical(capability: str) -> str:
    """A capability in the canonical vocabulary; aliases resolve, anything else is refused."""
    name = capability.strip().lower().replace("-", "_").replace(" ", "_")
    if name in CAPABILITIES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    near = difflib.get_close_matches(name, [*CAPABILITIES, *ALIASES], n=1)
    hint = f"; did you mean {ALIASES.get(near[0], near[0])!r}?" if near else ""
    raise InvalidInput(f"unknown capability {capability!r}{hint} (known: {', '.join(CAPABILITIES)})")


def capabilities(names: Iterable[str]) -> frozenset[str]:
    return frozenset(canonical(n) for n in names)


def model_key(provider: str, model_id: str) -> str:
    return f"{provider}::{model_id}"


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise InvalidInput(f"{key!r} is not a model key; write provider::model, e.g. 'anthropic::claude-haiku-4-6'")
    return key


@dataclass(frozen=True, slots=True)
class Latency:
    """What the model's recent calls took (the tenant's audit rows, kortex/llm/latency.py)."""

    samples: int
    first_token_p50_ms: float
    first_token_p95_ms: float
    tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class RouteModel:
    """A catalog entry: one model of one provider, as the router sees it."""

    provider: str
    model: ModelInfo
    tier: Tier
    capabilities: frozenset[str]
    latency: Latency | None = None

    @property
    def key(self) -> str:
        return model_key(self.provider, self.model.id)

    @property
    def spec(self) -> str:
        return f"{self.provider}:{self.model.id}"

    def estimate(self, input_tokens: int, output_tokens: int) -> float:
        return self.model.cost(input_tokens, output_tokens)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One LLM step as a routing problem."""

    complexity: Complexity
    position: Position
    input_tokens: int
    output_tokens: int = 600
    required_capabilities: frozenset[str] = frozenset()
    cost_ceiling_usd: float | None = None
    latency_sla_ms: float | None = None
    #: what no cut to a model's window leaves out (the prompt, the turn's question and what
    #: followed it; kortex/turns/context.py): a model whose window holds that can answer, the
    #: session's earlier turns cut away. 0: the whole input.
    min_input_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    chosen: RouteModel
    fallback: RouteModel | None
    reason: str
    estimated_cost_usd: float
    #: models left out, by key, with why (the decision's audit row keeps them)
    excluded: dict[str, str] = field(default_factory=dict)
    #: the task it was made for (the router fills it in; a strategy need not)
    task: TaskSpec | None = None


class RoutingStrategy(Protocol):
    def select(self, task: TaskSpec, candidates: Sequence[RouteModel]) -> RoutingDecision: ...


class HeuristicRoutingStrategy:
    """Filter by constraints, pick by tier, keep the next-best by cost as the fallback."""

    def select(self, task: TaskSpec, candidates: Sequence[RouteModel]) -> RoutingDecision:
        excluded: dict[str, str] = {}
        fit: list[RouteModel] = []
        for c in candidates:
            why = self._unfit(task, c)
            if why:
                excluded[c.key] = why
            else:
                fit.append(c)
        if not fit:
            reasons = "; ".join(f"{k}: {v}" for k, v in excluded.items()) or "no models"
            raise ProviderUnavailable(f"no model satisfies this step's constraints ({reasons})", code="no_route")
        wanted = TIER_FOR[task.complexity]
        chosen, tier = self._pick(task, fit, wanted)
        cost = chosen.estimate(task.input_tokens, task.output_tokens)
        rest = sorted((c for c in fit if c.key != chosen.key),
                      key=lambda c: (c.estimate(task.input_tokens, task.output_tokens), c.key))
        reason = (f"{task.complexity} {task.position} step: "
                  + (f"the {'most capable' if wanted == 'powerful' else 'cheapest'} {tier} model"
                     if tier == wanted else f"no {wanted} model fits, so the nearest tier ({tier})")
                  + (f"; {len(excluded)} excluded by constraints" if excluded else ""))
        return RoutingDecision(chosen=chosen, fallback=rest[0] if rest else None, reason=reason,
                               estimated_cost_usd=cost, excluded=excluded)

    @staticmethod
    def _unfit(task: TaskSpec, c: RouteModel) -> str | None:
        missing = task.required_capabilities - c.capabilities
        if missing:
            return f"lacks {', '.join(sorted(missing))}"
        if task.cost_ceiling_usd is not None:
            cost = c.estimate(task.input_tokens, task.output_tokens)
            if cost > task.cost_ceiling_usd:
                return f"estimated ${cost:.4f} > ceiling ${task.cost_ceiling_usd:.4f}"
        if task.latency_sla_ms is not None and c.latency is not None:
            if c.latency.first_token_p50_ms > task.latency_sla_ms:
                return f"first token p50 {c.latency.first_token_p50_ms:.0f} ms > SLA {task.latency_sla_ms:.0f} ms"
        needed = (task.min_input_tokens or task.input_tokens) + task.output_tokens
        if needed > c.model.context_tokens:
            return f"context {c.model.context_tokens} tokens < {needed}"
        return None

    @staticmethod
    def _pick(task: TaskSpec, fit: list[RouteModel], wanted: Tier) -> tuple[RouteModel, Tier]:
        index = TIER_ORDER.index(wanted)
        # The nearest tier when the wanted one is empty: a notch up before a notch down for a
        # complex task's sake, a notch down first otherwise (cost).
        order = sorted(TIER_ORDER, key=lambda t: (abs(TIER_ORDER.index(t) - index),
                                                   TIER_ORDER.index(t) < index if wanted == "powerful"
                                                   else TIER_ORDER.index(t) > index))
        for tier in order:
            pool = [c for c in fit if c.tier == tier]
            if not pool:
                continue
            if wanted == "powerful":  # the most capable: the most capabilities, then the largest price
                best = max(pool, key=lambda c: (len(c.capabilities), c.model.output_usd_per_mtok,
                                                c.model.context_tokens, c.key))
            else:
                best = min(pool, key=lambda c: (c.estimate(task.input_tokens, task.output_tokens), c.key))
            return best, tier
        raise AssertionError("fit is not empty")


def load_strategy(path: str) -> RoutingStrategy:
    """``module:Class`` of a RoutingStrategy (configured), instantiated without arguments."""
    module, sep, name = path.partition(":")
    if not sep:
        raise ConfigError(f"[llm.routing] strategy must be 'module:Class', not {path!r}")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"[llm.routing] strategy {path!r} cannot be loaded: {exc}") from None
    strategy = cls()
    if not callable(getattr(strategy, "select", None)):
        raise ConfigError(f"[llm.routing] strategy {path!r} has no select(task, candidates)")
    return strategy  # type: ignore[no-any-return]


# ---- the step as a task ---------------------------------------------------------------------

_COMPLEX = re.compile(r"\b(why|root cause|correlat\w*|compare|explain|investigat\w*|diagnos\w*|what caused|"
                      r"how come|trade-?offs?|post-?mortem|regression|intermittent\w*)\b", re.I)
_SIMPLE = re.compile(r"^\s*(list|show|what is|what's|which|is|are|does|how many|status|name)\b", re.I)


def complexity_of(question: str) -> Complexity:
    """How hard the operator's question is, from its words: a "why" or a comparison is complex;
    a short lookup ("list the products", "is checkout up?") is simple; the rest moderate."""
    words = len(question.split())
    if _COMPLEX.search(question) or words > 60:
        return "complex"
    if _SIMPLE.search(question) and words <= 20:
        return "simple"
    return "moderate"


def task_of(history: Sequence[Message], *, last_step: bool, cost_ceiling_usd: float | None,
            latency_sla_ms: float | None, required: frozenset[str] = frozenset(),
            prompt_chars: int = 0) -> TaskSpec:
    """The step as a task: complexity from the question and the step's position (the first
    planning step, digesting tool results, or the final answer when no tools are left).
    ``prompt_chars``: what the request carries besides the history (the system prompt and the
    tool schemas offered), billed as input like it: often most of a short question's step."""
    last_user = max((i for i, m in enumerate(history) if isinstance(m, UserMessage)), default=-1)
    question = history[last_user].content if last_user >= 0 else ""  # type: ignore[union-attr]
    after = history[last_user + 1:]
    position: Position = "answer" if last_step else ("digest" if any(isinstance(m, ToolMessage) for m in after)
                                                     else "plan")
    complexity = complexity_of(str(question))
    if position == "digest" and complexity == "complex":
        complexity = "moderate"  # reading results back is lighter work than planning or concluding
    prompt = tokens_of(prompt_chars)
    own = sum(message_tokens(m) for m in history[max(0, last_user):]) + prompt  # the turn's: never cut away
    tokens = sum(message_tokens(m) for m in history[:max(0, last_user)]) + own
    return TaskSpec(complexity=complexity, position=position, input_tokens=max(1, tokens),
                    required_capabilities=required, cost_ceiling_usd=cost_ceiling_usd, latency_sla_ms=latency_sla_ms,
                    min_input_tokens=max(1, own))


# ---- what a request comes to ------------------------------------------------------------------
# One estimator, for routing (the task's input_tokens: its cost and which windows can hold it) and
# for holding each call of a step to its model's window and the session's token cap
# (kortex/turns/context.py). Measured against OpenAI's tokenizers (o200k, cl100k; Anthropic's is
# not public and taken to be alike): prose (questions, answers, the system prompt, tool schemas) comes to 3.2-4.7
# characters a token, so CHARS_PER_TOKEN (4) is within -20%..+15%; JSON data (tool arguments and
# results: numbers, timestamps, ids) to 1.6-3.0 (metric series 2.2, log lines 3.0, the demo's
# results 2.4, bare UUIDs 1.6), so DATA_CHARS_PER_TOKEN (2) is +10%..+48% on telemetry, the
# demo's +20%, and -18% only on JSON of bare ids. A result is measured as its JSON text, which the
# adapters send (kortex/llm/convert.py result_text); a holder to a hard limit keeps a margin.

#: characters of JSON data a token comes to, at most (see above)
DATA_CHARS_PER_TOKEN = 2
#: tokens a message or a tool call costs besides its content: its role and the chat template
#: around it (OpenAI counts 3-4 a message)
OVERHEAD_TOKENS = 4

#: the adapters' compact JSON (kortex/llm/convert.py result_text); one encoder, no cycle check: a
#: tenth faster than json.dumps, ~6 us a kilobyte of results
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str, check_circular=False)
#: id(object) -> (weak reference to it, its tokens): a result or call is serialised once however
#: often a step asks (routing, the fit of each call, a re-ask); gone with the object
_MEASURED: dict[int, tuple[weakref.ref[Any], int]] = {}


def _json_chars(value: Any) -> int:
    try:
        return len(_JSON.encode(value))
    except (RecursionError, TypeError, ValueError):  # the adapter cannot send it either: its call fails
        return 0


def _measured(obj: ToolCall | ToolMessage) -> int:
    key = id(obj)
    hit = _MEASURED.get(key)
    if hit is not None and hit[0]() is obj:
        return hit[1]
    if isinstance(obj, ToolCall):
        chars = len(obj.id) + len(obj.name) + _json_chars(obj.arguments)
    else:
        content = obj.result.content  # as result_text sends it (kortex/llm/convert.py)
        chars = len(obj.result.call_id) + (len(content) if isinstance(content, str) else _json_chars(content))
    tokens = -(-chars // DATA_CHARS_PER_TOKEN) + OVERHEAD_TOKENS

    def forget(ref: weakref.ref[Any], key: int = key) -> None:
        # Called as the object goes, before its id can be another's: drop this entry only.
        if (_MEASURED.get(key) or (None,))[0] is ref:
            _MEASURED.pop(key, None)

    _MEASURED[key] = (weakref.ref(obj, forget), tokens)
    return tokens


def tokens_of(chars: int) -> int:
    """Estimated tokens of ``chars`` characters of prose (rounded up)."""
    return -(-max(0, chars) // CHARS_PER_TOKEN)


def text_tokens(text: str) -> int:
    """Estimated tokens of a message that is text alone (a question, an answer)."""
    return tokens_of(len(text)) + OVERHEAD_TOKENS


def call_tokens(call: ToolCall) -> int:
    """Estimated tokens of one tool call as sent: its id, name and arguments as JSON."""
    return _measured(call)


def message_tokens(message: Message) -> int:
    """Estimated tokens of ``message`` as a vendor is sent it."""
    if isinstance(message, ToolMessage):
        return _measured(message)
    if isinstance(message, AssistantMessage):
        return text_tokens(message.content) + sum(_measured(c) for c in message.tool_calls)
    return text_tokens(message.content)


__all__ = ["ALIASES", "CAPABILITIES", "HeuristicRoutingStrategy", "Latency", "RouteModel", "RoutingDecision",
           "RoutingStrategy", "TaskSpec", "call_tokens", "canonical", "capabilities", "check_key", "complexity_of",
           "load_strategy", "message_tokens", "model_key", "task_of", "text_tokens", "tokens_of"]
