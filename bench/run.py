"""Benchmark the served embedding model on four workloads against its own speed; write docs/benchmarks.md.

    python -m bench.run                  # full run (~29 min on 2 CPU cores) -> docs/benchmarks.md, docs/*.png
    python -m bench.run --short          # smoke run (~8 min on 2 cores, 2 of them its exports) -> bench/results/short/
    python -m bench.run --workloads queries,passages --no-breakdown
    make bench BENCH_ARGS="--short"

Steps, in one process:
  1. repository: an export (--repository, else model_repository/ if it holds one, else all-MiniLM-L6-v2 exported
     into bench/results/repository), copied to a scratch repository with the bench-only models
     (bench/models/pytorch_baseline when a workload measures it, ensemble_probe);
  2. workloads (bench/corpus.py): queries (5-30 tokens), passages (100-500), mixed, client-batched (32 texts per
     request), each a seeded corpus of real prose;
  3. ceilings: onnxruntime in-process on the served model.onnx, each workload's texts sorted by length, at its best
     batch size (1..64), before the server starts; for many-text requests also the same requests, each cut into its
     own length groups as the tokenizer cuts them for ensemble_bls (what one request's grouping allows);
  4. the real tritonserver, and per workload and concurrency level: the ensemble over gRPC (perf_analyzer), and
     per workload the other systems (the HTTP proxy and Triton's KServe HTTP with wrk; client-side tokenization and
     a Python-backend PyTorch model on the mixed workload), with Triton's statistics around every run; then one
     query in flight through gRPC, KServe HTTP and the proxy in interleaved rounds (the proxy's added p50);
  5. padding efficiency of the encoder's batches (ensemble_probe, mixed workload);
  6. where one short request's time goes (bench/breakdown.py: Triton's trace API, micro-benchmarks, py-spy);
  7. the serving floor (bench/overhead.py): single texts through a near-zero-cost model's ensemble against an
     ensemble of two echo models, in their own server;
  8. cross-encoder reranking (bench/rerank.py): one query against 100 documents through the rerank model (KServe
     gRPC) and /v1/rerank (HTTP) against onnxruntime in-process on the same pairs, in their own server;
  9. CLIP images (bench/images.py): an open_clip ViT-B-32's image ensemble on raw JPEGs (KServe gRPC) against
     onnxruntime in-process on the same pixels, preprocessing's share per image size, retrieval sanity against
     open_clip, in their own server;
  10. the report: targets (ratios to each workload's ceiling), tables, plots (bench/report.py);
  11. bulk embedding (bench/bulk.py): the bulk command (`make embed`) on 10,000 mixed texts against the onnxruntime
      ceiling on the same texts, and its memory at 10,000 and 100,000 rows, on the step-4 server;
  12. the tail with several exports (bench/tail.py): single queries to the export through KServe HTTP, gRPC and the
      HTTP front at 16 and 64 connections, 3 interleaved rounds, with two other exports loaded, in their own server;
      every reading's p99/p50 is printed (target: KServe HTTP's ≤ 3);
  13. the encoder's backend (bench/backends.py): Triton's C++ onnxruntime backend (ONNXRUNTIME_BACKEND, or
      --onnxruntime-backend) against the stand-in, in alternating servers: queries at 32 in flight and
      client-batched requests, their ratio to the ceiling and the server's CPU per text;
  14. model families (bench/families.py): a decoder embedder (Qwen3-Embedding's layout, 4 layers of 256) and a
      static embedder (StaticEmbedding, 1024 wide), random, exported by name into one repository and served by one
      server: queries and passages in requests of 32 texts to NAME_bls (KServe gRPC) against onnxruntime in-process
      on the same model.onnx and texts at its best batch size; served / ceiling per model and workload; and
      MUVERA on a ColBERT export (PyLate's layout): the share of each query's exact MaxSim top 10 in its MUVERA
      top 100 over 1,000 passages, and its cost against the ColBERT path (bytes, scoring time, served passages/s).
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import string
import subprocess
import sys
import time

from bench import backends, baselines, breakdown, bulk, common, loadgen, overhead, report
from bench import corpus as corpus_lib
from bench import families as families_bench
from bench import images as images_bench
from bench import rerank as rerank_bench
from bench import tail as tail_bench

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PERF_MODELS = {"ensemble": "ensemble", "ensemble_bls": "ensemble_bls", "client_tokenization": "embedding",
               "pytorch_baseline": "pytorch_baseline"}
SYSTEMS = {  # workload -> systems measured on it (the ensemble everywhere)
    "queries": ("ensemble", "proxy_http", "kserve_http"),
    "passages": ("ensemble",),
    "mixed": ("ensemble", "client_tokenization", "pytorch_baseline"),
    "client-batched": ("ensemble", "ensemble_bls", "proxy_http"),
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
LATENCY_ROUNDS = 3  # interleaved rounds of one query in flight per system (one_in_flight_rounds)
ADMIN_KEY = "bench"  # the trace API is restricted; the scratch server runs with this key

_START = time.monotonic()


def progress(message):
    print(f"[{time.monotonic() - _START:6.1f}s] {message}", flush=True)


# ---------------------------------------------------------------- step 1: repository
def make_scratch(source, work_dir, manifest, device, pytorch_baseline=True):
    """The export with the current tracked code and configs (bench/common.py) + the bench-only models: the PyTorch
    baseline only when a workload measures it (its stub imports torch and transformers: seconds of every start)."""
    scratch = common.scratch_repository(source, os.path.join(work_dir, "repository"))
    if pytorch_baseline:
        add_pytorch_baseline(scratch, manifest, device)
    add_probe(scratch)
    return scratch


def add_pytorch_baseline(scratch, manifest, device):
    """The same Hugging Face folder in a Python-backend PyTorch model (bench/models/pytorch_baseline), its config
    rendered from the template there."""
    from exporter.source import resolve_model
    source = os.path.join(PROJECT, "bench", "models", "pytorch_baseline")
    target = os.path.join(scratch, "pytorch_baseline")
    common.copy_model(source, target, "*.template")
    with open(os.path.join(source, "config.pbtxt.template"), encoding="utf-8") as handle:
        template = string.Template(handle.read())
    values = {"max_batch_size": 64, "embedding_size": manifest["embedding_size"],
              "model_path": resolve_model(manifest["model"]), "pooling": manifest.get("pooling", "mean"),
              "max_length": manifest["max_length"], "device": device, "threads": common.encoder_threads(scratch),
              "kind": "KIND_GPU" if device == "cuda" else "KIND_CPU"}
    with open(os.path.join(target, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(template.substitute(values))


def add_probe(scratch):
    """ensemble_probe: the ensemble plus the padded attention_mask as an output (padding efficiency)."""
    probe = os.path.join(scratch, "ensemble_probe")
    os.makedirs(os.path.join(probe, "1"), exist_ok=True)
    config = common.pbtxt.read(os.path.join(scratch, "ensemble", "config.pbtxt"))
    common.pbtxt.write(os.path.join(probe, "config.pbtxt"),
                       common.pbtxt.with_output(config, "attention_mask", "TYPE_INT64", [-1]))


# Parameters worth a line in the report: the grouping, the token budget, threads, the proxy's BLS calls in flight.
TUNING_PARAMETERS = ("thread_count", "pad_to_multiple_of", "min_padding_efficiency", "batch_overhead_tokens",
                     "split_overhead_tokens", "max_batch_tokens", "bls_concurrency")


def tuning_snapshot(repository):
    """The tuning-relevant values of every config in the measured repository, for the report: max_batch_size, the
    dynamic batcher's delay and the rest of it, the instance groups and the TUNING_PARAMETERS, one line each."""
    snapshot = {}
    for model in ("tokenizer", "embedding", "ensemble", "proxy"):
        path = os.path.join(repository, model, "config.pbtxt")
        if not os.path.exists(path):
            continue
        config = common.pbtxt.read(path)
        lines = [f"max_batch_size: {config.max_batch_size}"]
        if config.HasField("dynamic_batching"):  # the delay even when 0 (text_format leaves defaults out)
            batching = config.dynamic_batching
            lines.append(f"max_queue_delay_microseconds: {batching.max_queue_delay_microseconds}")
            batching.ClearField("max_queue_delay_microseconds")
            if common.pbtxt.one_line(batching):
                lines.append(f"dynamic_batching {{ {common.pbtxt.one_line(batching)} }}")
        lines += [f"instance_group {{ {common.pbtxt.one_line(group)} }}" for group in config.instance_group]
        lines += [f"{key}: {value}" for key, value in sorted(common.pbtxt.parameters(config).items())
                  if any(word in key for word in TUNING_PARAMETERS)]
        snapshot[model] = lines
    return snapshot


