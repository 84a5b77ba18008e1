"""The fake LLM's scripts the benchmark serves, by model name (sessions ask for
``anthropic:<name>``; the asyncio floor sends ``<name>`` to the same server).

- ``bench-paced``: a real model's pace (300 ms to first token, 60 tokens/s in pieces of 4,
  200 tokens per step), two steps with one tool call between them: about 7.2 s of model time
  per turn alone, plus the tool and the hops.
- ``bench-zero``: the same shape at zero latency (12 text pieces, a tool call, 120 pieces).
- ``bench-trivial``: three text pieces, no tool: the smallest turn there is.
"""

from __future__ import annotations

from typing import Any

PACE = {"first_token_ms": 300, "tokens_per_s": 60, "piece_tokens": 4}
TOKENS_PER_STEP = 200
TOOL_CALL = {"name": "get_recent_deploys", "arguments": {"product": "checkout", "time_range": "last 6h"}}
QUESTION = "Why is checkout slow?"


def _pieces(n: int, tag: str) -> list[str]:
    # Four short words per piece: roughly four tokens, as a model's streamed deltas go.
    return [f"{tag}{i:03d}a {tag}{i:03d}b {tag}{i:03d}c {tag}{i:03d}d " for i in range(n)]


def paced() -> dict[str, Any]:
    pieces = TOKENS_PER_STEP // PACE["piece_tokens"]
    return {"steps": [
        {"text": _pieces(pieces, "s"), "tool_calls": [{**TOOL_CALL, "id": "toolu_bench_1"}], **PACE},
        {"text": _pieces(pieces, "t"), **PACE},
    ]}


def zero() -> dict[str, Any]:
    return {"steps": [
        {"text": _pieces(12, "s"), "tool_calls": [{**TOOL_CALL, "id": "toolu_bench_1"}]},
        {"text": _pieces(120, "t")},
    ]}


def trivial() -> dict[str, Any]:
    return {"steps": [{"text": ["Nothing ", "looks ", "wrong."]}]}


def all_scripts() -> dict[str, dict[str, Any]]:
    from bench import batch

    return {"bench-paced": paced(), "bench-zero": zero(), "bench-trivial": trivial(),
            "bench-postmortem": batch.script()}


def model_time_s(script: dict[str, Any]) -> float:
    """The model's own time for a turn of ``script`` (the floor of any engine's time)."""
    total = 0.0
    for step in script["steps"]:
        gap = step.get("piece_tokens", 1) / step["tokens_per_s"] if step.get("tokens_per_s") else 0.0
        total += step.get("first_token_ms", 0) / 1000 + max(0, len(step["text"]) - 1) * gap
    return total
