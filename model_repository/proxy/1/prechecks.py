"""The models' refusals the front can give before a request's first Triton call, from the request and the export's
data alone (registry.Card: its widths and prompts; the rerank model's max_documents as Triton's config of it says),
so that a request that can never succeed gets its 4xx whether the server is busy or not: admission (admission.py)
refuses a request with 429 at its first Triton call, before any model could refuse it (issue 59).

Each rule is a model's, repeated here with the model's kind, field and words, in the order the model checks them (the
first failure is the answer): the tokenizer's (an empty or invisible text, prompt_name, input_type), the BLS model's
(dimensions), the rerank models' (documents per request, weights). tests/test_busy_refusals.py checks them against
the models' own code, tests/test_both_doors.py through both doors. A text's field is the client's item as
inference.step_error names a model's `text[i]` (param[i]); the rerank models' fields are `query` and `documents[i]`.

What needs the tokens (a text over the max length with truncate false) stays the tokenizer's alone: the routes ask
it (Service.measure) for a request the gate refused (route_helpers.cut_while_busy). Plain Python: no Triton import."""
import json
import math
import unicodedata

from errors import InvalidInput

# the tokenizer's input_type values that are not prompt names (tokenizer/1/model.py INPUT_TYPES), in its order
INPUT_TYPES = ("query", "search_query", "document", "search_document", "passage", "classification", "clustering")
INVISIBLE = ("Cc", "Cf")  # the tokenizer's: control and format characters (NUL, zero-width space, BOM)
NO_CONTENT = "has no content (only whitespace, control or zero-width characters)"


# ---------------------------------------------------------------- the rules, each once
def text(value, param, field):
    """The tokenizer's rule on one text's content: not empty or whitespace only, not only invisible characters.
    field: the text's field, or its index in `param` (param[i], written only for a refusal). (A text that starts
    with a printable character other than a space passes: the callers skip it, a call fewer per text.)"""
    for char in value:  # a text with content ends this at its first visible character
        if not char.isspace() and unicodedata.category(char) not in INVISIBLE:
            return
    if isinstance(field, int):
        field = f"{param}[{field}]"
    if not value.strip():
        raise InvalidInput("is empty" + (" (whitespace only)" if value else ""), "invalid_input", param, field)
    raise InvalidInput(NO_CONTENT, "invalid_input", param, field)


def prompt(card, parameters):
    """The tokenizer's rule on prompt_name and input_type (one of them; a prompt the export has, or an input type
    it knows)."""
    name, kind = parameters.get("prompt_name"), parameters.get("input_type")
    if name is None and kind is None:
        return
    prompts = dict(card.prompts)
    names = ", ".join(prompts) or "none"
    if name is not None and kind is not None:
        raise InvalidInput("and input_type: give one of them, not both", "invalid_value", "prompt_name",
                           "prompt_name")
    if name is not None and name not in prompts:
        raise InvalidInput(f"{json.dumps(name)} is not one of this model's prompts ({names})", "not_served",
                           "prompt_name", "prompt_name")
    if kind is not None and kind not in prompts and kind not in INPUT_TYPES:
        raise InvalidInput(f"{json.dumps(kind)} is not one of {', '.join(INPUT_TYPES)} or this model's prompts "
                           f"({names})", "not_served", "input_type", "input_type")


def width(card, dimensions):
    """The BLS model's rule on `dimensions`: one of the widths the export serves (vectors.json, export.json's
    `dimensions`). An export whose card lists none is left to the model."""
    if dimensions is None or not card.dimensions or dimensions in card.dimensions:
        return
    allowed = ", ".join(map(str, card.dimensions))
    detail = f"one of this model's Matryoshka widths: {allowed}" if len(card.dimensions) > 1 else \
        f"{allowed}: this model is not Matryoshka and gives only its full size"
    raise InvalidInput(f"{json.dumps(dimensions)} is not served; dimensions must be {detail}", "not_served",
                       "dimensions", "dimensions")


def documents(count, max_documents):
    """The rerank models' rule on the documents of a request: 1 to max_documents (None: not known yet, the model's
    to say)."""
    if count == 0:
        raise InvalidInput("is empty: send at least one document", "invalid_input", "documents", "documents")
    if max_documents is not None and count > max_documents:
        raise InvalidInput(f"holds {count} documents, over the limit of {max_documents} (rerank parameter "
                           f"max_documents)", "too_many", "documents", "documents")


def weights(values):
    """bge-m3's rerank model's rule on `weights`."""
    if len(values) != 3 or any(not math.isfinite(w) or w < 0 for w in values):
        raise InvalidInput("must be 3 finite numbers >= 0: [dense, sparse, colbert]", "invalid_value", "weights",
                           "weights")


# ---------------------------------------------------------------- per call of the service, in the models' order
def embed(card, texts, param, parameters):
    """Service.embed's and Service.tokenize's texts: the BLS model's width, then the tokenizer's prompt and texts."""
    parameters = parameters or {}
    width(card, parameters.get("dimensions"))
    prompt(card, parameters)
    for i, value in enumerate(texts):
        if not (value[:1] > " " and value[:1].isprintable()):
            text(value, param, i)


def rerank(card, query, items, scores, parameters, max_documents):
    """Service.rerank's: bge-m3's rerank model checks its weights and documents, then the tokenizer the prompt and
    each text (the query first); a cross-encoder's rerank model its documents, then the tokenizer each document and
    the query (its pairs' shared query, read after their texts)."""
    if card.kind == "cross-encoder":
        documents(len(items), max_documents)
        for i, value in enumerate(items):
            if not (value[:1] > " " and value[:1].isprintable()):
                text(value, "documents", i)
        text(query, "query", "query")
        return
    weights(scores)
    documents(len(items), max_documents)
    prompt(card, parameters or {})
    text(query, "query", "query")
    for i, value in enumerate(items):
        if not (value[:1] > " " and value[:1].isprintable()):
            text(value, "documents", i)


def predict(inputs, param):
    """Service.predict's inputs (a text, or a (first, second) pair): the tokenizer's rule on each text, the pair's
    second (its `text`) before its first (its `query`)."""
    for i, item in enumerate(inputs):
        for value in reversed(item):
            text(value, param, i)
