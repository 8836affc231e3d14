"""A request's body, read and validated in one place, for every route that takes one. The gate (guard.py) reads it
(`read`: the content type, max_body_bytes, body_timeout_s, a client that leaves while sending) before any routing;
the routes get it parsed and validated here (`json`, `validated`): direct.py for a route's body parameter, and the
routes that pick their schema from the body (TEI's / and /rerank) themselves. Every route with a body is direct
(direct.py refuses a router holding one it cannot take), so FastAPI's pipeline validates no body in the served app;
where it runs (the bench's and the tests' baseline, baseline.py), it parses with the same `loads`.
The errors: ApiError kinds from the gate, RequestValidationError with FastAPI's locations from the routes (answered
in the path's dialect by http_errors.py)."""
import asyncio
import json as stdlib_json
import time

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from model_library.model_errors import ErrorKind

from .errors import ApiError

NO_BODY = object()  # an empty body (a JSON null is None)


def is_json(content_type):
    """The one content type rule (bytes, as the header came): `application/json` or `application/*+json` (RFC
    6839's suffix), parameters aside. Why this one: it is what FastAPI reads as JSON, so every body the gate lets
    through is parsed as JSON by every route, whichever pipeline; and a browser's cross-site "simple" POST (no
    preflight: text/plain, form types) can send none of them. (The gate once let any `*/*+json` through, which the
    routes then read as bytes: a 400 invalid_type, now a 415.)"""
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def too_large(limit):
    return ApiError(f"request body is over the limit of {limit} bytes (setting max_body_bytes)",
                    ErrorKind.BODY_TOO_LARGE)


async def read(headers, receive, settings):
    """The body's bytes (headers: the scope's, as a dict), or the gate's refusal (ApiError) before a route sees it;
    ConnectionError: the client left while sending."""
    declared = headers.get(b"content-length", b"")
    limit = settings.max_body_bytes
    if declared.isdigit() and int(declared) > limit:  # refused before it is read: errors.KINDS closes the connection
        raise too_large(limit)
    # No body at all (Content-Length 0, or neither it nor chunked: `curl -X POST .../load`) needs no type.
    empty = declared == b"0" or (not declared and b"transfer-encoding" not in headers)
    if not empty and not is_json(headers.get(b"content-type", b"")):
        raise ApiError("send the body as JSON with 'Content-Type: application/json'",
                       ErrorKind.UNSUPPORTED_MEDIA_TYPE)
    chunks, size = [], 0
    deadline = time.monotonic() + settings.body_timeout_s
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise ApiError(f"request body not received within {settings.body_timeout_s:g} s (setting "
                           f"body_timeout_s)", ErrorKind.BODY_TIMEOUT) from None
        if message["type"] == "http.disconnect":
            raise ConnectionError
        size += len(message.get("body", b""))
        if size > limit:
            raise too_large(limit)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def loads(body):
    """JSON by orjson: fast, and deep nesting is a JSONDecodeError, not a RecursionError. An escaped lone surrogate
    ("\\ud800") is valid JSON that orjson refuses: parsed by the standard parser, so the route names the field that
    holds it (`input[3] is not valid Unicode`). A body not in UTF-8 stays refused."""
    try:
        return orjson.loads(body)
    except stdlib_json.JSONDecodeError as error:  # orjson's errors are JSONDecodeErrors
        if "surrogate" in error.msg:
            try:
                return stdlib_json.loads(body.decode("utf-8"))
            except ValueError:  # (UnicodeDecodeError included)
                pass
        raise


async def json(request):
    """The request's body parsed: NO_BODY when empty (the gate has checked its content type), else JSON; not JSON:
    RequestValidationError as FastAPI raises it (json_invalid at the error's position)."""
    body = await request.body()
    if not body:
        return NO_BODY
    try:
        return loads(body)
    except stdlib_json.JSONDecodeError as error:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", error.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": error.msg}}], body=error.doc) from None


def checked(adapter, value, where):
    """(`value` as `adapter`'s type, []) or (None, pydantic's errors located under `where`), as FastAPI validates a
    parameter: ("body",), ("query", name)."""
    try:
        return adapter.validate_python(value, from_attributes=True), []
    except ValidationError as error:
        return None, [{**e, "loc": (*where, *e["loc"])} for e in error.errors(include_url=False)]


def validated(body, adapter):
    """The parsed body as `adapter`'s type (a route's body parameter), or FastAPI's RequestValidationError."""
    if body is NO_BODY:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    value, errors = checked(adapter, body, ("body",))
    if errors:
        raise RequestValidationError(errors, body=body)
    return value
