"""The models' refusals the front can give before a request's first Triton call, from the request and the export's
data alone (registry.Card: its widths and prompts; the rerank model's max_documents as Triton's config of it says),
so that a request that can never succeed gets its 4xx whether the server is busy or not: admission (admission.py)
refuses a request with 429 at its first Triton call, before any model could refuse it (issue 59).

Each rule is the models' own (model_library/request_rules.py, one copy, installed beside the models and this file),
applied here in the order the models apply them (the first failure is the answer): the tokenizer's (an empty or
invisible text, prompt_name, input_type), the BLS model's (dimensions), the rerank models' (documents per request,
weights). tests/test_busy_refusals.py checks the order and the fields against the models, busy and idle. A text's
field is the client's item as inference.step_error names a model's `text[i]` (param[i]); the rerank models' fields
are `query` and `documents[i]`.

What needs the tokens (a text over the max length with truncate false) stays the tokenizer's alone: the service asks
it (Service.measure) for a request the gate refused (busy.py). Plain Python: no Triton import."""
from model_library import (
    request_rules,  # the models' own rules (model_library/request_rules.py, installed beside this file)
)

from .errors import ClientError


def refuse(param):
    """request_rules' error class for a route's `param`: the proxy's ClientError, with the model's field."""
    return lambda field, problem, kind: ClientError(problem, kind, param, field)


# ---------------------------------------------------------------- per call of the service, in the models' order
def embed(card, items, param, parameters):
    """Service.embed's and Service.tokenize's texts: the BLS model's width, then the tokenizer's prompt and texts."""
    parameters = parameters or {}
    width(card, parameters.get("dimensions"))
    prompt(card, parameters)
    texts(items, param)


def width(card, dimensions):
    """The BLS model's `dimensions` (an export whose card lists no widths: the model's to say)."""
    if dimensions is not None and card.dimensions:
        request_rules.width(card.dimensions, dimensions, refuse("dimensions"))


def prompt(card, parameters):
    """The tokenizer's prompt_name and input_type."""
    name, kind = parameters.get("prompt_name"), parameters.get("input_type")
    if name is not None or kind is not None:
        request_rules.prompt(dict(card.prompts), None, name, kind,
                             lambda field, problem, kind: ClientError(problem, kind, field, field), card.routes)


def documents(count, max_documents):
    """The rerank models' documents per request (max_documents None: not known yet, the model's to say)."""
    request_rules.documents(count, float("inf") if max_documents is None else max_documents, refuse("documents"))


def rerank(card, query, items, scores, parameters, max_documents):
    """Service.rerank's: bge-m3's rerank model checks its weights and documents, then the tokenizer the prompt and
    each text (the query first); a cross-encoder's rerank model its documents, then the tokenizer each document and
    the query (its pairs' shared query, read after their texts)."""
    if card.kind == "cross-encoder":
        documents(len(items), max_documents)
        texts(items, "documents")
        request_rules.text(query, "query", refuse("query"))
        return
    request_rules.weights(scores, refuse("weights"))
    documents(len(items), max_documents)
    prompt(card, parameters or {})
    request_rules.text(query, "query", refuse("query"))
    texts(items, "documents")


def texts(items, param):
    """The tokenizer's rule on each text's content; fields param[i]."""
    texts_refuse = refuse(param)
    for i, value in enumerate(items):
        if not request_rules.starts_visible(value):  # the common case passes without a field's name written
            request_rules.text(value, f"{param}[{i}]", texts_refuse)


def predict(inputs, param):
    """Service.predict's inputs (a text, or a (first, second) pair): the tokenizer's rule on each text, the pair's
    second (its `text`) before its first (its `query`)."""
    texts_refuse = refuse(param)
    for i, item in enumerate(inputs):
        for value in reversed(item):
            request_rules.text(value, f"{param}[{i}]", texts_refuse)
