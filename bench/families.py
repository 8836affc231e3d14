"""Step 14 of `make bench`: a decoder embedder and a static embedder against their own in-process ceilings in one
run (issue 56). Random (seeded) weights: the speed of a model of that shape, not its quality.

The two folders come from tiny_checkpoints/ (laid out as the real checkpoints, so export takes them by the
same path): `qwen3`, Qwen3-Embedding's layout (last-token pooling, EOS appended) re-drawn at DECODER's size, and
`static`, static-retrieval-mrl-en-v1's layout (StaticEmbedding: mean of token rows) at its real size, 1024 wide over
BERT's 30,522-token vocabulary. Both are exported by name into one scratch repository and served by one tritonserver.

Per model and workload (bench/corpus.py's queries and passages, built with the export's own tokenizer):
- served: requests of 32 texts to NAME_bls over KServe gRPC asking for `embedding` only (what a client of vectors
  asks; perf_analyzer would ask for every output, the token embeddings included), a closed loop of Python client
  threads at each of LEVELS; the best level counts;
- ceiling: onnxruntime in-process on the served NAME_embedding/1/model.onnx, `embedding` only, with the served
  intra-op threads, the same texts tokenized by NAME_tokenizer/1/tokenizer.json, sorted by length, at its best
  batch size; swept before the server starts, its best batch run again after it stops, the better counts.
The ratio served / ceiling is printed per model and workload.

Inference-free SPLADE (issue 68): `neural-sparse`, opensearch-neural-sparse-encoding-doc-v3-distill's layout at the
test builder's tiny size (a Router: queries a weight lookup in the tokenizer model, documents a DistilBERT SPLADE
encoder), exported beside them. Its query path (input_type query: the tokenizer's lookup, no encoder run) against its
document path (input_type document: the encoder) on the same queries, in the same server, requests of 32 texts to
NAME_bls asking for the sparse outputs, at the same levels: texts/s each and their ratio. (No onnxruntime ceiling:
the query path has no graph.) At the tiny size the document path's encoder costs little: the ratio is a floor.

MUVERA (issue 70): `colbert`, a PyLate ColBERT checkpoint (answerai-colbert-small-v1's layout at the test builder's
tiny size, projecting to COLBERT_WIDTH: colbertv2's 128), exported beside them with MUVERA's default parameters.
Quality: each query's exact MaxSim top 10 over the passages (PyLate's score: the sum over query vectors of the best
dot product) against its MUVERA top N (the query side's encoding dotted with each passage's document side): the
share of the MaxSim top 10 found there (recall@N), the paper's measure of an encoding (its §3 reports it for real
ColBERTv2 vectors on BEIR; these are random-weight vectors: the approximation, not retrieval quality). Cost against
the ColBERT path: bytes per passage stored (float32), the time to score every passage for one query (MaxSim over
the vectors in numpy, against one matrix-vector product), and the served passages/s asking NAME_bls for the ColBERT
vectors with MUVERA against without (the BLS model computes it).

    python -m bench.families                  # ~4.5 min on 2 shared cores, 1.5 of them the two exports' checks
    python -m bench.families --short          # ~30 s smoke, half of it the exports: the tiny decoder, one level
    python -m bench.families --update-docs    # also put the section into docs/benchmarks.md
    (also a step of python -m bench.run: --no-families leaves it out)
"""
import argparse
import json
import os
import shutil
import sys
import threading
import time

