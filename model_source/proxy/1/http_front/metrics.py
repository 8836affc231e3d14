"""The proxy's Prometheus metrics (prometheus_client), labelled by route, status and served model. Triton's own
per-model nv_* metrics are on Triton's metrics port."""
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import Match

from model_library.model_errors import ErrorKind

from .errors import status

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
INPUT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
disable_created_metrics()  # no *_created series: one line per sample is what dashboards read
CLIENT_CLOSED = status(ErrorKind.CLIENT_CLOSED)  # nginx's 499: a client that left before its answer, not a server error


def route_label(app, scope):
    """The route's template (a bounded label set): the one the router matched, else the one it would match (a
    request the gate refused before routing), else "other"."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in getattr(app, "routes", ()) if r.matches(scope)[0] == Match.FULL), None)
    return getattr(route, "path_format", None) or "other"


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("proxy_requests", "HTTP requests answered, by route, status code and model.",
                                ["route", "status", "model"], registry=self.registry)
        self.latency = Histogram("proxy_request_duration_seconds", "Time from request received to response sent.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.inputs = Histogram("proxy_request_inputs", "Texts per successful embedding request.", ["model"],
                                buckets=INPUT_BUCKETS, registry=self.registry)
        self.tokens = Counter("proxy_tokens", "Tokens embedded (after truncation, special tokens included).",
                              ["model"], registry=self.registry)
        self.truncated = Counter("proxy_truncated_inputs", "Texts cut to the model's max length.", ["model"],
                                 registry=self.registry)
        self.in_flight = Gauge("proxy_requests_in_flight", "HTTP requests being answered now.",
                               registry=self.registry)
        # labels() validates and locks on every call: each label set's series, looked up once (the label values
        # are bounded: route templates, status codes, served models)
        self.request_series, self.embedding_series = {}, {}

    def observe_request(self, route, status, seconds, model):
        series = self.request_series.get((route, status, model))
        if series is None:
            series = self.request_series[(route, status, model)] = (
                self.requests.labels(route, str(status), model or ""), self.latency.labels(route))
        series[0].inc()
        series[1].observe(seconds)

    def observe_embedding(self, model, inputs, tokens, truncated):
        series = self.embedding_series.get(model)
        if series is None:
            series = self.embedding_series[model] = (
                self.inputs.labels(model), self.tokens.labels(model), self.truncated.labels(model))
        series[0].observe(inputs)
        series[1].inc(tokens)
        series[2].inc(truncated)

    def render(self):
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Outermost ASGI layer: counts every answer (errors, 404s and clients that left included) with its latency.
    Routes put the resolved model id in scope["state"]["model"]; `router` is the app whose routes label requests."""

    def __init__(self, app, metrics, router=None):
        self.app, self.metrics, self.router = app, metrics, router

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status, noted = time.perf_counter(), [CLIENT_CLOSED], [False]
        scope.setdefault("state", {})

        def note():
            if not noted[0]:
                noted[0] = True
                self.metrics.in_flight.dec()
                self.metrics.observe_request(route_label(self.router, scope), status[0],
                                             time.perf_counter() - started, scope["state"].get("model"))

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                note()  # before the answer's last byte goes out: a client reading /metrics next sees it counted
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            note()
