"""The HTTP API: FastAPI routes translating HTTP to the service (the Service protocol below: service.py calls Triton
through BLS, tests pass a fake). No Triton import here. The server runs create_server_app: the plain routes' requests
go to their functions directly (direct.py), the others through FastAPI.

Routes: GET /health (ready), /health/live; OpenAI POST /v1/embeddings, GET /v1/models[/{id}]; seed API
POST /v1/embedding; bge-m3: POST /v1/encode, TEI's POST /embed_sparse; POST /v1/rerank (the export's rerank model);
POST /v1/chunk_embeddings (late chunking); CLIP exports: images in /v1/embeddings, seed API POST /infer (images.py
turns the items into bytes);
admin POST /v1/models/{id}/load|unload, seed API POST /load_clip_model, /unload_clip_model, /delete_clip_model;
GET /metrics; /docs, /openapi.json. The app's state: settings, service, metrics (create_app).
"""
import base64
import hmac
import time
import uuid
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Protocol

import images
import model_errors
import numpy as np
import orjson
from direct import DirectRoutes
from errors import ServiceError, rename_field
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from guard import HttpGuard
from http_errors import ApiError, validation_error
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response

import schemas
from metrics import MetricsMiddleware

MODES = ("dense", "sparse", "colbert")  # the rerank model's mode_scores columns
UNKNOWN_MODEL_LABEL = "(unknown)"  # the metrics' model label of an admin request for an id no export has


class Service(Protocol):
    """What the routes need from the serving side. Card: id, name, outputs, embedding_size, colbert_size,
    max_length, source, created, kind, rerank, chunks (None: none); CLIP exports: image, architecture, pretrained
    (image None: text only). exports(): every export, loaded or not. embed_images -> vectors [n, d], inference_ms.
    embed -> dense [n, d] | None, sparse [(ids, weights)] | None, colbert [[m, c]] |
    None, tokens [n], truncated [n], inference_ms. rerank -> scores [n], mode_scores [n, 3] | None, tokens,
    query_truncated, truncated [n], inference_ms. Failures raise errors.ServiceError kinds."""

    draining: bool

    def cards(self): ...

    def resolve(self, model): ...

    def exports(self): ...

    def health(self): ...

    def live(self): ...

    async def embed(self, card, texts, outputs, param, parameters=None): ...

    async def embed_images(self, card, images, param, indices=None): ...

    async def rerank(self, card, query, documents, weights): ...

    async def chunk_embed(self, card, texts, spans, parameters): ...

    async def load(self, model_id): ...

    async def unload(self, model_id): ...


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
ADMIN = {"dependencies": [Depends(admin_key)], "response_model": schemas.AdminResult,
         "responses": {status: {"model": schemas.ErrorResponse} for status in (401, 403, 404, 409, 422, 503)}}
CLIP_ADMIN = {**ADMIN, "response_model": schemas.ClipAdminResult}
EXPORT_CLIP = "python build/export.py --open-clip ViT-B-32 --pretrained laion2b_s34b_b79k --name <name>"
USER = [Depends(user_key)]
router = APIRouter(route_class=OrjsonRoute)


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


# ---------------------------------------------------------------- health
@router.get("/health", response_class=PlainTextResponse, responses={503: {"description": "not ready"}})
async def health(request: Request):
    """200 `ok` when the default model and everything it needs are ready, else 503 with the reason. Answered from
    state the readiness thread keeps: no inference, never queued behind one. Never needs a key."""
    ok, reason = request.app.state.service.health()
    return PlainTextResponse("ok" if ok else reason, 200 if ok else 503, {} if ok else {"Retry-After": "1"})


@router.get("/health/live", response_class=PlainTextResponse, responses={503: {"description": "not alive"}})
async def live(request: Request):
    """200 while the proxy serves and its BLS threads are not stranded on dead stubs (a liveness probe)."""
    ok, reason = request.app.state.service.live()
    return PlainTextResponse("ok" if ok else reason, 200 if ok else 503)


