"""One error body for every route: ``{"error": {"code", "message", ...details}}``.

``RefoldError`` leaves carry a stable ``code`` (for alerting and clients); their HTTP status is
decided here, in one table, so routes raise domain errors and never build responses for them.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from refold.contracts.errors import RefoldError
from refold.contracts.store.credentials import redis_refused

__all__ = ["ApiError", "error_body", "install_error_handlers"]

logger = logging.getLogger(__name__)

_RETRY_S = 1  # Retry-After of a 503 for a store that did not answer
# Status of each error code; codes not listed are 500 (a defect, or a failure to look at).
_STATUS = {
    "EVENT_INVALID": 422,
    "EVENT_TYPE_UNKNOWN": 422,
    "EVENT_TOO_LARGE": 422,
    "SCHEMA_UNLOCKED": 422,
    "NO_LIVE_GENERATION": 404,
    "WINDOW_QUERY_INVALID": 422,
    "WINDOW_UNKNOWN": 404,
    "PROCESSOR_UNKNOWN": 404,
    "PUBLISH_FAILED": 503,
    "OFFSETS_UNAVAILABLE": 503,
    "CONSISTENCY_TOKEN_INVALID": 400,
    "REPLAY_PLAN_INVALID": 422,
    "REPLAY_ERROR": 409,
}


class ApiError(Exception):
    """An HTTP error with refold's body: raise it from a route.

    Args:
        status: HTTP status.
        code: Stable machine-readable code.
        message: What happened and, where it helps, what to do.
        headers: Extra response headers (``Retry-After``, ``WWW-Authenticate``).
        details: More fields of the error object (e.g. ``positions``, ``errors``).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.details = details


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The error object every route answers with."""
    return {"error": {"code": code, "message": message, **details}}


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)  # noqa: S101 - registered for ApiError only
    return JSONResponse(
        error_body(exc.code, exc.message, **exc.details), exc.status, headers=exc.headers
    )


async def _refold_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RefoldError)  # noqa: S101 - registered for RefoldError only
    status = _STATUS.get(exc.code, 500)
    if status == 500:
        logger.error("unhandled %s: %s", exc.code, exc, exc_info=exc)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(exc.code, str(exc)), status, headers=headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)  # noqa: S101 - registered for it only
    errors = [
        {
            "field": ".".join(str(part) for part in error.get("loc", ())),
            "message": str(error.get("msg", "")),
        }
        for error in exc.errors()
    ]
    text = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return JSONResponse(
        error_body("REQUEST_INVALID", f"invalid request: {text}", errors=errors), 422
    )


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)  # noqa: S101 - registered for it only
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
    return JSONResponse(error_body(code, str(exc.detail)), exc.status_code, headers=exc.headers)


async def _redis_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, redis.AuthenticationError):  # a setting to fix, not an outage to wait
        refused = redis_refused("the HTTP services", request.app.state.context.redis, exc)
        logger.error("%s", refused)
        return JSONResponse(error_body(refused.code, str(refused)), 500)
    logger.warning("Redis did not answer: %s", exc)
    msg = (
        f"Redis did not answer ({type(exc).__name__}: {exc}). Operator action: check that Redis "
        "is up and reachable (REFOLD_REDIS__URL)."
    )
    return JSONResponse(
        error_body("REDIS_UNAVAILABLE", msg), 503, headers={"Retry-After": str(_RETRY_S)}
    )


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.error("unexpected %s", type(exc).__name__, exc_info=exc)
    msg = (
        f"unexpected {type(exc).__name__}: a defect of refold's service (logged); please report it"
    )
    return JSONResponse(error_body("INTERNAL", msg), 500)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` with refold's error body."""
    app.add_exception_handler(redis.RedisError, _redis_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RefoldError, _refold_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
