"""The proxy model: an HTTP server inside Triton (one container ships) that translates HTTP to Triton calls on the
exports' models, in-process through BLS. This file is the Triton glue: settings, and the package http_front/ beside it
wired up:
  app.py        the app, assembled from one router per dialect over the service's protocol (ServiceProtocol); each
                dialect a folder, its routes.py beside its schemas.py (its request and response types): openai/
                (OpenAI's API, and this server's own routes in its shape), seed/ (the seed API), cohere/ (Cohere's
                API), tei/ (TEI's API), admin/ (load, unload), server/ (probes, /metrics, no types); schemas.py the
                types they share; dialects.py makes each router and says which dialect a path speaks;
                route_helpers.py what the routes share (key gates, model lookup, HTTP's own rules on the inputs,
                each once, the embed and rerank calls)
  service.py    the service, in parts over one state: busy.py (what a request the gate refused still gets: a text
                over the max length with truncate false, asked of the tokenizer alone), inference.py (BLS calls to
                each export's models, the models' errors as kinds), model_control.py (load/unload), readiness.py's
                ModelReadiness (which models are ready); prechecks.py the models' refusals that need no tokens,
                given before admission (admission.py)
  registry.py   the exports (Card each) and their models' readiness;  triton_server.py  Triton's HTTP API (library)
  readiness.py  keeps readiness current; calls on a model that stops being ready fail at once
  guard.py      admission, the body read (bodies.py), disconnects;  http_server.py  uvicorn in its own thread
  bodies.py     a request's body, one way for every route: read (the one content type rule, size, time), parsed,
                validated
  direct.py     the plain routes' requests (every route with a body) without FastAPI's request pipeline;
                baseline.py the same app through FastAPI's pipeline (bench and tests only: never imported here)
  images.py     images over HTTP (CLIP exports): base64, data URIs, URL fetching and their limits
  errors.py     the error table: every error's kind, its status and each dialect's body (OpenAI's, Cohere's,
                TEI's); http_errors.py FastAPI's and pydantic's errors as kinds;  metrics.py Prometheus
Dead stubs are the supervisor model's job (../supervisor), not this one's.
"""
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from http_front.app import create_server_app
from http_front.http_server import Server
from http_front.metrics import Metrics
from http_front.readiness import Readiness
from http_front.registry import Registry
from http_front.service import Service
from model_library.triton_server import TritonHttp, secret


def boolean(value):
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


# Setting (= config.pbtxt parameter) -> (environment variable that overrides it, type).
SETTINGS = {
    "host": ("PROXY_HOST", str),
    "port": ("PROXY_PORT", int),
    "default_model": ("PROXY_DEFAULT_MODEL", str),
    "served_model_names": ("PROXY_SERVED_MODEL_NAMES", str),
    "max_inputs_per_request": ("PROXY_MAX_INPUTS_PER_REQUEST", int),
    "max_body_bytes": ("PROXY_MAX_BODY_BYTES", int),
    "max_input_chars": ("PROXY_MAX_INPUT_CHARS", int),
    "max_embed_all_numbers": ("PROXY_MAX_EMBED_ALL_NUMBERS", int),  # TEI's /embed_all: tokens x hidden size
    "max_header_bytes": ("PROXY_MAX_HEADER_BYTES", int),
    "max_concurrent_requests": ("PROXY_MAX_CONCURRENT_REQUESTS", int),
    "bls_concurrency": ("PROXY_BLS_CONCURRENCY", int),
    "admission_target_s": ("PROXY_ADMISSION_TARGET_S", float),
    "request_timeout_s": ("PROXY_REQUEST_TIMEOUT_S", float),
    "header_timeout_s": ("PROXY_HEADER_TIMEOUT_S", float),
    "body_timeout_s": ("PROXY_BODY_TIMEOUT_S", float),
    "keep_alive_s": ("PROXY_KEEP_ALIVE_S", float),
    "shutdown_grace_s": ("PROXY_SHUTDOWN_GRACE_S", float),
    "readiness_interval_s": ("PROXY_READINESS_INTERVAL_S", float),
    # images (CLIP exports): images.py
    "max_image_bytes": ("PROXY_MAX_IMAGE_BYTES", int),
    "max_images_per_request": ("PROXY_MAX_IMAGES_PER_REQUEST", int),
    "image_url_hosts": ("PROXY_IMAGE_URL_HOSTS", str),
    "image_url_max_bytes": ("PROXY_IMAGE_URL_MAX_BYTES", int),
    "image_url_timeout_s": ("PROXY_IMAGE_URL_TIMEOUT_S", float),
    "image_url_allow_private": ("PROXY_IMAGE_URL_ALLOW_PRIVATE", boolean),
}


