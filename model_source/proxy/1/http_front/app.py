"""The HTTP app, assembled: one router per dialect, each in its folder with its types (openai/: OpenAI's API and
this server's own routes in its shape; seed/: the seed API; cohere/: Cohere's API; tei/: TEI's API; admin/: load
and unload; server/: the probes and /metrics; voyage/: Voyage's contextualized chunk embeddings: each routes.py's
docstring lists its routes), the error handlers
(http_errors.py: every error in its path's dialect), and the protocol of the service the routes call (service.py
calls Triton through BLS, tests pass a fake). No route and no Triton import here. The server runs
create_server_app: the plain routes' requests (every route with a body: bodies.py) go to their functions directly
(direct.py), the others through FastAPI. The app's state: settings, service, metrics (create_app).
"""
from typing import Protocol

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles

from model_library import tracing

from . import http_errors
from .admin import routes as admin_routes
from .cohere import routes as cohere_routes
from .direct import DirectRoutes
from .guard import HttpGuard
from .inference import (
    ChunkedDocuments,
    ChunkEmbeddings,
    Embeddings,
    ImageEmbeddings,
    Measured,
    Prediction,
    RerankScores,
    Token,
)
from .metrics import MetricsMiddleware
from .openai import routes as openai_routes
from .registry import Card, Health
from .seed import routes as seed_routes
from .server import routes as server_routes
from .tei import routes as tei_routes
from .voyage import routes as voyage_routes


class ServiceProtocol(Protocol):
    """What the routes need from the serving side, over the exports (registry.Card; exports(): every export, loaded
    or not). The calls answer with inference.py's dataclasses, as annotated (predict: cross-encoders; measure: the
    tokenizer alone, outside admission, for a request the gate refused; None: no answer in time; count_tokens: the
    tokens an answer of every token's vector holds). Failures raise errors.ApiError kinds; a request refused by
    admission raises errors.NotAdmitted, before which the service has given the models' refusals that need no
    tokens (prechecks.py) and, truncate false, the tokenizer's refusal of a text over the max length (busy.py)."""

    draining: bool

    def cards(self) -> list[Card]: ...

    def resolve(self, model: str | None) -> Card: ...

    def exports(self) -> list[Card]: ...

    def health(self) -> Health: ...

    def live(self) -> Health: ...

    async def embed(self, card: Card, texts, outputs, param, parameters=None) -> Embeddings: ...

    async def embed_images(self, card: Card, images, param, indices=None) -> ImageEmbeddings: ...

    async def rerank(self, card: Card, query, documents, weights, parameters=None) -> RerankScores: ...

    async def predict(self, card: Card, inputs, param, parameters=None) -> Prediction: ...

    async def tokenize(self, card: Card, texts, param, parameters) -> list[list[Token]]: ...

    async def count_tokens(self, card: Card, texts, param, parameters) -> int: ...

    async def decode(self, card: Card, ids, param, parameters) -> list[str]: ...

    async def measure(self, card: Card, texts, param, parameters=None, queries=None) -> Measured | None: ...

    async def chunk_embed(self, card: Card, texts, spans, parameters) -> ChunkEmbeddings: ...

    async def document_chunks(self, card: Card, documents, outputs, parameters) -> ChunkedDocuments: ...

    async def load(self, model_id: str) -> float: ...

    async def unload(self, model_id: str) -> float: ...


# Every dialect's router, in the order their routes are matched (OpenAI's GET /v1/models/{id} before the admin's
# POST /v1/models/{id}/load: different methods, so either order serves both).
ROUTERS = (server_routes.router, openai_routes.router, seed_routes.router, admin_routes.router, cohere_routes.router,
           tei_routes.router, voyage_routes.router)
# All of them in one router (their own route objects: FastAPI's include_router would nest them), as the app
# includes them and direct.py answers the plain ones.
router = APIRouter(routes=[route for routes in ROUTERS for route in routes.routes])


async def swagger_ui():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="triton-embed API",
                               swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url="/docs/assets/swagger-ui.css",
                               swagger_favicon_url="/docs/assets/favicon-32x32.png",
                               swagger_ui_parameters={"validatorUrl": None})  # no call to swagger.io


def create_app(settings, service: ServiceProtocol, metrics, routes=router):
    """settings: api_key, admin_api_key, max_inputs_per_request, max_input_chars, swagger_path (or None). routes:
    the app's (baseline.py: the same routes, each through FastAPI's pipeline)."""
    app = FastAPI(title="triton-embed", version="2.0", docs_url=None, redoc_url=None,
                  description="Text embeddings served by Triton: OpenAI-compatible embeddings, bge-m3's sparse and "
                              "ColBERT outputs, reranking, and the seed API.")
    app.state.settings, app.state.service, app.state.metrics = settings, service, metrics
    app.include_router(routes)
    for kind, handler in http_errors.HANDLERS:
        app.add_exception_handler(kind, handler)
    if settings.swagger_path:
        app.mount("/docs/assets", StaticFiles(directory=str(settings.swagger_path)), name="swagger-assets")
        app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    return app


def create_server_app(settings, service: ServiceProtocol, metrics):
    """The ASGI app the server runs: the metrics outermost (inside the request's span when traced:
    model_library/tracing.py), the gate (guard.py), then the routes: the plain ones directly (direct.py), the others
    through FastAPI."""
    app = create_app(settings, service, metrics)
    return tracing.asgi(MetricsMiddleware(HttpGuard(DirectRoutes(app, router), settings, service), metrics, app),
                        untraced={route.path for route in server_routes.router.routes})  # probes, /metrics
