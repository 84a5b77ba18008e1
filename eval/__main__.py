"""``./dev eval``: run every scenario under eval/scenarios/ (dev set, then held-out) through the
embedded Kortex and print one line each, a summary per part and the grounding figures.

    ./dev eval [--only NAME,...] [--model provider:model] [--verbose]

A scenario is a YAML file (eval/scenarios/<part>/<name>.yaml):

    question: Why is ledger failing writes?
    must_name: [disk, ledger-3]        # every one must appear in the answer's conclusion (case-insensitive)
    must_not_name: [deploy]            # no idea of these may appear anywhere in it (by word stems, or re:<regex>)
    telemetry:                         # loaded only through POST /v1/ingest/{kind}
      series:  [{product, metric, before, after, onset: -35m, span: 3h, every: 1m, unit?, host?}]
      logs:    [{product, level, message, from: -35m, to?: 0m, every: 20s, host?}]
      deploys, incidents, products, spans, llm-deployments, llm-users, llm-requests: items as the
               ingest API takes them, times written relative to now (-35m, -2h, -1d)

The conclusion is what the answer blames: its "Most likely cause" (or "Leading hypothesis")
sentence with how to confirm it, and any action it proposed; an answer without one concludes in
its summary. A quoted log line elsewhere names nothing: an answer that blames a deploy and quotes
"x509: certificate has expired" further down does not name the certificate. A forbidden idea is
matched by the stems of its words near each other, in any order, wherever the answer is not
quoting: "rollback" forbids "roll api-gateway back" and "rolling back" too.

The scenarios run in one embedded Kortex (a fresh home), each for a fresh tenant, so none sees
another's data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
PARTS = ("dev", "heldout")
_REL = re.compile(r"^-?(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(value: str) -> float:
    match = _REL.match(str(value).strip())
    if not match:
        raise ValueError(f"not a relative time such as -35m or 3h: {value!r}")
    return float(match.group(1)) * _UNIT[match.group(2)]


def _at(now: datetime, value: Any) -> str:
    """A relative time (-35m: 35 minutes ago) as the ISO timestamp ingest takes."""
    if isinstance(value, str) and _REL.match(value.strip()):
        return (now - timedelta(seconds=_seconds(value))).isoformat().replace("+00:00", "Z")
    return str(value)


_TIME_FIELDS = ("ts", "opened_at", "closed_at", "updated_at", "created_at", "start")


def expand(telemetry: dict[str, Any], now: datetime) -> dict[str, list[dict[str, Any]]]:
    """The scenario's telemetry as ingest batches by kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in telemetry.get("series", []):
        span, every = _seconds(s.get("span", "3h")), _seconds(s.get("every", "1m"))
        onset = _seconds(s["onset"]) if s.get("onset") is not None else None
        points = []
        t = span
        while t >= 0:
            after = onset is not None and t <= onset
            value = float(s["after"] if after else s["before"])  # YAML reads 1.0e9 as text
            jitter = s.get("jitter", 0.0)
            if jitter:
                value = value * (1 + jitter * ((int(t / every) % 5) - 2) / 2)
            item = {"product": s["product"], "metric": s["metric"], "value": value,
                    "ts": (now - timedelta(seconds=t)).isoformat().replace("+00:00", "Z")}
            if s.get("unit"):
                item["unit"] = s["unit"]
            if s.get("labels"):
                item["labels"] = s["labels"]
            points.append(item)
            t -= every
        out.setdefault("metrics", []).extend(points)
    for line in telemetry.get("logs", []):
        start, end, every = _seconds(line["from"]), _seconds(line.get("to", "0s")), _seconds(line.get("every", "1m"))
        t = start
        while t >= end:
            item = {"product": line["product"], "level": line["level"], "message": line["message"],
                    "ts": (now - timedelta(seconds=t)).isoformat().replace("+00:00", "Z")}
            if line.get("host"):
                item["host"] = line["host"]
            out.setdefault("logs", []).append(item)
            t -= every
    for kind, items in telemetry.items():
        if kind in ("series", "logs"):
            continue
        for item in items:
            out.setdefault(kind, []).append({k: _at(now, v) if k in _TIME_FIELDS else v for k, v in item.items()})
    return out


_CAUSE = re.compile(r"(?:Most likely cause|Leading hypothesis):[^\n]*?(?=\s*Runner-up:|\n|$)")
_PROPOSED = re.compile(r"^.*propose_action: proposed.*$", re.M)
_SUMMARY = re.compile(r"\*\*Summary\.\*\*[^\n]*")
_QUOTE = re.compile(r"\"[^\"\n]*\"")
# Words written as one that an answer writes apart too ("roll checkout back").
_COMPOUNDS = {"rollback": ("roll", "back"), "rollout": ("roll", "out"), "failover": ("fail", "over")}
_WORDS = re.compile(r"[a-z0-9]+")
_NEAR = 3  # other words a forbidden idea's words may have between them


