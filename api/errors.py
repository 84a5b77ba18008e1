"""Map the error tree to HTTP: one JSON shape, ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kortex import metrics
from kortex.errors import (
    AuthError,
    Conflict,
    Forbidden,
    InvalidInput,
    KortexError,
    NotFound,
    ProviderError,
    RateLimited,
    StorageError,
    StreamError,
)

log = logging.getLogger(__name__)

def _detail(error: Any) -> dict[str, str]:
    """One refused part of a request: ``field`` and ``message`` and nothing else, as every
    other 422 names them (``filter.product``, a header's or a query parameter's name), so a
    value refused here and the same value refused by the domain look alike to a client."""
    raw = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid" and len(raw) == 2 and raw[0] == "body" and isinstance(raw[1], int):
        # FastAPI puts the offset of malformed JSON where a field goes: not a field ("9"), the body
        reason = (error.get("ctx") or {}).get("error") or error.get("msg", "")
        return {"field": "body", "message": f"not valid JSON: {reason} at position {raw[1]}"}
    loc = [str(p) for p in raw]
    where = loc[1:] if len(loc) > 1 and loc[0] in ("body", "query", "path", "header", "cookie") else loc
    return {"field": ".".join(where) or "body", "message": str(error.get("msg", ""))}


#: why a JSON body could not be read at all, by what the decoder raised
_UNREADABLE: dict[type[BaseException], str] = {
    UnicodeDecodeError: "not valid JSON: the body is not UTF-8",
    RecursionError: "not valid JSON: nested too deeply",
}


STATUS: tuple[tuple[type[KortexError], int], ...] = (
    (NotFound, 404),
    (AuthError, 401),
    (Forbidden, 403),
    (RateLimited, 429),
    (Conflict, 409),
    (InvalidInput, 422),
    (ProviderError, 422),  # only raised before enqueueing: an unknown or unavailable model
    (StorageError, 503),
    (StreamError, 503),
)


def error_response(status: int, code: str, message: str, details: object = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, object] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(KortexError)
    async def _kortex(request: Request, exc: KortexError) -> JSONResponse:
        status = next((s for cls, s in STATUS if isinstance(exc, cls)), 500)
        if status >= 500:
            log.warning("%s %s failed: %s", request.method, request.url.path, exc.message)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status == 429:
            metrics.refused(str((exc.details or {}).get("limit") or exc.code) if isinstance(exc.details, dict)
                            else exc.code)
            wait = getattr(exc, "retry_after", None)
            # inf: waiting never helps (a session's spent tokens), so no Retry-After to obey
            headers = None if wait == math.inf else {
                "Retry-After": str(max(1, math.ceil(wait)) if wait is not None else 5)}
        message = exc.message if status < 500 else "a backing service is unavailable; retry shortly"
        return error_response(status, exc.code, message, exc.details if status < 500 else None, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [_detail(e) for e in exc.errors()[:20]]
        return error_response(422, "validation", "the request is not valid", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        unreadable = _UNREADABLE.get(type(cause)) if cause is not None and exc.status_code == 400 else None
        if unreadable is not None:
            # FastAPI's 400 "There was an error parsing the body" for what its JSON decoder
            # raised besides a syntax error: bad input like malformed JSON, so answered alike.
            return error_response(422, "validation", "the request is not valid",
                                  [{"field": "body", "message": unreadable}])
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal", "internal error")
