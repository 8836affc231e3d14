"""The HTTP API: FastAPI routes over an injected `service` (the served models, inference, health, admin).

Routes: GET /health (ready), /health/live; OpenAI POST /v1/embeddings, GET /v1/models[/{id}]; seed API
POST /v1/embedding; bge-m3: POST /v1/encode (dense, sparse and/or ColBERT), TEI's POST /embed_sparse,
POST /v1/rerank (M3 combined score); admin POST /v1/models/{id}/load|unload, DELETE /v1/models/{id};
GET /metrics; /docs and /openapi.json. Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}.

No Triton import here: model.py passes a service that calls the ensembles through BLS, and tests pass a fake one
(see tests/test_proxy_app.py). The service's contract is in `Service` below.
"""
import asyncio
import base64
import hmac
import time

import numpy as np
import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response

import schemas

JSON = "application/json"
MODES = ("dense", "sparse", "colbert")  # the rerank model's mode_scores columns
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
               408: "timeout_error", 429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}


MAX_MESSAGE_CHARS = 1000  # an error that quotes a client's value (a 1 MB model id) is cut: no 1 MB error back


class ApiError(Exception):
    def __init__(self, status, message, code=None, param=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers

    def response(self):
        kind = ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        message = self.message if len(self.message) <= MAX_MESSAGE_CHARS else \
            f"{self.message[:MAX_MESSAGE_CHARS]}... ({len(self.message)} characters, cut)"
        body = {"error": {"message": message, "type": kind, "param": self.param, "code": self.code}}
        return Response(orjson.dumps(body), self.status, self.headers, JSON)


class Service:
    """What the routes need from the serving side (model.py's BLS implementation, or a test's fake).

    cards() -> [Card]: the loaded models; resolve(model) -> Card (ApiError 404 / 503); health() / live() ->
    (ok, reason), cheap (no inference); draining: True while shutting down;
    async embed(card, texts, outputs, param) -> Embeddings; async rerank(card, query, documents, weights) ->
    RerankResult; async load(id) / unload(id) / delete(id) -> seconds.
    Card: id, name, outputs, embedding_size, colbert_size, max_length, source, created.
    Embeddings: dense [n, d] | None, sparse [(ids, weights)] | None, colbert [[m, c]] | None, tokens [n],
    truncated [n], inference_ms.
    RerankResult: scores [n], mode_scores [n, 3] (dense, sparse, ColBERT), tokens, query_truncated, truncated [n],
    inference_ms."""


def json_response(content, headers=None):
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), 200, headers, JSON)


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


def validation_error(error):
    """pydantic's errors in today's codes: missing_input, invalid_type, invalid_value, invalid_json."""
    first = error.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = location[0] if location else None
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                       for e in error.errors()[:5])
    kind = first.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
                        "invalid_json")
    if kind == "missing":
        return ApiError(400, detail, f"missing_{param}" if param in ("input", "inputs", "query", "documents")
                        else "invalid_parameter", param)
    if kind in ("literal_error", "enum", "greater_than_equal", "too_short", "too_long"):
        return ApiError(400, detail, "invalid_value", param)
    return ApiError(400, detail, "invalid_type", param)