from bench import baselines, common
from bench import corpus as corpus_lib

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Qwen3-Embedding-0.6B (hidden 1024, 28 layers, 16 heads of 128 over 8 KV heads, MLP 3x) scaled to what 2 shared
# cores measure within the step's minutes: 4 layers of 256 (4 heads of 64 over 2 KV heads, MLP 3x). At 384 wide,
# 32 passages took seconds per request and the windows outgrew the budget.
DECODER = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "intermediate_size": 768}
STATIC_DIMENSION = 1024  # static-retrieval-mrl-en-v1's
MAX_LENGTH = 512
PER_REQUEST = 32
WORKLOADS = ("queries", "passages")
MODELS = {"qwen3": "decoder (Qwen3-Embedding layout)", "static": "static (StaticEmbedding layout)"}
SPARSE_MODEL = "neural-sparse"  # inference-free SPLADE (opensearch-neural-sparse-encoding-doc-v3-distill's layout)
SIDES = {"query": "query path (tokenizer's lookup, no encoder)", "document": "document path (SPLADE encoder)"}
SPARSE_OUTPUTS = ("sparse_indices", "sparse_values", "sparse_count")
COLBERT_MODEL = "colbert"  # a PyLate ColBERT (answerai-colbert-small-v1's layout): MUVERA's vectors
COLBERT_WIDTH = 128  # colbertv2's token vectors
COLBERT_OUTPUTS = ("colbert_vectors", "colbert_length")
FULL = {"texts": {"queries": 512, "passages": 256}, "levels": (2, 4), "seconds": 6.0, "ceiling_seconds": 1.5,
        "batch_sizes": (1, 4, 16, 64), "decoder": DECODER,
        "muvera": {"passages": 1000, "queries": 50, "top": 100}}
SHORT = {"texts": {"queries": 64, "passages": 64}, "levels": (2,), "seconds": 0.5, "ceiling_seconds": 0.2,
         "batch_sizes": (8, 32), "decoder": None,  # None: the builder's own tiny decoder
         "muvera": {"passages": 64, "queries": 8, "top": 16}}


# ---------------------------------------------------------------- the folders and their export
def model_families():
    """tiny_checkpoints/: the builders of the tiny checkpoints the tests build theirs from too."""
    import tiny_checkpoints

    return tiny_checkpoints


def build_decoder(folder, size, families):
    """The builder's Qwen3-Embedding folder (tokenizer, modules, prompts), its weights re-drawn at `size`."""
    families.build_qwen3_embedding(folder)
    if not size:
        return folder
    import torch
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config.from_pretrained(folder)
    config.update({**size, "layer_types": ["full_attention"] * size["num_hidden_layers"]})
    torch.manual_seed(56)
    Qwen3Model(config).eval().save_pretrained(folder)  # default init: a speed measurement, no quality wanted
    for path, changes in (("config.json", {"architectures": ["Qwen3ForCausalLM"]}),  # as the builder (and the hub)
                          ("1_Pooling/config.json", {"word_embedding_dimension": size["hidden_size"]})):
        with open(os.path.join(folder, path), encoding="utf-8") as handle:
            data = json.load(handle)
        with open(os.path.join(folder, path), "w", encoding="utf-8") as handle:
            json.dump({**data, **changes}, handle, indent=2)
    return folder


def build_static(folder, families):
    """The builder's StaticEmbedding folder at the real width. Its tokenizer.json is MiniLM's, truncating at 128;
    set to MAX_LENGTH so passages reach 500 tokens as the decoder's do (export checks the served truncation against
    the reference's, which reads it from this file)."""
    families.build_static_embedding(folder, dimension=STATIC_DIMENSION)
    path = os.path.join(folder, "0_StaticEmbedding", "tokenizer.json")
    with open(path, encoding="utf-8") as handle:
        spec = json.load(handle)
    spec["truncation"]["max_length"] = MAX_LENGTH
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle, ensure_ascii=False)
    return folder


def build_folders(work_dir, decoder_size, progress):
    """{name: folder}, built once per size (seeded: a rebuild gives the same weights)."""
    tag = "x".join(str(decoder_size[k]) for k in ("hidden_size", "num_hidden_layers")) if decoder_size else "tiny"
    folders = {"qwen3": os.path.join(work_dir, f"qwen3-{tag}"),
               "static": os.path.join(work_dir, f"static-{STATIC_DIMENSION}"),
               SPARSE_MODEL: os.path.join(work_dir, "neural-sparse-tiny"),
               COLBERT_MODEL: os.path.join(work_dir, f"colbert-tiny-{COLBERT_WIDTH}")}
    builders = {"qwen3": lambda folder: build_decoder(folder, decoder_size, families),
                "static": lambda folder: build_static(folder, families),
                SPARSE_MODEL: lambda folder: families.build_inference_free_splade(folder),
                COLBERT_MODEL: lambda folder: families.build_colbert(folder, out_features=COLBERT_WIDTH)}
    families = None
    for name, folder in folders.items():
        if os.path.exists(os.path.join(folder, "modules.json")):
            continue
        families = families or model_families()
        progress(f"families: building {name} ({folder})")
        shutil.rmtree(folder, ignore_errors=True)
        builders[name](folder)
    return folders


