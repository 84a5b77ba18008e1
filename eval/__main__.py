"""``./dev eval``: run every scenario under eval/scenarios/ (dev set, then held-out) through the
embedded Kortex and print one line each, a summary per part and the grounding figures.

    ./dev eval [--only NAME,...] [--model provider:model] [--verbose]

A scenario is a YAML file (eval/scenarios/<part>/<name>.yaml):

    question: Why is ledger failing writes?
    must_name: [disk, ledger-3]        # every one must appear in the answer (case-insensitive)
    must_not_name: [deploy]            # none may
    telemetry:                         # loaded only through POST /v1/ingest/{kind}
      series:  [{product, metric, before, after, onset: -35m, span: 3h, every: 1m, unit?, host?}]
      logs:    [{product, level, message, from: -35m, to?: 0m, every: 20s, host?}]
      deploys, incidents, products, spans, llm-deployments, llm-users, llm-requests: items as the
               ingest API takes them, times written relative to now (-35m, -2h, -1d)

Each scenario gets a fresh tenant in a fresh embedded home, so none sees another's data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
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


def run_one(path: Path, part: str, model: str) -> Result:
    import yaml
    from fastapi.testclient import TestClient

    spec = yaml.safe_load(path.read_text())
    name = path.stem
    started = time.monotonic()
    home = tempfile.mkdtemp(prefix=f"kortex-eval-{name}-")
    for key in [k for k in os.environ if k.startswith("KORTEX_") and k != "KORTEX_LOG_LEVEL"]:
        os.environ.pop(key)
    os.environ["KORTEX_HOME"] = home
    os.environ["KORTEX_LLM__BUDGET__TURNS_PER_MINUTE"] = "100000"
    os.environ["KORTEX_LOG_LEVEL"] = "WARNING"
    from api.main import create_app
    from kortex.config import load_settings
    from kortex.container import Kortex
    from kortex.storage import tenants
    from kortex.storage.migrate import upgrade

    settings = load_settings()
    upgrade(settings.effective_database_url)
    k = Kortex.create(settings)
    with k.db.begin() as conn:
        tenant = tenants.create_tenant(conn, f"eval-{name}"[:60])
        chat_key = tenants.issue_api_key(conn, tenant.id, role="chat").key
        ingest_key = tenants.issue_api_key(conn, tenant.id, role="ingest").key
    k.close()
    now = datetime.now(UTC).replace(microsecond=0)
    try:
        with TestClient(create_app(settings)) as client:
            for kind, items in expand(spec.get("telemetry") or {}, now).items():
                for i in range(0, len(items), 5000):
                    r = client.post(f"/v1/ingest/{kind}", json={"items": items[i:i + 5000]},
                                    headers={"Authorization": f"Bearer {ingest_key}"})
                    if r.status_code != 200:
                        raise RuntimeError(f"ingest {kind}: {r.status_code} {r.text[:300]}")
            auth = {"Authorization": f"Bearer {chat_key}"}
            sid = client.post("/v1/sessions", json={"name": name, "model": model}, headers=auth).json()["id"]
            posted = client.post(f"/v1/sessions/{sid}/messages", json={"content": spec["question"]}, headers=auth)
            if posted.status_code != 202:
                raise RuntimeError(f"post: {posted.status_code} {posted.text[:300]}")
            body = client.get(posted.json()["events_url"], headers=auth).text
    except Exception as exc:  # the scenario fails; the run goes on
        return Result(name, part, False, error=f"{exc.__class__.__name__}: {exc}"[:300],
                      seconds=time.monotonic() - started)
    events = _events(body)
    answer = "".join(e.get("delta", "") for kind, e in events if kind == "text")
    done = next((e for kind, e in events if kind == "done"), {})
    low = answer.lower()
    missing = [m for m in spec.get("must_name", []) if m.lower() not in low]
    wrongly = [m for m in spec.get("must_not_name", []) if m.lower() in low]
    grounding = done.get("grounding") or {}
    return Result(name, part, not missing and not wrongly and done.get("status") == "done", missing, wrongly,
                  list(grounding.get("dangling", [])), list(grounding.get("uncited_numbers", [])),
                  None if done.get("status") == "done" else f"turn {done.get('status')}: {done.get('error')}",
                  time.monotonic() - started, answer)


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
    for part in PARTS:
        for path in sorted((SCENARIOS / part).glob("*.yaml")):
            if only and path.stem not in only:
                continue
            r = run_one(path, part, args.model)
            results.append(r)
            why = "; ".join(filter(None, [
                f"missing {', '.join(r.missing)}" if r.missing else "",
                f"wrongly names {', '.join(r.wrongly)}" if r.wrongly else "",
                f"dangling {', '.join(r.dangling)}" if r.dangling else "",
                r.error or ""]))
            print(f"{'PASS' if r.passed else 'FAIL'}  {part:<7} {r.name:<34} {r.seconds:5.1f}s  {why}", flush=True)
            if args.verbose:
                print("      " + r.answer.replace("\n", "\n      "))
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
