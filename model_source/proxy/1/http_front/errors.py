"""Every error the HTTP front answers, as one table (KINDS): a kind's HTTP status, OpenAI's `type` (its `code` is the
kind), TEI's status and `error_type`, and the headers it carries; the error itself (ApiError) and the body each
dialect writes (response). No HTTP status is written anywhere else in the proxy.

A model's error arrives as a kind of the error contract (model_library/model_errors.py) and becomes one of these
through FROM_MODEL, once (inference.step_error). The field at fault stays data until the body is written: the
message is composed then (it leads with the field), and every dialect's body carries the field apart, so a client
(bulk_embed's HTTP door) reads the kind and the field, never the prose."""
from typing import NamedTuple

import orjson
import tracing
from starlette.responses import Response

MAX_MESSAGE_CHARS = 1000  # an error that quotes a client's value (a 1 MB model id) is cut: no 1 MB error back
INVALID, AUTH, TIMEOUT, BUSY, DOWN, FAULT = ("invalid_request_error", "authentication_error", "timeout_error",
                                             "rate_limit_error", "service_unavailable", "server_error")
VALIDATION, BACKEND = "Validation", "Backend"  # TEI's error types (and NotFound, Unauthorized, Overloaded, Unhealthy)


class Kind(NamedTuple):
    status: int  # HTTP status: OpenAI's, the seed API's and Cohere's routes
    type: str  # OpenAI's `type`
    tei_status: int  # on TEI's routes: TEI answers a validation error 422, too many inputs 413, a backend error 424
    tei_type: str  # TEI's `error_type`
    routes: str = "all"  # the routes that answer it (the OpenAPI document): all, api (inference), admin
    retry_after: int | None = None  # Retry-After (seconds) unless the error gives its own
    close: bool = False  # Connection: close (refused before the body was read, or the server is going)
    headers: tuple = ()  # more headers: ((name, value), ...)


KINDS = {
    # the request's form: FastAPI, pydantic, Starlette (http_errors.py)
    "invalid_json": Kind(400, INVALID, 422, VALIDATION),
    "invalid_type": Kind(400, INVALID, 422, VALIDATION),
    "missing": Kind(400, INVALID, 422, VALIDATION),  # a required field (param) is absent
    "not_found": Kind(404, INVALID, 404, "NotFound"),  # no such route
    "method_not_allowed": Kind(405, INVALID, 405, VALIDATION),
    # the HTTP gate (guard.py) and the keys (route_helpers.py)
    "invalid_api_key": Kind(401, AUTH, 401, "Unauthorized", headers=(("WWW-Authenticate", "Bearer"),)),
    "admin_disabled": Kind(403, "permission_error", 403, "Unauthorized", "admin"),
    "body_timeout": Kind(408, TIMEOUT, 408, VALIDATION, close=True),
    "body_too_large": Kind(413, INVALID, 413, VALIDATION, close=True),
    "unsupported_media_type": Kind(415, INVALID, 415, VALIDATION, close=True),
    "shutting_down": Kind(503, DOWN, 503, "Unhealthy", retry_after=1, close=True),
    "restarting": Kind(503, DOWN, 503, "Unhealthy", retry_after=2, close=True),  # the supervisor restarts the server
    # the request's content: the models' client kinds (model_errors.CLIENT_KINDS) and the proxy's own checks
    "invalid_input": Kind(400, INVALID, 422, VALIDATION, "api"),  # a text, an image, a document, a span
    "invalid_value": Kind(400, INVALID, 422, VALIDATION),  # a request parameter
    "not_served": Kind(400, INVALID, 422, VALIDATION, "api"),  # what the export lacks: an output, a width, images
    "too_long": Kind(422, INVALID, 422, VALIDATION, "api"),  # a text over a limit: characters, bytes, tokens
    "too_many": Kind(422, INVALID, 413, VALIDATION, "api"),  # more items than a limit: inputs, documents, images
    "answer_too_large": Kind(413, INVALID, 413, VALIDATION, "api"),  # TEI's /embed_all: max_embed_all_numbers
    "image_too_large": Kind(413, INVALID, 413, VALIDATION, "api"),  # an image's bytes (max_image_bytes)
    "image_urls_off": Kind(400, INVALID, 422, VALIDATION, "api"),  # a URL, and image_url_hosts is empty
    "image_fetch_failed": Kind(400, INVALID, 422, VALIDATION, "api"),  # the URL gave no image
    # the models
    "model_not_found": Kind(404, INVALID, 404, "NotFound"),
    "no_model_served": Kind(503, DOWN, 503, "Unhealthy", "api"),  # no model named, and no default export
    "model_not_ready": Kind(503, DOWN, 503, "Unhealthy", retry_after=1),  # loading, recovering, stopping
    "server_exited": Kind(503, DOWN, 503, "Unhealthy", "api", retry_after=2),  # tritonserver is gone
    "overloaded": Kind(429, BUSY, 429, "Overloaded", "api", retry_after=1),  # admission, or a model's full queue
    "inference_timeout": Kind(504, TIMEOUT, 504, BACKEND, "api"),  # request_timeout_s passed
    "inference_failed": Kind(500, FAULT, 424, BACKEND, "api"),  # a model's internal error
    # the admin routes
    "starting": Kind(503, DOWN, 503, "Unhealthy", "admin", retry_after=2),  # tritonserver is still starting
    "model_control_off": Kind(409, INVALID, 409, BACKEND, "admin"),
    "load_failed": Kind(422, INVALID, 422, VALIDATION, "admin"),
    "unload_failed": Kind(500, FAULT, 424, BACKEND, "admin"),
    # no route's answer
    "internal": Kind(500, FAULT, 424, BACKEND, "none"),  # an exception nobody handled (direct.py)
    "client_closed": Kind(499, INVALID, 499, VALIDATION, "none"),  # the client left first: counted (metrics.py)
}
# the error contract's kinds (model_errors.KINDS) -> the table's
FROM_MODEL = {"invalid_input": "invalid_input", "invalid_value": "invalid_value", "too_long": "too_long",
              "too_many": "too_many", "not_served": "not_served", "overloaded": "overloaded",
              "unavailable": "model_not_ready", "cancelled": "model_not_ready", "timeout": "inference_timeout",
              "internal": "inference_failed"}


