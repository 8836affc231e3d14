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
KServe error code (KINDS), an HTTP status (the proxy's app.py).

Errors Triton itself raises (a full queue, an expired timeout, a model not loaded) carry no tag: parse() gives
them their kind from Triton's own wording, here and nowhere else.

Plain Python (no Triton import): the proxy and the tests import it as well as the models. build/export.py installs
it beside every Python model's model.py.
"""
from typing import NamedTuple

# kind -> the KServe (Triton) error code a client gets for it
KINDS = {
    "invalid_input": "INVALID_ARG",  # an input tensor or one of its elements is wrong (text[3], spans[2], image[0])
    "invalid_value": "INVALID_ARG",  # a request parameter is wrong (prompt_name, chunk_tokens, weights)
    "too_long": "INVALID_ARG",       # a text or a request over a length limit
    "too_many": "INVALID_ARG",       # more items than a limit allows (documents over max_documents)
    "not_served": "INVALID_ARG",     # asks for what this export does not have (a width, an output)
    "overloaded": "UNAVAILABLE",     # a bounded queue is full: retry later
    "unavailable": "UNAVAILABLE",    # a step is not loaded or the server is stopping
    "timeout": "UNAVAILABLE",        # the request's own timeout passed
    "cancelled": "CANCELLED",        # the client went away
    "internal": "INTERNAL",          # a fault of the server (a bug): nothing the client can change
}
CLIENT_KINDS = ("invalid_input", "invalid_value", "too_long", "too_many", "not_served")
# Triton's own messages (tritonserver 2.48), lower-cased -> their kind; the first match wins
TRITON_WORDING = (("exceeds maximum queue size", "overloaded"), ("timeout expired", "timeout"),
                  ("cancelled", "cancelled"), ("unknown model", "unavailable"), ("not ready", "unavailable"),
                  ("unavailable", "unavailable"), ("server is stopping", "unavailable"), ("not found", "unavailable"))


class ModelErrorInfo(NamedTuple):
    kind: str
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
        kind = next((kind for words, kind in TRITON_WORDING if words in lowered), "internal")
        return ModelErrorInfo(kind, None, message)
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
