"""HTTP front of the embedding service, itself a Triton model.

initialize() binds the port (a busy port fails the model load), then runs FastAPI on uvicorn in a thread with its
own asyncio loop; uvicorn installs no signal handlers there (Triton owns signals). Handlers call `ensemble` in
process through BLS (`async_exec`, run in the loop's default executor), one BLS request per chunk of at most the
ensemble's max_batch_size texts, chunks in parallel, so concurrent HTTP requests reach Triton's batchers together.
finalize() stops the server and joins the thread, releasing the port.

Routes: GET /health; POST /v1/embedding (seed API); POST /v1/embeddings (OpenAI); GET /v1/models[/{id}];
GET /metrics (Prometheus, the proxy's own; Triton's nv_* stay on its metrics port); /docs (Swagger UI, local
assets) and /openapi.json. Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}:
400 malformed request, 401 missing/wrong API key, 404 unknown model/route, 413 body over max_body_bytes,
422 over a limit (inputs per request, characters per input, tokens with truncate: false), 503 not ready.
Over-long inputs are truncated to max_length tokens unless the request says truncate: false (seed API:
?truncate=false); the OpenAI items then carry "truncated": true and X-Truncated-Inputs counts them.
X-Inference-Time is the milliseconds spent in BLS (the rest of a request's latency is the proxy's own).
Limits and the port are named settings: config.pbtxt parameters, each overridable by an environment variable.
"""
import asyncio
import base64
import bisect
import hmac
import json
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import triton_python_backend_utils as pb_utils
import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response
from swagger_ui_bundle import swagger_ui_path

# Setting name (= config.pbtxt parameter) -> (environment variable that overrides it, type).
SETTINGS = {
    "host": ("PROXY_HOST", str),
    "port": ("PROXY_PORT", int),
    "api_key": ("API_KEY", str),
    "max_inputs_per_request": ("PROXY_MAX_INPUTS_PER_REQUEST", int),
    "max_body_bytes": ("PROXY_MAX_BODY_BYTES", int),
    "max_input_chars": ("PROXY_MAX_INPUT_CHARS", int),
    "bls_concurrency": ("PROXY_BLS_CONCURRENCY", int),
    "ensemble_name": ("PROXY_ENSEMBLE_NAME", str),
    "model_id": (None, str),
    "embedding_size": (None, int),
    "max_length": (None, int),
    "max_batch_size": (None, int),
}
OUTPUTS = ["embedding", "num_tokens", "truncated"]
READY_CACHE_S = 1.0  # a positive is_model_ready() is trusted this long (it is an IPC round trip)
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
TRITON_INPUT_ERROR = re.compile(r"text\[(\d+)\] (.+)")  # the tokenizer's per-text error messages
JSON = "application/json"


class ApiError(Exception):
    def __init__(self, status, message, code=None, param=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers

    def response(self):
        kind = {401: "authentication_error", 503: "service_unavailable"}.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return Response(orjson.dumps(body), self.status, self.headers, JSON)


class Histogram:
    def __init__(self, buckets):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * (len(buckets) + 1), 0.0, 0

    def observe(self, value):
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name, labels=""):
        lines, total = [], 0
        for bound, count in zip(list(self.buckets) + ["+Inf"], self.counts):
            total += count
            lines.append(f'{name}_bucket{{{labels}{"," if labels else ""}le="{bound}"}} {total}')
        suffix = f"{{{labels}}}" if labels else ""
        return lines + [f"{name}_sum{suffix} {self.sum}", f"{name}_count{suffix} {self.count}"]