def export(work_dir, folders, progress):
    """Both exported by name into one fresh repository (one after the other: run side by side on 2 cores, the two
    took longer than in turn)."""
    repository = os.path.join(work_dir, "repository")
    shutil.rmtree(repository, ignore_errors=True)
    for name, folder in folders.items():
        started = time.monotonic()
        length = [] if name == COLBERT_MODEL else ["--max-length", str(MAX_LENGTH)]  # PyLate's lengths are its own
        common.run_export(folder, repository, "--name", name, *length, who=f"bench families ({name})")
        progress(f"families: exported {name} in {time.monotonic() - started:.0f} s (parity and reference checks "
                 f"included)")
    return repository


# ---------------------------------------------------------------- texts and the ceiling
def workload_texts(repository, name, workload, size):
    """The workload's texts for this export (token counts by its own tokenizer) and their ids as served."""
    with open(os.path.join(repository, name, "1", "export.json"), encoding="utf-8") as handle:
        max_length = int(json.load(handle)["max_length"])
    tokenizer_json = os.path.join(repository, f"{name}_tokenizer", "1", "tokenizer.json")
    tokenizer = corpus_lib.load_tokenizer(tokenizer_json)
    texts = [t["text"] for t in corpus_lib.build(tokenizer, corpus_lib.WORKLOADS[workload], size, 0, max_length)]
    with open(tokenizer_json, encoding="utf-8") as handle:
        pad_id = json.load(handle)["padding"]["pad_id"]
    return texts, [e.ids for e in tokenizer.encode_batch(texts)], pad_id


def batches(encodings, size, pad_id, budget):
    """The texts sorted by length, cut into batches of `size` rows padded to their own longest text; a batch whose
    rows x width would pass the encoder's max_batch_tokens (its graph refuses it) is cut shorter, as the served
    batcher's budget cuts it."""
    rows, cut, start = sorted(encodings, key=len), [], 0
    while start < len(rows):
        end = min(start + size, len(rows))
        while end - start > 1 and (end - start) * len(rows[end - 1]) > budget:
            end -= 1
        cut.append(baselines._padded(rows[start:end], len(rows[end - 1]), pad_id))
        start = end
    return cut


def ceiling(onnx_path, encodings, pad_id, threads, budget, batch_sizes, seconds):
    """texts/s of onnxruntime in-process asked for `embedding` only (the served BLS asks the encoder for nothing
    else), at each batch size for `seconds` or one pass, the batches in bit-reversed order (a time-limited run
    samples every length): {"best": {"batch_size", "texts_per_s"}, "sweep": {size: texts/s}}."""
    session = baselines._session(onnx_path, threads, "cpu")
    sweep = {}
    for size in batch_sizes:
        cut = batches(encodings, size, pad_id, budget)
        session.run(["embedding"], {"input_ids": cut[-1][0], "attention_mask": cut[-1][1]})  # warm-up
        texts, started = 0, time.perf_counter()
        for index in baselines._spread(len(cut)):
            ids, mask = cut[index]
            session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
            texts += len(ids)
            if time.perf_counter() - started >= seconds:
                break
        sweep[size] = texts / (time.perf_counter() - started)
    best = max(sweep, key=sweep.get)
    return {"best": {"batch_size": best, "texts_per_s": sweep[best]}, "sweep": sweep}


