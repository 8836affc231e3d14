"""Latency the HTTP proxy adds over a direct gRPC call to `ensemble`, at concurrency 1.

One request = the same 8 texts. Both clients keep their connection open; after a warm-up, requests alternate
gRPC and proxy (so drift on a noisy machine hits both alike) and the p50/p90 of each are compared.

    python -m bench.studies.proxy_overhead --grpc 127.0.0.1:8001 --proxy http://127.0.0.1:8080 \
        [--requests 200] [--model NAME]
"""
import argparse
import http.client as httplib
import statistics
import time
import urllib.parse

import numpy as np
import orjson
import tritonclient.grpc as grpcclient

TEXTS = [f"Sentence number {i} about serving text embeddings with Triton on a small machine." for i in range(8)]


def percentile(values, q):
    return float(np.percentile(np.array(values) * 1000, q))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:8001")
    parser.add_argument("--proxy", default="http://127.0.0.1:8080")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per path")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--encoding", choices=["float", "base64"], default="float")
    parser.add_argument("--model", help="the proxy's model name (default: the first of its /v1/models)")
    args = parser.parse_args(argv)

    grpc = grpcclient.InferenceServerClient(args.grpc)
    text = grpcclient.InferInput("text", [len(TEXTS), 1], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object).reshape(-1, 1))
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("embedding", "num_tokens", "truncated")]
    # The stdlib client: light per request (httpx alone added ~1 ms here), keep-alive like the gRPC channel.
    proxy = urllib.parse.urlsplit(args.proxy)
    http = httplib.HTTPConnection(proxy.hostname, proxy.port or 80, timeout=30)
    if args.model is None:
        http.request("GET", "/v1/models")
        args.model = orjson.loads(http.getresponse().read())["data"][0]["id"]
    body = {"input": TEXTS, "model": args.model, "encoding_format": args.encoding}

    def call_grpc():
        grpc.infer("ensemble", [text], outputs=outputs).as_numpy("embedding")

    request_body = orjson.dumps(body)
    headers = {"content-type": "application/json"}
    inference_ms = []

    def call_proxy():
        http.request("POST", "/v1/embeddings", request_body, headers)
        response = http.getresponse()
        content = response.read()
        if response.status != 200:
            raise RuntimeError(f"proxy answered {response.status}: {content[:200]!r}")
        orjson.loads(content)  # a fast client-side decode, as a real client would use
        return float(response.getheader("x-inference-time"))

    timings = {"grpc": [], "proxy": []}
    for _ in range(args.warmup):
        call_grpc()
        call_proxy()
    # Interleaved pairs (order alternating), so load from elsewhere on a shared machine hits both paths alike.
    for i in range(args.requests):
        for name, call in ((("grpc", call_grpc), ("proxy", call_proxy)) if i % 2 == 0 else
                           (("proxy", call_proxy), ("grpc", call_grpc))):
            started = time.perf_counter()
            bls_ms = call()
            timings[name].append(time.perf_counter() - started)
            if bls_ms is not None:
                inference_ms.append(bls_ms / 1000)
    for name, values in timings.items():
        print(f"{name:5s}: n={len(values)} p50 {percentile(values, 50):.3f} ms, p90 {percentile(values, 90):.3f} ms, "
              f"mean {statistics.mean(values) * 1000:.3f} ms")
    paired = [p - g for p, g in zip(timings["proxy"], timings["grpc"])]
    print(f"proxy overhead: p50(proxy) - p50(grpc) = "
          f"{percentile(timings['proxy'], 50) - percentile(timings['grpc'], 50):+.3f} ms; "
          f"median of paired differences {percentile(paired, 50):+.3f} ms "
          f"(8 texts, encoding_format={args.encoding}, concurrency 1)")
    outside_bls = [total - bls for total, bls in zip(timings["proxy"], inference_ms)]
    print(f"inside the proxy: BLS p50 {percentile(inference_ms, 50):.3f} ms; HTTP + JSON + client (proxy time minus "
          f"its X-Inference-Time) p50 {percentile(outside_bls, 50):.3f} ms, p90 {percentile(outside_bls, 90):.3f} ms")

if __name__ == "__main__":
    main()