def conclusion(answer: str) -> str:
    """What the answer blames (see the module's docstring)."""
    found = [m.group(0) for m in _CAUSE.finditer(answer)] + _PROPOSED.findall(answer)
    if found:
        return "\n".join(found)
    summary = _SUMMARY.search(answer)
    return _QUOTE.sub(" ", summary.group(0) if summary else answer)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[:-len(suffix)]
    return word


def _inflects(word: str, stem: str) -> bool:
    """"rolled", "rolling" and "rolls" are "roll"; "backlog" is not "back"."""
    return re.fullmatch(rf"{re.escape(stem)}(?:s|es|e?d|ing|ments?)?", word) is not None


def _split(text: str) -> list[str]:
    low = text.lower()
    for whole, parts in _COMPOUNDS.items():
        low = re.sub(rf"\b{whole}", " ".join(parts), low)
    return _WORDS.findall(low)


def _in_order(window: list[str], parts: tuple[str, ...]) -> bool:
    at = 0
    for part in parts:
        at = next((i + 1 for i in range(at, len(window)) if _inflects(window[i], part)), -1)
        if at < 0:
            return False
    return True


def mentions_idea(text: str, idea: str) -> bool:
    """Whether ``text``, outside its quotes, speaks of ``idea``: each of its words (inflected, and
    a compound's parts in order: "roll ... back") within a few words of the others, in any order;
    ``re:<pattern>`` is a regular expression instead."""
    text = _QUOTE.sub(" ", text)
    if idea.startswith("re:"):
        return re.search(idea[3:], text, re.I) is not None
    units = [tuple(_stem(p) for p in _COMPOUNDS.get(w, (w,))) for w in _WORDS.findall(idea.lower())]
    if not units:
        return False
    words = _split(text)
    size = sum(len(u) for u in units)
    span = size + _NEAR * (size - 1)
    firsts = {u[0] for u in units}
    for start, word in enumerate(words):
        if any(_inflects(word, f) for f in firsts) and all(_in_order(words[start:start + span], u) for u in units):
            return True
    return False


@dataclass
class Result:
    name: str
    part: str
    passed: bool
    missing: list[str] = field(default_factory=list)
    wrongly: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    uncited: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    answer: str = ""
    question: str = ""
    # The turn's tool_call and tool_result events as the client saw them: what every claim must trace to.
    calls: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Asked:
    """One question's turn as its event stream told it."""

    answer: str
    done: dict[str, Any]
    calls: list[dict[str, Any]]
    results: list[dict[str, Any]]


class Embedded:
    """One embedded Kortex (a fresh home, its API in process) that runs scenarios one after the
    other, each for a tenant of its own: telemetry, sessions and budgets are scoped by tenant, so
    none sees another's data, and the app starts and stops once for the whole set."""

    def __init__(self) -> None:
        from fastapi.testclient import TestClient

        from api.main import create_app
        from kortex.config import load_settings
        from kortex.container import Kortex
        from kortex.storage.migrate import upgrade

        self.settings = load_settings()
        upgrade(self.settings.effective_database_url)
        self.kortex = Kortex.create(self.settings)
        self.client = TestClient(create_app(self.settings))
        self.client.__enter__()

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.kortex.close()

    def tenant(self, name: str) -> tuple[str, str, str]:
        """A new tenant's id, chat key and ingest key."""
        from kortex.storage import tenants

        with self.kortex.db.begin() as conn:
            tenant = tenants.create_tenant(conn, f"{name}-{secrets.token_hex(3)}"[:60])
            chat = tenants.issue_api_key(conn, tenant.id, role="chat").key
            ingest = tenants.issue_api_key(conn, tenant.id, role="ingest").key
        return tenant.id, chat, ingest

    def ingest(self, key: str, batches: dict[str, list[dict[str, Any]]]) -> None:
        for kind, items in batches.items():
            for i in range(0, len(items), 5000):
                r = self.client.post(f"/v1/ingest/{kind}", json={"items": items[i:i + 5000]},
                                     headers={"Authorization": f"Bearer {key}"})
                if r.status_code != 200:
                    raise RuntimeError(f"ingest {kind}: {r.status_code} {r.text[:300]}")

    def ask(self, key: str, question: str, model: str, name: str = "eval") -> Asked:
        auth = {"Authorization": f"Bearer {key}"}
        sid = self.client.post("/v1/sessions", json={"name": name, "model": model}, headers=auth).json()["id"]
        posted = self.client.post(f"/v1/sessions/{sid}/messages", json={"content": question}, headers=auth)
        if posted.status_code != 202:
            raise RuntimeError(f"post: {posted.status_code} {posted.text[:300]}")
        events = _events(self.client.get(posted.json()["events_url"], headers=auth).text)
        return Asked(answer="".join(e.get("delta", "") for kind, e in events if kind == "text"),
                     done=next((e for kind, e in events if kind == "done"), {}),
                     calls=[e for kind, e in events if kind == "tool_call"],
                     results=[e for kind, e in events if kind == "tool_result"])

    def run(self, path: Path, part: str, model: str) -> Result:
        import yaml

        spec = yaml.safe_load(path.read_text())
        name = path.stem
        started = time.monotonic()
        try:
            _, chat_key, ingest_key = self.tenant(f"eval-{name}")
            self.ingest(ingest_key, expand(spec.get("telemetry") or {}, datetime.now(UTC).replace(microsecond=0)))
            asked = self.ask(chat_key, spec["question"], model, name)
        except Exception as exc:  # the scenario fails; the run goes on
            return Result(name, part, False, error=f"{exc.__class__.__name__}: {exc}"[:300],
                          seconds=time.monotonic() - started, question=spec["question"])
        done, concluded = asked.done, conclusion(asked.answer).lower()
        missing = [m for m in spec.get("must_name", []) if m.lower() not in concluded]
        wrongly = [m for m in spec.get("must_not_name", []) if mentions_idea(asked.answer, m)]
        grounding = done.get("grounding") or {}
        return Result(name, part, not missing and not wrongly and done.get("status") == "done", missing, wrongly,
                      list(grounding.get("dangling", [])), list(grounding.get("uncited_numbers", [])),
                      None if done.get("status") == "done" else f"turn {done.get('status')}: {done.get('error')}",
                      time.monotonic() - started, asked.answer, spec["question"], asked.calls, asked.results)


