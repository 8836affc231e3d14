"""OpenTelemetry traces, off unless the standard OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
is set: one HTTP request to the front is one trace, front -> BLS model -> tokenizer -> encoder (docs/deploying.md,
"Traces").

Off, it costs a check of ENABLED: this module imports nothing of OpenTelemetry, and every caller tests the flag
before calling in (`if tracing.ENABLED:`; the decorators hand the function back unchanged).

On, each process that traces (the proxy's stub, each Python model's stub) makes one SDK TracerProvider, lazily, the
first time it needs it: a BatchSpanProcessor (OTEL_BSP_* settings) over an OTLP/HTTP protobuf exporter to the
endpoint (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS sent with it), sampling by OTEL_TRACES_SAMPLER[_ARG] (the SDK reads
them), resource attributes from OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME (service.name: triton-embed unless they
say). The exporter is this module's (`OtlpHttpExporter`, opentelemetry-exporter-otlp-proto-common's encoder):
opentelemetry-exporter-otlp-proto-http 1.45 needs protobuf >= 5, and tritonclient 2.48, in the same venv, < 5.

Who makes which span:
- the front (proxy): `asgi()` wraps the app: a SERVER span per HTTP request, continuing an incoming W3C
  `traceparent`; `span("admission")`; `bls_call` a CLIENT span around each Triton call, named after the model,
  whose context goes with the call as the request parameter `traceparent` (PARAMETER); `error_kind` puts the kind
  of the error the front answers on the request's span; a span for writing the answer.
- the Python models: a request Triton traced itself (a KServe request, Triton in `--trace-config
  mode=opentelemetry`: request.trace().get_context() is not None) has Triton's own spans, and its child calls pass
  trace=request.trace() so that Triton's spans for them join it. A request that Triton did not trace but that carries
  the parameter (the front's calls: BLS requests without a parent request, for which Triton 24.07 makes no span)
  gets a SERVER span of the model's own (`model_span` in model_common.answer, `per_request` around a model's
  execute), and each of its child calls a CLIENT span (`child_call`, in model_common.call) whose context goes on as
  the child's parameter: the tokenizer's own span is its child. The encoder (onnxruntime, C++) cannot read a
  parameter: its span is that CLIENT span.
"""
import functools
import os
import threading
import time
import urllib.request
from contextlib import contextmanager
from contextvars import ContextVar

PARAMETER = "traceparent"  # the request parameter that carries a call's W3C trace context
SERVICE_NAME = "triton-embed"  # service.name unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say


def traces_url(env=None):
    """The OTLP/HTTP traces URL the settings name (None: tracing is off). OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it
    is; else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces (the OTLP exporter spec). OTEL_SDK_DISABLED=true or
    OTEL_TRACES_EXPORTER=none turn it off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or \
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if url:
        return url
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


URL = traces_url()
ENABLED = URL is not None
MODEL = None  # this process's model (name_model, at initialize): the name of its own spans

_tracer = None
_lock = threading.Lock()
_request = ContextVar("tracing_request", default=None)  # the front: the HTTP request's Traced
_spans = {}  # the models: id(Triton request) -> the model's own span for it (requests traced by the parameter)


def name_model(name):
    global MODEL
    MODEL = name


# ---------------------------------------------------------------- the SDK, once per process
def tracer():
    global _tracer
    if _tracer is None:
        with _lock:
            if _tracer is None:
                _tracer = _make_tracer()
    return _tracer


def _make_tracer():
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    # The front samples by OTEL_TRACES_SAMPLER[_ARG] (the SDK reads them); a model only continues the front's
    # decision (its spans always have the front's as parent): a ratio sampler there would cut traces in pieces.
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE_NAME}),
                              sampler=ParentBased(ALWAYS_ON) if MODEL is not None else None)
    provider.add_span_processor(BatchSpanProcessor(OtlpHttpExporter(URL)))
    return provider.get_tracer("triton-embed")


def _headers(env=None):
    """OTEL_EXPORTER_OTLP_[TRACES_]HEADERS: `key=value,key2=value2`, URL-encoded values."""
    from urllib.parse import unquote

    env = os.environ if env is None else env
    text = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {key.strip(): unquote(value.strip()) for key, value in pairs}


class OtlpHttpExporter:
    """OTLP/HTTP with protobuf bodies (ExportTraceServiceRequest, the official encoder), POSTed to `url`."""

    def __new__(cls, url):
        from opentelemetry.sdk.trace.export import SpanExporter

        class Exporter(SpanExporter):
            def __init__(self):
                self.url, self.headers, self.warned = url, {"Content-Type": "application/x-protobuf", **_headers()},\
                    False
                self.timeout_s = float(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                                       or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") or 10000) / 1000

            def export(self, spans):
                from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
                from opentelemetry.sdk.trace.export import SpanExportResult

                body = encode_spans(spans).SerializeToString()
                request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
                try:
                    with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                        answer.read()
                    return SpanExportResult.SUCCESS
                except OSError as error:
                    if not self.warned:  # once per process: a collector that is down must not flood the log
                        self.warned = True
                        print(f"tracing: spans not sent to {self.url}: {error}", flush=True)
                    return SpanExportResult.FAILURE

            def shutdown(self):
                pass

            def force_flush(self, timeout_millis=30000):
                return True
        return Exporter()


# ---------------------------------------------------------------- contexts
def _parent(traceparent):
    """The OTel context that continues a W3C traceparent (None or malformed: a new trace)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({PARAMETER: traceparent} if traceparent else {})