# ---------------------------------------------------------------- embeddings
@router.post("/v1/embeddings", dependencies=USER, response_model=schemas.EmbeddingsResponse, responses=ERRORS)
async def embeddings(request: Request, body: schemas.EmbeddingsRequest):
    """OpenAI-compatible embeddings (`encoding_format` float, base64 little-endian float32, or int8 / uint8 / binary
    / ubinary as the BLS model quantizes them); `dimensions`, `input_type`, `prompt_name` go to the models (texts).
    CLIP exports: `input` may mix texts and `{"image": base64 | data URI | URL}` / `{"text": ...}` objects (Jina's
    shape); rows keep the input's order; images are float / base64 only and count 0 tokens."""
    items = as_list(body.input)
    if not items:
        raise ApiError(400, "'input' must be a string or a non-empty list of strings", "invalid_input", "input")
    if any(isinstance(t, (int, list)) for t in items):
        raise ApiError(400, "token arrays are not supported: send text", "invalid_input", "input")
    card = select(request, body.model)
    need(card, "dense", "/v1/embeddings")
    pictures = [(i, t.image) for i, t in enumerate(items) if isinstance(t, schemas.ImageItem)]
    texts = [(i, t if isinstance(t, str) else t.text) for i, t in enumerate(items)
             if not isinstance(t, schemas.ImageItem)]
    if pictures:
        need_images(card)
        for name, value in (("encoding_format", body.encoding_format if body.encoding_format in QUANTIZED else None),
                            ("dimensions", body.dimensions)):
            if value is not None:
                raise ApiError(400, f"{name} {value}: images are embedded as float only (the image model has no "
                                    f"quantized or Matryoshka outputs): use encoding_format float or base64 without "
                                    f"dimensions", "invalid_value", name)
    outputs = ("dense", body.encoding_format) if body.encoding_format in QUANTIZED else ("dense",)
    parameters = {"dimensions": body.dimensions, "input_type": body.input_type, "prompt_name": body.prompt_name}
    rows, flags, tokens, truncated, inference_ms = [None] * len(items), [False] * len(items), 0, 0, 0.0
    with client_indices("input", [i for i, _ in texts]):
        checked = check_texts(request, [t for _, t in texts], "input")
    encoded = await images.load([p for _, p in pictures], "input", request.app.state.settings,
                                [i for i, _ in pictures]) if pictures else []
    if texts:
        with client_indices("input", [i for i, _ in texts]):
            result = await embed(request, card, checked, outputs, "input", body.truncate, parameters)
        for (i, _), vector, flag in zip(texts, vector_rows(result, body.encoding_format), result.truncated):
            rows[i], flags[i] = vector, bool(flag)
        tokens, truncated, inference_ms = result.tokens.sum(), result.truncated.sum(), result.inference_ms
    if pictures:
        vectors, image_ms = await embed_images(request, card, encoded, "input", [i for i, _ in pictures])
        for (i, _), vector in zip(pictures, vector_rows(SimpleNamespace(dense=vectors), body.encoding_format)):
            rows[i] = vector
        inference_ms += image_ms
    data = [{"object": "embedding", "index": i, "embedding": rows[i], "truncated": flags[i]} for i in range(len(items))]
    return json_response({"object": "list", "data": data, "model": card.id, "usage": usage(tokens)},
                         timing_headers(truncated, inference_ms))


