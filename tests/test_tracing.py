"""Traces (issue 57): a real tritonserver sending its spans, and the front's and the Python models', to an OTLP/HTTP
receiver (bench/otlp_receiver.py) that decodes the real messages (opentelemetry-proto's
ExportTraceServiceRequest). One HTTP
request to /v1/embeddings on a named export is one trace: the front's spans (the request, admission, the Triton call,
writing the answer), the BLS model's, the tokenizer's, and the encoder's (the BLS model's call to it); a KServe
request carrying a traceparent joins the caller's trace with Triton's own spans for every model that ran; a refused
request's span carries the error kind; a server with tracing off sends nothing."""
import importlib.util
import os
import shutil
import time
import urllib.error
import urllib.request

import orjson
import pytest

from bench.otlp_receiver import Receiver
from conftest import (
    PROJECT,
    export,
    launch,
    serve_until_done,
    start_server,
    tiny_sentence_transformer,
    wait_for_proxy,
)

NAME = "mini"
TEXTS = ["the first text", "a second, longer text about something else entirely", "third"]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # the client's trace and span (W3C's example)
CALLER_SPAN = "00f067aa0ba902b7"
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@pytest.fixture(scope="module")
def repository(minilm_repository, minilm_model_dir, tmp_path_factory):
    """The MiniLM repository (the default export) with a named export beside it (a tiny BERT)."""
    root = tmp_path_factory.mktemp("tracing")
    target = root / "repository"
    shutil.copytree(minilm_repository, target)
    export(target, "--model", tiny_sentence_transformer(root / "tiny", minilm_model_dir, seed=57), "--name", NAME)
    return target


@pytest.fixture(scope="module")
def receiver():
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def traced(repository, receiver, tmp_path_factory):
    """The repository served with traces on: every request sampled, spans exported every 200 ms."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_TRACES_SAMPLER": "always_on",
           "OTEL_BSP_SCHEDULE_DELAY": "200"}
    yield from serve_until_done(repository, tmp_path_factory.mktemp("traced_server"), extra_env=env)


def post(server, path, body, headers=None):
    request = urllib.request.Request(server.proxy_url + path, data=orjson.dumps(body), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def by_name(spans, name, kind=None):
    found = [s for s in spans if s["name"] == name and (kind is None or s["kind"] == kind)]
    assert found, (name, kind, [(s["name"], s["kind"]) for s in spans])
    return found


def linked(spans, root_parent):
    """Every span's parent is a span of the same trace, but the root's, which is `root_parent` ("": none)."""
    ids = {s["span"] for s in spans}
    roots = [s for s in spans if s["parent"] not in ids]
    assert [s["parent"] for s in roots] == [root_parent], [(s["name"], s["parent"]) for s in roots]
    return roots[0]


def test_http_request_is_one_trace(traced, receiver, tmp_path):
    """POST /v1/embeddings with a traceparent, three texts on the named export: the front's SERVER span continues
    the caller's; under it admission, a CLIENT span to NAME_bls and the answer's writing; under that the BLS
    model's own span, its CLIENT spans to the tokenizer and the encoder, and the tokenizer's own span."""
    # a first request warms the stubs (each makes its tracer at its first traced request), so that the picture
    # below shows a warm request's times
    for _ in range(4):
        assert post(traced, "/v1/embeddings", {"model": NAME, "input": TEXTS})[0] == 200
    status, body = post(traced, "/v1/embeddings", {"model": NAME, "input": TEXTS},
                        {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert status == 200, body

    def complete(spans):
        names = {(s["name"], s["kind"]) for s in spans}
        return {("POST /v1/embeddings", SERVER), ("admission", 1), ("write answer", 1), (f"{NAME}_bls", CLIENT),
                (f"{NAME}_bls", SERVER), (f"{NAME}_tokenizer", CLIENT), (f"{NAME}_tokenizer", SERVER),
                (f"{NAME}_embedding", CLIENT)} <= names
    spans = receiver.wait(CALLER_TRACE, complete)
    root = linked(spans, CALLER_SPAN)  # one trace, its root the caller's child
    assert (root["name"], root["kind"]) == ("POST /v1/embeddings", SERVER)
    assert root["attributes"]["http.route"] == "/v1/embeddings"
    assert root["attributes"]["http.response.status_code"] == 200
    assert root["attributes"]["triton_embed.model"] == NAME
    assert root["attributes"]["triton_embed.texts"] == len(TEXTS)
    assert root["attributes"]["triton_embed.tokens"] == body["usage"]["prompt_tokens"]
    parent = {s["span"]: s for s in spans}
    admission, = by_name(spans, "admission")
    writing, = by_name(spans, "write answer")
    front_call, = by_name(spans, f"{NAME}_bls", CLIENT)
    assert admission["parent"] == writing["parent"] == front_call["parent"] == root["span"]
    assert front_call["attributes"]["triton_embed.texts"] == len(TEXTS)
    assert front_call["attributes"]["triton_embed.tokens"] == body["usage"]["prompt_tokens"]
    bls, = by_name(spans, f"{NAME}_bls", SERVER)  # the BLS model's own span, in its stub
    assert bls["parent"] == front_call["span"]
    tokenizer_call, = by_name(spans, f"{NAME}_tokenizer", CLIENT)
    tokenizer, = by_name(spans, f"{NAME}_tokenizer", SERVER)  # the tokenizer's own span, in its stub
    assert tokenizer_call["parent"] == bls["span"] and tokenizer["parent"] == tokenizer_call["span"]
    encoder_calls = by_name(spans, f"{NAME}_embedding", CLIENT)  # one per length group
    assert all(call["parent"] == bls["span"] for call in encoder_calls)
    assert {parent[s["parent"]]["name"] for s in spans if s is not root} <= \
        {root["name"], f"{NAME}_bls", f"{NAME}_tokenizer"}
    assert not any(s["error"] for s in spans)
    assert {s["service"] for s in spans} == {"triton-embed"}
    with receiver.lock:  # the probes (wait_for_proxy's /health) are not traced
        assert not [s for s in receiver.spans if s["name"].startswith("GET /health")]
    draw_waterfall(spans, tmp_path)


def draw_waterfall(spans, folder):
    """The docs' picture of this trace (deploy/monitoring/pictures.py): a bar per span, each under its parent.
    TRITON_EMBED_PICTURES=FOLDER also writes it there (docs: how the docs' copy was made)."""
    path = os.path.join(PROJECT, "deploy", "monitoring", "pictures.py")
    spec = importlib.util.spec_from_file_location("monitoring_pictures", path)
    pictures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pictures)
    picture = folder / "trace.png"
    kinds = {SERVER: "server", CLIENT: "client"}
    named = [{**s, "span_id": s["span"], "parent_span_id": s["parent"], "service": kinds.get(s["kind"], "internal"),
              "name": f"{s['name']} ({kinds.get(s['kind'], 'internal')})"} for s in spans]
    rows = pictures.waterfall(named, picture, "POST /v1/embeddings, 3 texts, named export: one trace")
    assert len(rows) == len(spans) and rows[0].startswith("POST /v1/embeddings")
    assert picture.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("TRITON_EMBED_PICTURES"):
        shutil.copy(picture, os.path.join(os.environ["TRITON_EMBED_PICTURES"], "trace.png"))


