"""The OpenAPI document a client generator can use: FastAPI's, plus what it cannot infer.

- Errors: every failure is ``{"error": {"code", "message", "details"?}}`` (api/errors.py); each
  router lists the statuses it can answer with that body (``ERRORS``), 422 included (FastAPI's
  own ``HTTPValidationError`` is not what this API sends).
- Ingest: ``POST /v1/ingest/{kind}`` validates its items by ``kind`` in the domain (one pass,
  every bad item reported); the document names the kinds and each kind's item schema.
- Turn events: ``GET /v1/turns/{id}/events`` is Server-Sent Events; each event's ``data`` is a
  JSON object whose schema is listed under ``x-sse-events`` by event name, each also a component.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter

from kortex import events
from kortex.telemetry import ingest


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable, e.g. not_found, validation, turn_in_progress, rate_limited")
    message: str = Field(description="for a person; never a secret")
    details: Any = Field(None, description="what was wrong where (validation: field and reason), when known")


class ErrorBody(BaseModel):
    error: ErrorInfo


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


#: the failures every authenticated route can answer with
ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("no API key, or one that is unknown, revoked or of a disabled tenant"),
    403: _error("the key's role does not allow this"),
    404: _error("no such object for this tenant"),
    422: _error("the request is not valid: details name each field and reason"),
    429: _error("a rate, concurrency or budget limit; Retry-After says when to try again"),
    503: _error("a backing service is unavailable; retry shortly"),
}

EVENT_MODELS: dict[str, type[BaseModel]] = {
    "turn": events.TurnEvent, "text": events.TextEvent, "tool_call": events.ToolCallEvent,
    "tool_progress": events.ToolProgressEvent, "tool_result": events.ToolResultEvent,
    "proposal": events.ProposalEvent, "error": events.ErrorEvent, "route": events.RouteEvent,
    "anomaly": events.AnomalyEvent, "recovery": events.RecoveryEvent, "done": events.DoneEvent,
}


def _components(models: dict[str, type[BaseModel]], schemas: dict[str, Any]) -> dict[str, str]:
    """Add each model (and what it refers to) to ``schemas``; returns name -> $ref."""
    refs: dict[str, str] = {}
    for name, model in models.items():
        schema = TypeAdapter(model).json_schema(ref_template="#/components/schemas/{model}")
        for def_name, definition in schema.pop("$defs", {}).items():
            schemas.setdefault(def_name, definition)
        schemas.setdefault(model.__name__, schema)
        refs[name] = f"#/components/schemas/{model.__name__}"
    return refs


def build(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):  # this API never sends them
        schemas.pop(unused, None)

    items = _components({kind: spec[0] for kind, spec in ingest.KINDS.items()}, schemas)
    post = doc["paths"]["/v1/ingest/{kind}"]["post"]
    for param in post.get("parameters", []):
        if param["name"] == "kind":
            param["schema"] = {"type": "string", "enum": list(ingest.KINDS)}
            param["description"] = "what the items are; each kind has its item schema (see the request body)"
    post["requestBody"]["content"]["application/json"]["schema"] = {
        "type": "object", "additionalProperties": False, "required": ["items"],
        "properties": {"items": {
            "type": "array", "minItems": 1, "maxItems": ingest.MAX_ITEMS,
            "description": "items of the path's kind: " + ", ".join(f"{k} → {v.rsplit('/', 1)[1]}"
                                                                     for k, v in items.items()),
            "items": {"oneOf": [{"$ref": ref} for ref in items.values()]},
        }},
    }

    sse = _components(EVENT_MODELS, schemas)
    ok = doc["paths"]["/v1/turns/{turn_id}/events"]["get"]["responses"]["200"]
    ok["description"] = ("Server-Sent Events: `id` (resume with Last-Event-ID), `event` (the type) and `data` (a "
                         "JSON object: schema by event type in x-sse-events). Events carry `attempt` and `seq`; a "
                         "client drops events of an attempt older than the latest `turn` event's. Ends after `done`.")
    ok["content"] = {"text/event-stream": {"schema": {"type": "string"},
                                           "x-sse-events": {name: {"$ref": ref} for name, ref in sse.items()}}}
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for operations in doc["paths"].values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                if status[0] in "45" and not response.get("content"):  # a route's own 409, 410, ...
                    response["content"] = error_body
                    response.setdefault("description", "see error.code")
    app.openapi_schema = doc
    return doc


__all__ = ["ERRORS", "ErrorBody", "build"]
