"""HTTP errors in OpenAI's shape {"error": {"message", "type", "param", "code"}} (on TEI's routes in TEI's,
{"error", "error_type"}, with TEI's statuses), and the status of each of the service's error kinds (errors.py)."""
import errors
import orjson
from starlette.responses import Response

ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
               408: "timeout_error", 429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}
STATUS = {errors.InvalidInput: 400, errors.OverLimit: 422, errors.NotFound: 404, errors.Conflict: 409,
          errors.LoadFailed: 422, errors.Overloaded: 429, errors.Unavailable: 503, errors.Timeout: 504}
# Hugging Face TEI's routes answer errors in TEI's shape (routes_tei.py); a route may set its request's
# scope["state"]["dialect"] (/rerank speaks Cohere's shape too).
TEI_PATHS = frozenset({"/", "/embed", "/embed_all", "/embed_sparse", "/rerank", "/predict", "/similarity", "/tokenize",
                       "/decode", "/info"})
# TEI's error_type per status; TEI answers every validation error 422, an over-large batch 413, a backend error 424.
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
            status = 413 if self.code == "too_many_inputs" else 422 if self.status == 400 else \
                424 if self.status == 500 else self.status
            body = {"error": unicode(message), "error_type": TEI_ERROR_TYPES.get(status, "Backend"),
                    "code": self.code, "param": unicode(self.param)}
            return Response(orjson.dumps(body), status, self.headers, "application/json")
        kind = ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        body = {"error": {"message": unicode(message), "type": kind, "param": unicode(self.param), "code": self.code}}
        return Response(orjson.dumps(body), self.status, self.headers, "application/json")


def dialect(scope):
    """The error shape a request's answer takes: the route's choice, else TEI's on TEI's paths, else OpenAI's."""
    return (scope.get("state") or {}).get("dialect") or ("tei" if scope.get("path") in TEI_PATHS else "openai")


def unicode(text):
    """`text` without lone surrogates (a client's, quoted back), which JSON output cannot carry."""
    return text.encode("utf-8", "replace").decode("utf-8") if isinstance(text, str) else text


def validation_error(error):
    """pydantic's errors in the API's codes: missing_input, invalid_type, invalid_value, invalid_json."""
    first = error.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = location[0] if location else None
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                       for e in error.errors()[:5])
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
