"""CPU per request of the proxy's ASGI app (metrics, gate, routes) with its plain routes answered directly
(proxy/1/http_front/direct.py, what the proxy runs) against the same app with every request through FastAPI's
pipeline (which parses and validates the bodies of routes with a body parameter itself).

No server and no Triton: requests are handed to the ASGI callables in one process, over a service that answers at
once (vectors of the model's width), so what is measured is the app's own Python work per request. Rounds alternate
the two apps; the ratio is FastAPI's time over the direct one's (above 1: direct is faster).

--gap-ms idles the loop that long before each request, as a client at concurrency 1 leaves the proxy idle while
Triton computes (~11 ms for a query on 2 cores): only the request's own CPU is counted, but it then runs on a core
that went idle (cold caches). On this machine that alone makes the same code ~3x dearer (bench/TUNING.md).

    python -m bench.studies.proxy_app [--requests 2000] [--rounds 3] [--width 1024] [--gap-ms 11]
"""
import argparse
import asyncio
import statistics
import time
from types import SimpleNamespace

import numpy as np
import orjson
import uvloop

from model_library.in_process import model_module

# the proxy's modules, imported as its model.py imports them inside Triton (model_library/in_process.py)
NotFound = model_module("proxy", "http_front.errors").NotFound
from model_library.model_errors import ErrorKind  # noqa: E402

proxy_service = model_module("proxy", "http_front.service")  # its answers' dataclasses
baseline = model_module("proxy", "http_front.baseline")  # the app through FastAPI's pipeline
proxy_app = model_module("proxy", "http_front.app")
Metrics = model_module("proxy", "http_front.metrics").Metrics

WORKLOADS = {  # name -> (path, body, expected status)
    "one query": ("/v1/embeddings", {"input": "what is the capital of france?"}, 200),
    "8 texts": ("/v1/embeddings", {"input": [f"sentence number {i} about serving embeddings" for i in range(8)]},
                200),
    "rerank, 8 documents": ("/v1/rerank", {"query": "capital of france",
                                           "documents": [f"document {i}" for i in range(8)]}, 200),
    "refused (unknown model)": ("/v1/embeddings", {"input": "x", "model": "nope"}, 404),
    # the routes that read their body another way before bodies.py: the seed API's (query parameters: FastAPI's
    # pipeline then) and TEI's / (its schema picked from the body)
    "seed API, one query": ("/v1/embedding", [{"query": "what is the capital of france?"}], 200),
    "TEI /, one query": ("/", {"inputs": "what is the capital of france?"}, 200),
}


class InstantService:
    """The app's Service protocol, answering at once."""
    draining = False

    def __init__(self, width):
        self.card = SimpleNamespace(id="bench", name="ensemble", outputs=("dense",), embedding_size=width,
                                    colbert_size=width, max_length=512, source="bench", created=0, kind="embedding",
                                    chunks=None, rerank="rerank", image=None, architecture=None, pretrained=None)
        self.vector = np.full(width, width ** -0.5, dtype=np.float32)

    def cards(self):
        return [self.card]

    exports = cards

    def resolve(self, model):
        if model not in (None, "bench"):
            raise NotFound(f"model '{model}' is not served here", ErrorKind.MODEL_NOT_FOUND, "model")
        return self.card

    def health(self):
        return proxy_service.Health(True, "ok")

    live = health

    async def embed(self, card, texts, outputs, param, parameters=None):
        n = len(texts)
        return proxy_service.Embeddings(dense=np.tile(self.vector, (n, 1)), sparse=None, colbert=None,
                                        tokens=np.full(n, 9), truncated=np.zeros(n, bool), inference_ms=1.0)

    async def rerank(self, card, query, documents, weights, parameters=None):
        n = len(documents)
        return proxy_service.RerankScores(scores=np.linspace(1, 0, n, dtype=np.float32),
                                          mode_scores=np.full((n, 3), np.nan, np.float32), tokens=9 * (n + 1),
                                          query_truncated=False, truncated=np.zeros(n, bool), inference_ms=1.0)


def settings():
    return SimpleNamespace(api_key="", admin_api_key="", max_inputs_per_request=2048, max_input_chars=262144,
                           max_concurrent_requests=256, admission_target_s=2.0, max_body_bytes=2097152,
                           body_timeout_s=5.0, swagger_path=None, max_image_bytes=1, max_images_per_request=1,
                           image_url_hosts="", image_url_max_bytes=1, image_url_timeout_s=1.0,
                           image_url_allow_private=False, max_embed_all_numbers=4_000_000, request_timeout_s=60.0)


def apps(width):
    """(direct: what the proxy runs, through FastAPI: the same app without direct.py)."""
    config, service = settings(), InstantService(width)
    direct = proxy_app.create_server_app(config, service, Metrics())
    return direct, baseline.create_baseline_app(config, service, Metrics())


async def call(app, path, body, expected):
    given, answered = [False], asyncio.Event()

    async def receive():
        if not given[0]:
            given[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    status = []

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}
    await app(scope, receive, send)
    answered.set()
    if status != [expected]:
        raise SystemExit(f"bench: {path} answered {status}, expected {expected}")


async def cpu_us(app, path, body, expected, requests, gap_s=0.0):
    spent = 0.0
    for _ in range(requests):
        if gap_s:
            await asyncio.sleep(gap_s)
        started = time.process_time()
        await call(app, path, body, expected)
        spent += time.process_time() - started
    return spent / requests * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per app and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024, help="vector width (bge-m3: 1024)")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="idle time before each request, not counted (default 0: back to back)")
    args = parser.parse_args(argv)
    direct, through_fastapi = apps(args.width)
    loop = uvloop.new_event_loop()  # the proxy's loop (server.py)
    print(f"{'workload':26s} {'direct us/req':>14s} {'FastAPI us/req':>15s} {'FastAPI/direct':>15s}")
    for name, (path, body, expected) in WORKLOADS.items():
        body = orjson.dumps(body)
        times = {"direct": [], "fastapi": []}
        for app in (direct, through_fastapi):  # warm-up
            loop.run_until_complete(cpu_us(app, path, body, expected, 100))
        for round_ in range(args.rounds):
            order = (("direct", direct), ("fastapi", through_fastapi))
            for key, app in order if round_ % 2 == 0 else order[::-1]:
                times[key].append(loop.run_until_complete(
                    cpu_us(app, path, body, expected, args.requests, args.gap_ms / 1000)))
        d, f = statistics.median(times["direct"]), statistics.median(times["fastapi"])
        print(f"{name:26s} {d:14.0f} {f:15.0f} {f / d:15.2f}", flush=True)
    loop.close()


if __name__ == "__main__":
    main()
