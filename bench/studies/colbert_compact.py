"""Compact ColBERT (issue 17, item 4): bytes per passage for each pool factor and type, and how well MaxSim keeps
its ranking against the full float vectors, through the real tritonserver (`ensemble_bls`).

The model is bge-m3's *shape* (hidden 1024, the XLM-R tokenizer, random sparse and ColBERT heads:
bench.studies.m3_cost's build_model) with one random layer. Vector counts, hence bytes, are what bge-m3 gives for
the same texts (they depend only on the tokens); the ranking figures are a sanity check of the compression on random
vectors, not a retrieval quality measure (that needs the real model and relevance labels, e.g. the paper's BEIR
runs).

Passages: ~100 passages of 200-500 tokens (bench/corpus.py, real English prose); queries: 20 sentences of 5-30
tokens, scored against every passage: MaxSim = sum over query vectors of the best dot product with the passage's
vectors (FlagEmbedding's colbert_score without its division by the query length, which does not change a ranking).
Compressed passages are scored as stored: fp16 cast back, int8 / 127, binary as sign vectors / sqrt(dim) (an
asymmetric score: float query, binary passage). Per query: Spearman's rho of all passages' scores and the overlap of
the top 10 with the full float ranking; mean over queries.

    python -m bench.studies.colbert_compact [--passages 100 --queries 20 --work-dir DIR]   (~3 min on 2 busy cores)
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

from bench import common, corpus
from bench.studies.m3_cost import build_model, tokenizer_folder

NAME = "m3c"
MAX_LENGTH = 512
TYPES = {"float": "colbert_vectors", "fp16": "colbert_vectors_fp16", "int8": "colbert_vectors_int8",
         "binary": "colbert_vectors_binary"}
POOL_FACTORS = (1, 2, 3)
BATCH = 8


def progress(message):
    print(f"colbert_compact: {message}", file=sys.stderr, flush=True)


def encode(url, texts, pool_factor, names):
    """Per text, per output: its rows (colbert_length of them)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    rows = {name: [] for name in names}
    try:
        for first in range(0, len(texts), BATCH):
            part = np.array([t.encode() for t in texts[first:first + BATCH]], dtype=np.object_).reshape(-1, 1)
            tensor = grpcclient.InferInput("text", list(part.shape), "BYTES")
            tensor.set_data_from_numpy(part)
            result = client.infer(f"{NAME}_bls", [tensor], outputs=[grpcclient.InferRequestedOutput(n)
                                                                     for n in (*names, "colbert_length")],
                                  parameters={"colbert_pool_factor": pool_factor}, timeout=600_000_000)
            lengths = result.as_numpy("colbert_length").reshape(-1)
            for name in names:
                values = result.as_numpy(name)
                rows[name] += [values[i, :n] for i, n in enumerate(lengths)]
    finally:
        client.close()
    return rows


def as_float(rows, kind, dim):
    if kind == "fp16":
        return [r.astype(np.float32) for r in rows]
    if kind == "int8":
        return [r.astype(np.float32) / 127 for r in rows]
    if kind == "binary":
        return [(np.unpackbits(r, axis=-1)[:, :dim].astype(np.float32) * 2 - 1) / np.sqrt(dim) for r in rows]
    return rows


def maxsim(queries, passages):
    """[queries, passages] scores."""
    return np.array([[float((q @ p.T).max(axis=1).sum()) for p in passages] for q in queries])


def agreement(scores, reference):
    from scipy.stats import spearmanr

    rho = [spearmanr(s, r).statistic for s, r in zip(scores, reference)]
    top = [len(set(np.argsort(-s)[:10]) & set(np.argsort(-r)[:10])) / 10 for s, r in zip(scores, reference)]
    return float(np.mean(rho)), float(np.mean(top))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--work-dir", help="keeps the model and its export between runs")
    args = parser.parse_args(argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="colbert_compact_")
    started = time.monotonic()
    tokenizer_dir = tokenizer_folder(os.path.join(work, "tokenizer"))
    tokenizer = corpus.load_tokenizer(os.path.join(tokenizer_dir, "tokenizer.json"), MAX_LENGTH)
    passages = [c["text"] for c in corpus._passages(__import__("random").Random("colbert:0"), tokenizer,
                                                    corpus._paragraphs(), args.passages, (200, 500), MAX_LENGTH,
                                                    set(), 200 * args.passages)]
    sentences = [s for p in corpus._paragraphs() for s in p.split(". ")]
    queries = [c["text"] for c in corpus._queries(__import__("random").Random("colbert:q"), tokenizer, sentences,
                                                  args.queries, (5, 30), set(), 200 * args.queries)]
    folder, repository = os.path.join(work, "model"), os.path.join(work, "repository")
    if not os.path.exists(os.path.join(folder, "colbert_linear.pt")):
        progress("building a 1-layer bge-m3-shaped model")
        ids = np.array([tokenizer.encode(p).ids[:128] for p in passages[:4] if len(tokenizer.encode(p).ids) >= 128])
        build_model(folder, 1, tokenizer_dir, ids)
    if not os.path.exists(os.path.join(repository, f"{NAME}_bls", "config.pbtxt")):
        progress("exporting it")
        common.run_export(folder, repository, "--name", NAME, "--max-length", str(MAX_LENGTH), who="colbert_compact")
    ports = common.free_ports()
    server = common.start_server(repository, ports, os.path.join(work, "tritonserver.log"))
    try:
        url = f"127.0.0.1:{ports['grpc']}"
        progress(f"encoding {len(passages)} passages and {len(queries)} queries")
        query_vectors = encode(url, queries, 1, ["colbert_vectors"])["colbert_vectors"]
        results = {factor: encode(url, passages, factor, list(TYPES.values())) for factor in POOL_FACTORS}
    finally:
        common.stop_server(server)
    dim = query_vectors[0].shape[1]
    tokens = [len(v) for v in results[1]["colbert_vectors"]]
    reference = maxsim(query_vectors, results[1]["colbert_vectors"])
    print(f"\nCompact ColBERT, {len(passages)} passages of {min(tokens)}-{max(tokens)} ColBERT vectors (mean "
          f"{np.mean(tokens):.0f}; bge-m3 tokens - 1), dim {dim}, {len(queries)} queries; random 1-layer "
          f"bge-m3-shaped model: the ranking columns are a sanity check, not retrieval quality (a query's passage "
          f"scores differ by {np.mean(reference.std(axis=1) / reference.mean(axis=1)):.1%} (std / mean): small "
          f"changes reorder them).\n")
    print("| pool factor | type | vectors / passage | bytes / passage | vs float, no pooling | Spearman rho | "
          "top-10 overlap |")
    print("|---|---|---|---|---|---|---|")
    full_bytes = None
    for factor in POOL_FACTORS:
        for kind, name in TYPES.items():
            rows = results[factor][name]
            size = np.mean([r.nbytes for r in rows])
            full_bytes = full_bytes or size
            rho, top = agreement(maxsim(query_vectors, as_float(rows, kind, dim)), reference)
            print(f"| {factor} | {kind} | {np.mean([len(r) for r in rows]):.1f} | {size:,.0f} | "
                  f"{full_bytes / size:.1f}x smaller | {rho:.4f} | {top:.2f} |")
    print(f"\n({time.monotonic() - started:.0f} s; work dir {work})")


if __name__ == "__main__":
    main()
