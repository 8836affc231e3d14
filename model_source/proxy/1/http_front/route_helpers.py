"""What every dialect's routes share (openai/, seed/, cohere/, tei/, voyage/, admin/: each folder's routes.py): the
key gates, the model lookup, HTTP's own rules on a request's inputs (each written once, naming the field in the
dialect's own words), the embed and rerank calls with their metrics, and the answer's pieces. A request the gate
refuses is the service's business (busy.py), never a route's. No Triton import here."""
import base64
import hmac
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import orjson
from fastapi import Depends, Request
from starlette.responses import Response

from model_library import model_errors, model_outputs
from model_library.model_errors import ErrorKind

from . import errors, schemas
from .errors import ApiError, rename_field
from .inference import RerankScores
from .registry import Card


def json_response(content, headers=None):
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), 200, headers, "application/json")


def error_responses(shape, schema=schemas.ErrorResponse, routes="api"):
    """OpenAPI's error answers of a dialect's routes: each status of the error table (errors.KINDS) its shape
    answers, in its error body's `schema` (OpenAI's, unless the dialect has its own)."""
    return errors.documented(shape, schema, routes)


# ---------------------------------------------------------------- gates (route dependencies: checked before the body
# is validated, so a caller without the key learns nothing about the request schema)
def authorize(request, key, what="API"):
    """`Authorization: Bearer <key>`; the scheme is case-insensitive (RFC 9110)."""
    if not key:
        return
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(f"missing or wrong {what} key: send 'Authorization: Bearer <key>'", ErrorKind.INVALID_API_KEY)


# async: FastAPI runs a plain `def` dependency in a worker thread, a thread round trip on every request (~0.3 ms).
async def user_key(request: Request):
    authorize(request, request.app.state.settings.api_key)


async def admin_key(request: Request):
    if not request.app.state.settings.admin_api_key:
        raise ApiError("the admin routes are off: set ADMIN_API_KEY (or ADMIN_API_KEY_FILE) to use them",
                       ErrorKind.ADMIN_DISABLED)
    authorize(request, request.app.state.settings.admin_api_key, "admin")


USER = [Depends(user_key)]


# ---------------------------------------------------------------- HTTP's own rules on the inputs, each once: `param`
# is the request parameter in the dialect's words (input, inputs, texts, query, documents, ids), `field` the item
def need_items(items, param, field=None, what="a text or a non-empty list of texts"):
    """A request's list of inputs must hold one at least (400 invalid_input; TEI: 422): every dialect's empty list
    is this one kind (the input is wrong, not a parameter), so no schema says min_length for one (schemas.NOT_EMPTY)."""
    if not items:
        raise ApiError(f"is empty: send {what}", ErrorKind.INVALID_INPUT, param, field or param)


def check_count(request, count, param):
    """Items per request: at most max_inputs_per_request (the proxy cuts them into the BLS model's pieces)."""
    limit = request.app.state.settings.max_inputs_per_request
    if count > limit:
        raise ApiError(f"{count} inputs is over the limit of {limit} per request (setting max_inputs_per_request)",
                       ErrorKind.TOO_MANY, param)


def check_length(request, length, field, param, unit="characters"):
    """One input's length: at most max_input_chars characters (token ids for /decode: as many as a text's)."""
    limit = request.app.state.settings.max_input_chars
    if length > limit:
        also = "" if unit == "characters" else ": as many as a text may have characters"
        raise ApiError(f"holds {length} {unit}, over the limit of {limit} (setting max_input_chars{also})",
                       ErrorKind.TOO_LONG, param, field)


def check_text(request, text, field, param):
    """One text: its characters, and JSON's lone surrogates ("\\ud800": valid JSON, not valid Unicode). Its own
    rules (empty, bytes, tokens) are the tokenizer's: its error names the field too."""
    check_length(request, len(text), field, param)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ApiError(f"is not valid Unicode: a lone surrogate at character {error.start}",
                           ErrorKind.INVALID_INPUT, param, field) from None


def check_texts(request, texts, param, count=True):
    """check_text for each of a list of texts (param[i]); `count`: and how many (not for rerank, whose model counts
    its documents)."""
    if count:
        check_count(request, len(texts), param)
    for i, text in enumerate(texts):
        check_text(request, text, f"{param}[{i}]", param)
    return texts


def refusing_cut(parameters, truncate):
    """The request parameters a model call carries: with `truncate` false the tokenizer refuses an input over the
    max length (too_long naming it: request_rules.truncate), before the encoder runs; busy or not (busy.py)."""
    return parameters if truncate else {**(parameters or {}), "truncate": False}


def need(card, output, route, param="model"):
    """The model must serve `output`; `param`: the client's field that asked for it (default: the model)."""
    if output not in card.outputs:
        raise ApiError(f"model '{card.id}' serves {', '.join(card.outputs)}, not {output} (needed by {route}); "
                       f"export it with --outputs {output}", ErrorKind.NOT_SERVED, param)


def need_images(card):
    if not card.image:
        raise ApiError(f"model '{card.id}' serves text only: images need a CLIP export (one with an image model)",
                       ErrorKind.NOT_SERVED, "model")


# ---------------------------------------------------------------- the calls
def select(request, model):
    card = request.app.state.service.resolve(model)
    request.scope["state"]["model"] = card.id
    return card


