"""The HTTP API: FastAPI routes translating HTTP to the service (the Service protocol below: service.py calls Triton
through BLS, tests pass a fake). No Triton import here. The server runs create_server_app: the plain routes' requests
go to their functions directly (direct.py), the others through FastAPI.

Routes here: GET /health (ready), /health/live; OpenAI POST /v1/embeddings, GET /v1/models[/{id}] (also without
/v1, as Infinity's clients post); seed API POST /v1/embedding; bge-m3: POST /v1/encode; POST /v1/chunk_embeddings
(late chunking); CLIP exports: images in /v1/embeddings, seed API POST /infer (images.py turns the items into bytes);
Cohere's routes (embed, rerank, /v1/rerank included) in routes_cohere.py, TEI's in routes_tei.py;
admin POST /v1/models/{id}/load|unload, seed API POST /load_clip_model, /unload_clip_model, /delete_clip_model;
GET /metrics; /docs, /openapi.json. The app's state: settings, service, metrics (create_app).
"""
import os
import time
from types import SimpleNamespace
from typing import Protocol

import images
import numpy as np
import routes_cohere
import routes_tei
from direct import DirectRoutes
from errors import ServiceError
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from guard import HttpGuard
from http_errors import ApiError, dialect, validation_error
from route_helpers import (
    ERRORS,
    QUANTIZED,
    USER,
    OrjsonRoute,
    admin_key,
    as_list,
    check_texts,
    client_indices,
    embed,
    embed_images,
    json_response,
    need,
    need_images,
    select,
    timing_headers,
    usage,
    vector_rows,
)
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response

import schemas
from metrics import MetricsMiddleware

UNKNOWN_MODEL_LABEL = "(unknown)"  # the metrics' model label of an admin request for an id no export has
# Which code serves the `backend: "onnxruntime"` models, as the launcher set it (local_triton/launch.py); None: not
# started by the launcher
ONNXRUNTIME_BACKEND = os.environ.get("TRITON_EMBED_ONNXRUNTIME_BACKEND")


class Service(Protocol):
    """What the routes need from the serving side. Card: id, name, outputs, embedding_size, colbert_size,
    max_length, source, created, kind, rerank, chunks (None: none); CLIP exports: image, architecture, pretrained
    (image None: text only). exports(): every export, loaded or not. embed_images -> vectors [n, d], inference_ms.
    embed -> dense [n, d] | None, sparse [(ids, weights)] | None, colbert [[m, c]] |
    None, tokens [n], truncated [n], inference_ms, token_vectors [[m, d]] | None. rerank -> scores [n],
    mode_scores [n, 3] | None, tokens, query_truncated, truncated [n], inference_ms. predict (cross-encoders) ->
    logits [n, labels], scores [n, labels], tokens, truncated [n], inference_ms. tokenize -> per text [Token(id,
    text, special, start, stop)]; decode -> [text]. Failures raise errors.ServiceError kinds."""

    draining: bool

    def cards(self): ...

    def resolve(self, model): ...

    def exports(self): ...

    def health(self): ...

    def live(self): ...

    async def embed(self, card, texts, outputs, param, parameters=None): ...

    async def embed_images(self, card, images, param, indices=None): ...

    async def rerank(self, card, query, documents, weights, parameters=None): ...

    async def predict(self, card, inputs, param, parameters=None): ...

    async def tokenize(self, card, texts, param, parameters): ...

    async def decode(self, card, ids, param, parameters): ...

    async def chunk_embed(self, card, texts, spans, parameters): ...

    async def load(self, model_id): ...

    async def unload(self, model_id): ...


ADMIN = {"dependencies": [Depends(admin_key)], "response_model": schemas.AdminResult,
         "responses": {status: {"model": schemas.ErrorResponse} for status in (401, 403, 404, 409, 422, 503)}}
CLIP_ADMIN = {**ADMIN, "response_model": schemas.ClipAdminResult}
EXPORT_CLIP = "python build/export.py --open-clip ViT-B-32 --pretrained laion2b_s34b_b79k --name <name>"
router = APIRouter(route_class=OrjsonRoute)


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
@router.post("/embeddings", dependencies=USER, response_model=schemas.EmbeddingsResponse, responses=ERRORS)
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
def card_json(card, name=None):
    """An export's model card; under one of its served names (`name`), that name with `root` the export's id."""
    return {"id": name or card.id, "object": "model", "created": card.created, "owned_by": "triton-embed",
            "embedding_size": card.embedding_size, "max_input_tokens": card.max_length,
            "outputs": list(card.outputs), "source": card.source, "kind": card.kind,
            "prompts": dict(card.prompts), "default_prompt_name": card.default_prompt_name,
            **({"root": card.id} if name and name != card.id else {})}


@router.get("/models", dependencies=USER, response_model=schemas.ModelList, responses=ERRORS)
@router.get("/v1/models", dependencies=USER, response_model=schemas.ModelList, responses=ERRORS)
async def models(request: Request):
    """The models loaded now (a model exported or loaded after start-up appears here), each also under its served
    names (export --served-name, setting served_model_names)."""
    return json_response({"object": "list", "data": [card_json(c, name) for c in request.app.state.service.cards()
                                                     for name in (c.id, *c.served_names)],
                          "onnxruntime_backend": ONNXRUNTIME_BACKEND})


@router.get("/models/{model_id:path}", dependencies=USER, response_model=schemas.ModelCard, responses=ERRORS)
@router.get("/v1/models/{model_id:path}", dependencies=USER, response_model=schemas.ModelCard, responses=ERRORS)
async def model(request: Request, model_id: str):
    card = select(request, model_id)
    return json_response(card_json(card, model_id if model_id in card.served_names else None))


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
async def on_api_error(request, error):
    return error.response(dialect(request.scope))


async def on_service_error(request, error):
    return ApiError.of(error).response(dialect(request.scope))


async def on_validation_error(request, error):
    return validation_error(error).response(dialect(request.scope))


async def on_http_error(request, error):
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
    return ApiError(error.status_code, str(error.detail), code,
                    headers=getattr(error, "headers", None)).response(dialect(request.scope))


ROUTERS = (router, routes_cohere.router, routes_tei.router)  # this module's, Cohere's and TEI's routes


def create_app(settings, service: Service, metrics):
    """settings: api_key, admin_api_key, max_inputs_per_request, max_input_chars, swagger_path (or None)."""
    app = FastAPI(title="triton-embed", version="2.0", docs_url=None, redoc_url=None,
                  description="Text embeddings served by Triton: OpenAI-compatible embeddings, bge-m3's sparse and "
                              "ColBERT outputs, reranking, and the seed API.")
    app.state.settings, app.state.service, app.state.metrics = settings, service, metrics
    for routes in ROUTERS:
        app.include_router(routes)
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
    return MetricsMiddleware(HttpGuard(DirectRoutes(app, *ROUTERS), settings, service), metrics, app)