# ---------------------------------------------------------------- the served path
def served(url, model, texts, concurrency, seconds, names=("embedding",), parameters=None):
    """A closed loop of `concurrency` client threads, each sending requests of PER_REQUEST texts (cycling through
    `texts` in their order) over gRPC for `names` (default `embedding`) with the request `parameters`; counted after
    every client has had an answer, for `seconds` or 2 of the slowest warm-up requests, whichever is longer (a
    shorter window counts whole waves or none)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    requests = [np.array([texts[(start + k) % len(texts)].encode() for k in range(PER_REQUEST)],
                         dtype=np.object_).reshape(-1, 1) for start in range(0, len(texts), PER_REQUEST)]
    lock, stop, done, answered, errors = threading.Lock(), threading.Event(), [], set(), []

    def client(index):
        connection = grpcclient.InferenceServerClient(url)
        wanted = [grpcclient.InferRequestedOutput(name) for name in names]
        try:
            for k in range(index, 1 << 30, concurrency):
                if stop.is_set():
                    return
                text = grpcclient.InferInput("text", [PER_REQUEST, 1], "BYTES")
                text.set_data_from_numpy(requests[k % len(requests)])
                started = time.perf_counter()
                try:
                    rows = connection.infer(model, [text], outputs=wanted, parameters=parameters).as_numpy(
                        names[-1]).shape[0]
                    if rows != PER_REQUEST:
                        raise RuntimeError(f"{rows} vectors for {PER_REQUEST} texts")
                except Exception as error:  # reported below, not raised in a thread
                    with lock:
                        errors.append(str(error)[:300])
                    stop.set()
                    return
                with lock:
                    answered.add(index)
                    done.append((time.perf_counter(), time.perf_counter() - started))
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    deadline = time.perf_counter() + 300
    while len(answered) < concurrency and not errors and time.perf_counter() < deadline:
        time.sleep(0.05)
    with lock:
        slowest = max((latency for _, latency in done), default=0.0)
        start = time.perf_counter()
    time.sleep(max(seconds, 2 * slowest))
    with lock:
        end = time.perf_counter()
        window = [latency for at, latency in done if start < at <= end]
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    if errors or not window:
        raise SystemExit(f"bench families: {model} c={concurrency}: "
                         f"{errors[0] if errors else 'no answer in the window'}")
    window.sort()
    return {"texts_per_s": len(window) * PER_REQUEST / (end - start), "requests": len(window),
            "p50_ms": window[len(window) // 2] * 1000, "p99_ms": window[min(len(window) - 1,
                                                                             int(0.99 * len(window)))] * 1000}


# ---------------------------------------------------------------- the step
def measure(work_dir, short=False, progress=print):
    """{"rows": [{model, family, workload, texts, mean_tokens, ceiling, sweep, levels, best_level, texts_per_s,
    ratio}], ...}: one row per model and workload."""
    settings = SHORT if short else FULL
    started, load = time.monotonic(), [os.getloadavg()[0]]  # other work on a shared machine shows here
    os.makedirs(work_dir, exist_ok=True)
    folders = build_folders(work_dir, settings["decoder"], progress)
    repository = export(work_dir, folders, progress)
    progress(f"families: exported in {time.monotonic() - started:.0f} s; ceilings (onnxruntime in-process)")
    rows = []
    for name in MODELS:
        onnx_path = os.path.join(repository, f"{name}_embedding", "1", "model.onnx")
        threads = int(common.config_parameter(repository, f"{name}_embedding", "intra_op_thread_count", "0") or 0)
        budget = int(common.config_parameter(repository, f"{name}_embedding", "max_batch_tokens"))
        for workload in WORKLOADS:
            texts, encodings, pad_id = workload_texts(repository, name, workload, settings["texts"][workload])
            top = ceiling(onnx_path, encodings, pad_id, threads, budget, settings["batch_sizes"],
                          settings["ceiling_seconds"])
            rows.append({"model": name, "family": MODELS[name], "workload": workload, "texts": texts,
                         "mean_tokens": sum(map(len, encodings)) / len(encodings), "encodings": encodings,
                         "pad_id": pad_id, "onnx": onnx_path, "threads": threads, "budget": budget,
                         "ceiling": top["best"], "sweep": top["sweep"], "levels": {}})
            progress(f"families: {name} {workload}: ceiling {top['best']['texts_per_s']:.1f} texts/s at batch "
                     f"{top['best']['batch_size']} ({rows[-1]['mean_tokens']:.0f} tokens per text)")
    ports = common.free_ports()
    progress(f"families: starting tritonserver with {', '.join(folders)}")
    server = common.start_server(repository, ports, os.path.join(work_dir, "tritonserver.log"),
                                 env={"PROXY_DEFAULT_MODEL": next(iter(folders)), "PROXY_HOST": "127.0.0.1"})
    try:
        for row in rows:
            for level in settings["levels"]:
                reading = served(f"127.0.0.1:{ports['grpc']}", f"{row['model']}_bls", row["texts"], level,
                                 settings["seconds"])
                row["levels"][level] = reading
                progress(f"families: {row['model']} {row['workload']} c={level}: {reading['texts_per_s']:.1f} "
                         f"texts/s (p50 {reading['p50_ms']:.0f} ms)")
        sparse = sparse_sides(f"127.0.0.1:{ports['grpc']}", repository, settings, progress)
        muvera = muvera_quality(f"127.0.0.1:{ports['grpc']}", repository, settings, progress)
    finally:
        common.stop_server(server, drain=not short)  # short: killed, nothing left to measure in it
    for row in rows:  # the best batch again once the server is gone: the better of the two passes is the ceiling
        again = ceiling(row["onnx"], row["encodings"], row["pad_id"], row["threads"], row["budget"],
                        [row["ceiling"]["batch_size"]], settings["ceiling_seconds"])["best"]
        row["ceiling"]["passes"] = [row["ceiling"]["texts_per_s"], again["texts_per_s"]]
        row["ceiling"]["texts_per_s"] = max(row["ceiling"]["passes"])
        row["best_level"] = max(row["levels"], key=lambda c: row["levels"][c]["texts_per_s"])
        row["texts_per_s"] = row["levels"][row["best_level"]]["texts_per_s"]
        row["ratio"] = row["texts_per_s"] / row["ceiling"]["texts_per_s"]
        row["texts"] = len(row["texts"])
        for key in ("encodings", "pad_id", "onnx", "budget"):
            del row[key]
    machine = common.machine_info()
    return {"mode": "short" if short else "full", "rows": rows, "sparse": sparse, "muvera": muvera,
            "decoder": settings["decoder"],
            "static_dimension": STATIC_DIMENSION, "max_length": MAX_LENGTH, "per_request": PER_REQUEST,
            "seconds_per_level": settings["seconds"], "elapsed_s": time.monotonic() - started,
            "load_average": [*load, os.getloadavg()[0]],
            "machine": f"{machine['cpu']}, {machine['cores']} cores", "cores": machine["cores"],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def sparse_sides(url, repository, settings, progress):
    """Inference-free SPLADE's query path against its document path: the same queries to NAME_bls for the sparse
    outputs, input_type query (the tokenizer's lookup) then document (the encoder), at each level, in turn; the
    encoder's execution count read before and after the query path (it must not move)."""
    texts, encodings, _ = workload_texts(repository, SPARSE_MODEL, "queries", settings["texts"]["queries"])
    result = {"texts": len(texts), "mean_tokens": sum(map(len, encodings)) / len(encodings), "sides": {}}
    for side in SIDES:
        before = encoder_runs(url, repository)
        levels = {}
        for level in settings["levels"]:
            levels[level] = served(url, f"{SPARSE_MODEL}_bls", texts, level, settings["seconds"], SPARSE_OUTPUTS,
                                   {"input_type": side})
            progress(f"families: {SPARSE_MODEL} {side} path c={level}: {levels[level]['texts_per_s']:.1f} texts/s "
                     f"(p50 {levels[level]['p50_ms']:.0f} ms)")
        best = max(levels, key=lambda c: levels[c]["texts_per_s"])
        result["sides"][side] = {"levels": levels, "best_level": best, "texts_per_s": levels[best]["texts_per_s"],
                                 "encoder_runs": encoder_runs(url, repository) - before}
    if result["sides"]["query"]["encoder_runs"]:
        raise SystemExit(f"bench families: the query path ran the encoder "
                         f"{result['sides']['query']['encoder_runs']} times")
    result["ratio"] = result["sides"]["query"]["texts_per_s"] / result["sides"]["document"]["texts_per_s"]
    return result


def colbert_rows(url, texts, side, names):
    """NAME_bls's answers for `texts` (requests of PER_REQUEST), input_type `side`: {name: per text} (ColBERT
    vectors cut to their length)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    connection = grpcclient.InferenceServerClient(url)
    found = {name: [] for name in names}
    try:
        for first in range(0, len(texts), PER_REQUEST):
            part = texts[first:first + PER_REQUEST]
            text = grpcclient.InferInput("text", [len(part), 1], "BYTES")
            text.set_data_from_numpy(np.array([t.encode() for t in part], dtype=np.object_).reshape(-1, 1))
            result = connection.infer(f"{COLBERT_MODEL}_bls", [text], parameters={"input_type": side},
                                      outputs=[grpcclient.InferRequestedOutput(n) for n in names])
            lengths = result.as_numpy("colbert_length").reshape(-1)
            for name in names:
                rows = result.as_numpy(name)
                found[name] += [v[:n] for v, n in zip(rows, lengths)] if name == "colbert_vectors" else list(rows)
    finally:
        connection.close()
    return found


def muvera_quality(url, repository, settings, progress):
    """MUVERA against exact MaxSim on the ColBERT export's vectors (the module docstring): recall of the MaxSim top
    10 in the MUVERA top N and top 10; bytes per passage; one query's scoring time over every passage; served
    passages/s with and without MUVERA."""
    import numpy as np

    wanted = settings["muvera"]
    passages, _, _ = workload_texts(repository, COLBERT_MODEL, "passages", wanted["passages"])
    queries, _, _ = workload_texts(repository, COLBERT_MODEL, "queries", wanted["queries"])
    names = (*COLBERT_OUTPUTS, "muvera")
    documents, asked = colbert_rows(url, passages, "document", names), colbert_rows(url, queries, "query", names)
    doc_matrix, query_matrix = np.stack(documents["muvera"]), np.stack(asked["muvera"])
    exact_s, fde_s, recall_top, recall_ten = 0.0, 0.0, [], []
    for q, vectors in enumerate(asked["colbert_vectors"]):
        started = time.perf_counter()
        exact = np.array([float((vectors @ d.T).max(axis=1).sum()) for d in documents["colbert_vectors"]])
        exact_s += time.perf_counter() - started
        started = time.perf_counter()
        approximate = doc_matrix @ query_matrix[q]
        fde_s += time.perf_counter() - started
        best = set(np.argsort(-exact, kind="stable")[:10].tolist())
        order = np.argsort(-approximate, kind="stable")
        recall_top.append(len(best & set(order[:wanted["top"]].tolist())) / 10)
        recall_ten.append(len(best & set(order[:10].tolist())) / 10)
    vectors_per_passage = float(np.mean([len(d) for d in documents["colbert_vectors"]]))
    serving = {}
    for label, outputs in (("colbert", COLBERT_OUTPUTS), ("colbert+muvera", names)):
        serving[label] = served(url, f"{COLBERT_MODEL}_bls", passages, settings["levels"][0], settings["seconds"],
                                outputs, {"input_type": "document"})
    result = {"passages": len(passages), "queries": len(queries), "top": wanted["top"],
              "recall_at_top": float(np.mean(recall_top)), "recall_at_10": float(np.mean(recall_ten)),
              "width": int(doc_matrix.shape[1]), "vectors_per_passage": vectors_per_passage,
              "colbert_bytes": vectors_per_passage * COLBERT_WIDTH * 4, "muvera_bytes": int(doc_matrix.shape[1]) * 4,
              "maxsim_ms_per_query": exact_s / len(queries) * 1000, "muvera_ms_per_query": fde_s / len(queries) * 1000,
              "serving": serving, "level": settings["levels"][0],
              "served_ratio": serving["colbert+muvera"]["texts_per_s"] / serving["colbert"]["texts_per_s"]}
    progress(muvera_line(result))
    return result


def muvera_line(m):
    return (f"families: MUVERA on {COLBERT_MODEL} ({m['passages']} passages, {m['queries']} queries): MaxSim top 10 "
            f"in MUVERA top {m['top']}: {m['recall_at_top']:.2f}, top 10: {m['recall_at_10']:.2f}; scoring a query "
            f"{m['maxsim_ms_per_query']:.2f} ms MaxSim / {m['muvera_ms_per_query']:.3f} ms MUVERA = "
            f"{m['maxsim_ms_per_query'] / max(m['muvera_ms_per_query'], 1e-9):.0f}x; bytes per passage "
            f"{m['colbert_bytes']:.0f} ColBERT / {m['muvera_bytes']} MUVERA; served passages with MUVERA / without "
            f"= {m['served_ratio']:.2f}")


def encoder_runs(url, repository):
    """The inference-free export's encoder executions so far (Triton's statistics, over gRPC)."""
    import tritonclient.grpc as grpcclient

    connection = grpcclient.InferenceServerClient(url)
    try:
        stats = connection.get_inference_statistics(f"{SPARSE_MODEL}_embedding", as_json=True)
    finally:
        connection.close()
    return sum(int(model.get("execution_count", 0)) for model in stats.get("model_stats", []))


# ---------------------------------------------------------------- report
def ratios(result):
    """One line per model and workload: served / ceiling; and inference-free SPLADE's query / document paths."""
    lines = [f"families: {r['model']} {r['workload']}: served {r['texts_per_s']:.1f} texts/s (c="
             f"{r['best_level']}) / ceiling {r['ceiling']['texts_per_s']:.1f} (batch "
             f"{r['ceiling']['batch_size']}) = {r['ratio']:.2f}" for r in result["rows"]]
    if result.get("muvera"):
        lines.append(muvera_line(result["muvera"]))
    sparse = result.get("sparse")
    if sparse:
        query, document = sparse["sides"]["query"], sparse["sides"]["document"]
        lines.append(f"families: {SPARSE_MODEL} queries: query path {query['texts_per_s']:.1f} texts/s (c="
                     f"{query['best_level']}, encoder runs {query['encoder_runs']}) / document path "
                     f"{document['texts_per_s']:.1f} (c={document['best_level']}) = {sparse['ratio']:.2f}")
    return "\n".join(lines)