@router.post("/v2/embed", dependencies=USER, response_model=schemas.CohereEmbedResponse, responses=ERRORS)
async def cohere_embed(request: Request, body: schemas.CohereEmbedRequest):
    """Cohere's embed v2: `texts`, `input_type`, `embedding_types` (several at once), `output_dimension`."""
    card = select(request, body.model)
    need(card, "dense", "/v2/embed")
    kinds = list(dict.fromkeys(body.embedding_types))
    parameters = {"dimensions": body.output_dimension, "input_type": body.input_type, "prompt_name": body.prompt_name}
    with client_fields({"dimensions": "output_dimension"}):
        result = await embed(request, card, check_texts(request, body.texts, "texts"),
                             ("dense", *(k for k in kinds if k in QUANTIZED)), "texts", body.truncate == "END",
                             parameters)
    tokens = int(result.tokens.sum())
    return json_response({"id": str(uuid.uuid4()), "embeddings": {kind: vector_rows(result, kind) for kind in kinds},
                          "texts": body.texts, "meta": {"api_version": {"version": "2"},
                                                        "billed_units": {"input_tokens": tokens}},
                          "response_type": "embeddings_by_type"},
                         timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/v1/embedding", dependencies=USER, response_model=list[schemas.SeedResult], responses=ERRORS)
async def seed_embedding(request: Request, body: list[schemas.SeedItem],
                         truncate: bool = Query(True, description="false: over-long = 422"),
                         model: str | None = Query(None, description="served model id (default model)")):
    """Seed API: `[{"query": "..."}]` -> `[{"embedding": [...]}]`."""
    if not body:
        raise ApiError(400, 'request body must be a non-empty list of {"query": "..."} objects', "invalid_type")
    card = select(request, model)
    need(card, "dense", "/v1/embedding")
    texts = check_texts(request, [item.query for item in body], "query")
    result = await embed(request, card, texts, ("dense",), "query", truncate)
    vectors = np.ascontiguousarray(result.dense, dtype=np.float32)
    return json_response([{"embedding": row} for row in vectors],
                         timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/infer", dependencies=USER, response_model=schemas.InferResponse, responses=ERRORS)
async def infer(request: Request, body: schemas.InferRequest):
    """Seed API (CLIP): `{"text": [...], "image": [...]}` (base64, data URIs or URLs) -> `text_embeddings`,
    `image_embeddings` (in order) and `processingTimeMs`. Default model: the first loaded CLIP export by id."""
    started = time.perf_counter()
    if not body.text and not body.image:
        raise ApiError(400, "give 'text' or 'image': a non-empty list (or both)", "invalid_input", "text")
    card = clip_card(request, body.model)
    texts = check_texts(request, body.text or [], "text")
    encoded = await images.load(body.image or [], "image", request.app.state.settings)
    text_rows = (await embed(request, card, texts, ("dense",), "text", True)).dense if texts else []
    image_rows = (await embed_images(request, card, encoded, "image"))[0] if encoded else []
    return json_response({"text_embeddings": np.ascontiguousarray(text_rows, dtype=np.float32) if texts else [],
                          "image_embeddings": image_rows,
                          "processingTimeMs": round((time.perf_counter() - started) * 1000, 3)})


def clip_card(request, model):
    if not model:
        model = next((c.id for c in request.app.state.service.cards() if c.image), None)
        if model is None:
            raise ApiError(404, f"no CLIP model is loaded: export one ({EXPORT_CLIP}) and load it (POST "
                                f"/load_clip_model)", "model_not_found", "model")
    card = select(request, model)
    need_images(card)
    return card


@router.post("/v1/encode", dependencies=USER, response_model=schemas.EncodeResponse, responses=ERRORS)
async def encode(request: Request, body: schemas.EncodeRequest):
    """Any combination of dense, sparse ({indices, values}, as Milvus and Qdrant take it) and ColBERT vectors per
    input, from one forward pass (FlagEmbedding's encode(return_dense, return_sparse, return_colbert_vecs)).
    ColBERT: `colbert_pool_factor` pools them (token pooling), `colbert_type` gives them as float (default), fp16,
    int8 or binary (packed sign bits as 0-255 ints), as ensemble_bls computes them."""
    texts = check_texts(request, as_list(body.input), "input")
    if not texts:
        raise ApiError(400, "'input' must not be empty", "invalid_input", "input")
    card = select(request, body.model)
    wanted = tuple(kind for kind, flag in (("dense", body.return_dense), ("sparse", body.return_sparse),
                                           ("colbert", body.return_colbert)) if flag)
    if not wanted:
        raise ApiError(400, "ask for at least one of return_dense, return_sparse, return_colbert", "invalid_value")
    wanted, parameters = colbert_options(card, body, wanted)  # first: its 400 names the compact field
    for kind in wanted:  # the 400 names the client's return_<output> flag
        need(card, kind.split("_")[0], "/v1/encode", f"return_{kind.split('_')[0]}")
    result = await embed(request, card, texts, wanted, "input", body.truncate, parameters)
    data = []
    for i in range(len(texts)):
        item = {"index": i, "truncated": bool(result.truncated[i])}
        if "dense" in wanted:
            item["dense"] = result.dense[i]
        if "sparse" in wanted:
            item["sparse"] = {"indices": result.sparse[i][0], "values": result.sparse[i][1]}
        if any(kind.startswith("colbert") for kind in wanted):
            item["colbert"] = result.colbert[i]
        data.append(item)
    return json_response({"object": "list", "data": data, "model": card.id, "usage": usage(result.tokens.sum())},
                         timing_headers(result.truncated.sum(), result.inference_ms))


def colbert_options(card, body, wanted):
    """/v1/encode's compact ColBERT fields -> (outputs with the ColBERT type asked for, request parameters)."""
    options = [(name, value) for name, value, default in (("colbert_pool_factor", body.colbert_pool_factor, None),
                                                          ("colbert_type", body.colbert_type, "float"))
               if value != default]
    if not options:
        return wanted, None
    name, value = options[0]
    if "colbert" not in card.outputs:
        raise ApiError(400, f"{name}: model '{card.id}' has no ColBERT output (it serves {', '.join(card.outputs)})",
                       "output_not_served", name)
    if "colbert" not in wanted:
        raise ApiError(400, f"{name} {value!r} applies to ColBERT vectors: set return_colbert to true",
                       "invalid_value", name)
    kind = "colbert" if body.colbert_type == "float" else f"colbert_{body.colbert_type}"
    return tuple(kind if w == "colbert" else w for w in wanted), {"colbert_pool_factor": body.colbert_pool_factor}


@router.post("/embed_sparse", dependencies=USER, response_model=list[list[schemas.SparseEntry]], responses=ERRORS)
async def embed_sparse(request: Request, body: schemas.EmbedSparseRequest):
    """TEI's sparse route: `[[{"index": token id, "value": weight}, ...], ...]` per input."""
    texts = check_texts(request, as_list(body.inputs), "inputs")
    if not texts:
        raise ApiError(400, "'inputs' must not be empty", "invalid_input", "inputs")
    card = select(request, body.model)
    need(card, "sparse", "/embed_sparse")
    result = await embed(request, card, texts, ("sparse",), "inputs", body.truncate)
    return json_response([[{"index": int(t), "value": float(w)} for t, w in zip(*pair)] for pair in result.sparse],
                         timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/v1/rerank", dependencies=USER, response_model=schemas.RerankResponse, responses=ERRORS)
async def rerank(request: Request, body: schemas.RerankRequest):
    """Scores each document against the query with the export's rerank model, by the model's kind: a cross-encoder's
    relevance (CrossEncoder.predict, FlagReranker.compute_score normalized); for an embedding model bge-m3's
    combined score, as FlagEmbedding's compute_score ('colbert+sparse+dense' with `weights`; models without
    sparse/ColBERT outputs use what they serve)."""
    settings = request.app.state.settings
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    unicode_text(body.query, "query", "query")
    if len(body.query) > settings.max_input_chars:
        raise ApiError(422, f"query has {len(body.query)} characters, over the limit of {settings.max_input_chars} "
                            f"(setting max_input_chars)", "input_too_long", "query", field="query")
    check_texts(request, documents, "documents", count=False)  # the rerank model counts them (max_documents)
    card = select(request, body.model)
    if card.rerank is None:
        raise ApiError(400, f"model '{card.id}' has no rerank model", "output_not_served", "model")
    served = [mode for mode in MODES if mode in card.outputs]
    if card.kind == "cross-encoder":
        if body.weights is not None:
            raise ApiError(400, f"weights: model '{card.id}' is a cross-encoder; weights are for bge-m3's modes",
                           "invalid_value", "weights")
    elif not served:
        raise ApiError(400, f"model '{card.id}' serves none of dense, sparse, colbert", "output_not_served")
    result = await request.app.state.service.rerank(card, body.query, documents, body.weights or (1.0, 1.0, 1.0))
    if not body.truncate and (result.query_truncated or result.truncated.any()):
        what = "query" if result.query_truncated else f"documents[{int(np.argmax(result.truncated))}]"
        raise ApiError(422, f"{what} is longer than the model's maximum of {card.max_length} tokens (truncate is "
                            f"false)", "context_length_exceeded", what.split("[")[0])
    truncated = int(result.query_truncated) + int(result.truncated.sum())
    request.app.state.metrics.observe_embedding(card.id, 1 + len(documents), result.tokens, truncated)
    scores = result.scores.tolist()
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:body.top_n or len(documents)]
    results = [{"index": i, "relevance_score": scores[i],
                **({"scores": {mode: float(result.mode_scores[i, MODES.index(mode)]) for mode in served}}
                   if result.mode_scores is not None else {}),
                **({"document": {"text": documents[i]}} if body.return_documents else {})} for i in order]
    return json_response({"results": results, "model": card.id, "usage": usage(result.tokens)},
                         timing_headers(truncated, result.inference_ms))


@router.post("/v1/chunk_embeddings", dependencies=USER, response_model=schemas.ChunkEmbeddingsResponse,
             responses=ERRORS)
async def chunk_embeddings(request: Request, body: schemas.ChunkEmbeddingsRequest):
    """Late chunking through the export's late chunking model: per text, one vector per chunk (the client's `spans`,
    or sentences grouped to `chunk_tokens`), each the mean of the chunk's token vectors from the whole text's one
    forward pass, L2-normalized. A text over the model's max tokens is refused (400), not truncated."""
    single = isinstance(body.input, str)
    texts = check_texts(request, as_list(body.input), "input")
    if not texts:
        raise ApiError(400, "'input' must not be empty", "invalid_input", "input")
    spans = body.spans  # (spans or chunk_tokens, one of them: the late chunking model's rule)
    if spans is not None:
        spans = [spans] if single else spans
        if len(spans) != len(texts) or not all(isinstance(s, list) and all(isinstance(p, list) for p in s)
                                               for s in spans):
            raise ApiError(400, "spans: one list of [start, end] per input text" if not single else
                           "spans: a list of [start, end] for the text", "invalid_value", "spans")
        for i, text_spans in enumerate(spans):
            for k, pair in enumerate(text_spans):
                if len(pair) != 2:
                    where = f"spans[{k}]" if single else f"input[{i}]: spans[{k}]"
                    raise ApiError(400, f"{where} must be [start, end], not {pair}", "invalid_value", "spans")
    card = select(request, body.model)
    if card.chunks is None:
        raise ApiError(400, f"model '{card.id}' has no late chunking model (export it again)", "output_not_served",
                       "model")
    parameters = {"chunk_tokens": body.chunk_tokens, "input_type": body.input_type, "prompt_name": body.prompt_name}
    results, inference_ms = await request.app.state.service.chunk_embed(card, texts, spans, parameters)
    tokens = sum(r[3] for r in results)
    request.app.state.metrics.observe_embedding(card.id, len(texts), tokens, 0)
    data = [{"index": i, "num_tokens": total,
             "chunks": [{"embedding": vector, "span": span, "num_tokens": int(n)}
                        for vector, span, n in zip(vectors, found.tolist(), counts)]}
            for i, (vectors, found, counts, total) in enumerate(results)]
    return json_response({"object": "list", "data": data, "model": card.id, "usage": usage(tokens)},
                         timing_headers(0, inference_ms))


# ---------------------------------------------------------------- models
def card_json(card):
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": "triton-embed",
            "embedding_size": card.embedding_size, "max_input_tokens": card.max_length,
            "outputs": list(card.outputs), "source": card.source, "kind": card.kind,
            "prompts": dict(card.prompts), "default_prompt_name": card.default_prompt_name}


@router.get("/v1/models", dependencies=USER, response_model=schemas.ModelList, responses=ERRORS)
async def models(request: Request):
    """The models loaded now (a model exported or loaded after start-up appears here)."""
    return json_response({"object": "list", "data": [card_json(c) for c in request.app.state.service.cards()]})


@router.get("/v1/models/{model_id:path}", dependencies=USER, response_model=schemas.ModelCard, responses=ERRORS)
async def model(request: Request, model_id: str):
    return json_response(card_json(select(request, model_id)))


async def admin(request, model_id, action):
    # model_id takes a hub id's '/'; it is only ever looked up among the exports' cards, never a path. The metrics
    # label is an export's id, or one fixed label for an id no export has (a path, a NUL byte, 10,000 characters)
    found = [c.id for c in request.app.state.service.exports() if model_id in (c.id, c.name)]
    request.scope["state"]["model"] = found[0] if found else UNKNOWN_MODEL_LABEL
    seconds = await getattr(request.app.state.service, action)(model_id)
    return json_response({"id": model_id, "status": f"{action}ed", "seconds": round(seconds, 3)})


@router.post("/v1/models/{model_id:path}/load", **ADMIN)
async def load(request: Request, model_id: str):
    """Admin: load (or reload) an exported model; models already serving keep serving. Needs ADMIN_API_KEY."""
    return await admin(request, model_id, "load")


@router.post("/v1/models/{model_id:path}/unload", **ADMIN)
async def unload(request: Request, model_id: str):
    """Admin: unload a model; its in-flight requests finish first. Needs ADMIN_API_KEY. Its files are removed with
    `python build/remove_export.py NAME`, not over HTTP."""
    return await admin(request, model_id, "unload")


def clip_export(request, body):
    """The CLIP export of open_clip's model name (or the HF model_type, or an export id) and pretrained tag (None:
    any), a loaded one first."""
    service = request.app.state.service
    loaded = {c.id for c in service.cards()}
    found = [c for c in service.exports() if c.image and body.model_name in (c.architecture, c.id, c.name)
             and body.pretrained in (None, c.pretrained)]
    if not found:
        what = body.model_name + (f" / {body.pretrained}" if body.pretrained else "")
        command = f"python build/export.py --open-clip {body.model_name} --pretrained " \
                  f"{body.pretrained or '<pretrained>'} --name <name>"
        raise ApiError(404, f"no CLIP export of {what} in the model repository. The server never exports (its "
                            f"container has no torch): run `{command}` where the export tools are installed, into "
                            f"this model repository, then load it", "model_not_found", "model_name")
    card = sorted(found, key=lambda c: c.id not in loaded)[0]
    request.scope["state"]["model"] = card.id
    return card


async def clip_admin(request, body, action, delete=False):
    card = clip_export(request, body)
    seconds = await getattr(request.app.state.service, action)(card.id)
    kept = {"files_kept": True, "message": f"unloaded; files are never removed over HTTP: remove them with `python "
                                           f"build/remove_export.py {card.name}`"} if delete else {}
    return json_response({"status": f"{action}ed", "model": card.id, "model_name": body.model_name,
                          "pretrained": card.pretrained, "seconds": round(seconds, 3), **kept})


@router.post("/load_clip_model", **CLIP_ADMIN)
async def load_clip_model(request: Request, body: schemas.ClipModelRequest):
    """Seed API (admin): load the CLIP export of `model_name` (open_clip's, e.g. ViT-B-32) and `pretrained` (e.g.
    laion2b_s34b_b79k; none: any). The server never exports: a missing one is a 404 with the export command."""
    return await clip_admin(request, body, "load")


@router.post("/unload_clip_model", **CLIP_ADMIN)
async def unload_clip_model(request: Request, body: schemas.ClipModelRequest):
    """Seed API (admin): unload that CLIP export (a loaded one first)."""
    return await clip_admin(request, body, "unload")


@router.post("/delete_clip_model", **CLIP_ADMIN)
async def delete_clip_model(request: Request, body: schemas.ClipModelRequest):
    """Seed API (admin): unloads the CLIP export; its files stay (never removed over HTTP)."""
    return await clip_admin(request, body, "unload", delete=True)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request):
    """Prometheus text for the proxy; Triton's own nv_* metrics are on Triton's metrics port."""
    content, media_type = request.app.state.metrics.render()
    return Response(content, 200, media_type=media_type)


