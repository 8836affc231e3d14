"""The HTTP app, assembled: one router per dialect (routes_openai.py: OpenAI's embeddings and models, bge-m3's
/v1/encode, late chunking; routes_seed.py: the seed API; routes_cohere.py: Cohere's embed and rerank; routes_tei.py:
TEI's API; routes_admin.py: load and unload; routes_server.py: the probes and /metrics), the error handlers
(http_errors.py: every error in its path's dialect), and the Service protocol the routes call (service.py calls
Triton through BLS, tests pass a fake). No route and no Triton import here. The server runs create_server_app: the
plain routes' requests (every route with a body: bodies.py) go to their functions directly (direct.py), the others
through FastAPI. The app's state: settings, service, metrics (create_app).
"""
from typing import Protocol

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles

from model_library import tracing

from . import http_errors, routes_admin, routes_cohere, routes_openai, routes_seed, routes_server, routes_tei
from .direct import DirectRoutes
from .guard import HttpGuard
from .inference import ChunkEmbeddings, Embeddings, ImageEmbeddings, Measured, Prediction, RerankResult, Token
from .metrics import MetricsMiddleware
from .registry import Health


class Service(Protocol):
    """What the routes need from the serving side. Card: id, name, outputs, embedding_size, colbert_size,
    max_length, source, created, kind, rerank, chunks (None: none); CLIP exports: image, architecture, pretrained
    (image None: text only). exports(): every export, loaded or not. The calls answer with inference.py's
    dataclasses, as annotated (predict: cross-encoders; measure: the tokenizer alone, outside admission, for a
    request the gate refused; None: no answer in time). Failures raise errors.ApiError kinds; a request refused by
    admission raises errors.NotAdmitted, before which the service has given the models' refusals that need no
    tokens (prechecks.py)."""

    draining: bool

    def cards(self): ...

    def resolve(self, model): ...

    def exports(self): ...

    def health(self) -> Health: ...

    def live(self) -> Health: ...

    async def embed(self, card, texts, outputs, param, parameters=None) -> Embeddings: ...

    async def embed_images(self, card, images, param, indices=None) -> ImageEmbeddings: ...

    async def rerank(self, card, query, documents, weights, parameters=None) -> RerankResult: ...

    async def predict(self, card, inputs, param, parameters=None) -> Prediction: ...

    async def tokenize(self, card, texts, param, parameters) -> list[list[Token]]: ...

    async def decode(self, card, ids, param, parameters) -> list[str]: ...

    async def measure(self, card, texts, param, parameters=None, queries=None) -> Measured | None: ...

    async def chunk_embed(self, card, texts, spans, parameters) -> ChunkEmbeddings: ...

    async def load(self, model_id): ...

    async def unload(self, model_id): ...


# Every dialect's router, in the order their routes are matched (OpenAI's GET /v1/models/{id} before the admin's
# POST /v1/models/{id}/load: different methods, so either order serves both).
ROUTERS = (routes_server.router, routes_openai.router, routes_seed.router, routes_admin.router, routes_cohere.router,
           routes_tei.router)
# All of them in one router (their own route objects: FastAPI's include_router would nest them), as the app
# includes them and direct.py answers the plain ones.
router = APIRouter(routes=[route for routes in ROUTERS for route in routes.routes])


async def swagger_ui():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="triton-embed API",
                               swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url="/docs/assets/swagger-ui.css",
                               swagger_favicon_url="/docs/assets/favicon-32x32.png",
                               swagger_ui_parameters={"validatorUrl": None})  # no call to swagger.io


def create_app(settings, service: Service, metrics):
    """settings: api_key, admin_api_key, max_inputs_per_request, max_input_chars, swagger_path (or None)."""
    app = FastAPI(title="triton-embed", version="2.0", docs_url=None, redoc_url=None,
                  description="Text embeddings served by Triton: OpenAI-compatible embeddings, bge-m3's sparse and "
                              "ColBERT outputs, reranking, and the seed API.")
    app.state.settings, app.state.service, app.state.metrics = settings, service, metrics
    app.include_router(router)
    for kind, handler in http_errors.HANDLERS:
        app.add_exception_handler(kind, handler)
    if settings.swagger_path:
        app.mount("/docs/assets", StaticFiles(directory=str(settings.swagger_path)), name="swagger-assets")
        app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    return app


def create_server_app(settings, service: Service, metrics):
    """The ASGI app the server runs: the metrics outermost (inside the request's span when traced:
    model_library/tracing.py), the gate (guard.py), then the routes: the plain ones directly (direct.py), the others
    through FastAPI."""
    app = create_app(settings, service, metrics)
    return tracing.asgi(MetricsMiddleware(HttpGuard(DirectRoutes(app, router), settings, service), metrics, app),
                        untraced={route.path for route in routes_server.router.routes})  # probes, /metrics