def read_settings(config):
    parameters = config.get("parameters", {})
    settings = {}
    for name, (variable, kind) in SETTINGS.items():
        value = os.environ.get(variable)
        if value is None:
            if name not in parameters:
                raise pb_utils.TritonModelException(f"proxy: config.pbtxt has no parameter '{name}'")
            value = parameters[name]["string_value"]
        try:
            settings[name] = kind(value)
        except ValueError:
            raise pb_utils.TritonModelException(f"proxy: setting {name}={value!r} is not a {kind.__name__}") from None
    # Shared with the launcher (local_triton/launch.py), which starts tritonserver with them.
    settings["api_key"], settings["admin_api_key"] = secret("API_KEY"), secret("ADMIN_API_KEY")
    settings["model_control"] = os.environ.get("MODEL_CONTROL") or "explicit"
    # Triton's own HTTP frontend (the launcher sets TRITON_HTTP_PORT; tritonserver's default is 8000)
    address = os.environ.get("TRITON_ADDRESS") or "127.0.0.1"
    settings["triton_host"] = "127.0.0.1" if address in ("0.0.0.0", "::", "[::]") else address
    settings["triton_http_port"] = int(os.environ.get("TRITON_HTTP_PORT") or 8000)
    settings["load_models"] = os.environ.get("LOAD_MODELS") or "*"
    try:
        from swagger_ui_bundle import swagger_ui_path  # Swagger UI's assets, served locally (no CDN)
        settings["swagger_path"] = swagger_ui_path
    except ImportError:
        settings["swagger_path"] = None
    return SimpleNamespace(**settings)


def log(message):
    print(message, flush=True)


class TritonPythonModel:
    def initialize(self, args):
        settings = read_settings(json.loads(args["model_config"]))
        repository = os.path.dirname(os.path.abspath(args["model_repository"]))
        self.executor = ThreadPoolExecutor(settings.bls_concurrency, thread_name_prefix="proxy-bls")
        triton = TritonHttp(settings.triton_host, settings.triton_http_port,
                            {"admin-key": settings.admin_api_key} if settings.admin_api_key else None)
        self.registry = Registry(repository, settings)
        self.service = Service(pb_utils, self.registry, triton, settings, self.executor)
        self.metrics = Metrics()
        self.server = Server(create_server_app(settings, self.service, self.metrics), settings, log)
        try:
            self.server.start()
        except RuntimeError as error:
            raise pb_utils.TritonModelException(str(error)) from None
        self.readiness = Readiness(self.service, triton, settings, pb_utils, self.server, log, args["model_name"])
        log(f"proxy: serving http://{settings.host}:{settings.port} for {len(self.registry.cards_by_name)} exported "
            f"model(s) in {repository}; API key {'required' if settings.api_key else 'off'}; admin routes "
            f"{'on' if settings.admin_api_key else 'off'}")
        # BLS works once initialize() has returned; the readiness thread's first round waits for that.
        self.readiness.start()

    def execute(self, requests):
        error = pb_utils.TritonError(f"the proxy model answers HTTP on port {self.server.settings.port} "
                                     f"(POST /v1/embeddings), not inference requests", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]

    def finalize(self):
        self.registry.draining = True  # new requests: 503 with Retry-After
        self.readiness.stop()
        self.server.stop()  # requests in flight get shutdown_grace_s to finish
        self.executor.shutdown(wait=False, cancel_futures=True)
        log("proxy: stopped, port released")