async def swagger_ui():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="triton-embed API",
                               swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url="/docs/assets/swagger-ui.css",
                               swagger_favicon_url="/docs/assets/favicon-32x32.png",
                               swagger_ui_parameters={"validatorUrl": None})  # no call to swagger.io


# ---------------------------------------------------------------- the app
async def on_api_error(_request, error):
    return error.response()


async def on_service_error(_request, error):
    return ApiError.of(error).response()


async def on_validation_error(_request, error):
    return validation_error(error).response()


async def on_http_error(_request, error):
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
    return ApiError(error.status_code, str(error.detail), code, headers=getattr(error, "headers", None)).response()


def create_app(settings, service: Service, metrics):
    """settings: api_key, admin_api_key, max_inputs_per_request, max_input_chars, swagger_path (or None)."""
    app = FastAPI(title="triton-embed", version="2.0", docs_url=None, redoc_url=None,
                  description="Text embeddings served by Triton: OpenAI-compatible embeddings, bge-m3's sparse and "
                              "ColBERT outputs, reranking, and the seed API.")
    app.state.settings, app.state.service, app.state.metrics = settings, service, metrics
    app.include_router(router)
    for kind, handler in ((ApiError, on_api_error), (ServiceError, on_service_error),
                          (RequestValidationError, on_validation_error), (HTTPException, on_http_error)):
        app.add_exception_handler(kind, handler)
    if settings.swagger_path:
        app.mount("/docs/assets", StaticFiles(directory=str(settings.swagger_path)), name="swagger-assets")
        app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    return app


def create_server_app(settings, service: Service, metrics):
    """The ASGI app the server runs: the metrics outermost, the gate (guard.py), then the routes: the plain ones
    directly (direct.py), the others through FastAPI."""
    app = create_app(settings, service, metrics)
    return MetricsMiddleware(HttpGuard(DirectRoutes(app, router), settings, service), metrics, app)
