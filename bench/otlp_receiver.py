"""An OTLP/HTTP trace receiver (POST /v1/traces) that decodes the real messages with opentelemetry-proto: protobuf
(the OpenTelemetry SDKs', model_library/tracing.py's) and OTLP/JSON (Triton 24.07's exporter sends JSON, ids in hex).
tests/test_tracing.py asserts on what it keeps; bench/studies/tracing_cost.py counts each server's spans with it."""
import base64
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson


class Receiver:
    """The receiver, on `port` (0: a free one): keeps every span as a dict (trace, span, parent: hex; name, kind,
    attributes, service, error, start_ns, end_ns), and each POST (path, headers, size)."""

    def __init__(self, port=0):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        receiver = self
        self.spans, self.posts, self.failures, self.lock = [], [], [], threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.body()
                with receiver.lock:
                    receiver.posts.append((self.path, dict(self.headers), len(body)))
                try:
                    if self.headers.get("Content-Type", "").startswith("application/json"):
                        decoded = from_json(body, ExportTraceServiceRequest())  # Triton 24.07's exporter
                    else:
                        decoded = ExportTraceServiceRequest.FromString(body)  # the SDK's (tracing.py)
                except Exception as error:  # noqa: BLE001 - kept for the test to show
                    with receiver.lock:
                        receiver.failures.append((dict(self.headers), body[:200], repr(error)))
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with receiver.lock:
                    for resource in decoded.resource_spans:
                        service = next((a.value.string_value for a in resource.resource.attributes
                                        if a.key == "service.name"), None)
                        for scope in resource.scope_spans:
                            for span in scope.spans:
                                receiver.spans.append({
                                    "trace": span.trace_id.hex(), "span": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(), "name": span.name, "kind": span.kind,
                                    "service": service, "attributes": {a.key: value(a.value) for a in span.attributes},
                                    "error": span.status.code == 2, "start_ns": span.start_time_unix_nano,
                                    "end_ns": span.end_time_unix_nano})
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                        if size == 0:
                            return b"".join(chunks)
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                return gzip.decompress(data) if self.headers.get("Content-Encoding") == "gzip" else data

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id):
        with self.lock:
            return [span for span in self.spans if span["trace"] == trace_id]

    def wait(self, trace_id, done, timeout_s=30):
        """The trace's spans once done(spans) holds (else what arrived, for the assertion to show)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if done(spans):
                return spans
            time.sleep(0.2)
        return self.trace(trace_id)

    def services(self):
        """{service.name: spans received}."""
        with self.lock:
            counts = {}
            for span in self.spans:
                counts[span["service"]] = counts.get(span["service"], 0) + 1
            return counts

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def from_json(body, message):
    """OTLP/JSON into the protobuf message: protobuf's JSON mapping, but for the ids, which OTLP writes in hex
    (protobuf's mapping: base64)."""
    from google.protobuf import json_format

    data = orjson.loads(body)
    for resource in data.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(data, message)


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None