def sparse_table(sparse):
    """Markdown: inference-free SPLADE's two paths on the same queries, every level."""
    levels = sorted({int(c) for side in sparse["sides"].values() for c in side["levels"]})
    lines = ["| path | " + " | ".join(f"c={c} texts/s" for c in levels) + " | encoder runs |",
             "|---|" + "---|" * len(levels) + "---|"]
    for side, reading in sparse["sides"].items():
        by_level = {int(c): v for c, v in reading["levels"].items()}
        cells = [f"{by_level[c]['texts_per_s']:.1f}" if c in by_level else "–" for c in levels]
        lines.append(f"| {SIDES[side]} | " + " | ".join(cells) + f" | {reading['encoder_runs']} |")
    return "\n".join(lines)


def table(result):
    """Markdown: per model and workload, every level served, the ceiling, the ratio."""
    levels = sorted({int(c) for r in result["rows"] for c in r["levels"]})
    lines = ["| model | workload | mean tokens | " + " | ".join(f"served c={c} texts/s" for c in levels)
             + " | ceiling texts/s (batch) | served / ceiling |", "|---|---|---|" + "---|" * len(levels) + "---|---|"]
    for r in result["rows"]:
        by_level = {int(c): v for c, v in r["levels"].items()}
        cells = [f"{by_level[c]['texts_per_s']:.1f}" if c in by_level else "–" for c in levels]
        lines.append(f"| {r['model']}: {r['family']} | {r['workload']} | {r['mean_tokens']:.0f} | "
                     + " | ".join(cells) + f" | {r['ceiling']['texts_per_s']:.1f} ({r['ceiling']['batch_size']}) | "
                     f"**{r['ratio']:.2f}** |")
    return "\n".join(lines)


