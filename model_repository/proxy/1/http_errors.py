"""HTTP errors in OpenAI's shape {"error": {"message", "type", "param", "code"}} (on TEI's routes in TEI's,
{"error", "error_type"}, with TEI's statuses), and the status of each of the service's error kinds (errors.py)."""
import re

import errors
import orjson
from starlette.responses import Response

ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
               408: "timeout_error", 429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}
STATUS = {errors.InvalidInput: 400, errors.OverLimit: 422, errors.NotFound: 404, errors.Conflict: 409,
          errors.LoadFailed: 422, errors.Overloaded: 429, errors.Unavailable: 503, errors.Timeout: 504}
# Hugging Face TEI's routes answer every error in TEI's shape (routes_tei.py), whatever the body: /rerank with
# Cohere's `documents` too (the path decides, never the body).
TEI_PATHS = frozenset({"/", "/embed", "/embed_all", "/embed_sparse", "/rerank", "/predict", "/similarity", "/tokenize",
                       "/decode", "/info"})
# TEI's error_type per status; TEI answers every validation error 422, a backend error 424, and (its documented
# status on every route) too many inputs in one request 413: every error code "too_many..." (too_many_inputs, the
# rerank model's too_many documents / sentences) is a 413 on TEI's paths.
TEI_ERROR_TYPES = {401: "Unauthorized", 403: "Unauthorized", 404: "NotFound", 405: "Validation", 408: "Validation",
                   413: "Validation", 415: "Validation", 422: "Validation", 429: "Overloaded", 503: "Unhealthy",
                   504: "Backend"}
MAX_MESSAGE_CHARS = 1000  # an error that quotes a client's value (a 1 MB model id) is cut: no 1 MB error back


class ApiError(Exception):
    """field: the item the message leads with (`input[3]`), as errors.ServiceError's."""

    def __init__(self, status, message, code=None, param=None, headers=None, field=None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers
        self.field = field

    @classmethod
    def of(cls, error):
        """The HTTP answer to a service error."""
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after else None
        return cls(STATUS.get(type(error), 500), error.message, error.code, error.param, headers, error.field)

    def response(self, dialect="openai"):
        message = self.message if len(self.message) <= MAX_MESSAGE_CHARS else \
            f"{self.message[:MAX_MESSAGE_CHARS]}... ({len(self.message)} characters, cut)"
        if dialect == "tei":  # TEI's two fields, then ours (code, param) for clients that read them
            status = 413 if (self.code or "").startswith("too_many") else 422 if self.status == 400 else \
                424 if self.status == 500 else self.status
            body = {"error": unicode(message), "error_type": TEI_ERROR_TYPES.get(status, "Backend"),
                    "code": self.code, "param": unicode(self.param)}
            return Response(orjson.dumps(body), status, self.headers, "application/json")
        kind = ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        body = {"error": {"message": unicode(message), "type": kind, "param": unicode(self.param), "code": self.code}}
        return Response(orjson.dumps(body), self.status, self.headers, "application/json")


def dialect(scope):
    """The error shape a request's answer takes: TEI's on TEI's paths (whatever the body), else OpenAI's."""
    return "tei" if scope.get("path") in TEI_PATHS else "openai"


def unicode(text):
    """`text` without lone surrogates (a client's, quoted back), which JSON output cannot carry."""
    return text.encode("utf-8", "replace").decode("utf-8") if isinstance(text, str) else text


# The parts of a pydantic error location that are its validators, not the client's fields: a union member's tag
# (`list[constrained-int]`, `function-after[...]`, `str`), a model's class name in a union (`TextItem`).
VALIDATOR_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none", "list", "dict", "tuple", "set"})
SOURCES = ("body", "query", "path", "header", "cookie")  # where FastAPI found the value: the location's first part


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
    """pydantic's errors in the API's codes: missing_input, invalid_type, invalid_value, invalid_json. The message
    names each field as the client wrote it (client_path), each problem once; param: the request field."""
    found = error.errors()
    first, parts = found[0], [client_parts(e) for e in found]
    param = next((part for part in parts[0] if isinstance(part, str)), None)
    detail = "; ".join(list(dict.fromkeys(f"{client_path(p)}: {e['msg']}" for p, e in zip(parts, found)))[:5])
    kind = first.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
                        "invalid_json")
    if kind == "missing":
        return ApiError(400, detail, f"missing_{param}" if param in ("input", "inputs", "query", "documents")
                        else "invalid_parameter", param)
    if kind in ("literal_error", "enum", "greater_than_equal", "less_than_equal", "too_short", "too_long"):
        return ApiError(400, detail, "invalid_value", param)
    return ApiError(400, detail, "invalid_type", param)
