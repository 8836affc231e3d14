"""What FastAPI, pydantic and Starlette raise, as the table's kinds (errors.py), and the app's exception handlers:
every error answered in the shape of the dialect its path speaks (dialects.shape)."""
import re

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from model_library.model_errors import ErrorKind

from . import dialects
from .errors import ApiError, response, status

# The parts of a pydantic error location that are its validators, not the client's fields: a union member's tag
# (`list[constrained-int]`, `function-after[...]`, `str`), a model's class name in a union (`TextItem`).
VALIDATOR_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none", "list", "dict", "tuple", "set"})
SOURCES = ("body", "query", "path", "header", "cookie")  # where FastAPI found the value: the location's first part
# pydantic's error types -> the table's kinds (json_invalid: invalid_json; missing: missing; others: invalid_type)
VALUE_ERRORS = ("literal_error", "enum", "greater_than_equal", "less_than_equal", "too_short", "too_long")
# Starlette's HTTPException (routing, FastAPI's body parsing) by its status -> the table's kinds
HTTP_EXCEPTIONS = {status(kind): kind for kind in
                   (ErrorKind.NOT_FOUND, ErrorKind.METHOD_NOT_ALLOWED, ErrorKind.INVALID_JSON)}


def validator_part(part):
    return isinstance(part, str) and (part in VALIDATOR_TAGS or bool(re.search(r"[\[\]\-,]", part)) or
                                      part[:1].isupper())


def client_parts(error):
    """The parts of an error's location that are the client's: without FastAPI's source (body, query...) and
    pydantic's validator parts. An unknown key (extra_forbidden) is the client's own: kept as sent."""
    loc = list(error.get("loc") or ())
    if loc[:1] and loc[0] in SOURCES:
        loc = loc[1:]
    return [part for k, part in enumerate(loc) if not validator_part(part) or
            (k == len(loc) - 1 and error.get("type") == "extra_forbidden")]


def client_path(parts):
    """The field as the client wrote it: `ids[0]`, `inputs.sentences[1]`, `input[2].image`, `body[0].query` (a
    list body), `body` (the whole body)."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return ("body" + path if path.startswith("[") else path) or "body"


def validation_error(error):
    """pydantic's errors as the table's kinds: invalid_json, missing, invalid_value, invalid_type. The message
    names each field as the client wrote it (client_path), each problem once; param: the request parameter; field:
    the first field named."""
    found = error.errors()
    first, parts = found[0], [client_parts(e) for e in found]
    param = next((part for part in parts[0] if isinstance(part, str)), None)
    detail = "; ".join(list(dict.fromkeys(f"{client_path(p)}: {e['msg']}" for p, e in zip(parts, found)))[:5])
    error_type = first.get("type", "")  # pydantic's
    if error_type == "json_invalid":
        return ApiError(f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
                        ErrorKind.INVALID_JSON)
    kind = ErrorKind.MISSING if error_type == "missing" else \
        ErrorKind.INVALID_VALUE if error_type in VALUE_ERRORS else ErrorKind.INVALID_TYPE
    return ApiError(detail, kind, param, client_path(parts[0]), leads=False)


def http_exception(error):
    return ApiError(str(error.detail), HTTP_EXCEPTIONS.get(error.status_code, ErrorKind.INTERNAL),
                    headers=getattr(error, "headers", None))


async def on_api_error(request, error):
    return response(error, dialects.shape(request.scope))


async def on_validation_error(request, error):
    return response(validation_error(error), dialects.shape(request.scope))


async def on_http_exception(request, error):
    return response(http_exception(error), dialects.shape(request.scope))


HANDLERS = ((ApiError, on_api_error), (RequestValidationError, on_validation_error),
            (HTTPException, on_http_exception))