# ---------------------------------------------------------------- step 2: workloads
def build_workloads(args, scratch, manifest):
    tokenizer = corpus_lib.load_tokenizer(os.path.join(scratch, "tokenizer", "1", "tokenizer.json"))
    data_dir = os.path.join(args.work_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    workloads = {}
    for name in args.workloads:
        spec = corpus_lib.WORKLOADS[name]
        size = args.corpus_size or (max(64, spec.texts_per_request * 8) if args.short else spec.texts)
        texts = corpus_lib.build(tokenizer, spec, size, args.seed, int(manifest["max_length"]))
        encodings = [e.ids for e in tokenizer.encode_batch([t["text"] for t in texts])]
        counts = [len(e) for e in encodings]
        perf_data = os.path.join(data_dir, f"{name}.json")
        loadgen.write_ensemble_data(perf_data, texts)
        workloads[name] = {
            "spec": spec, "texts": texts, "encodings": encodings, "perf_data": perf_data,
            "info": {"name": name, "description": spec.description, "size": len(texts), "seed": args.seed,
                     "sha256": corpus_lib.digest(texts), "texts_per_request": spec.texts_per_request,
                     "mean_tokens": statistics.mean(counts), "median_tokens": statistics.median(counts),
                     "min_tokens": min(counts), "max_tokens": max(counts)},
        }
        progress(f"workload {name}: {len(texts)} texts, mean {statistics.mean(counts):.1f} tokens "
                 f"({min(counts)}-{max(counts)}), {spec.texts_per_request} per request")
    if "mixed" in workloads:
        token_data = os.path.join(data_dir, "tokens.json")
        loadgen.write_token_data(token_data, workloads["mixed"]["encodings"])
        workloads["mixed"]["token_data"] = token_data
    return workloads, tokenizer


# ---------------------------------------------------------------- step 3: ceilings
def measure_ceilings(args, scratch, manifest, workloads):
    onnx_path = os.path.join(scratch, manifest["onnx"])
    threads = common.encoder_threads(scratch)
    with open(os.path.join(scratch, "tokenizer", "1", "tokenizer.json"), encoding="utf-8") as handle:
        pad_id = json.load(handle)["padding"]["pad_id"]
    thread_options = [threads] if threads == 0 or args.device == "cuda" else [threads, 0]
    sizes = (1, 8) if args.short else BATCH_SIZES
    for name, workload in workloads.items():
        progress(f"ceiling for {name}: onnxruntime in-process ({args.device}), batch sizes {list(sizes)}")
        best, sweep = baselines.ceiling(onnx_path, workload["encodings"], pad_id, thread_options, args.device, sizes,
                                        args.ceiling_seconds, progress)
        workload["ceiling"], workload["ceiling_sweep"] = best, sweep
        if workload["spec"].texts_per_request > 1:  # what ensemble_bls's per-request grouping allows (the report)
            workload["grouped"] = baselines.grouped_requests(
                onnx_path, workload["encodings"], pad_id, best["threads"], args.device,
                workload["spec"].texts_per_request, split_plan(scratch), args.ceiling_seconds * 2)
            progress(f"same requests, each in its own length groups (the tokenizer's split for ensemble_bls), "
                     f"in-process: {workload['grouped']['texts_per_s']:.1f} texts/s, "
                     f"{workload['grouped']['rows_per_run']:.2f} rows per run")
    return threads


def split_plan(scratch):
    """lengths -> [(rows, padded width)]: the tokenizer's cut of one request for a BLS caller, with the very
    settings the model reads from the scratch repository (its send_split's call)."""
    module, model = breakdown.tokenizer_model(scratch)
    return lambda lengths: module.plan_groups(
        [[n] for n in lengths], model.multiple, model.split_overhead, model.min_efficiency, model.max_batch_tokens,
        model.power_of_two, model.max_width)


# ---------------------------------------------------------------- step 4: the server and the load
def start_server(args, scratch, ports):
    env = {"PROXY_PORT": str(ports["proxy"]), "PROXY_HOST": "127.0.0.1", "ADMIN_API_KEY": ADMIN_KEY,
           **dict(kv.split("=", 1) for kv in args.server_env)}
    trace_dir = os.path.join(args.work_dir, "trace")
    shutil.rmtree(trace_dir, ignore_errors=True)
    os.makedirs(trace_dir)
    # Tracing is off until bench/breakdown.py switches it on through the trace API (the file is set at start).
    tracing = ["--trace-config", "mode=triton", "--trace-config", f"triton,file={trace_dir}/trace.json",
               "--trace-config", "level=OFF"]
    progress(f"starting tritonserver (HTTP {ports['http']}, gRPC {ports['grpc']}, proxy {ports['proxy']}; "
             f"{' '.join(args.server_env) or 'default settings'})")
    server = common.start_server(scratch, ports, os.path.join(args.work_dir, "tritonserver.log"), env,
                                 [*tracing, *args.server_arg])
    common.wait_for_proxy(ports["proxy"])
    progress("tritonserver ready")
    return server, env


def wrk_scripts(args, workload, manifest, name):
    spec, texts = workload["spec"], [t["text"] for t in workload["texts"]]
    step = spec.texts_per_request
    batches = [texts[i:i + step] for i in range(0, len(texts) - step + 1, step)]
    data_dir = os.path.join(args.work_dir, "data")
    return {
        "proxy_http": ("proxy", loadgen.write_wrk_script(
            os.path.join(data_dir, f"{name}-proxy.lua"),
            [{"input": batch, "model": manifest["id"]} for batch in batches], "/v1/embeddings")),
        "kserve_http": ("http", loadgen.write_wrk_script(
            os.path.join(data_dir, f"{name}-kserve.lua"),
            [{"inputs": [{"name": "text", "shape": [len(batch), 1], "datatype": "BYTES", "data": batch}]}
             for batch in batches], "/v2/models/ensemble/infer")),
    }


def run_level(args, ports, workload, system, concurrency, expected, scripts, log_path):
    """One system at one concurrency level: a row (texts/s, latency percentiles) or None."""
    grpc, per_request = f"127.0.0.1:{ports['grpc']}", workload["spec"].texts_per_request
    # one request's latency, about: from the last level's rate; at the first level, from the ceiling's in a short
    # run (a lower bound), else 1 s
    rate = expected or (workload["ceiling"]["texts_per_s"] if args.short else None)
    latency_s = concurrency * per_request / rate if rate else 1.0
    if system in PERF_MODELS:
        data = workload.get("token_data") if system == "client_tokenization" else workload["perf_data"]
        # a window = about --window-s seconds of responses, and never fewer than 2 per request in flight (short: 1,
        # so that requests of 32 long texts taking seconds each make a window of one wave of answers)
        in_flight = concurrency if args.short else 2 * concurrency
        window = max(args.min_window_requests, in_flight, int((expected or 0) / per_request * args.window_s))
        # short: time windows of --window-s where a request takes a tenth of one at most (a count window lasts a
        # second at least)
        window_ms = 1000 * args.window_s if args.short and 10 * latency_s <= args.window_s else None
        csv_path = os.path.join(args.work_dir, "data", f"{workload['info']['name']}-{system}-{concurrency}.csv")
        row = loadgen.perf_analyzer(PERF_MODELS[system], grpc, data, concurrency, csv_path, window, args.max_trials,
                                    log_path, stability=args.stability, batch=per_request, window_ms=window_ms)
        if row:
            row["texts_per_s"] = row["requests_per_s"]  # perf_analyzer counts rows (-b) as inferences
        return row
    port, script = scripts[system]
    # wrk counts the answers that come before its end
    duration = max(args.wrk_seconds, min(60, args.wrk_latencies * latency_s))
    duration = math.ceil(duration) if args.short else int(duration)  # short: never under its latencies
    row = loadgen.wrk(f"http://127.0.0.1:{ports[port]}", script, concurrency, duration, log_path,
                      warmup_s=args.wrk_warmup_s)
    if row:
        row["texts_per_s"] = row["requests_per_s"] * per_request
    return row


def run_workloads(args, ports, workloads, manifest):
    http, metrics = f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['metrics']}"
    log_path = os.path.join(args.work_dir, "loadgen.log")
    open(log_path, "w").close()
    # the PyTorch baseline is served only when a workload measures it (make_scratch)
    baseline = ("pytorch_baseline",) if os.path.isdir(os.path.join(args.work_dir, "repository", "pytorch_baseline")) \
        else ()
    watched, drained = ("embedding", "tokenizer", *baseline), ("ensemble", "embedding", *baseline)
    have_wrk = shutil.which("wrk") is not None
    if not have_wrk:
        progress("wrk is not installed (Debian package wrk; `make setup` installs it): HTTP systems left out")
    for name, workload in workloads.items():
        systems = [s for s in SYSTEMS[name] if s not in args.skip and (have_wrk or s in PERF_MODELS)]
        scripts = workload["wrk_scripts"] = wrk_scripts(args, workload, manifest, name)
        levels = list(args.concurrency or workload["spec"].concurrency)
        if args.short:
            levels = [levels[0], levels[min(2, len(levels) - 1)]]
        workload["results"], rate = {s: {} for s in systems}, {}
        # Levels outer, systems inner: background noise drifts over minutes, so systems compared at one level
        # are measured close together in time.
        for concurrency in levels:
            for system in systems:
                before = {m: loadgen.model_stats(http, m) for m in watched}
                started = time.monotonic()
                row = run_level(args, ports, workload, system, concurrency, rate.get(system), scripts, log_path)
                quiet = max(0.5, min(8.0, row["p99_ms"] / 1000.0)) if row else 2.0
                if args.short and row and system in PERF_MODELS:
                    quiet = 0.5  # perf_analyzer exits once every response is in (wrk does not wait for them)
                loadgen.drain(http, metrics, models=drained, quiet_s=quiet)
                after = {m: loadgen.model_stats(http, m) for m in watched}
                if row is None:
                    progress(f"{name} {system} c={concurrency}: no measurement (see {log_path})")
                    continue
                row["stats"] = {m: loadgen.stats_delta(before[m], after[m]) for m in watched}
                rate[system] = row["texts_per_s"]
                workload["results"][system][concurrency] = row
                batch = row["stats"]["pytorch_baseline" if system == "pytorch_baseline" else "embedding"]["mean_batch"]
                progress(f"{name:14s} {system:19s} c={concurrency:<3d} {row['texts_per_s']:7.1f} texts/s  "
                         f"p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  encoder batch {batch:5.2f}  "
                         f"[{time.monotonic() - started:.0f}s]")