def status(kind):
    return KINDS[kind].status


class ApiError(Exception):
    """One error the front answers: `kind` (KINDS), `problem` (for people: what is wrong with `field`, the message
    after it), `param` (the request parameter at fault), `field` (the item at fault as the client wrote it:
    `input[3]`, `inputs.sentences[1]`; None: the param), `retry_after` (seconds, else the kind's), `headers`.
    leads: the message leads with the field (`input[3] is empty`); false: `problem` is the whole message."""

    def __init__(self, problem, kind, param=None, field=None, retry_after=None, headers=None, leads=True):
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(problem)
        self.problem, self.kind, self.param, self.field, self.retry_after, self.headers, self.leads = \
            problem, kind, param, field, retry_after, headers, leads

    @property
    def code(self):
        return self.kind

    @property
    def message(self):
        return f"{self.field} {self.problem}" if self.field and self.leads else self.problem

    def __str__(self):
        return self.message


class InvalidInput(ApiError):
    """The request's content is wrong: a model's client kind, or the proxy's own check (the service renames its
    field into the route's terms)."""


class NotFound(ApiError):
    """No such model, or not loaded."""


class Unavailable(ApiError):
    """A model is not ready (loading, recovering) or Triton is starting or stopping."""


class Timeout(ApiError):
    """The work did not finish within the request's deadline."""


class NotAdmitted(ApiError):
    """overloaded: admission (admission.py) refused the request at its first Triton call, so nothing of it ran and no
    model has seen it; what only a model could refuse in it is asked before this is answered
    (route_helpers.cut_while_busy)."""


def rename_field(error, field):
    """The error restated about `field` (the client's name for the model's field): data only, the message is
    written from it."""
    error.field = field


def response(error, shape):
    """The HTTP answer to `error` in a dialect's shape: "openai" {"error": {message, type, param, code, field}};
    "cohere" that with Cohere's own {"message"} beside it; "tei" TEI's {error, error_type} and ours (code, param,
    field), with TEI's status."""
    if tracing.ENABLED:  # the kind on the request's span (model_library/tracing.py)
        tracing.error_kind(error.kind)
    kind = KINDS[error.kind]
    message = error.message if len(error.message) <= MAX_MESSAGE_CHARS else \
        f"{error.message[:MAX_MESSAGE_CHARS]}... ({len(error.message)} characters, cut)"
    message, param, field = unicode(message), unicode(error.param), unicode(error.field or error.param)
    retry_after = kind.retry_after if error.retry_after is None else error.retry_after
    headers = {**({"Retry-After": str(retry_after)} if retry_after else {}),
               **({"Connection": "close"} if kind.close else {}), **dict(kind.headers), **(error.headers or {})}
    if shape == "tei":
        body = {"error": message, "error_type": kind.tei_type, "code": error.kind, "param": param, "field": field}
        return Response(orjson.dumps(body), kind.tei_status, headers or None, "application/json")
    body = {"error": {"message": message, "type": kind.type, "param": param, "code": error.kind, "field": field}}
    if shape == "cohere":
        body = {"message": message, **body}
    return Response(orjson.dumps(body), kind.status, headers or None, "application/json")


def documented(shape, schema, routes):
    """OpenAPI's `responses` of routes answering the kinds of `routes` ("api", "admin") and every route's: each
    status the shape answers with, in `schema`."""
    statuses = sorted({kind.tei_status if shape == "tei" else kind.status for kind in KINDS.values()
                       if kind.routes in ("all", routes)})
    return {code: {"model": schema} for code in statuses}


def unicode(text):
    """`text` without lone surrogates (a client's, quoted back), which JSON output cannot carry."""
    return text.encode("utf-8", "replace").decode("utf-8") if isinstance(text, str) else text