@contextmanager
def embedded() -> Iterator[Embedded]:
    """An embedded Kortex in a fresh home, with the environment it was started in restored after."""
    saved = dict(os.environ)
    home = tempfile.mkdtemp(prefix="kortex-eval-")
    for key in [k for k in os.environ if k.startswith("KORTEX_") and k != "KORTEX_LOG_LEVEL"]:
        os.environ.pop(key)
    os.environ["KORTEX_HOME"] = home
    os.environ["KORTEX_LLM__BUDGET__TURNS_PER_MINUTE"] = "100000"
    os.environ["KORTEX_LOG_LEVEL"] = "WARNING"
    kortex = None
    try:
        kortex = Embedded()
        yield kortex
    finally:
        if kortex is not None:
            kortex.close()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(home, ignore_errors=True)


def scenario_files(only: set[str] | None = None) -> list[tuple[Path, str]]:
    return [(path, part) for part in PARTS for path in sorted((SCENARIOS / part).glob("*.yaml"))
            if not only or path.stem in only]


def _events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out, kind, data = [], None, []
    for line in body.splitlines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and kind:
            out.append((kind, json.loads("\n".join(data))))
            kind, data = None, []
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="scenario names, comma-separated")
    parser.add_argument("--model", default="offline:analyst", help="provider:model (default: the offline analyst)")
    parser.add_argument("--verbose", action="store_true", help="print each answer")
    args = parser.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)  # the in-process worker's task lines are noise here
    only = {n.strip() for n in args.only.split(",")} if args.only else None
    results: list[Result] = []
    with embedded() as kortex:
        for path, part in scenario_files(only):
            r = kortex.run(path, part, args.model)
            results.append(r)
            why = "; ".join(filter(None, [
                f"missing {', '.join(r.missing)}" if r.missing else "",
                f"wrongly names {', '.join(r.wrongly)}" if r.wrongly else "",
                f"dangling {', '.join(r.dangling)}" if r.dangling else "",
                r.error or ""]))
            print(f"{'PASS' if r.passed else 'FAIL'}  {part:<7} {r.name:<34} {r.seconds:5.1f}s  {why}", flush=True)
            if args.verbose:
                print("      " + r.answer.replace("\n", "\n      "))
                if r.uncited:
                    print(f"      uncited numbers: {', '.join(r.uncited)}")
    if not results:
        print("no scenarios matched")
        return 1
    for part in PARTS:
        mine = [r for r in results if r.part == part]
        if mine:
            print(f"{part}: {sum(r.passed for r in mine)}/{len(mine)} pass")
    dangling = sum(len(r.dangling) for r in results)
    grounded = sum(1 for r in results if not r.dangling and not r.uncited and not r.error)
    print(f"grounding: {grounded}/{len(results)} pass, {dangling} dangling citations, "
          f"{sum(len(r.uncited) for r in results)} uncited numbers")
    return 0 if all(r.passed for r in results) and dangling == 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