def one_in_flight_rounds(args, ports, workloads):
    """The proxy's added latency: queries one at a time through the proxy (wrk), Triton's KServe HTTP (wrk: the same
    client) and gRPC (perf_analyzer), in interleaved rounds, median p50 of each. The levels above measure each system
    once, tens of seconds apart; at concurrency 1 that drift is as large as the difference measured."""
    queries = workloads.get("queries")
    if not queries or shutil.which("wrk") is None:
        return None
    systems = [s for s in ("ensemble", "kserve_http", "proxy_http") if s not in args.skip]
    log_path = os.path.join(args.work_dir, "loadgen.log")
    scripts = queries["wrk_scripts"]
    rounds = 1 if args.short else LATENCY_ROUNDS
    p50 = {s: [] for s in systems}
    brief = argparse.Namespace(**{**vars(args), "wrk_seconds": args.wrk_seconds if args.short else 4,
                                  "window_s": args.window_s if args.short else 1.5})
    for index in range(rounds):
        for system in systems[index % len(systems):] + systems[:index % len(systems)]:  # each goes first once
            row = run_level(brief, ports, queries, system, 1, queries["results"].get(system, {}).get(1, {}).get(
                "texts_per_s"), scripts, log_path)
            if row:
                p50[system].append(row["p50_ms"])
    result = {s: {"p50_ms": statistics.median(v), "rounds": v} for s, v in p50.items() if v}
    progress("one query in flight, interleaved rounds, median p50: " + ", ".join(
        f"{s} {r['p50_ms']:.2f} ms" for s, r in result.items()))
    return result


