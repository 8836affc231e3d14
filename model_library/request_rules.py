"""The request rules that need no tokens, each written once: the models apply them (the tokenizer, the BLS model, the
rerank models) and the proxy applies them before admission (proxy/1/prechecks.py), so that a request that can never
succeed gets the same 4xx whether the server is busy or idle (issue 59).

Each rule takes the export's data it needs (prompts, widths, max_documents) and `refuse`, the caller's error class
called as refuse(field, problem, kind) (model_common.InvalidInput in a model; the proxy passes its own): a rule raises
what its caller raises, and the words, kind and field are the same through both doors.

Plain Python (no Triton import): build/export.py installs it beside every Python model's model.py and the proxy's."""
import json
import math
import unicodedata

from model_library.model_errors import ErrorKind

NO_CONTENT = "has no content (only whitespace, control or zero-width characters)"
# A text with a visible character is embedded even when every token it gives is special (a lone combining mark:
# BERT's normalizer strips it, and sentence-transformers and TEI embed [CLS][SEP]); only an invisible text is refused.
INVISIBLE = ("Cc", "Cf")  # control and format characters (NUL, zero-width space, BOM): no content, as whitespace
# input_type values that are not prompt names: the prompt names they stand for, first found wins
INPUT_TYPES = {"query": ("query",), "search_query": ("query",), "document": ("document", "passage"),
               "search_document": ("document", "passage"), "passage": ("passage", "document"),
               "classification": ("classification",), "clustering": ("clustering",)}
# A Router's tasks (inference-free SPLADE: sentence-transformers' encode_query / encode_document) the input types
# stand for, and the prompt each task takes when the request names no prompt (encode_query's, encode_document's)
TASKS = {"query": "query", "search_query": "query", "document": "document", "search_document": "document",
         "passage": "document"}
TASK_PROMPTS = {"query": ("query",), "document": ("document", "passage", "corpus")}
WEIGHTS = "must be 3 finite numbers >= 0: [dense, sparse, colbert]"


def starts_visible(value):
    """The common case, told at the first character: a text that starts with a visible character has content."""
    return value[:1] > " " and value[:1].isprintable()


def text(value, field, refuse):
    """A text has content: not empty, not whitespace, control and zero-width characters alone."""
    if starts_visible(value):
        return
    for char in value:
        if not char.isspace() and unicodedata.category(char) not in INVISIBLE:
            return
    if not value.strip():
        raise refuse(field, "is empty" + (" (whitespace only)" if value else ""), ErrorKind.INVALID_INPUT)
    raise refuse(field, NO_CONTENT, ErrorKind.INVALID_INPUT)


def prompt(prompts, default, name, kind, refuse, routes=()):
    """The prompt a request's prompt_name or input_type picks (one of them; `default` when neither is given):
    a prompt name the export has, or an input type (INPUT_TYPES) or prompt name for input_type. routes: a Router
    export's tasks (query, document), which prompt_name may also name (task())."""
    names = ", ".join(prompts) or "none"
    if name is not None and kind is not None:
        raise refuse("prompt_name", "and input_type: give one of them, not both", ErrorKind.INVALID_VALUE)
    if name is not None:
        if name not in prompts and name in routes:  # a Router's task with no prompt of its name: as encode_query
            return next((p for p in TASK_PROMPTS.get(name, ()) if p in prompts), default)
        if name not in prompts:
            raise refuse("prompt_name", f"{json.dumps(name)} is not one of this model's prompts ({names})",
                         ErrorKind.NOT_SERVED)
        return name
    if kind is not None:
        if kind in prompts:
            return kind
        if kind not in INPUT_TYPES:
            raise refuse("input_type", f"{json.dumps(kind)} is not one of {', '.join(INPUT_TYPES)} or this model's "
                                       f"prompts ({names})", ErrorKind.NOT_SERVED)
        return next((p for p in INPUT_TYPES[kind] if p in prompts), default)
    return default


def task(routes, name, kind):
    """A Router export's task for a request (the side that answers it: sentence-transformers' encode_query is
    "query", encode_document "document"): its prompt_name where that names a route, else what its input_type stands
    for (TASKS); None (the Router's default route, as SparseEncoder.encode) when neither says. routes: the export's
    tasks (none: no Router, always None)."""
    if not routes:
        return None
    if name is not None:
        return name if name in routes else None
    chosen = TASKS.get(kind) if kind is not None else None
    return chosen if chosen in routes else None


def width(dimensions, value, refuse):
    """The width a request's `dimensions` asks for (an int, or digits in a string), one of `dimensions` (the widths
    the export serves)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in dimensions:
        return value
    allowed = ", ".join(map(str, dimensions))
    detail = f"one of this model's Matryoshka widths: {allowed}" if len(dimensions) > 1 else \
        f"{allowed}: this model is not Matryoshka and gives only its full size"
    raise refuse("dimensions", f"{json.dumps(value)} is not served; dimensions must be {detail}", ErrorKind.NOT_SERVED)


def documents(count, max_documents, refuse):
    """A rerank request's documents: 1 to max_documents (the rerank model's parameter)."""
    if count == 0:
        raise refuse("documents", "is empty: send at least one document", ErrorKind.INVALID_INPUT)
    if count > max_documents:
        raise refuse("documents", f"holds {count} documents, over the limit of {max_documents} (rerank parameter "
                                  f"max_documents)", ErrorKind.TOO_MANY)


def weights(values, refuse):
    """bge-m3's rerank weights: 3 finite numbers >= 0 (dense, sparse, colbert)."""
    if len(values) != 3 or any(not math.isfinite(w) or w < 0 for w in values):
        raise refuse("weights", WEIGHTS, ErrorKind.INVALID_VALUE)


def truncate(parameters, refuse):
    """A request's `truncate` parameter: true (the default) cuts a text over the model's max length to it and says
    so (`truncated`); false refuses it (cut_refused). Given by every text model (the tokenizer decides; the BLS,
    rerank and late chunking models pass it on) and by the proxy's routes that take truncate false."""
    value = parameters.get("truncate", True)
    if not isinstance(value, bool):
        raise refuse("truncate", f"must be true or false, not {json.dumps(value)[:40]}", ErrorKind.INVALID_VALUE)
    return value


def cut_refused(field, max_length, refuse):
    """truncate false: the text (or pair) at `field` has more tokens than `max_length`: too_long, before the encoder
    runs. Returns the error for the caller to raise."""
    return refuse(field, f"is longer than the model's maximum of {max_length} tokens (truncate is false)",
                  ErrorKind.TOO_LONG)