class Metrics:
    """Prometheus counters; only the server's event loop thread updates them, so no lock."""
    LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
    INPUT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    ROUTES = ("/health", "/metrics", "/v1/embedding", "/v1/embeddings", "/v1/models", "/openapi.json", "/docs")

    def __init__(self):
        self.requests, self.latency, self.in_flight = {}, {}, 0
        self.inputs = Histogram(self.INPUT_BUCKETS)
        self.tokens = self.truncated = 0

    def route(self, path):
        if path in self.ROUTES:
            return path
        if path.startswith("/v1/models/"):
            return "/v1/models/{id}"
        return "/docs" if path.startswith("/docs/") else "other"  # bounded label set

    def observe_request(self, path, status, seconds):
        route = self.route(path)
        self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
        self.latency.setdefault(route, Histogram(self.LATENCY_BUCKETS)).observe(seconds)

    def observe_embedding(self, inputs, tokens, truncated):
        self.inputs.observe(inputs)
        self.tokens += tokens
        self.truncated += truncated

    def render(self):
        out = ["# HELP proxy_requests_total HTTP requests answered, by route and status code.",
               "# TYPE proxy_requests_total counter"]
        out += [f'proxy_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())]
        out += ["# HELP proxy_request_duration_seconds Time from request received to response sent.",
                "# TYPE proxy_request_duration_seconds histogram"]
        for route, histogram in sorted(self.latency.items()):
            out += histogram.render("proxy_request_duration_seconds", f'route="{route}"')
        out += ["# HELP proxy_request_inputs Texts per successful embedding request.",
                "# TYPE proxy_request_inputs histogram", *self.inputs.render("proxy_request_inputs"),
                "# HELP proxy_tokens_total Tokens embedded (after truncation, special tokens included).",
                "# TYPE proxy_tokens_total counter", f"proxy_tokens_total {self.tokens}",
                "# HELP proxy_truncated_inputs_total Texts cut to the model's max length.",
                "# TYPE proxy_truncated_inputs_total counter", f"proxy_truncated_inputs_total {self.truncated}",
                "# HELP proxy_requests_in_flight HTTP requests being answered now.",
                "# TYPE proxy_requests_in_flight gauge", f"proxy_requests_in_flight {self.in_flight}"]
        return "\n".join(out) + "\n"


class MetricsMiddleware:
    """Outermost ASGI layer: counts every answer (errors and 404s included) with its latency."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.in_flight += 1
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.in_flight -= 1
            self.metrics.observe_request(scope["path"], status[0], time.perf_counter() - started)


def _text_schema():
    return {"type": "string", "minLength": 1, "description": "text to embed (not blank)"}


def _error_responses(*statuses):
    error = {"type": "object", "properties": {"error": {"type": "object", "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
        "code": {"type": ["string", "null"]}}}}}
    return {s: {"description": "error", "content": {JSON: {"schema": error}}} for s in statuses}


class Proxy:
    def __init__(self, settings):
        self.__dict__.update(settings)
        self.api_key_bytes = f"Bearer {self.api_key}".encode() if self.api_key else None
        self.metrics = Metrics()
        self.initialized = False  # BLS raises until initialize() has returned
        self.ready_until = 0.0
        self.created = int(time.time())

    # ---------------------------------------------------------------- gates
    def authorize(self, request):
        if self.api_key_bytes is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, self.api_key_bytes):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    async def is_ready(self):
        if not self.initialized:
            return False
        if time.monotonic() < self.ready_until:
            return True
        ready = await asyncio.get_running_loop().run_in_executor(None, pb_utils.is_model_ready, self.ensemble_name)
        if ready:
            self.ready_until = time.monotonic() + READY_CACHE_S
        return ready

    async def ensure_ready(self):
        if not await self.is_ready():
            raise ApiError(503, f"model '{self.ensemble_name}' is not ready yet", "not_ready",
                           headers={"Retry-After": "1"})

    async def read_json(self, request):
        declared = request.headers.get("content-length", "")
        too_large = ApiError(413, f"request body is over the limit of {self.max_body_bytes} bytes "
                                  f"(setting max_body_bytes)", "body_too_large")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_large
            chunks.append(chunk)
        try:
            return orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError as error:
            raise ApiError(400, f"request body is not valid JSON: {error}", "invalid_json") from None

    def check_texts(self, texts, param):
        """Texts -> UTF-8 bytes, enforcing the per-request limits."""
        if len(texts) > self.max_inputs_per_request:
            raise ApiError(422, f"{len(texts)} inputs is over the limit of {self.max_inputs_per_request} per request "
                                f"(setting max_inputs_per_request)", "too_many_inputs", param)
        encoded = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ApiError(400, f"{param}[{i}] must be a string, not {type(text).__name__}", "invalid_type", param)
            if len(text) > self.max_input_chars:
                raise ApiError(422, f"{param}[{i}] has {len(text)} characters, over the limit of "
                                    f"{self.max_input_chars} (setting max_input_chars)", "input_too_long", param)
            if not text.strip():
                raise ApiError(400, f"{param}[{i}] is empty", "empty_input", param)
            try:
                encoded.append(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise ApiError(400, f"{param}[{i}] is not valid Unicode (lone surrogate)", "invalid_text", param) from None
        return encoded

    # ---------------------------------------------------------------- inference
    async def infer_chunk(self, texts, offset, param):
        request = pb_utils.InferenceRequest(
            model_name=self.ensemble_name, requested_output_names=OUTPUTS,
            inputs=[pb_utils.Tensor("text", np.array(texts, dtype=np.object_).reshape(-1, 1))])
        try:
            response = await request.async_exec()
        except Exception as error:  # noqa: BLE001 - BLS refused (stub starting or stopping): not ready
            raise ApiError(503, f"model '{self.ensemble_name}' is not available: {error}", "not_ready") from None
        if response.has_error():
            message = response.error().message()
            bad_input = TRITON_INPUT_ERROR.search(message)
            if bad_input:
                raise ApiError(400, f"{param}[{offset + int(bad_input[1])}] {bad_input[2]}", "invalid_input", param)
            if "unknown model" in message or "not ready" in message or "unavailable" in message.lower():
                self.ready_until = 0.0
                raise ApiError(503, f"model '{self.ensemble_name}' is not available: {message}", "not_ready")
            raise ApiError(500, f"inference failed: {message}", "inference_failed")
        return [pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in OUTPUTS]

    async def embed(self, texts, truncate, param):
        """-> (embeddings [n, dim] float32, tokens per text, truncated per text, response headers), in input
        order. X-Inference-Time: ms spent in BLS calls (TEI sends the same header), the rest is the proxy."""
        step, started = self.max_batch_size, time.perf_counter()
        chunks = [self.infer_chunk(texts[i:i + step], i, param) for i in range(0, len(texts), step)]
        parts = [await chunks[0]] if len(chunks) == 1 else await asyncio.gather(*chunks)
        inference_ms = (time.perf_counter() - started) * 1000
        embeddings, tokens, truncated = (np.concatenate([p[k] for p in parts]) for k in range(3))
        tokens, truncated = tokens.reshape(-1), truncated.reshape(-1)
        if not truncate and truncated.any():
            i = int(np.argmax(truncated))
            raise ApiError(422, f"{param}[{i}] is longer than the model's maximum of {self.max_length} tokens "
                                f"(truncate is false)", "context_length_exceeded", param)
        self.metrics.observe_embedding(len(texts), int(tokens.sum()), int(truncated.sum()))
        headers = {"X-Truncated-Inputs": str(int(truncated.sum())), "X-Inference-Time": f"{inference_ms:.3f}"}
        return embeddings, tokens, truncated, headers

    # ---------------------------------------------------------------- routes
    async def openai_embeddings(self, request):
        self.authorize(request)
        await self.ensure_ready()
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object", "invalid_type")
        if "input" not in body:
            raise ApiError(400, "'input' is required: a string or a list of strings", "missing_input", "input")
        raw = body["input"]
        if isinstance(raw, str):
            raw = [raw]
        elif not isinstance(raw, list) or not raw:
            raise ApiError(400, "'input' must be a string or a non-empty list of strings", "invalid_input", "input")
        elif not isinstance(raw[0], str) and isinstance(raw[0], (int, list)):
            raise ApiError(400, "token arrays are not supported: send text", "invalid_input", "input")
        for key, kind in (("model", str), ("user", str), ("encoding_format", str), ("truncate", bool)):
            if body.get(key) is not None and not isinstance(body[key], kind):
                raise ApiError(400, f"'{key}' must be a {kind.__name__}", "invalid_type", key)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise ApiError(400, f"encoding_format must be 'float' or 'base64', not {encoding!r}", "invalid_value",
                           "encoding_format")
        dimensions = body.get("dimensions")
        if dimensions is not None and (type(dimensions) is not int or dimensions != self.embedding_size):
            raise ApiError(400, f"dimensions: this model only returns {self.embedding_size} dimensions",
                           "invalid_value", "dimensions")
        texts = self.check_texts(raw, "input")
        truncate = body.get("truncate")
        embeddings, tokens, truncated, headers = await self.embed(texts, truncate is not False, "input")
        if encoding == "base64":
            vectors = [base64.b64encode(row.astype("<f4", copy=False).tobytes()).decode("ascii") for row in embeddings]
        else:
            vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
        flags = truncated.tolist()
        data = [{"object": "embedding", "index": i, "embedding": vectors[i], "truncated": flags[i]}
                for i in range(len(texts))]
        used = int(tokens.sum())
        result = {"object": "list", "data": data, "model": self.model_id,
                  "usage": {"prompt_tokens": used, "total_tokens": used}}
        return Response(orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY), 200, headers, JSON)

    async def seed_embedding(self, request, truncate):
        self.authorize(request)
        await self.ensure_ready()
        body = await self.read_json(request)
        if not isinstance(body, list) or not body:
            raise ApiError(400, 'request body must be a non-empty list of {"query": "..."} objects', "invalid_type")
        if not all(isinstance(item, dict) and "query" in item for item in body):
            raise ApiError(400, 'every item must be an object with a "query" string', "invalid_type", "query")
        texts = self.check_texts([item["query"] for item in body], "query")
        embeddings, _, _, headers = await self.embed(texts, truncate, "query")
        vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
        return Response(orjson.dumps([{"embedding": row} for row in vectors], option=orjson.OPT_SERIALIZE_NUMPY),
                        200, headers, JSON)

    def model_card(self):
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "triton-embed",
                "embedding_size": self.embedding_size, "max_input_tokens": self.max_length}

    def build_app(self):
        app = FastAPI(title="triton-embed", version="1.0", docs_url=None, redoc_url=None,
                      description="Text embeddings served by Triton: an OpenAI-compatible API and the seed API.")
        seed_body = {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["query"], "properties": {"query": _text_schema()}}}
        openai_body = {"type": "object", "required": ["input"], "properties": {
            "input": {"anyOf": [_text_schema(), {"type": "array", "minItems": 1, "items": _text_schema()}]},
            "model": {"type": "string", "description": f"accepted; the served model is {self.model_id}"},
            "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float"},
            "dimensions": {"type": "integer", "description": f"only {self.embedding_size} is accepted"},
            "user": {"type": "string"},
            "truncate": {"type": "boolean", "default": True,
                         "description": f"false: inputs over {self.max_length} tokens are an error (422)"}}}
        vector = {"type": "array", "items": {"type": "number"}}
        item = {"type": "object", "properties": {"object": {"type": "string"}, "index": {"type": "integer"},
                "embedding": {"anyOf": [vector, {"type": "string"}]}, "truncated": {"type": "boolean"}}}
        openai_out = {"type": "object", "properties": {
            "object": {"type": "string"}, "data": {"type": "array", "items": item}, "model": {"type": "string"},
            "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                       "total_tokens": {"type": "integer"}}}}}
        seed_out = {"type": "array", "items": {"type": "object", "properties": {"embedding": vector}}}
        errors = _error_responses(400, 401, 413, 422, 503)

        def body_doc(schema):
            return {"requestBody": {"required": True, "content": {JSON: {"schema": schema}}}}

        @app.exception_handler(ApiError)
        async def on_api_error(_request, error):
            return error.response()

        @app.exception_handler(RequestValidationError)
        async def on_validation_error(_request, error):
            detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            return ApiError(400, detail, "invalid_parameter").response()

        @app.exception_handler(HTTPException)
        async def on_http_error(_request, error):
            return ApiError(error.status_code, str(error.detail), "not_found" if error.status_code == 404 else None,
                            headers=getattr(error, "headers", None)).response()

        @app.get("/health", response_class=PlainTextResponse, responses={503: {"description": "not ready"}})
        async def health():
            """200 `ok` when the ensemble is ready, 503 otherwise. Never needs the API key."""
            ready = await self.is_ready()
            return PlainTextResponse("ok" if ready else "not ready", 200 if ready else 503)

        @app.post("/v1/embeddings", openapi_extra=body_doc(openai_body),
                  responses={200: {"content": {JSON: {"schema": openai_out}}}, **errors})
        async def embeddings(request: Request):
            """OpenAI-compatible embeddings (`encoding_format` float or base64 little-endian float32)."""
            return await self.openai_embeddings(request)

        @app.post("/v1/embedding", openapi_extra=body_doc(seed_body),
                  responses={200: {"content": {JSON: {"schema": seed_out}}}, **errors})
        async def embedding(request: Request, truncate: bool = Query(True, description="false: over-long = 422")):
            """Seed API: `[{"query": "..."}]` -> `[{"embedding": [...]}]`."""
            return await self.seed_embedding(request, truncate)

        @app.get("/v1/models", responses=_error_responses(401))
        async def models(request: Request):
            self.authorize(request)
            return Response(orjson.dumps({"object": "list", "data": [self.model_card()]}), 200, None, JSON)

        @app.get("/v1/models/{model_id:path}", responses=_error_responses(401, 404))
        async def model(request: Request, model_id: str):
            self.authorize(request)
            if model_id != self.model_id:
                raise ApiError(404, f"model '{model_id}' is not served here; {self.model_id} is", "model_not_found")
            return Response(orjson.dumps(self.model_card()), 200, None, JSON)

        @app.get("/metrics", response_class=PlainTextResponse)
        async def metrics():
            """Prometheus text for the proxy; Triton's own nv_* metrics are on Triton's metrics port."""
            return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

        app.mount("/docs/assets", StaticFiles(directory=str(swagger_ui_path)), name="swagger-assets")

        @app.get("/docs", include_in_schema=False)
        async def docs():
            return get_swagger_ui_html(openapi_url="/openapi.json", title="triton-embed API",
                                       swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                       swagger_css_url="/docs/assets/swagger-ui.css",
                                       swagger_favicon_url="/docs/assets/favicon-32x32.png",
                                       swagger_ui_parameters={"validatorUrl": None})  # no call to swagger.io

        return app

    # ---------------------------------------------------------------- lifecycle
    def start(self):
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets; without it, a response written as
        # headers + body waits ~40 ms for the client's delayed ACK (Nagle).
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; a listener still wins
        try:
            self.socket.bind((self.host, self.port))
        except OSError as error:
            self.socket.close()
            raise pb_utils.TritonModelException(
                f"proxy: cannot listen on {self.host}:{self.port} ({error.strerror}); "
                f"set PROXY_PORT or the 'port' parameter to a free port") from None
        self.socket.listen(2048)
        config = uvicorn.Config(MetricsMiddleware(self.build_app(), self.metrics), lifespan="off",
                                log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="proxy-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise pb_utils.TritonModelException("proxy: the HTTP server did not start (see the log above)")
            time.sleep(0.01)

    def _serve(self):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        # async_exec() runs each blocking BLS call in this executor: its size bounds BLS calls in flight.
        executor = ThreadPoolExecutor(self.bls_concurrency, thread_name_prefix="proxy-bls")
        loop.set_default_executor(executor)
        try:
            loop.run_until_complete(self.server.serve(sockets=[self.socket]))
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()

    def stop(self):
        self.initialized = False
        server = getattr(self, "server", None)
        if server is not None:
            server.should_exit = True
            self.thread.join(STOP_TIMEOUT_S)
            if self.thread.is_alive():
                server.force_exit = True
                self.thread.join(2.0)
        self.socket.close()


def _read_settings(config):
    parameters = config.get("parameters", {})
    settings = {}
    for name, (variable, kind) in SETTINGS.items():
        value = os.environ.get(variable) if variable else None
        if value is None:
            if name not in parameters:
                raise pb_utils.TritonModelException(f"proxy: config.pbtxt has no parameter '{name}'")
            value = parameters[name]["string_value"]
        try:
            settings[name] = kind(value)
        except ValueError:
            raise pb_utils.TritonModelException(f"proxy: setting {name}={value!r} is not a {kind.__name__}") from None
    return settings


class TritonPythonModel:
    def initialize(self, args):
        self.proxy = Proxy(_read_settings(json.loads(args["model_config"])))
        self.proxy.start()
        print(f"proxy: serving http://{self.proxy.host}:{self.proxy.port} for {self.proxy.ensemble_name} "
              f"({self.proxy.model_id}); API key {'required' if self.proxy.api_key else 'off'}", flush=True)
        # The thread may call BLS from now on: the stub marks itself initialized as soon as we return.
        self.proxy.initialized = True

    def execute(self, requests):
        error = pb_utils.TritonError(f"the proxy model answers HTTP on port {self.proxy.port} "
                                     f"(POST /v1/embeddings), not Triton inference requests")
        return [pb_utils.InferenceResponse(error=error) for _ in requests]

    def finalize(self):
        self.proxy.stop()
        print("proxy: stopped, port released", flush=True)