# ---------------------------------------------------------------- step 5: padding of the encoder's batches
def measure_padding(args, ports, workloads):
    if "mixed" not in workloads:
        return None
    http = f"127.0.0.1:{ports['http']}"
    before = loadgen.model_stats(http, "embedding")
    texts = [t["text"] for t in workloads["mixed"]["texts"]][:100 if args.short else 1000]
    concurrency = 8 if args.short else 32
    progress(f"padding probe: {len(texts)} mixed texts through ensemble_probe at concurrency {concurrency}")
    probe = baselines.padding_probe(f"127.0.0.1:{ports['grpc']}", "ensemble_probe", texts, concurrency)
    probe["embedding"] = loadgen.stats_delta(before, loadgen.model_stats(http, "embedding"))
    probe["concurrency"] = concurrency
    progress(f"padding efficiency {probe['padding_efficiency']:.3f}, encoder mean batch "
             f"{probe['embedding']['mean_batch']:.2f}")
    return probe


# ---------------------------------------------------------------- machine and versions
def versions(server_log):
    from importlib import metadata

    found = {"python": platform.python_version()}
    for package in ("nvidia-pytriton", "tritonclient", "onnxruntime", "torch", "transformers", "tokenizers", "numpy",
                    "fastapi", "uvicorn"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    match = re.search(r"server_version\s*\|\s*(\S+)", server_log or "")
    if match:
        found["tritonserver"] = match.group(1)
    if shutil.which("wrk"):
        result = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
        first = (result.stdout + result.stderr).strip().splitlines()
        found["wrk"] = first[0].split(" [")[0].replace("wrk ", "") if first else "?"
    return found


# ---------------------------------------------------------------- the run
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="CI smoke mode: small corpora, 2 levels, short "
                        "windows; checks that every stage produces numbers")
    parser.add_argument("--repository", help="an exported repository (default: model_repository/ if exported, "
                        "else a bench-owned export of all-MiniLM-L6-v2 in bench/results/repository)")
    parser.add_argument("--output", help="where the report and plots go (default docs/ for a full run, "
                        "bench/results/short/ with --short)")
    parser.add_argument("--work-dir", help="scratch repository, load data and logs (default bench/results/<mode>)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the ceiling and the PyTorch baseline run")
    parser.add_argument("--workloads", default=",".join(corpus_lib.WORKLOADS),
                        help=f"comma-separated, of {', '.join(corpus_lib.WORKLOADS)}")
    parser.add_argument("--concurrency", help="comma-separated levels for every workload (default: per workload)")
    parser.add_argument("--corpus-size", type=int, help="texts per workload (default: per workload; short 64-256)")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--window-s", type=float, help="perf_analyzer window, in seconds of responses at the last "
                        "measured rate (count_windows; default 3; short 0.3)")
    parser.add_argument("--min-window-requests", type=int, help="fewest responses per window (default 30; short 8)")
    parser.add_argument("--max-trials", type=int, help="perf_analyzer windows before it gives up on stability "
                        "(default 6; short 3, with no stability check)")
    parser.add_argument("--wrk-seconds", type=int, help="wrk duration per level (default 8; short 1, with no "
                        "warm-up run before it)")
    parser.add_argument("--ceiling-seconds", type=float, help="time per batch size in the ceiling sweep "
                        "(default 4; short 0.5)")
    parser.add_argument("--skip", default="", help="comma-separated systems to leave out: ensemble, proxy_http, "
                        "kserve_http, client_tokenization, pytorch_baseline")
    parser.add_argument("--no-breakdown", action="store_true", help="leave out step 6 (where the time goes)")
    parser.add_argument("--no-overhead", action="store_true", help="leave out step 7 (the serving floor: a "
                        "near-zero-cost model's ensemble against an echo ensemble, bench/overhead.py)")
    parser.add_argument("--floor-export", help="step 7 on this existing export of a tiny model instead of "
                        "exporting a 2-layer, 64-wide random XLM-R (the test suite passes its own)")
    parser.add_argument("--rerank-sizes", help="step 8's cross-encoder shapes, comma-separated (minilm, m3: 24 "
                        "layers, slow on 2 cores); default minilm, none with --short; empty: leave the step out")
    parser.add_argument("--no-bulk", action="store_true", help="leave out step 11 (the bulk command)")
    parser.add_argument("--no-tail", action="store_true", help="leave out step 12 (the tail with several exports; "
                        "--short: 1 round of 1 s readings)")
    parser.add_argument("--no-images", action="store_true", help="leave out step 9 (CLIP images: an open_clip "
                        "export's image ensemble against onnxruntime in-process, bench/images.py)")
    parser.add_argument("--images-architecture", default=images_bench.ARCHITECTURE,
                        help="step 9's open_clip architecture (default ViT-B-32)")
    parser.add_argument("--onnxruntime-backend", default=os.environ.get("ONNXRUNTIME_BACKEND", ""),
                        help="step 13: a folder holding Triton's libtriton_onnxruntime.so, measured against the "
                        "stand-in (default: ONNXRUNTIME_BACKEND; none: the step is left out). Steps 4-12 run on the "
                        "backend ONNXRUNTIME_BACKEND names, as the launcher does")
    parser.add_argument("--no-backends", action="store_true", help="leave out step 13")
    parser.add_argument("--no-families", action="store_true", help="leave out step 14 (a decoder and a static "
                        "embedder against their in-process ceilings, bench/families.py)")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a launcher setting for the server (repeatable), e.g. RATE_LIMIT=off")
    parser.add_argument("--server-arg", action="append", default=[], help="extra tritonserver argument")
    parser.add_argument("--title", default="", help="extra line under the report's title")
    args = parser.parse_args(argv)
    args.mode = "short" if args.short else "full"
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(corpus_lib.WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")] if args.concurrency else None
    args.window_s = args.window_s or (0.3 if args.short else 3.0)
    args.min_window_requests = args.min_window_requests or (8 if args.short else 30)
    args.max_trials = args.max_trials or (3 if args.short else 6)
    args.stability = 1000 if args.short else 25  # short: no stability check, the first 3 windows count
    args.wrk_seconds = args.wrk_seconds or (1 if args.short else 8)
    args.wrk_warmup_s = 0 if args.short else 1.0  # a wrk run of this long before each reading
    args.wrk_latencies = 3 if args.short else 5  # a wrk reading lasts at least this many request latencies
    args.ceiling_seconds = args.ceiling_seconds or (0.5 if args.short else 4.0)
    args.output = os.path.abspath(args.output or (os.path.join(common.RESULTS, "short") if args.short
                                                  else os.path.join(PROJECT, "docs")))
    args.work_dir = os.path.abspath(args.work_dir or os.path.join(common.RESULTS, args.mode))
    args.skip = {s for s in args.skip.split(",") if s}
    return args


def main(argv=None):
    args = parse_args(argv)
    command_line = " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])])
    os.makedirs(args.output, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    source, owned = common.find_export(args.repository, progress)
    with open(os.path.join(source, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    baseline_measured = "pytorch_baseline" not in args.skip and any(
        "pytorch_baseline" in SYSTEMS[name] for name in args.workloads)
    scratch = make_scratch(source, args.work_dir, manifest, args.device, baseline_measured)
    progress(f"{args.mode} run of {manifest['model']} (max length {manifest['max_length']}); scratch {scratch}")
    workloads, tokenizer = build_workloads(args, scratch, manifest)
    threads = measure_ceilings(args, scratch, manifest, workloads)
    micro = None
    if not args.no_breakdown and "queries" in workloads:
        progress("breakdown: micro-benchmarks of the stubs' work on the queries (before the server starts)")
        micro = breakdown.micro_benchmarks(args, scratch, workloads["queries"])
    ports = common.free_ports()
    server, server_env = start_server(args, scratch, ports)
    probe, times, one_in_flight, bulk_run, backends_read = None, None, None, None, None
    backend_settings = {"window_requests": args.min_window_requests * (1 if args.short else 4),
                        "max_trials": args.max_trials, "stability": args.stability, "short": args.short}
    try:
        run_workloads(args, ports, workloads, manifest)
        one_in_flight = one_in_flight_rounds(args, ports, workloads)
        probe = measure_padding(args, ports, workloads)
        if micro:
            times = breakdown.measure(args, ports, server.pid, workloads["queries"], micro, ADMIN_KEY, progress)
        if not args.no_bulk:
            bulk_run = bulk.measure(os.path.join(args.work_dir, "bulk"), scratch, ports["grpc"], args.short, progress)
        if args.short and not args.no_backends and args.onnxruntime_backend:
            # step 13's arm that this server runs is read on it (a short run's one round): one server fewer
            arm = backends.arm_of(server_env, args.onnxruntime_backend)
            if arm:
                backends_read = {arm: backends.read_arm(arm, 0, server.pid, ports, workloads,
                                                        os.path.join(args.work_dir, "backends"), backend_settings,
                                                        progress)}
    finally:
        common.stop_server(server, drain=not args.short)  # short: killed, nothing is measured after it
    with open(os.path.join(args.work_dir, "tritonserver.log"), encoding="utf-8", errors="replace") as handle:
        server_log = handle.read()
    floor = None
    if not args.no_overhead:  # its own server: a tiny model's export beside two echo models
        floor = overhead.measure(os.path.join(args.work_dir, "overhead"), rounds=1 if args.short else 3,
                                 window_requests=200 if args.short else 2000, max_trials=args.max_trials,
                                 stability=args.stability, progress=progress, export=args.floor_export,
                                 drain=not args.short, window_ms=1000 * args.window_s if args.short else None)
    sizes = tuple(s for s in (args.rerank_sizes if args.rerank_sizes is not None else
                              "" if args.short else "minilm").split(",") if s)
    reranking = rerank_bench.measure(os.path.join(args.work_dir, "rerank"), sizes, progress=progress) if sizes else None
    pictures = None
    if not args.no_images:
        pictures = images_bench.measure(os.path.join(args.work_dir, "images"), args.short, args.images_architecture,
                                        progress=progress)
    tail = None
    if not args.no_tail:
        tail = tail_bench.measure(os.path.join(args.work_dir, "tail"), scratch, rounds=1 if args.short else 3,
                                  seconds=1 if args.short else 5, progress=progress, short=args.short)
        progress(tail_bench.summary(tail))
    backend_run = None
    if not args.no_backends:
        backend_run = backends.measure(os.path.join(args.work_dir, "backends"), scratch, workloads,
                                       args.onnxruntime_backend, 1 if args.short else 2, backend_settings, progress,
                                       read=backends_read)
    families = None
    if not args.no_families:
        families = families_bench.measure(os.path.join(args.work_dir, "families"), args.short, progress)
        progress(families_bench.ratios(families))
    run = {
        "mode": args.mode, "command": command_line, "device": args.device, "manifest": manifest,
        "repository": os.path.relpath(source, PROJECT) if source.startswith(PROJECT) else source,
        "bench_owned_export": owned, "encoder_threads": threads, "probe": probe, "breakdown": times, "overhead": floor,
        "one_in_flight": one_in_flight,
        "rerank": reranking, "images": pictures, "bulk": bulk_run, "tail": tail, "backends": backend_run,
        "families": families,
        "onnxruntime_backend": common.launch.describe_onnxruntime_backend(),
        "client_tokenize_us": baselines.client_tokenization_cost(
            tokenizer, [t["text"] for t in workloads[next(iter(workloads))]["texts"][:200]], 0.5),
        "workloads": {name: {k: w.get(k) for k in ("info", "ceiling", "ceiling_sweep", "grouped", "results")}
                      for name, w in workloads.items()},
        "machine": common.machine_info(), "versions": versions(server_log), "tuning": tuning_snapshot(scratch),
        "server_args": [a for a in common.launch.server_command(scratch, env=server_env, admin_key="KEY")[1:]
                        if not a.startswith(("--model-repository", "--backend-directory", "--http-port",
                                             "--grpc-port", "--metrics-port"))],
        "settings": {"window_s": args.window_s, "min_window_requests": args.min_window_requests,
                     "max_trials": args.max_trials, "wrk_seconds": args.wrk_seconds,
                     "wrk_warmup_s": args.wrk_warmup_s, "ceiling_seconds": args.ceiling_seconds,
                     "time_windows_s": args.window_s if args.short else None},  # run_level's time windows
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "elapsed_s": time.monotonic() - _START,
        "title": args.title,
    }
    with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(run, handle, indent=1)
    paths = report.write(run, args.output)
    print(report.targets_text(run), flush=True)
    progress(f"wrote {', '.join(os.path.relpath(p, PROJECT) if p.startswith(PROJECT) else p for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