def create_app(settings, service, metrics):
    """settings: api_key, admin_api_key, max_inputs_per_request, max_input_chars, swagger_path (or None)."""
    app = FastAPI(title="triton-embed", version="2.0", docs_url=None, redoc_url=None,
                  description="Text embeddings served by Triton: OpenAI-compatible embeddings, bge-m3's sparse and "
                              "ColBERT outputs, reranking, and the seed API.")
    app.router.route_class = OrjsonRoute
    errors = {status: {"model": schemas.ErrorResponse} for status in (400, 401, 404, 413, 415, 422, 429, 503, 504)}
    admin_errors = {status: {"model": schemas.ErrorResponse} for status in (401, 403, 404, 409, 422, 503)}

    # ---------------------------------------------------------------- gates
    def authorize(request, key, what="API"):
        """`Authorization: Bearer <key>`; the scheme is case-insensitive (RFC 9110)."""
        if not key:
            return
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, f"missing or wrong {what} key: send 'Authorization: Bearer <key>'",
                           "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def authorize_admin(request: Request):
        if not settings.admin_api_key:
            raise ApiError(403, "the admin routes are off: set ADMIN_API_KEY (or ADMIN_API_KEY_FILE) to use them",
                           "admin_disabled")
        authorize(request, settings.admin_api_key, "admin")

    # As route dependencies, the keys are checked before the body is validated: a caller without the key learns
    # nothing about the request schema.
    def user_key(request: Request):
        authorize(request, settings.api_key)

    user = [Depends(user_key)]
    admin_route = {"dependencies": [Depends(authorize_admin)], "response_model": schemas.AdminResult,
                   "responses": admin_errors}

    def select(request, model):
        card = service.resolve(model)
        request.scope["state"]["model"] = card.id
        return card

    def check_texts(texts, param):
        if len(texts) > settings.max_inputs_per_request:
            raise ApiError(422, f"{len(texts)} inputs is over the limit of {settings.max_inputs_per_request} per "
                                f"request (setting max_inputs_per_request)", "too_many_inputs", param)
        for i, text in enumerate(texts):
            if len(text) > settings.max_input_chars:
                raise ApiError(422, f"{param}[{i}] has {len(text)} characters, over the limit of "
                                    f"{settings.max_input_chars} (setting max_input_chars)", "input_too_long", param)
            if not text.strip():
                raise ApiError(400, f"{param}[{i}] is empty", "empty_input", param)
        return texts

    def need(card, output, route):
        if output not in card.outputs:
            raise ApiError(400, f"model '{card.id}' serves {', '.join(card.outputs)}, not {output} (needed by "
                                f"{route}); export it with --outputs {output}", "output_not_served", "model")

    async def embed(card, texts, outputs, param, truncate):
        result = await service.embed(card, texts, outputs, param)
        if not truncate and result.truncated.any():
            i = int(np.argmax(result.truncated))
            raise ApiError(422, f"{param}[{i}] is longer than the model's maximum of {card.max_length} tokens "
                                f"(truncate is false)", "context_length_exceeded", param)
        metrics.observe_embedding(card.id, len(texts), int(result.tokens.sum()), int(result.truncated.sum()))
        return result

    def usage(result):
        used = int(result.tokens.sum())
        return {"prompt_tokens": used, "total_tokens": used}

    def headers(result):
        # TEI sends the same: ms spent in Triton; the rest of a request's latency is the proxy's own.
        return {"X-Truncated-Inputs": str(int(result.truncated.sum())),
                "X-Inference-Time": f"{result.inference_ms:.3f}"}

    # ---------------------------------------------------------------- error handlers
    @app.exception_handler(ApiError)
    async def on_api_error(_request, error):
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_request, error):
        return validation_error(error).response()

    @app.exception_handler(HTTPException)
    async def on_http_error(_request, error):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return ApiError(error.status_code, str(error.detail), code, headers=getattr(error, "headers", None)).response()

    # ---------------------------------------------------------------- health
    @app.get("/health", response_class=PlainTextResponse, responses={503: {"description": "not ready"}})
    async def health():
        """200 `ok` when the default model and everything it needs are ready, else 503 with the reason. Answered
        from state the readiness thread keeps: no inference, never queued behind one. Never needs a key."""
        ok, reason = service.health()
        return PlainTextResponse("ok" if ok else reason, 200 if ok else 503, {} if ok else {"Retry-After": "1"})

    @app.get("/health/live", response_class=PlainTextResponse, responses={503: {"description": "not alive"}})
    async def live():
        """200 while the proxy serves and no dead Python stub is left unrecovered (a liveness probe)."""
        ok, reason = service.live()
        return PlainTextResponse("ok" if ok else reason, 200 if ok else 503)

    # ---------------------------------------------------------------- embeddings
    @app.post("/v1/embeddings", dependencies=user, response_model=schemas.EmbeddingsResponse, responses=errors)
    async def embeddings(request: Request, body: schemas.EmbeddingsRequest):
        """OpenAI-compatible embeddings (`encoding_format` float, or base64 little-endian float32)."""
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ApiError(400, "'input' must be a string or a non-empty list of strings", "invalid_input", "input")
        if not all(isinstance(t, str) for t in texts):
            raise ApiError(400, "token arrays are not supported: send text", "invalid_input", "input")
        card = select(request, body.model)
        need(card, "dense", "/v1/embeddings")
        if body.dimensions is not None and body.dimensions != card.embedding_size:
            raise ApiError(400, f"dimensions: this model only returns {card.embedding_size} dimensions",
                           "invalid_value", "dimensions")
        result = await embed(card, check_texts(texts, "input"), ("dense",), "input", body.truncate)
        if body.encoding_format == "base64":
            vectors = [base64.b64encode(row.astype("<f4", copy=False).tobytes()).decode("ascii")
                       for row in result.dense]
        else:
            vectors = np.ascontiguousarray(result.dense, dtype=np.float32)
        flags = result.truncated.tolist()
        data = [{"object": "embedding", "index": i, "embedding": vectors[i], "truncated": flags[i]}
                for i in range(len(texts))]
        return json_response({"object": "list", "data": data, "model": card.id, "usage": usage(result)},
                             headers(result))

    @app.post("/v1/embedding", dependencies=user, response_model=list[schemas.SeedResult], responses=errors)
    async def seed_embedding(request: Request, body: list[schemas.SeedItem],
                             truncate: bool = Query(True, description="false: over-long = 422"),
                             model: str | None = Query(None, description="served model id (default model)")):
        """Seed API: `[{"query": "..."}]` -> `[{"embedding": [...]}]`."""
        if not body:
            raise ApiError(400, 'request body must be a non-empty list of {"query": "..."} objects', "invalid_type")
        card = select(request, model)
        need(card, "dense", "/v1/embedding")
        texts = check_texts([item.query for item in body], "query")
        result = await embed(card, texts, ("dense",), "query", truncate)
        vectors = np.ascontiguousarray(result.dense, dtype=np.float32)
        return json_response([{"embedding": row} for row in vectors], headers(result))

    @app.post("/v1/encode", dependencies=user, response_model=schemas.EncodeResponse, responses=errors)
    async def encode(request: Request, body: schemas.EncodeRequest):
        """Any combination of dense, sparse ({indices, values}, as Milvus and Qdrant take it) and ColBERT vectors
        per input, from one forward pass (FlagEmbedding's encode(return_dense, return_sparse, return_colbert_vecs))."""
        texts = check_texts([body.input] if isinstance(body.input, str) else body.input, "input")
        if not texts:
            raise ApiError(400, "'input' must not be empty", "invalid_input", "input")
        card = select(request, body.model)
        wanted = tuple(kind for kind, flag in (("dense", body.return_dense), ("sparse", body.return_sparse),
                                               ("colbert", body.return_colbert)) if flag)
        if not wanted:
            raise ApiError(400, "ask for at least one of return_dense, return_sparse, return_colbert", "invalid_value")
        for kind in wanted:
            need(card, kind, "/v1/encode")
        result = await embed(card, texts, wanted, "input", body.truncate)
        data = []
        for i in range(len(texts)):
            item = {"index": i, "truncated": bool(result.truncated[i])}
            if "dense" in wanted:
                item["dense"] = result.dense[i]
            if "sparse" in wanted:
                item["sparse"] = {"indices": result.sparse[i][0], "values": result.sparse[i][1]}
            if "colbert" in wanted:
                item["colbert"] = result.colbert[i]
            data.append(item)
        return json_response({"object": "list", "data": data, "model": card.id, "usage": usage(result)},
                             headers(result))

    @app.post("/embed_sparse", dependencies=user, response_model=list[list[schemas.SparseEntry]], responses=errors)
    async def embed_sparse(request: Request, body: schemas.EmbedSparseRequest):
        """TEI's sparse route: `[[{"index": token id, "value": weight}, ...], ...]` per input."""
        texts = check_texts([body.inputs] if isinstance(body.inputs, str) else body.inputs, "inputs")
        if not texts:
            raise ApiError(400, "'inputs' must not be empty", "invalid_input", "inputs")
        card = select(request, body.model)
        need(card, "sparse", "/embed_sparse")
        result = await embed(card, texts, ("sparse",), "inputs", body.truncate)
        return json_response([[{"index": int(t), "value": float(w)} for t, w in zip(*pair)]
                              for pair in result.sparse], headers(result))

    @app.post("/v1/rerank", dependencies=user, response_model=schemas.RerankResponse, responses=errors)
    async def rerank(request: Request, body: schemas.RerankRequest):
        """Scores each document against the query with the export's rerank model: bge-m3's combined score, as
        FlagEmbedding's compute_score ('colbert+sparse+dense' with `weights`); models without sparse/ColBERT outputs
        use what they serve."""
        documents = [d if isinstance(d, str) else d.text for d in body.documents]
        if not body.query.strip():
            raise ApiError(400, "query is empty", "empty_input", "query")
        if len(body.query) > settings.max_input_chars:
            raise ApiError(422, f"query has {len(body.query)} characters, over the limit of {settings.max_input_chars}"
                                f" (setting max_input_chars)", "input_too_long", "query")
        check_texts(documents, "documents")
        card = select(request, body.model)
        served = [mode for mode in MODES if mode in card.outputs]
        if not served:
            raise ApiError(400, f"model '{card.id}' serves none of dense, sparse, colbert", "output_not_served")
        result = await service.rerank(card, body.query, documents, body.weights or (1.0, 1.0, 1.0))
        if not body.truncate and (result.query_truncated or result.truncated.any()):
            what = "query" if result.query_truncated else f"documents[{int(np.argmax(result.truncated))}]"
            raise ApiError(422, f"{what} is longer than the model's maximum of {card.max_length} tokens "
                                f"(truncate is false)", "context_length_exceeded", what.split("[")[0])
        truncated = int(result.query_truncated) + int(result.truncated.sum())
        metrics.observe_embedding(card.id, 1 + len(documents), result.tokens, truncated)
        scores = result.scores.tolist()
        order = sorted(range(len(documents)), key=lambda i: -scores[i])[:body.top_n or len(documents)]
        results = [{"index": i, "relevance_score": scores[i],
                    "scores": {mode: float(result.mode_scores[i, MODES.index(mode)]) for mode in served},
                    **({"document": {"text": documents[i]}} if body.return_documents else {})} for i in order]
        usage_tokens = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
        return json_response({"results": results, "model": card.id, "usage": usage_tokens},
                             {"X-Truncated-Inputs": str(truncated), "X-Inference-Time": f"{result.inference_ms:.3f}"})

    # ---------------------------------------------------------------- models
    def card_json(card):
        return {"id": card.id, "object": "model", "created": card.created, "owned_by": "triton-embed",
                "embedding_size": card.embedding_size, "max_input_tokens": card.max_length,
                "outputs": list(card.outputs), "source": card.source}

    @app.get("/v1/models", dependencies=user, response_model=schemas.ModelList, responses=errors)
    async def models(request: Request):
        """The models loaded now (a model exported or loaded after start-up appears here)."""
        return json_response({"object": "list", "data": [card_json(c) for c in service.cards()]})

    @app.get("/v1/models/{model_id:path}", dependencies=user, response_model=schemas.ModelCard, responses=errors)
    async def model(request: Request, model_id: str):
        return json_response(card_json(select(request, model_id)))

    async def admin(request, model_id, action):
        # model_id takes a hub id's '/'; it is only ever looked up among the exports' cards, never a path
        request.scope["state"]["model"] = model_id
        seconds = await getattr(service, action)(model_id)
        status = {"load": "loaded", "unload": "unloaded", "delete": "deleted"}[action]
        return json_response({"id": model_id, "status": status, "seconds": round(seconds, 3)})

    @app.post("/v1/models/{model_id:path}/load", **admin_route)
    async def load(request: Request, model_id: str):
        """Admin: load (or reload) an exported model; models already serving keep serving. Needs ADMIN_API_KEY."""
        return await admin(request, model_id, "load")

    @app.post("/v1/models/{model_id:path}/unload", **admin_route)
    async def unload(request: Request, model_id: str):
        """Admin: unload a model; its in-flight requests finish first. Needs ADMIN_API_KEY."""
        return await admin(request, model_id, "unload")

    @app.delete("/v1/models/{model_id:path}", **admin_route)
    async def delete(request: Request, model_id: str):
        """Admin: delete an unloaded model's files from the repository (409 while loaded). Needs ADMIN_API_KEY."""
        return await admin(request, model_id, "delete")

    # ---------------------------------------------------------------- metrics and docs
    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        """Prometheus text for the proxy; Triton's own nv_* metrics are on Triton's metrics port."""
        content, media_type = metrics.render()
        return Response(content, 200, media_type=media_type)

    if settings.swagger_path:
        app.mount("/docs/assets", StaticFiles(directory=str(settings.swagger_path)), name="swagger-assets")

        @app.get("/docs", include_in_schema=False)
        async def docs():
            return get_swagger_ui_html(openapi_url="/openapi.json", title="triton-embed API",
                                       swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                       swagger_css_url="/docs/assets/swagger-ui.css",
                                       swagger_favicon_url="/docs/assets/favicon-32x32.png",
                                       swagger_ui_parameters={"validatorUrl": None})  # no call to swagger.io
    return app


