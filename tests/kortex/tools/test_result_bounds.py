"""A tool result that cannot be stored or published ends its call at once with an error the
model can read: nested past ``MAX_RESULT_DEPTH`` (telemetry stored before ingest bounded its
depth, or a structure a tool built) it is ``result_too_large``; a value JSON cannot encode is
``internal``. Before, the tool task raised while storing it, the call stayed ``running`` and the
watchdog answered it with a timeout a minute later. get_traces never builds a tree too deep to
return: a long chain of spans continues in fragments (``too_deep``), every span once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kortex.config import Settings
from kortex.container import Kortex
from kortex.nesting import MAX_DEPTH, deeper_than
from kortex.storage import audit
from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from kortex.tools.builtin.get_traces import TREE_DEPTH
from kortex.tools.pipeline import MAX_RESULT_DEPTH
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec
from tests.conftest import Harness, make_settings


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


class OddInput(ToolInput):
    kind: str = "deep"
    depth: int = 300


ODD_VALUES: dict[str, Any] = {"object": object(), "datetime": datetime(2026, 1, 1), "bytes": b"\xff",
                              "nan": float("nan")}


def _odd(args: OddInput, ctx: ToolContext) -> dict[str, Any]:
    """A result as a tool might build it from rows it read."""
    if args.kind == "deep":
        return {"items": [_nested(args.depth)]}
    return {"items": [{"value": ODD_VALUES[args.kind]}]}


ODD = ToolSpec(name="debug_odd", description="Return an odd result (tests the result bounds).",
               input_model=OddInput, run=_odd, redact=("items",), list_field="items")


class OddHarness(Harness):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.k = Kortex.create(settings, extra_tools=[ODD])


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "scripts"
    folder.mkdir()
    return folder


@pytest.fixture
def h(tmp_path: Path, sqlite_url: str, scripts: Path) -> Iterator[Harness]:
    harness = OddHarness(make_settings(tmp_path, sqlite_url, testing={"scripts_dir": scripts}))
    yield harness
    harness.close()


def _script(scripts: Path, name: str, tool: str, arguments: dict[str, Any]) -> str:
    (scripts / f"{name}.json").write_text(json.dumps({"steps": [
        {"text": ["Looking."], "tool_calls": [{"id": "c1", "name": tool, "arguments": arguments}]},
        {"text": ["Done."]}]}))
    return f"scripted:{name}"


def _ask(h: Harness, tenant: str, model: str) -> tuple[Any, dict[str, Any], float]:
    """The finished turn, its one tool_result event as a client reads it, and the turn's seconds."""
    started = time.monotonic()
    turn = h.ask(tenant, "why?", model=model)
    took = time.monotonic() - started
    [result] = [json.loads(e.data) for e in h.events(turn.id) if e.type == "tool_result"]
    return turn, result, took


def _audited(h: Harness, tenant: str, turn_id: str) -> list[dict[str, Any]]:
    with h.k.db.connect() as conn:
        return [r["payload"] for r in audit.list_for_turn(conn, tenant, turn_id) if r["kind"] == "tool_call"]


def test_a_result_nested_300_deep_ends_its_call_with_result_too_large(h: Harness, scripts: Path) -> None:
    tenant = h.tenant("acme")
    turn, result, took = _ask(h, tenant, _script(scripts, "deep", "debug_odd", {"depth": 300}))
    assert turn.status == "done" and took < 5
    assert result["is_error"] and result["error_code"] == "result_too_large"
    assert result["content"]["code"] == "RESULT_TOO_LARGE"
    assert f"nests deeper than {MAX_RESULT_DEPTH} levels" in result["content"]["message"]
    # what the model reads next is that error, and the call has its audit row
    [stored] = [m for m in h.messages(tenant, turn.session_id) if m.role == "tool"]
    assert stored.is_error and stored.result == result["content"]
    assert [p["error_code"] for p in _audited(h, tenant, turn.id)] == ["result_too_large"]


def test_a_result_at_the_depth_bound_is_returned_whole(h: Harness) -> None:
    tenant = h.tenant("acme")
    # the result object, its list, then the value: MAX_RESULT_DEPTH levels in all
    result = h.call(tenant, "debug_odd", {"depth": MAX_RESULT_DEPTH - 2})
    assert not result.is_error and result.content["items"] == [_nested(MAX_RESULT_DEPTH - 2)]
    assert h.call(tenant, "debug_odd", {"depth": MAX_RESULT_DEPTH - 1}).error_code == "result_too_large"


@pytest.mark.parametrize("kind", list(ODD_VALUES))
def test_a_result_json_cannot_encode_ends_its_call_with_an_internal_error(h: Harness, scripts: Path,
                                                                       kind: str) -> None:
    tenant = h.tenant("acme")
    turn, result, took = _ask(h, tenant, _script(scripts, f"odd_{kind}", "debug_odd", {"kind": kind}))
    assert turn.status == "done" and took < 5
    assert result["is_error"] and result["error_code"] == "internal"
    assert "cannot be encoded as JSON" in result["content"]["message"]