def _under(span):
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def traceparent(span):
    """The W3C traceparent of `span` (what a child call carries)."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _failed(span, kind):
    """The span's error kind (error.type, the front's or the error contract's kind) and its ERROR status."""
    if span is not None and kind and span.is_recording():
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", str(kind))  # an ErrorKind as its value: exporters take plain strings
        span.set_status(Status(StatusCode.ERROR))


def _rows(array):
    shape = getattr(array, "shape", ())
    return int(shape[0]) if len(shape) else 1


# ---------------------------------------------------------------- the front (the proxy)
class Traced:
    """The HTTP request's span and what its calls add to it (texts, tokens)."""

    def __init__(self, span):
        self.span, self.texts, self.tokens, self.admitted = span, 0, 0, False


def asgi(app, untraced=()):
    """The ASGI app with a SERVER span per HTTP request but those to the paths `untraced` (the probes and /metrics:
    an orchestrator's polling is no traffic to trace); the app itself when tracing is off."""
    if not ENABLED:
        return app
    untraced = frozenset(untraced)

    async def traced(scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in untraced:
            return await app(scope, receive, send)
        from opentelemetry.trace import SpanKind

        incoming = next((value.decode("latin-1") for name, value in scope["headers"]
                         if name.lower() == b"traceparent"), None)
        path, method = scope.get("path", ""), scope.get("method", "")
        span = tracer().start_span(f"{method} {path}", _parent(incoming), SpanKind.SERVER,
                                   {"http.request.method": method, "url.path": path, "http.route": path})
        if not span.is_recording():  # not sampled: the request runs as untraced (bls_call sees no request either)
            return await app(scope, receive, send)
        request, writing = Traced(span), [None]
        token = _request.set(request)

        async def send_traced(message):
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    from opentelemetry.trace import Status, StatusCode

                    span.set_status(Status(StatusCode.ERROR))
                writing[0] = tracer().start_span("write answer", _under(span))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and writing[0] is not None:
                writing[0].end()
                writing[0] = None

        try:
            await app(scope, receive, send_traced)
        except BaseException as error:
            _failed(span, getattr(error, "kind", None) or type(error).__name__)
            raise
        finally:
            if writing[0] is not None:
                writing[0].end()
            if request.texts:
                span.set_attribute("triton_embed.texts", request.texts)
            if request.tokens:
                span.set_attribute("triton_embed.tokens", request.tokens)
            span.end()
            _request.reset(token)
    return traced


def error_kind(kind):
    """The front answers an error of `kind` (errors.KINDS): on the HTTP request's span."""
    request = _request.get()
    if request is not None:
        _failed(request.span, kind)


@contextmanager
def span(name, **attributes):
    """A span of the current HTTP request (none outside one), as a context manager; yields it or None."""
    request = _request.get()
    if request is None or not request.span.is_recording():
        yield None
        return
    child = tracer().start_span(name, _under(request.span), attributes=attributes)
    try:
        yield child
    except BaseException as error:
        _failed(child, getattr(error, "kind", None) or type(error).__name__)
        raise
    finally:
        child.end()


def bls_call(infer, admit_request):
    """The proxy's Inference.infer(self, card, model, inputs, names, rows, parameters=None, admit=True), with a
    CLIENT span named after `model` around it, its context sent as the call's parameter `traceparent`; the texts
    (rows of text, documents, image) and tokens (num_tokens) counted on it and on the request's span. The request's
    admission (admit_request(), at its first admitted call) gets a span of its own before it. Off: infer."""
    if not ENABLED:
        return infer
    from model_library.model_outputs import NUM_TOKENS

    @functools.wraps(infer)
    async def traced(self, card, model, inputs, names, rows, parameters=None, admit=True):
        request = _request.get()
        if request is None or not request.span.is_recording():
            # not sampled (OTEL_TRACES_SAMPLER_ARG): the call goes as it would untraced, without a traceparent, so
            # that the models behind it do nothing for it either
            return await infer(self, card, model, inputs, names, rows, parameters, admit)
        if admit and not request.admitted:  # the first admitted call decides (admit_request: then a no-op)
            request.admitted = True
            with span("admission", **{"triton_embed.model": card.id}):
                admit_request(card, inputs)
        from opentelemetry.trace import SpanKind

        texts = sum(_rows(inputs[name]) for name in ("text", "documents", "image") if name in inputs)
        request.span.set_attribute("triton_embed.model", card.id)
        child = tracer().start_span(model, _under(request.span), SpanKind.CLIENT,
                                    {"triton_embed.model": model, "triton_embed.texts": texts})
        carried = {**(parameters or {}), PARAMETER: traceparent(child)}
        try:
            result = await infer(self, card, model, inputs, names, rows, carried, admit)
            if NUM_TOKENS in result:
                tokens = int(result[NUM_TOKENS].sum())
                child.set_attribute("triton_embed.tokens", tokens)
                if admit:
                    request.tokens += tokens
            if admit:
                request.texts += texts
            return result
        except BaseException as error:
            _failed(child, getattr(error, "kind", None) or type(error).__name__)
            raise
        finally:
            child.end()
    return traced


# ---------------------------------------------------------------- the Python models
def _triton_traced(request):
    """Whether Triton traces this request itself (its context, else None)."""
    try:
        return request.trace().get_context()
    except Exception:  # noqa: BLE001 - a stand-in request (unit tests) has no trace
        return None


def _own_parent(request):
    """The request's `traceparent` parameter when Triton does not trace it (None: no span of ours)."""
    import json

    try:
        value = json.loads(request.parameters() or "{}").get(PARAMETER)
    except (ValueError, AttributeError):
        return None
    # the front sends it only for a sampled request (bls_call); a caller's unsampled one opens nothing (W3C flags:
    # bit 0 sampled; the SDK also sets bit 1, a random trace id: "03")
    if not isinstance(value, str) or not _sampled(value) or _triton_traced(request) is not None:
        return None
    return value


def _sampled(traceparent):
    try:
        return bool(int(traceparent[-2:], 16) & 1)
    except ValueError:
        return False


def _open(request):
    parent = _own_parent(request)
    if parent is None:
        return None
    from opentelemetry.trace import SpanKind

    opened = tracer().start_span(MODEL or "model", _parent(parent), SpanKind.SERVER,
                                 {"triton_embed.model": MODEL or ""})
    _spans[id(request)] = opened
    return opened


def _close(request, opened):
    if opened is not None:
        _spans.pop(id(request), None)
        opened.end()


@contextmanager
def model_span(request):
    """The model's own span for one request traced by parameter (model_common.answer); yields it or None."""
    opened = _open(request)
    try:
        yield opened
    finally:
        _close(request, opened)


def answered(opened, kind):
    """The model answered its request with an error of `kind` (the error contract's)."""
    _failed(opened, kind)


def per_request(execute):
    """A model's execute(self, requests) with its own span for each request traced by parameter, from the call to
    its return (the tokenizer, image preprocessing: they answer their requests inside it). Off: execute."""
    if not ENABLED:
        return execute

    @functools.wraps(execute)
    def traced(self, requests):
        opened = [(request, _open(request)) for request in requests]
        try:
            return execute(self, requests)
        finally:
            for request, own in opened:
                _close(request, own)
    return traced


@contextmanager
def child_call(request, model, parameters):
    """Around one BLS call of a model for `request` to `model`: yields (the call's parameters, its trace argument).
    Triton traces the request: parameters as they are and trace=request.trace() (Triton's spans). Traced by
    parameter: a CLIENT span named after `model`, its context the child's `traceparent`. Else: as they are, None."""
    parameters = parameters or {}
    if _triton_traced(request) is not None:
        yield parameters, request.trace()
        return
    parent = _spans.get(id(request))
    if parent is None:
        yield parameters, None
        return
    from opentelemetry.trace import SpanKind

    child = tracer().start_span(model, _under(parent), SpanKind.CLIENT, {"triton_embed.model": model})
    started = time.monotonic()
    try:
        yield {**parameters, PARAMETER: traceparent(child)}, None
    except BaseException as error:
        _failed(child, getattr(error, "kind", None) or type(error).__name__)
        raise
    finally:
        child.set_attribute("triton_embed.call_ms", round((time.monotonic() - started) * 1000, 3))
        child.end()