class HttpGuard:
    """ASGI layer under the metrics: refuses what must never reach a route, and stops work nobody waits for.

    - while shutting down: 503 with Retry-After;
    - over max_concurrent_requests inference requests at once: 429 with Retry-After, at once (admission control:
      the excess is refused, not queued until it times out; admin routes are not counted);
    - a body that is not JSON: 415 (stops cross-site "simple" POSTs), over max_body_bytes: 413, not received within
      body_timeout_s: 408;
    - a client that leaves before its answer: the route is cancelled (its Triton call's result is dropped) and the
      request counts as 499."""

    def __init__(self, app, settings, service):
        self.app, self.settings, self.service = app, settings, service
        self.admitted = 0  # inference requests in the app now (one event loop: no lock needed)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):  # probes, metrics, model lists: answered while draining
            return await self.run(scope, receive, send, None)
        if self.service.draining:
            return await self.refuse(send, ApiError(503, "the server is shutting down", "shutting_down",
                                                    headers={"Retry-After": "1"}))
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.run(scope, receive, send, None)
        inference = not scope["path"].startswith("/v1/models/")
        if inference and self.admitted >= self.settings.max_concurrent_requests:
            return await self.refuse(send, ApiError(
                429, f"the server is busy: {self.admitted} requests in progress, the limit is "
                     f"{self.settings.max_concurrent_requests} (setting max_concurrent_requests); retry", "overloaded",
                headers={"Retry-After": "1", "Connection": "close"}))
        self.admitted += inference
        try:
            try:
                body = await self.read_body(scope, receive)
            except ApiError as error:
                return await self.refuse(send, error)
            except ConnectionError:
                return  # client left while sending: nothing to answer
            return await self.run(scope, receive, send, body)
        finally:
            self.admitted -= inference

    async def read_body(self, scope, receive):
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        declared = headers.get(b"content-length", b"")
        limit = self.settings.max_body_bytes
        close = {"Connection": "close"}  # refused before its body was read: the connection goes with it
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes (setting max_body_bytes)",
                           "body_too_large", headers=close)
        # No body at all (Content-Length 0, or neither it nor chunked: `curl -X POST .../load`) needs no type.
        empty = declared == b"0" or (not declared and b"transfer-encoding" not in headers)
        if content_type != b"application/json" and not content_type.endswith(b"+json") and not empty:
            raise ApiError(415, "send the body as JSON with 'Content-Type: application/json'",
                           "unsupported_media_type", headers=close)
        chunks, size = [], 0
        deadline = time.monotonic() + self.settings.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise ApiError(408, f"request body not received within {self.settings.body_timeout_s:g} s "
                                    f"(setting body_timeout_s)", "body_timeout", headers=close) from None
            if message["type"] == "http.disconnect":
                raise ConnectionError
            size += len(message.get("body", b""))
            if size > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes (setting max_body_bytes)",
                               "body_too_large", headers=close)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    async def run(self, scope, receive, send, body):
        """The app, fed the buffered body, racing the client's disconnect."""
        if body is None:
            return await self.app(scope, receive, send)
        replayed, disconnected = [False], asyncio.Event()

        async def replay():
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        task, watcher = asyncio.ensure_future(self.app(scope, replay, send)), asyncio.ensure_future(watch())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():  # the client left: stop waiting for its answer
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - nobody is left to answer
                    pass
            else:
                task.result()
        finally:
            watcher.cancel()

    @staticmethod
    async def refuse(send, error):
        response = error.response()
        await response({"type": "http"}, None, send)
