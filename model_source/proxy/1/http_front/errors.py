"""Every error the HTTP front answers, as one table (KINDS, keyed by model_errors.ErrorKind, the one enum of kinds): a
kind's HTTP status, OpenAI's `type` (its `code` is the kind), TEI's status and `error_type`, and the headers it
carries; the error itself (ApiError) and the body each dialect writes (response). No HTTP status is written anywhere
else in the proxy.

A model's error arrives as a kind of the error contract (model_library/model_errors.py) and becomes one of these
through FROM_MODEL, once (inference.step_error). The field at fault stays data until the body is written: the
message is composed then (it leads with the field), and every dialect's body carries the field apart, so a client
(bulk_embed's HTTP door) reads the kind and the field, never the prose."""
from contextlib import contextmanager
from typing import NamedTuple

import orjson
from starlette.responses import Response

from model_library import model_errors, tracing
from model_library.model_errors import ErrorKind

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
    ErrorKind.INVALID_JSON: Kind(400, INVALID, 422, VALIDATION),
    ErrorKind.INVALID_TYPE: Kind(400, INVALID, 422, VALIDATION),
    ErrorKind.MISSING: Kind(400, INVALID, 422, VALIDATION),  # a required field (param) is absent
    ErrorKind.NOT_FOUND: Kind(404, INVALID, 404, "NotFound"),  # no such route
    ErrorKind.METHOD_NOT_ALLOWED: Kind(405, INVALID, 405, VALIDATION),
    # the HTTP gate (guard.py) and the keys (route_helpers.py)
    ErrorKind.INVALID_API_KEY: Kind(401, AUTH, 401, "Unauthorized", headers=(("WWW-Authenticate", "Bearer"),)),
    ErrorKind.ADMIN_DISABLED: Kind(403, "permission_error", 403, "Unauthorized", "admin"),
    ErrorKind.BODY_TIMEOUT: Kind(408, TIMEOUT, 408, VALIDATION, close=True),
    ErrorKind.BODY_TOO_LARGE: Kind(413, INVALID, 413, VALIDATION, close=True),
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: Kind(415, INVALID, 415, VALIDATION, close=True),
    ErrorKind.SHUTTING_DOWN: Kind(503, DOWN, 503, "Unhealthy", retry_after=1, close=True),
    ErrorKind.RESTARTING: Kind(503, DOWN, 503, "Unhealthy", retry_after=2, close=True),  # the supervisor restarts it
    # the request's content: the models' client kinds (model_errors.CLIENT_KINDS) and the proxy's own checks
    ErrorKind.INVALID_INPUT: Kind(400, INVALID, 422, VALIDATION, "api"),  # a text, an image, a document, a span
    ErrorKind.INVALID_VALUE: Kind(400, INVALID, 422, VALIDATION),  # a request parameter
    ErrorKind.NOT_SERVED: Kind(400, INVALID, 422, VALIDATION, "api"),  # the export lacks it: an output, a width, images
    ErrorKind.TOO_LONG: Kind(422, INVALID, 422, VALIDATION, "api"),  # a text over a limit: characters, bytes, tokens
    ErrorKind.TOO_MANY: Kind(422, INVALID, 413, VALIDATION, "api"),  # over a limit of items: inputs, documents, images
    ErrorKind.ANSWER_TOO_LARGE: Kind(413, INVALID, 413, VALIDATION, "api"),  # TEI's /embed_all: max_embed_all_numbers
    ErrorKind.IMAGE_TOO_LARGE: Kind(413, INVALID, 413, VALIDATION, "api"),  # an image's bytes (max_image_bytes)
    ErrorKind.IMAGE_URLS_OFF: Kind(400, INVALID, 422, VALIDATION, "api"),  # a URL, and image_url_hosts is empty
    ErrorKind.IMAGE_FETCH_FAILED: Kind(400, INVALID, 422, VALIDATION, "api"),  # the URL gave no image
    # the models
    ErrorKind.MODEL_NOT_FOUND: Kind(404, INVALID, 404, "NotFound"),
    ErrorKind.NO_MODEL_SERVED: Kind(503, DOWN, 503, "Unhealthy", "api"),  # no model named, and no default export
    ErrorKind.MODEL_NOT_READY: Kind(503, DOWN, 503, "Unhealthy", retry_after=1),  # loading, recovering, stopping
    ErrorKind.SERVER_EXITED: Kind(503, DOWN, 503, "Unhealthy", "api", retry_after=2),  # tritonserver is gone
    ErrorKind.OVERLOADED: Kind(429, BUSY, 429, "Overloaded", "api", retry_after=1),  # admission, a model's full queue
    ErrorKind.INFERENCE_TIMEOUT: Kind(504, TIMEOUT, 504, BACKEND, "api"),  # request_timeout_s passed
    # admission: more work than the server finishes within request_timeout_s at its measured rate (not retried as is)
    ErrorKind.TOO_MUCH_WORK: Kind(413, INVALID, 413, VALIDATION, "api"),
    ErrorKind.INFERENCE_FAILED: Kind(500, FAULT, 424, BACKEND, "api"),  # a model's internal error
    # the admin routes
    ErrorKind.STARTING: Kind(503, DOWN, 503, "Unhealthy", "admin", retry_after=2),  # tritonserver is still starting
    ErrorKind.MODEL_CONTROL_OFF: Kind(409, INVALID, 409, BACKEND, "admin"),
    ErrorKind.LOAD_FAILED: Kind(422, INVALID, 422, VALIDATION, "admin"),
    ErrorKind.UNLOAD_FAILED: Kind(500, FAULT, 424, BACKEND, "admin"),
    # no route's answer
    ErrorKind.INTERNAL: Kind(500, FAULT, 424, BACKEND, "none"),  # an exception nobody handled (direct.py)
    ErrorKind.CLIENT_CLOSED: Kind(499, INVALID, 499, VALIDATION, "none"),  # the client left first: counted (metrics.py)
}
# the error contract's kinds (model_errors.KINDS) -> the table's
FROM_MODEL = {**{kind: kind for kind in model_errors.CLIENT_KINDS}, ErrorKind.OVERLOADED: ErrorKind.OVERLOADED,
              ErrorKind.UNAVAILABLE: ErrorKind.MODEL_NOT_READY, ErrorKind.CANCELLED: ErrorKind.MODEL_NOT_READY,
              ErrorKind.TIMEOUT: ErrorKind.INFERENCE_TIMEOUT, ErrorKind.INTERNAL: ErrorKind.INFERENCE_FAILED}