def section(result):
    """The docs/benchmarks.md section (bench/report.py adds it to the report; --update-docs puts it in place)."""
    size = result["decoder"]
    decoder = (f"hidden {size['hidden_size']}, {size['num_hidden_layers']} layers, {size['num_attention_heads']} "
               f"heads of {size['head_dim']} over {size['num_key_value_heads']} KV heads, MLP "
               f"{size['intermediate_size']}" if size else "the test builder's tiny size")
    load = " at the start, ".join(f"{x:.1f}" for x in result.get("load_average", [])) + " at the end"
    return ["## Model families: a decoder embedder and a static embedder", "",
            f"bench/families.py ({result['mode']} run, {result['date']}, {result['elapsed_s'] / 60:.1f} min with "
            f"both exports; {result['machine']}, shared with the load generator: its client threads run on the "
            f"same cores as the server; 1-minute load average {load}). Random seeded weights from "
            "tiny_checkpoints' folders: `qwen3`, "
            f"Qwen3-Embedding's layout (last-token pooling, EOS appended; its 2,000-piece BPE) at {decoder}; "
            f"`static`, static-retrieval-mrl-en-v1's layout ({result['static_dimension']} wide over BERT's 30,522 "
            f"tokens). Both exported by name (max length {result['max_length']}) into one repository and served by "
            f"one server. Served: requests of {result['per_request']} texts to `NAME_bls` over KServe gRPC asking "
            "for `embedding`, a closed loop of N client threads, measured for "
            f"{result['seconds_per_level']:g} s or 2 of the slowest warm-up requests. Ceiling: onnxruntime "
            "in-process on the served `NAME_embedding/1/model.onnx` (`embedding` only, the served intra-op threads), "
            "the same texts tokenized by the export's `tokenizer.json`, sorted by length, at its best batch size "
            "(swept before the server started, the best batch again after it stopped; the better counts).", "",
            table(result), ""] + sparse_section(result) + muvera_section(result)