def test_a_nul_or_a_lone_surrogate_a_source_sent_is_replaced_not_refused(h: Harness, scripts: Path) -> None:
    # PostgreSQL's jsonb holds neither: the whole result was refused there (and the call waited
    # for the watchdog); what a source sent is kept as the model's output is, with U+FFFD
    ODD_VALUES["nul"] = "a\x00b"
    ODD_VALUES["surrogate"] = "c\ud800d"
    try:
        tenant = h.tenant("acme")
        for kind, kept in (("nul", "a\ufffdb"), ("surrogate", "c\ufffdd")):
            turn, result, took = _ask(h, tenant, _script(scripts, f"odd_{kind}", "debug_odd", {"kind": kind}))
            assert turn.status == "done" and took < 5 and not result["is_error"], result
            assert result["content"]["items"] == [{"value": kept}]
    finally:
        del ODD_VALUES["nul"], ODD_VALUES["surrogate"]


# get_traces over a chain of spans, each the child of the one before


def _chain(h: Harness, tenant: str, n: int, tags: Any, *, validated: bool = True) -> list[str]:
    start = utcnow() - timedelta(minutes=10)
    items = [{"trace_id": "chain01", "span_id": f"s{i:04d}", "parent_span_id": f"s{i - 1:04d}" if i else None,
              "service": "api", "operation": f"op {i}", "start": (start + timedelta(milliseconds=i)).isoformat(),
              "duration_us": 1000, "status": "ok", "tags": tags} for i in range(n)]
    # validated: through ingest's checks, as the API stores spans; else as stored before those
    rows = ingest.validate_batch("spans", items, now=utcnow()) if validated else [
        {k: v for k, v in item.items() if k != "start"} | {
            "request_id": None, "error_message": None, "start_ts": datetime.fromisoformat(item["start"])}
        for item in items]
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "spans", rows)
    return [item["span_id"] for item in items]


def _trees(content: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """Each tree of a page with how many levels of spans it has."""
    trees = ([content["root"]] if content["root"] else []) + content["fragments"]
    out = []
    for tree in trees:
        levels, node = 1, tree
        while node["children"]:
            [node] = node["children"]
            levels += 1
        out.append((tree, levels))
    return out


def _spans_of(tree: dict[str, Any]) -> list[str]:
    ids, node = [tree["span_id"]], tree
    while node["children"]:
        [node] = node["children"]
        ids.append(node["span_id"])
    return ids


def test_get_traces_over_a_chain_of_200_spans_returns_every_span_in_trees_it_can_return(
        h: Harness, scripts: Path) -> None:
    tenant = h.tenant("acme")
    ids = _chain(h, tenant, 200, _nested(MAX_DEPTH))  # as deep as ingest allows

    turn, result, took = _ask(h, tenant, _script(scripts, "chain", "get_traces", {"request_id": "chain01"}))
    assert turn.status == "done" and took < 5
    assert not result["is_error"], result["content"]

    seen: list[str] = []
    cursor, pages = None, 0
    while True:
        page = h.call(tenant, "get_traces", {"request_id": "chain01", **({"cursor": cursor} if cursor else {})})
        assert not page.is_error, page.content
        content = page.content
        pages += 1
        assert not deeper_than(content, MAX_RESULT_DEPTH)
        for tree, levels in _trees(content):
            assert levels <= TREE_DEPTH
            spans = _spans_of(tree)
            if tree.get("too_deep"):  # cut for depth: under the span before it, on this page
                assert tree["parent_span_id"] == seen[-1] and seen[-1] not in spans
            seen += spans
        cursor = content.get("next_cursor")
        if not cursor:
            break
        assert pages < 10
    assert seen == ids  # every span once, in order
    assert pages == 2  # flattened, not paged more finely
    first = h.call(tenant, "get_traces", {"request_id": "chain01"}).content
    assert [levels for _, levels in _trees(first)] == [TREE_DEPTH, TREE_DEPTH, TREE_DEPTH, 100 - 3 * TREE_DEPTH]
    assert first["root"]["span_id"] == "s0000" and [f["too_deep"] for f in first["fragments"]] == [True] * 3


def test_get_traces_shows_tags_stored_deeper_than_ingest_allows_up_to_its_bound(
        h: Harness, scripts: Path) -> None:
    tenant = h.tenant("acme")
    _chain(h, tenant, 200, _nested(150), validated=False)

    turn, result, took = _ask(h, tenant, _script(scripts, "chain", "get_traces", {"request_id": "chain01"}))
    assert turn.status == "done" and took < 5
    assert not result["is_error"], result["content"]
    tags = result["content"]["root"]["tags"]
    assert not deeper_than(tags, MAX_DEPTH) and deeper_than(tags, MAX_DEPTH - 1)
    for _ in range(MAX_DEPTH - 1):
        tags = tags["a"]
    assert tags == {"a": f"…[nested deeper than {MAX_DEPTH} levels; not shown]"}


def test_a_deep_chain_paged_by_a_small_cap_still_returns_every_span_once(harness_factory: Any) -> None:
    h = harness_factory(tools={"result_cap_bytes": 16384})
    tenant = h.tenant("acme")
    ids = _chain(h, tenant, 150, {"sql": "SELECT " + "c, " * 10})
    seen: list[str] = []
    cursor, pages, cuts = None, 0, 0
    while True:
        page = h.call(tenant, "get_traces", {"request_id": "chain01", **({"cursor": cursor} if cursor else {})})
        assert not page.is_error, page.content
        assert len(json.dumps(page.content, separators=(",", ":"), ensure_ascii=False).encode()) <= 16384
        for tree, levels in _trees(page.content):
            assert levels <= TREE_DEPTH
            cuts += bool(tree.get("too_deep"))
            seen += _spans_of(tree)
        pages += 1
        cursor = page.content.get("next_cursor")
        if not cursor:
            break
        assert pages < 100
    assert seen == ids and pages >= 3 and cuts > 0