def status(kind):
    return KINDS[kind].status


class ApiError(Exception):
    """One error the front answers: `kind` (KINDS: an ErrorKind, or its value), `problem` (for people: what is wrong
    with `field`, the message after it), `param` (the request parameter at fault), `field` (the item at fault as the
    client wrote it: `input[3]`, `inputs.sentences[1]`; None: the param), `retry_after` (seconds, else the kind's),
    `headers`.
    leads: the message leads with the field (`input[3] is empty`); false: `problem` is the whole message."""

    def __init__(self, problem, kind, param=None, field=None, retry_after=None, headers=None, leads=True):
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(problem)
        self.problem, self.kind, self.param, self.field, self.retry_after, self.headers, self.leads = \
            problem, ErrorKind(kind), param, field, retry_after, headers, leads

    @property
    def code(self):
        return self.kind

    @property
    def message(self):
        return f"{self.field} {self.problem}" if self.field and self.leads else self.problem

    def __str__(self):
        return self.message


class ClientError(ApiError):
    """The request's content is wrong: a model's client kind (model_errors.CLIENT_KINDS), or the proxy's own check
    (the service renames its field into the route's terms)."""


class NotFound(ApiError):
    """No such model, or not loaded."""


class Unavailable(ApiError):
    """A model is not ready (loading, recovering) or Triton is starting or stopping."""


class Timeout(ApiError):
    """The work did not finish within the request's deadline."""


class NotAdmitted(ApiError):
    """overloaded (busy now), or too_much_work (more than the server finishes within the request's deadline):
    admission (admission.py) refused the request at its first Triton call, so nothing of it ran and no model has seen
    it; what only a model could refuse in it is asked before this is answered (busy.py)."""


def rename_field(error, field):
    """The error restated about `field` (the client's name for the model's field): data only, the message is
    written from it."""
    error.field = field


@contextmanager
def client_indices(param, indices):
    """Errors about `param[i]` of a part of the inputs (the texts of a list mixing texts and images, the pairs of a
    list mixing texts and pairs) name the client's index instead: indices[i]."""
    try:
        yield
    except ApiError as error:
        name, i = model_errors.split_field(error.field or "")
        if name == param and i is not None and i < len(indices):
            rename_field(error, f"{param}[{indices[i]}]")
        raise


def response(error, shape):
    """The HTTP answer to `error` in a dialect's shape: "openai" {"error": {message, type, param, code, field}};
    "cohere" that with Cohere's own {"message"} beside it; "voyage" that with Voyage's own {"detail"} beside it
    (its client reads nothing else); "tei" TEI's {error, error_type} and ours (code, param, field), with TEI's
    status."""
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
    elif shape == "voyage":
        body = {"detail": message, **body}
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