def sparse_section(result):
    sparse = result.get("sparse")
    if not sparse:
        return []
    return [f"Inference-free SPLADE (`{SPARSE_MODEL}`, opensearch-neural-sparse-encoding-doc-v3-distill's layout at "
            "the test builder's tiny size, DistilBERT 32 wide: the document path's encoder costs little here, so the "
            f"ratio is a floor), same server and run: its {sparse['texts']} queries ({sparse['mean_tokens']:.0f} "
            f"tokens each) in requests of {result['per_request']} to `NAME_bls` for the sparse outputs, "
            "`input_type` query (the tokenizer model's weight lookup) against document (the SPLADE encoder). Query "
            f"path / document path: **{sparse['ratio']:.2f}**.", "", sparse_table(sparse), ""]


def muvera_section(result):
    m = result.get("muvera")
    if not m:
        return []
    return [f"MUVERA (`{COLBERT_MODEL}`, answerai-colbert-small-v1's PyLate layout at the test builder's tiny size, "
            f"{COLBERT_WIDTH}-wide token vectors, random weights; MUVERA's defaults: {m['width']:,} values), same "
            f"server and run: {m['passages']} passages ({m['vectors_per_passage']:.0f} vectors each) and "
            f"{m['queries']} queries. Quality, the paper's measure (its §3, on real ColBERTv2 vectors; here the "
            "approximation on random-weight vectors, not retrieval quality): the share of each query's exact MaxSim "
            f"top 10 found in its MUVERA top {m['top']}, and top 10. Cost against the ColBERT path: bytes per passage "
            "(float32), scoring one query against every passage (numpy: MaxSim over the vectors, against one "
            f"matrix-vector product), and passages/s served at c={m['level']} asking `NAME_bls` for the ColBERT "
            "vectors with MUVERA against without.", "",
            "| MaxSim top 10 in MUVERA top N | in MUVERA top 10 | bytes per passage: ColBERT / MUVERA | "
            "one query over every passage: MaxSim / MUVERA | served passages/s: with / without MUVERA |",
            "|---|---|---|---|---|",
            f"| **{m['recall_at_top']:.2f}** (N = {m['top']}) | {m['recall_at_10']:.2f} | {m['colbert_bytes']:,.0f} / "
            f"{m['muvera_bytes']:,} | {m['maxsim_ms_per_query']:.2f} ms / {m['muvera_ms_per_query']:.3f} ms | "
            f"{m['serving']['colbert+muvera']['texts_per_s']:.1f} / {m['serving']['colbert']['texts_per_s']:.1f} "
            f"= **{m['served_ratio']:.2f}** |", ""]


def update_docs(result, path=None):
    """Replace (or insert, before the ceiling sweeps) the section in an existing benchmarks.md (default docs/)."""
    lines = section(result)
    return common.put_section("\n".join(lines), lines[0] + "\n", path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", help="default bench/results/families (short: bench/results/families-short)")
    parser.add_argument("--short", action="store_true", help="smoke: the tiny decoder, 64 texts, c=2, short windows")
    parser.add_argument("--update-docs", action="store_true", help="put the section into docs/benchmarks.md")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or os.path.join(common.RESULTS, "families-short" if args.short else "families")
    progress = lambda message: print(message, flush=True)  # noqa: E731
    result = measure(work_dir, args.short, progress)
    with open(os.path.join(work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(table(result))
    if result.get("sparse"):
        print(sparse_table(result["sparse"]))
    print(ratios(result))
    if args.update_docs:
        print(update_docs(result))
    print(f"families: {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
