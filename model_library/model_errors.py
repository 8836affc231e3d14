"""The error contract of the repository's models: how an error says its kind and its field, across BLS calls and to
the proxy, without anyone reading its prose.

Format: a model's error message is a sentence for people that leads with the field it is about, then a tag:

    documents[3] is empty [invalid_input documents[3]]
    dimensions 77 is not served; dimensions must be one of 1024, 512 [not_served dimensions]
    the request was cancelled [cancelled]

The tag is the message's last word group: `[kind field]`, or `[kind]` when no field is at fault. Fields name the
model's own inputs and parameters (`text[3]`, `query`, `documents[0]`, `spans[2]`, `dimensions`, `image[1]`) and
hold no spaces. Why a tag and not the Triton error code: in Triton 24.07 an error a BLS call returns arrives with
code INTERNAL whatever the callee said, and Triton's ensemble puts its own words before a step's message; a tag at the
end survives both. The caller (a BLS model, the proxy) reads it with parse() and maps the kind to its own answer: a
KServe error code (KINDS), an HTTP status (the proxy's http_front/errors.py).

Errors Triton itself raises (a full queue, an expired timeout, a model not loaded) carry no tag: parse() gives
them their kind from Triton's own wording, here and nowhere else.

Every kind is a member of ErrorKind, the one enum of error kinds: the models' (KINDS) and the HTTP front's own
(its table, proxy/1/http_front/errors.py). Code names a kind by its member, never as a string
(tests/test_proxy_errors.py checks); a kind read from text (a tag, an HTTP body) is compared as it is, since a
member equals its value.

Plain Python (no Triton import): the proxy and the tests import it as well as the models. build/export.py installs
it beside every Python model's model.py.
"""
from enum import Enum
from typing import NamedTuple


class ErrorKind(str, Enum):
    """Every error kind. A str whose value is the wire's word (a tag, an HTTP body's `code`, a metrics label), so a
    member and the text it travels as compare and hash alike. (Python 3.10: no StrEnum.)"""
    # the error contract's (KINDS): models, the proxy, bulk_embed
    INVALID_INPUT = "invalid_input"
    INVALID_VALUE = "invalid_value"
    TOO_LONG = "too_long"
    TOO_MANY = "too_many"
    NOT_SERVED = "not_served"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INTERNAL = "internal"
    # the HTTP front's own (its errors.KINDS): the request's form, the gate, the keys, the models, the admin routes
    INVALID_JSON = "invalid_json"
    INVALID_TYPE = "invalid_type"
    MISSING = "missing"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INVALID_API_KEY = "invalid_api_key"
    ADMIN_DISABLED = "admin_disabled"
    BODY_TIMEOUT = "body_timeout"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    SHUTTING_DOWN = "shutting_down"
    RESTARTING = "restarting"
    ANSWER_TOO_LARGE = "answer_too_large"
    IMAGE_TOO_LARGE = "image_too_large"
    IMAGE_URLS_OFF = "image_urls_off"
    IMAGE_FETCH_FAILED = "image_fetch_failed"
    MODEL_NOT_FOUND = "model_not_found"
    NO_MODEL_SERVED = "no_model_served"
    MODEL_NOT_READY = "model_not_ready"
    SERVER_EXITED = "server_exited"
    INFERENCE_TIMEOUT = "inference_timeout"
    TOO_MUCH_WORK = "too_much_work"
    INFERENCE_FAILED = "inference_failed"
    STARTING = "starting"
    MODEL_CONTROL_OFF = "model_control_off"
    LOAD_FAILED = "load_failed"
    UNLOAD_FAILED = "unload_failed"
    CLIENT_CLOSED = "client_closed"

    def __str__(self):  # the value, as f-strings and str() give it on every Python (3.12 changed a mixin's format)
        return self.value


# kind -> the KServe (Triton) error code a client gets for it
KINDS = {
    ErrorKind.INVALID_INPUT: "INVALID_ARG",  # an input tensor or one of its elements is wrong (text[3], spans[2])
    ErrorKind.INVALID_VALUE: "INVALID_ARG",  # a request parameter is wrong (prompt_name, chunk_tokens, weights)
    ErrorKind.TOO_LONG: "INVALID_ARG",       # a text or a request over a length limit
    ErrorKind.TOO_MANY: "INVALID_ARG",       # more items than a limit allows (documents over max_documents)
    ErrorKind.NOT_SERVED: "INVALID_ARG",     # asks for what this export does not have (a width, an output)
    ErrorKind.OVERLOADED: "UNAVAILABLE",     # a bounded queue is full: retry later
    ErrorKind.UNAVAILABLE: "UNAVAILABLE",    # a step is not loaded or the server is stopping
    ErrorKind.TIMEOUT: "UNAVAILABLE",        # the request's own timeout passed
    ErrorKind.CANCELLED: "CANCELLED",        # the client went away
    ErrorKind.INTERNAL: "INTERNAL",          # a fault of the server (a bug): nothing the client can change
}
CLIENT_KINDS = (ErrorKind.INVALID_INPUT, ErrorKind.INVALID_VALUE, ErrorKind.TOO_LONG, ErrorKind.TOO_MANY,
                ErrorKind.NOT_SERVED)
# Triton's own messages (tritonserver 2.48), lower-cased -> their kind; the first match wins
TRITON_WORDING = (("exceeds maximum queue size", ErrorKind.OVERLOADED), ("timeout expired", ErrorKind.TIMEOUT),
                  ("cancelled", ErrorKind.CANCELLED), ("unknown model", ErrorKind.UNAVAILABLE),
                  ("not ready", ErrorKind.UNAVAILABLE), ("unavailable", ErrorKind.UNAVAILABLE),
                  ("server is stopping", ErrorKind.UNAVAILABLE), ("not found", ErrorKind.UNAVAILABLE))


class ModelErrorInfo(NamedTuple):
    kind: ErrorKind
    field: str | None  # the field at fault, None when none is
    message: str       # for people: leads with the field (Triton's ensemble prefix removed), without the tag


def tagged(kind, field, problem):
    """The message of an error of `kind` about `field` (None: no field): `field problem [kind field]`."""
    if kind not in KINDS:
        raise ValueError(f"unknown error kind {kind!r}")
    if field is None:
        return f"{problem} [{kind}]"
    return f"{field} {problem} [{kind} {field}]"


def parse(message):
    """ModelErrorInfo of any error message: a tagged one's kind and field; an untagged one (Triton's own) gets its
    kind from TRITON_WORDING, else internal."""
    body, opened, tag = message.rstrip().rpartition(" [")
    kind, _, field = tag[:-1].partition(" ")
    if not opened or not tag.endswith("]") or kind not in KINDS:
        lowered = message.lower()
        kind = next((kind for words, kind in TRITON_WORDING if words in lowered), ErrorKind.INTERNAL)
        return ModelErrorInfo(kind, None, message)
    kind = ErrorKind(kind)  # the tag's text as its member
    if not field:
        return ModelErrorInfo(kind, None, body)
    start = body.find(field + " ")  # after the words Triton's ensemble puts before a step's message
    return ModelErrorInfo(kind, field, body[start:] if start >= 0 else f"{field} {body}")


def problem(info):
    """What a tagged message says about its field: the message without the field that leads it."""
    return info.message[len(info.field):].lstrip() if info.field else info.message


def split_field(field):
    """`documents[3]` -> ("documents", 3); `dimensions` -> ("dimensions", None)."""
    name, bracket, rest = field.partition("[")
    if bracket and rest.endswith("]") and rest[:-1].isdigit():
        return name, int(rest[:-1])
    return field, None