async def embed(request, card, texts, outputs, param, truncate, parameters=None):
    """The export's embedding models over `texts`; truncate false: the tokenizer refuses a text over the max length
    (too_long, 422, naming param[i]) before the encoder runs."""
    result = await request.app.state.service.embed(card, texts, outputs, param, refusing_cut(parameters, truncate))
    request.app.state.metrics.observe_embedding(card.id, len(texts), int(result.tokens.sum()),
                                                int(result.truncated.sum()))
    return result


@contextmanager
def client_fields(renames):
    """The models and the shared rules name their own fields (`dimensions`, `documents`); a route whose client sent
    another name (Cohere's `output_dimension`, TEI's `texts`) answers in the client's terms: param and field."""
    try:
        yield
    except ApiError as error:
        if error.param in renames:
            name, i = model_errors.split_field(error.field or "")
            if name == error.param:
                rename_field(error, renames[name] + ("" if i is None else f"[{i}]"))
            error.param = renames[error.param]
        raise


async def embed_images(request, card, pictures, param, indices=None):
    """The export's image models over `pictures` -> ImageEmbeddings, its vectors contiguous float32 (as orjson
    writes them)."""
    result = await request.app.state.service.embed_images(card, pictures, param, indices)
    request.app.state.metrics.observe_embedding(card.id, len(pictures), 0, 0)
    result.dense = np.ascontiguousarray(result.dense, dtype=np.float32)
    return result


MODES = model_outputs.MODES  # the rerank model's mode_scores columns


@dataclass
class ScoredDocuments:
    """score_documents' answer."""
    card: Card  # the export
    result: RerankScores
    served: list  # the modes (MODES) the export serves
    truncated: int  # how many texts were cut: the query and the documents


async def score_documents(request, model, query, documents, weights=None, truncate=True, parameters=None):
    """The export's rerank model over (query, documents), for every rerank dialect (and TEI's /similarity: dense
    weights only): the checks that are HTTP's own, the model's kind, the call and its metrics -> ScoredDocuments.
    parameters: the request parameters (prompt_name), passed on."""
    check_text(request, query, "query", "query")
    # the rerank models' own rule and words (request_rules.documents), before any other check of the documents
    need_items(documents, "documents", what="at least one document")
    check_texts(request, documents, "documents", count=False)  # the rerank model counts them (max_documents)
    card = select(request, model)
    if card.rerank is None:
        raise ApiError(f"model '{card.id}' has no rerank model", ErrorKind.NOT_SERVED, "model")
    served = [mode for mode in MODES if mode in card.outputs]
    if card.kind == "cross-encoder":
        if weights is not None:
            raise ApiError(f"weights: model '{card.id}' is a cross-encoder; weights are for bge-m3's modes",
                           ErrorKind.INVALID_VALUE, "weights")
    elif not served:
        raise ApiError(f"model '{card.id}' serves none of dense, sparse, colbert", ErrorKind.NOT_SERVED)
    # truncate false: the tokenizer refuses the query or a document over the max length (too_long, 422)
    result = await request.app.state.service.rerank(card, query, documents, weights or (1.0, 1.0, 1.0),
                                                    refusing_cut(parameters, truncate))
    truncated = int(result.query_truncated) + int(result.truncated.sum())
    request.app.state.metrics.observe_embedding(card.id, 1 + len(documents), result.tokens, truncated)
    return ScoredDocuments(card, result, served, truncated)


# ---------------------------------------------------------------- the answers' pieces
def usage(tokens):
    return {"prompt_tokens": int(tokens), "total_tokens": int(tokens)}


def timing_headers(truncated, inference_ms):
    # TEI sends the same: ms spent in Triton; the rest of a request's latency is the proxy's own.
    return {"X-Truncated-Inputs": str(int(truncated)), "X-Inference-Time": f"{inference_ms:.3f}"}


def vector_rows(result, kind):
    """The vectors of one embedding type: numpy rows (orjson writes them as lists), or base64 little-endian
    float32 strings."""
    if kind == "base64":
        return [base64.b64encode(row.astype("<f4", copy=False).tobytes()).decode("ascii") for row in result.dense]
    return np.ascontiguousarray(result.dense, dtype=np.float32) if kind == "float" else result.quantized[kind]


QUANTIZED = tuple(model_outputs.QUANTIZED)


def as_list(value):
    return [value] if isinstance(value, str) else value


def best_first(scores, top_n=None):
    """The indices of `scores`, best first; the first top_n (None: all)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n or len(scores)]


def ranked(result, documents, top_n, return_documents, served=()):
    """Cohere's results, best first: index, relevance_score, the per-mode scores of `served` (bge-m3's modes; v1
    only), the document when asked."""
    scores = result.scores.tolist()
    modes = served if result.mode_scores is not None else ()
    return [{"index": i, "relevance_score": scores[i],
             **({"scores": {mode: float(result.mode_scores[i, MODES.index(mode)]) for mode in modes}}
                if modes else {}),
             **({"document": {"text": documents[i]}} if return_documents else {})}
            for i in best_first(scores, top_n)]


async def rerank_v1_answer(request, body):
    """The rerank answer in Cohere's v1 shape, with bge-m3's per-mode scores and `usage`: POST /v1/rerank's, and
    TEI's /rerank's for a body with Cohere's `documents` (Infinity's and Cohere's clients post there)."""
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    scored = await score_documents(request, body.model, body.query, documents, body.weights, body.truncate)
    answer = {"id": str(uuid.uuid4()), "results": ranked(scored.result, documents, body.top_n, body.return_documents,
                                                          scored.served),
              "model": scored.card.id, "usage": usage(scored.result.tokens),
              "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}}}
    return json_response(answer, timing_headers(scored.truncated, scored.result.inference_ms))