def test_one_text_through_the_ensemble(traced, receiver):
    """One text goes to the plain ensemble NAME: Triton 24.07's ensemble passes the request's parameters to its
    steps (ensemble_scheduler.cc), so the tokenizer's span joins the trace; the encoder has no span of its own (the
    ensemble's CLIENT span covers both). No traceparent: the front starts the trace."""
    status, body = post(traced, "/v1/embeddings", {"model": NAME, "input": "just one, alone"})
    assert status == 200, body

    def mine():
        with receiver.lock:
            return [s["trace"] for s in receiver.spans if s["name"] == NAME and s["kind"] == CLIENT]
    deadline = time.monotonic() + 30
    while not mine() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(mine()) == 1, "no span of the call to the ensemble"
    spans = receiver.wait(mine()[0], lambda spans: {("POST /v1/embeddings", SERVER), (f"{NAME}_tokenizer", SERVER)}
                          <= {(s["name"], s["kind"]) for s in spans})
    linked(spans, "")
    call, = by_name(spans, NAME, CLIENT)
    tokenizer, = by_name(spans, f"{NAME}_tokenizer", SERVER)
    assert tokenizer["parent"] == call["span"]


def test_kserve_request_joins_the_callers_trace(traced, receiver):
    """A KServe request to NAME_bls with a traceparent header: Triton (--trace-config mode=opentelemetry, set by the
    launcher) continues the caller's trace, and the BLS model's calls carry its trace (trace=request.trace()), so
    Triton's spans cover every model that ran: the BLS model, the tokenizer and the encoder."""
    import numpy as np
    import tritonclient.http as httpclient

    trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    connection = httpclient.InferenceServerClient(traced.http_url)
    try:
        text = httpclient.InferInput("text", [len(TEXTS), 1], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(-1, 1))
        connection.infer(f"{NAME}_bls", [text], outputs=[httpclient.InferRequestedOutput("embedding")],
                         headers={"traceparent": f"00-{trace_id}-{span_id}-01"})
    finally:
        connection.close()
    models = {f"{NAME}_bls", f"{NAME}_tokenizer", f"{NAME}_embedding"}
    spans = receiver.wait(trace_id, lambda spans: models <= {s["attributes"].get("triton.model_name") for s in spans}
                          and any(s["parent"] == span_id for s in spans))  # and Triton's root, which ends last
    assert not receiver.failures, receiver.failures[:2]  # every export was OTLP protobuf
    linked(spans, span_id)  # the caller's trace, its root the caller's child
    assert models <= {s["attributes"].get("triton.model_name") for s in spans}, [(s["name"], s["attributes"])
                                                                          for s in spans]
    assert {s["service"] for s in spans} == {"triton-embed"}  # the launcher's resource setting
    # Triton's spans only: the models make none of their own for a request Triton traces
    assert not any(s["attributes"].get("triton_embed.model") for s in spans)


