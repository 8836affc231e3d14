"""What every dialect's routes share (app.py: OpenAI, the seed API, bge-m3's outputs, rerank, admin; routes_tei.py:
Hugging Face TEI's API; routes_cohere.py: Cohere's): the orjson route class, the key gates, the model lookup, HTTP's
own limits on texts, the embed call with its metrics, and the answer's pieces. No Triton import here."""
import base64
import hmac
from contextlib import contextmanager

import model_errors
import numpy as np
import orjson
from errors import ServiceError, rename_field
from fastapi import Depends, Request
from fastapi.routing import APIRoute
from http_errors import ApiError
from starlette.responses import Response

import schemas


class OrjsonRequest(Request):
    """Bodies are parsed with orjson: faster, and deep nesting is a JSONDecodeError (a 400), not a RecursionError."""

    async def json(self):
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def handle(request):
            return await handler(OrjsonRequest(request.scope, request.receive))
        return handle


def json_response(content, headers=None):
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), 200, headers, "application/json")


# ---------------------------------------------------------------- gates (route dependencies: checked before the body
# is validated, so a caller without the key learns nothing about the request schema)
def authorize(request, key, what="API"):
    """`Authorization: Bearer <key>`; the scheme is case-insensitive (RFC 9110)."""
    if not key:
        return
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(401, f"missing or wrong {what} key: send 'Authorization: Bearer <key>'", "invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


# async: FastAPI runs a plain `def` dependency in a worker thread, a thread round trip on every request (~0.3 ms).
async def user_key(request: Request):
    authorize(request, request.app.state.settings.api_key)


async def admin_key(request: Request):
    if not request.app.state.settings.admin_api_key:
        raise ApiError(403, "the admin routes are off: set ADMIN_API_KEY (or ADMIN_API_KEY_FILE) to use them",
                       "admin_disabled")
    authorize(request, request.app.state.settings.admin_api_key, "admin")


ERRORS = {status: {"model": schemas.ErrorResponse} for status in (400, 401, 404, 413, 415, 422, 429, 503, 504)}
USER = [Depends(user_key)]


# ---------------------------------------------------------------- helpers of the routes
def select(request, model):
    card = request.app.state.service.resolve(model)
    request.scope["state"]["model"] = card.id
    return card


def check_texts(request, texts, param, count=True):
    """What HTTP's own limits say of a list of texts: how many per request (`count`: the proxy cuts them into the
    BLS model's pieces; not for rerank, whose model counts its documents), characters per text, JSON's lone
    surrogates. The texts' own rules (empty, bytes, tokens) are the tokenizer's: its error names param[i]."""
    settings = request.app.state.settings
    if count and len(texts) > settings.max_inputs_per_request:
        raise ApiError(422, f"{len(texts)} inputs is over the limit of {settings.max_inputs_per_request} per request "
                            f"(setting max_inputs_per_request)", "too_many_inputs", param)
    for i, text in enumerate(texts):
        if len(text) > settings.max_input_chars:
            raise ApiError(422, f"{param}[{i}] has {len(text)} characters, over the limit of "
                                f"{settings.max_input_chars} (setting max_input_chars)", "input_too_long", param,
                           field=f"{param}[{i}]")
        if not text.isascii():
            unicode_text(text, f"{param}[{i}]", param)
    return texts


def unicode_text(text, where, param):
    """A 400 naming the text when it holds a lone surrogate (JSON's "\\ud800": valid JSON, not valid Unicode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(400, f"{where} is not valid Unicode: a lone surrogate at character {error.start}",
                       "invalid_text", param, field=where) from None


def need(card, output, route, param="model"):
    """A 400 when the model lacks `output`; `param`: the client's field that asked for it (default: the model)."""
    if output not in card.outputs:
        raise ApiError(400, f"model '{card.id}' serves {', '.join(card.outputs)}, not {output} (needed by {route}); "
                            f"export it with --outputs {output}", "output_not_served", param)


async def embed(request, card, texts, outputs, param, truncate, parameters=None):
    result = await request.app.state.service.embed(card, texts, outputs, param, parameters)
    if not truncate and result.truncated.any():
        i = int(np.argmax(result.truncated))
        raise ApiError(422, f"{param}[{i}] is longer than the model's maximum of {card.max_length} tokens (truncate "
                            f"is false)", "context_length_exceeded", param, field=f"{param}[{i}]")
    request.app.state.metrics.observe_embedding(card.id, len(texts), int(result.tokens.sum()),
                                                int(result.truncated.sum()))
    return result


@contextmanager
def client_indices(param, indices):
    """Errors about `param[i]` of a part of the inputs (the texts of a list mixing texts and images) name the
    client's index instead: indices[i]."""
    try:
        yield
    except (ApiError, ServiceError) as error:
        name, i = model_errors.split_field(error.field or "")
        if name == param and i is not None and i < len(indices):
            rename_field(error, f"{param}[{indices[i]}]")
        raise


@contextmanager
def client_fields(renames):
    """The models name their own fields (`dimensions`); a route whose client sent another name (Cohere's
    `output_dimension`) answers in the client's terms: the error's param and the field its message leads with."""
    try:
        yield
    except (ApiError, ServiceError) as error:
        if error.param in renames:
            name, i = model_errors.split_field(error.field or "")
            if name == error.param:
                rename_field(error, renames[name] + ("" if i is None else f"[{i}]"))
            error.param = renames[error.param]
        raise


def need_images(card):
    if not card.image:
        raise ApiError(400, f"model '{card.id}' serves text only: images need a CLIP export (one with an image "
                            f"model)", "images_not_served", "model")


async def embed_images(request, card, pictures, param, indices=None):
    vectors, inference_ms = await request.app.state.service.embed_images(card, pictures, param, indices)
    request.app.state.metrics.observe_embedding(card.id, len(pictures), 0, 0)
    return np.ascontiguousarray(vectors, dtype=np.float32), inference_ms


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


QUANTIZED = ("int8", "uint8", "binary", "ubinary")


def as_list(value):
    return [value] if isinstance(value, str) else value


MODES = ("dense", "sparse", "colbert")  # the rerank model's mode_scores columns


def best_first(scores, top_n=None):
    """The indices of `scores`, best first; the first top_n (None: all)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n or len(scores)]


async def score_documents(request, model, query, documents, weights=None, truncate=True, parameters=None):
    """The export's rerank model over (query, documents), for every rerank dialect (and TEI's /similarity: dense
    weights only): the checks that are HTTP's own, the model's kind, the call and its metrics -> (card, result, the
    modes served, how many texts were cut). parameters: the request parameters (prompt_name), passed on."""
    settings = request.app.state.settings
    unicode_text(query, "query", "query")
    if len(query) > settings.max_input_chars:
        raise ApiError(422, f"query has {len(query)} characters, over the limit of {settings.max_input_chars} "
                            f"(setting max_input_chars)", "input_too_long", "query", field="query")
    check_texts(request, documents, "documents", count=False)  # the rerank model counts them (max_documents)
    card = select(request, model)
    if card.rerank is None:
        raise ApiError(400, f"model '{card.id}' has no rerank model", "output_not_served", "model")
    served = [mode for mode in MODES if mode in card.outputs]
    if card.kind == "cross-encoder":
        if weights is not None:
            raise ApiError(400, f"weights: model '{card.id}' is a cross-encoder; weights are for bge-m3's modes",
                           "invalid_value", "weights")
    elif not served:
        raise ApiError(400, f"model '{card.id}' serves none of dense, sparse, colbert", "output_not_served")
    result = await request.app.state.service.rerank(card, query, documents, weights or (1.0, 1.0, 1.0), parameters)
    if not truncate and (result.query_truncated or result.truncated.any()):
        what = "query" if result.query_truncated else f"documents[{int(np.argmax(result.truncated))}]"
        raise ApiError(422, f"{what} is longer than the model's maximum of {card.max_length} tokens (truncate is "
                            f"false)", "context_length_exceeded", what.split("[")[0], field=what)
    truncated = int(result.query_truncated) + int(result.truncated.sum())
    request.app.state.metrics.observe_embedding(card.id, 1 + len(documents), result.tokens, truncated)
    return card, result, served, truncated