def test_refused_request_carries_its_error_kind(traced, receiver):
    """An empty list of inputs: 400 invalid_input, before any Triton call; the request's span says so."""
    trace_id = "5b8efff798038103d269b633813fc60c"
    status, body = post(traced, "/v1/embeddings", {"model": NAME, "input": []},
                        {"traceparent": f"00-{trace_id}-eee19b7ec3c1b174-01"})
    assert status == 400 and body["error"]["code"] == "invalid_input", body
    spans = receiver.wait(trace_id, lambda spans: any(s["kind"] == SERVER for s in spans))
    root = linked(spans, "eee19b7ec3c1b174")
    assert root["attributes"]["error.type"] == "invalid_input"
    assert root["attributes"]["http.response.status_code"] == 400
    assert not any(s["kind"] == CLIENT for s in spans)  # no call was made


def test_tracing_off_sends_nothing(repository, receiver, tmp_path_factory):
    """No OTEL_EXPORTER_OTLP_ENDPOINT: no span anywhere, even with a sampler set; tritonserver gets no --trace-config.
    A receiver on OTLP's default port (4318, where an SDK left on would send) hears nothing either."""
    from local_triton.server import server_command

    assert not any("--trace-config" in flag for flag in server_command(repository, env={"MODEL_CONTROL": "none"}))
    try:
        default_port = Receiver(4318)
    except OSError:
        default_port = None
    trace_id = CALLER_TRACE[::-1]
    running = start_server(repository, tmp_path_factory.mktemp("untraced_server"),
                           extra_env={"OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "100",
                                      "OTEL_SERVICE_NAME": "untraced"})
    try:
        wait_for_proxy(running)
        status, _ = post(running, "/v1/embeddings", {"model": NAME, "input": TEXTS},
                         {"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})
        assert status == 200
        time.sleep(3)
    finally:
        launch.stop(running.process)  # a drain: what the models' SDK would send as they finalize counts too
        if default_port is not None:
            default_port.close()
    # (the traced server of the other tests may still be running: its spans say whose they are)
    assert not [s for s in receiver.spans if s["service"] == "untraced" or s["trace"] == trace_id]
    assert default_port is None or not default_port.posts


def test_trace_flags():
    """The launcher's flags from the standard settings: none without an endpoint; the sampler as Triton's rate."""
    from local_triton.server import trace_flags, trace_rate

    assert trace_flags({"OTEL_TRACES_SAMPLER": "always_on"}) == []
    assert trace_flags({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}) == []
    flags = trace_flags({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_SERVICE_NAME": "emb"})
    assert flags == ["--trace-config=mode=opentelemetry", "--trace-config=level=TIMESTAMPS",
                     "--trace-config=rate=1", "--trace-config=count=-1",
                     "--trace-config=opentelemetry,url=http://c:4318/v1/traces",
                     "--trace-config=opentelemetry,resource=service.name=emb"]
    assert "--trace-config=opentelemetry,url=http://t/x" in trace_flags(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert trace_rate("parentbased_traceidratio", "0.001") == 1000
    assert trace_rate("traceidratio", "0.3") == 3
    assert trace_rate("traceidratio", "") == 1
    assert trace_rate("always_off", "") == 0
    assert trace_rate("", "") == trace_rate("always_on", "") == 1
    with pytest.raises(SystemExit):
        trace_rate("traceidratio", "2")


def test_off_imports_nothing():
    """Off, the library imports no OpenTelemetry module and its decorators hand the functions back."""
    import subprocess
    import sys

    code = ("import sys, tracing\n"
            "f = lambda *a: 1\n"
            "assert not tracing.ENABLED and tracing.per_request(f) is f and tracing.bls_call(f, f) is f\n"
            "assert tracing.asgi(f) is f\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    library = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_library")
    result = subprocess.run([sys.executable, "-c", code], cwd=library, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
