"""Benchmark the served embedding model against its baselines; write docs/benchmarks.md and plots.

    python -m bench.run                  # full run (~10-15 min on 2 CPU cores) -> docs/benchmarks.md, docs/*.png
    python -m bench.run --short          # CI smoke run (< 3 min) -> bench/results/short/
    python -m bench.run --device cuda    # same harness on a GPU machine (ceiling + PyTorch baseline on CUDA)
    make bench BENCH_ARGS="--short"

What it does, in one process:
  1. finds an export (`--repository`, else model_repository/ if it holds one, else exports all-MiniLM-L6-v2 into
     bench/results/repository), copies it to a scratch repository (the project's current configs and model code +
     the exported artifacts) and adds the bench-only `pytorch_baseline` model (bench/models/) and `ensemble_probe`;
  2. builds a seeded corpus of real text (bench/corpus.py: queries of 5-20 tokens + passages of 100-250 tokens);
  3. measures the onnxruntime ceiling in-process on the same model.onnx (before the server starts);
  4. starts the real tritonserver, and for each concurrency level drives, on the same texts:
       ensemble             perf_analyzer, gRPC, 1 text per request (the system under test)
       client_tokenization  perf_analyzer, gRPC, pre-tokenized [1, L] requests straight to `embedding`
       pytorch_baseline     perf_analyzer, gRPC, HF transformers + PyTorch in a Python-backend model
       proxy_http           wrk, OpenAI POST /v1/embeddings on the proxy model (if the repository has one)
       kserve_http          wrk, Triton's own KServe HTTP endpoint for `ensemble` (same load generator as the proxy)
     reading Triton's model statistics around every run (encoder mean executed batch, per-step times);
  5. measures padding efficiency of the batches the encoder ran (ensemble_probe at concurrency 32);
  6. writes the report (tables, targets met/missed, machine, versions, command) and the PNG plots.
"""
import argparse
import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PROJECT not in sys.path:
    sys.path.insert(0, PROJECT)

from bench import baselines, loadgen, report  # noqa: E402
from bench import corpus as corpus_lib

RESULTS = os.path.join(PROJECT, "bench", "results")
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SYSTEMS = ["ensemble", "client_tokenization", "pytorch_baseline", "proxy_http", "kserve_http"]
PERF_SYSTEMS = {"ensemble": "ensemble", "client_tokenization": "embedding", "pytorch_baseline": "pytorch_baseline"}

_START = time.monotonic()


def progress(message):
    print(f"[{time.monotonic() - _START:6.1f}s] {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_export_module():
    spec = importlib.util.spec_from_file_location("triton_embed_export", os.path.join(PROJECT, "build", "export.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- repository
def find_export(args):
    """The repository to benchmark, and whether it is the bench-owned one (then configs follow the project)."""
    if args.repository:
        if not os.path.exists(os.path.join(args.repository, "embedding", "1", "export.json")):
            raise SystemExit(f"bench: {args.repository} holds no export (embedding/1/export.json)")
        return os.path.abspath(args.repository), False
    project = os.path.join(PROJECT, "model_repository")
    if os.path.exists(os.path.join(project, "embedding", "1", "export.json")):
        return project, False
    owned = os.path.join(RESULTS, "repository")
    progress(f"no export in model_repository/: exporting {DEFAULT_MODEL} into {os.path.relpath(owned, PROJECT)}")
    command = [sys.executable, os.path.join(PROJECT, "build", "export.py"), "--repository", owned,
               "--model", DEFAULT_MODEL, "--skip-if-exported"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"bench: export failed:\n{result.stdout}{result.stderr}")
    return owned, True


def make_scratch(source, owned, work_dir, manifest, device):
    """Copy of the repository + bench-only models. A bench-owned export takes the project's current configs and
    model code (so tuning in model_repository/ is what gets measured) with the export's values filled in."""
    scratch = os.path.join(work_dir, "repository")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(source, scratch, ignore=shutil.ignore_patterns("__pycache__"))
    export = load_export_module()
    if owned:
        for config in glob.glob(os.path.join(PROJECT, "model_repository", "*", "config.pbtxt")):
            name = os.path.basename(os.path.dirname(config))
            os.makedirs(os.path.join(scratch, name, "1"), exist_ok=True)
            shutil.copy2(config, os.path.join(scratch, name, "config.pbtxt"))
            for code in glob.glob(os.path.join(PROJECT, "model_repository", name, "1", "*.py")):
                shutil.copy2(code, os.path.join(scratch, name, "1"))
        export.set_config_values(scratch, {k: manifest[k] for k in ("embedding_size", "max_length",
                                                                     "max_batch_size", "model_id") if k in manifest})
    # The PyTorch baseline, reading the same Hugging Face folder the export came from.
    model_path = export.resolve_model(manifest["model"])
    target = os.path.join(scratch, "pytorch_baseline")
    shutil.copytree(os.path.join(PROJECT, "bench", "models", "pytorch_baseline"), target,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(target, "config.pbtxt"), encoding="utf-8") as handle:
        text = handle.read()
    values = {"MAX_BATCH_SIZE": manifest["max_batch_size"], "EMBEDDING_SIZE": manifest["embedding_size"],
              "MODEL_PATH": model_path, "POOLING": manifest.get("pooling", "mean"),
              "MAX_LENGTH": manifest["max_length"], "DEVICE": device,
              "THREADS": encoder_threads(scratch)}
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    if device == "cuda":
        text = text.replace("kind: KIND_CPU", "kind: KIND_GPU")
    with open(os.path.join(target, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(text)
    # ensemble_probe: the ensemble plus the padded attention_mask as an output (padding-efficiency probe only).
    probe = os.path.join(scratch, "ensemble_probe")
    os.makedirs(os.path.join(probe, "1"), exist_ok=True)
    with open(os.path.join(scratch, "ensemble", "config.pbtxt"), encoding="utf-8") as handle:
        text = handle.read()
    text = re.sub(r'^name:\s*"ensemble"', 'name: "ensemble_probe"', text, flags=re.M)
    text = re.sub(r"^output \[", 'output [\n  { name: "attention_mask", data_type: TYPE_INT64, dims: [ -1 ] },', text,
                  count=1, flags=re.M)
    with open(os.path.join(probe, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(text)
    return scratch


def server_flags(launch, repository, extra):
    """The tritonserver flags of the run (the launcher's own and --server-arg), without paths and ports."""
    varying = ("--model-repository", "--backend-directory", "--http-port", "--grpc-port", "--metrics-port")
    return [a for a in launch.server_command(repository, extra_args=extra)[1:] if not a.startswith(varying)]


def config_parameter(repository, model, key, default=None):
    path = os.path.join(repository, model, "config.pbtxt")
    if not os.path.exists(path):
        return default
    with open(path, encoding="utf-8") as handle:
        match = re.search(r'key:\s*"%s"\s*value:\s*\{\s*string_value:\s*"([^"]*)"' % re.escape(key), handle.read())
    return match.group(1) if match else default


def encoder_threads(repository):
    return int(config_parameter(repository, "embedding", "intra_op_thread_count", "0") or 0)


def tuning_snapshot(repository):
    """The tuning-relevant lines of every config in the measured repository, for the report."""
    keep = re.compile(r"max_queue_delay_microseconds|instance_group|thread_count|pad_to_multiple_of|"
                      r"min_padding_efficiency|batch_overhead_tokens|max_batch_size|preferred_batch_size|"
                      r"bls_concurrency")
    snapshot = {}
    for model in ("tokenizer", "embedding", "ensemble", "proxy", "pytorch_baseline"):
        path = os.path.join(repository, model, "config.pbtxt")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                snapshot[model] = [line.strip() for line in handle if keep.search(line) and
                                   not line.strip().startswith("#")]
    return snapshot


# ---------------------------------------------------------------- machine and versions
def machine_info():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            kb = int(handle.readline().split()[1])
        memory = f"{kb / 1024 ** 2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    gpu = ""
    if shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True)
        gpu = result.stdout.strip().replace("\n", "; ")
    os_name = platform.platform()
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"') + f" ({platform.release()})"
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": memory, "gpu": gpu or "none", "os": os_name}


def versions(server_log):
    from importlib import metadata

    found = {"python": platform.python_version()}
    for package in ("nvidia-pytriton", "tritonclient", "onnxruntime", "onnxruntime-gpu", "torch", "transformers",
                    "tokenizers", "numpy", "fastapi", "uvicorn"):
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
    parser.add_argument("--short", action="store_true", help="CI smoke mode: small corpus, 2 concurrency levels, "
                        "short windows; checks that the pipeline produces numbers (< 3 min)")
    parser.add_argument("--repository", help="an exported repository (default: model_repository/ if exported, "
                        "else a bench-owned export of all-MiniLM-L6-v2 in bench/results/repository)")
    parser.add_argument("--output", help="where the report and plots go (default docs/ for a full run, "
                        "bench/results/short/ with --short)")
    parser.add_argument("--work-dir", help="scratch repository, perf_analyzer data and logs "
                        "(default bench/results/<full|short>)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the ceiling and the PyTorch baseline run (the served encoder follows its "
                             "own instance_group: KIND_AUTO = GPU when there is one)")
    parser.add_argument("--concurrency", help="comma-separated levels (default 1,2,4,8,16,32,64; short: 1,8)")
    parser.add_argument("--corpus-size", type=int, help="texts (default 2000; short 200)")
    parser.add_argument("--query-share", type=float, default=0.5, help="share of short queries (default 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--window-s", type=float, help="perf_analyzer window length aimed at, in seconds of "
                        "responses at the last measured rate (count_windows; default 3; short 1)")
    parser.add_argument("--min-window-requests", type=int, help="fewest responses per window (default 30; short 8)")
    parser.add_argument("--max-trials", type=int, help="perf_analyzer windows before it gives up on stability "
                        "(default 6; short 3, with no stability check)")
    parser.add_argument("--wrk-seconds", type=int, help="wrk duration per level (default 9; short 2)")
    parser.add_argument("--ceiling-seconds", type=float, help="time per batch size in the ceiling sweep "
                        "(default 6; short 1.5)")
    parser.add_argument("--probe-concurrency", type=int, help="padding probe concurrency (default 32; short 8)")
    parser.add_argument("--skip", default="", help=f"comma-separated systems to leave out: {','.join(SYSTEMS)}")
    parser.add_argument("--server-arg", action="append", default=[], help="extra tritonserver argument "
                        "(repeatable), e.g. --server-arg=--log-verbose=1")
    parser.add_argument("--title", default="", help="extra line under the report's title")
    args = parser.parse_args(argv)
    short = args.short
    args.mode = "short" if short else "full"
    args.concurrency = [int(c) for c in (args.concurrency or ("1,8" if short else "1,2,4,8,16,32,64")).split(",")]
    args.probe_concurrency = args.probe_concurrency or (8 if short else 32)
    args.corpus_size = args.corpus_size or (200 if short else 2000)
    args.window_s = args.window_s or (1.0 if short else 3.0)
    args.min_window_requests = args.min_window_requests or (8 if short else 30)
    args.max_trials = args.max_trials or (3 if short else 6)
    args.stability = 1000 if short else 25  # short: no stability check, the first 3 windows count
    args.wrk_seconds = args.wrk_seconds or (2 if short else 9)
    args.ceiling_seconds = args.ceiling_seconds or (1.5 if short else 6.0)
    args.output = os.path.abspath(args.output or (os.path.join(RESULTS, "short") if short
                                                  else os.path.join(PROJECT, "docs")))
    args.work_dir = os.path.abspath(args.work_dir or os.path.join(RESULTS, args.mode))
    args.skip = {s for s in args.skip.split(",") if s}
    unknown = args.skip - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems in --skip: {', '.join(sorted(unknown))}")
    return args


def main(argv=None):
    args = parse_args(argv)
    command_line = " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])])
    os.makedirs(args.output, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    source, owned = find_export(args)
    with open(os.path.join(source, "embedding", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    scratch = make_scratch(source, owned, args.work_dir, manifest, args.device)
    progress(f"{args.mode} run of {manifest['model']} (max length {manifest['max_length']}, max batch "
             f"{manifest['max_batch_size']}); scratch repository {scratch}")

    # -- corpus
    tokenizer = corpus_lib.load_tokenizer(os.path.join(scratch, "tokenizer", "1", "tokenizer.json"),
                                          int(manifest["max_length"]))
    texts = corpus_lib.build(tokenizer, args.corpus_size, args.seed, args.query_share, int(manifest["max_length"]))
    with open(os.path.join(args.work_dir, "corpus.jsonl"), "w", encoding="utf-8") as handle:
        for item in texts:
            handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    encodings = [e.ids for e in tokenizer.encode_batch([t["text"] for t in texts])]
    token_counts = [len(e) for e in encodings]
    corpus_info = {
        "size": len(texts), "seed": args.seed, "sha256": corpus_lib.digest(texts),
        "queries": sum(t["kind"] == "query" for t in texts), "passages": sum(t["kind"] == "passage" for t in texts),
        "mean_tokens": statistics.mean(token_counts), "median_tokens": statistics.median(token_counts),
        "min_tokens": min(token_counts), "max_tokens": max(token_counts),
        "python": platform.python_version(),
    }
    progress(f"corpus: {corpus_info['size']} texts ({corpus_info['queries']} queries, {corpus_info['passages']} "
             f"passages), mean {corpus_info['mean_tokens']:.1f} tokens, sha256 {corpus_info['sha256'][:12]}")
    data_dir = os.path.join(args.work_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    ensemble_data = os.path.join(data_dir, "ensemble.json")
    loadgen.write_ensemble_data(ensemble_data, texts)
    token_data = os.path.join(data_dir, "tokens.json")
    loadgen.write_token_data(token_data, encodings)
    tokenize_us = baselines.client_tokenization_cost(tokenizer, [t["text"] for t in texts[:200]],
                                                     0.5 if args.short else 2.0)

    # -- ceiling (no server running)
    onnx_path = os.path.join(scratch, manifest.get("onnx", "embedding/1/model.onnx"))
    threads = encoder_threads(scratch)
    pad_id = _pad_id(scratch)
    sizes = [s for s in ((1, 8, 32) if args.short else (1, 4, 8, 16, 32, 64)) if s <= int(manifest["max_batch_size"])]
    # The hardware's best: the encoder's own thread setting and all cores (0 = ORT's default), if they differ.
    thread_options = [threads] if threads == 0 or args.device == "cuda" else [threads, 0]
    progress(f"ceiling: onnxruntime in-process ({args.device}, intra_op threads "
             f"{', '.join(str(t or 'all') for t in thread_options)}), batch sizes {sizes}")
    ceiling, ceiling_sweep = baselines.ceiling(onnx_path, encodings, pad_id, thread_options, args.device, sizes,
                                               args.ceiling_seconds, progress)

    # -- server
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port(), "proxy": free_port()}
    log_path = os.path.join(args.work_dir, "tritonserver.log")
    from local_triton import launch

    has_proxy = os.path.exists(os.path.join(scratch, "proxy", "config.pbtxt"))
    progress(f"starting tritonserver (HTTP {ports['http']}, gRPC {ports['grpc']}"
             f"{', proxy ' + str(ports['proxy']) if has_proxy else ''})")
    env = {"PROXY_PORT": str(ports["proxy"]), "PROXY_HOST": "127.0.0.1"}
    server_args = list(args.server_arg or [])
    with open(log_path, "w", encoding="utf-8") as log_file:
        server = launch.start(scratch, ports["http"], ports["grpc"], ports["metrics"], extra_args=server_args,
                              log_file=log_file, extra_env=env)
    results = {}
    try:
        try:
            launch.wait_ready(server, ports["http"], timeout_s=300)
        except Exception:
            with open(log_path, encoding="utf-8", errors="replace") as handle:
                raise SystemExit("bench: tritonserver did not start:\n" + handle.read()[-4000:])
        progress("tritonserver ready")
        results = sweep(args, ports, has_proxy, texts, ensemble_data, token_data, manifest)
        probe = None
        if "ensemble" not in args.skip:
            http = f"127.0.0.1:{ports['http']}"
            before = loadgen.model_stats(http, "embedding")
            probe_texts = [t["text"] for t in texts[:min(len(texts), 100 if args.short else 1000)]]
            progress(f"padding probe: {len(probe_texts)} texts through ensemble_probe at concurrency "
                     f"{args.probe_concurrency}")
            probe = baselines.padding_probe(f"127.0.0.1:{ports['grpc']}", "ensemble_probe", probe_texts,
                                            args.probe_concurrency)
            probe["embedding"] = loadgen.stats_delta(before, loadgen.model_stats(http, "embedding"))
            progress(f"padding efficiency {probe['padding_efficiency']:.3f}, encoder mean batch "
                     f"{probe['embedding']['mean_batch']:.2f}")
    finally:
        launch.stop(server)
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        server_log = handle.read()

    run = {
        "mode": args.mode, "command": command_line, "device": args.device, "manifest": manifest,
        "repository": os.path.relpath(source, PROJECT) if source.startswith(PROJECT) else source,
        "bench_owned_export": owned, "corpus": corpus_info, "client_tokenize_us": tokenize_us,
        "ceiling": ceiling, "ceiling_sweep": ceiling_sweep, "encoder_threads": threads,
        "results": results, "probe": probe, "machine": machine_info(), "versions": versions(server_log),
        "tuning": tuning_snapshot(scratch), "server_args": server_flags(launch, scratch, server_args), "concurrency": args.concurrency, "has_proxy": has_proxy,
        "settings": {"window_s": args.window_s, "min_window_requests": args.min_window_requests, "max_trials": args.max_trials, "wrk_seconds": args.wrk_seconds,
                     "ceiling_seconds": args.ceiling_seconds, "probe_concurrency": args.probe_concurrency},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "elapsed_s": time.monotonic() - _START,
        "title": args.title,
    }
    with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(run, handle, indent=1)
    paths = report.write(run, args.output)
    progress(f"wrote {', '.join(os.path.relpath(p, PROJECT) if p.startswith(PROJECT) else p for p in paths)}")
    return 0




def _pad_id(repository):
    with open(os.path.join(repository, "tokenizer", "1", "tokenizer.json"), encoding="utf-8") as handle:
        padding = json.load(handle).get("padding") or {}
    return int(padding.get("pad_id", 0))


def sweep(args, ports, has_proxy, texts, ensemble_data, token_data, manifest):
    grpc = f"127.0.0.1:{ports['grpc']}"
    http = f"127.0.0.1:{ports['http']}"
    systems = [s for s in SYSTEMS if s not in args.skip and (s != "proxy_http" or has_proxy)]
    if "proxy_http" not in args.skip and not has_proxy:
        progress("no proxy model in the repository: proxy_http left out")
    if not shutil.which("wrk") and {"proxy_http", "kserve_http"} & set(systems):
        progress("wrk is not installed (Debian package wrk; `make setup` installs it): HTTP systems left out")
        systems = [s for s in systems if s not in ("proxy_http", "kserve_http")]
    scripts = {}
    if "proxy_http" in systems:
        scripts["proxy_http"] = (f"http://127.0.0.1:{ports['proxy']}", loadgen.write_wrk_script(
            os.path.join(args.work_dir, "data", "proxy.lua"),
            [{"input": [t["text"]], "model": manifest["model"]} for t in texts], "/v1/embeddings"))
    if "kserve_http" in systems:
        scripts["kserve_http"] = (f"http://{http}", loadgen.write_wrk_script(
            os.path.join(args.work_dir, "data", "kserve.lua"),
            [{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [t["text"]]}]}
             for t in texts], "/v2/models/ensemble/infer"))
    log_path = os.path.join(args.work_dir, "loadgen.log")
    open(log_path, "w").close()
    metrics = f"127.0.0.1:{ports['metrics']}"
    watched = ["embedding", "tokenizer", "pytorch_baseline"]
    results = {s: {} for s in systems}
    total, done = len(systems) * len(args.concurrency), 0
    rate = {}  # last measured texts/s of each system: sizes the next level's windows
    # Concurrency outer, systems inner: background noise drifts over minutes, so systems compared at one level
    # are measured close together in time.
    for concurrency in args.concurrency:
        for system in systems:
            done += 1
            before = {m: loadgen.model_stats(http, m) for m in watched}
            started = time.monotonic()
            expected = rate.get(system)
            if system in PERF_SYSTEMS:
                data = token_data if system == "client_tokenization" else ensemble_data
                # a window = about --window-s seconds of responses, and never fewer than 2 per request in flight
                window = max(args.min_window_requests, 2 * concurrency,
                             int((expected or 0) * args.window_s))
                row = loadgen.perf_analyzer(PERF_SYSTEMS[system], grpc, data, concurrency,
                                            os.path.join(args.work_dir, "data", f"{system}_{concurrency}.csv"),
                                            window, args.max_trials, log_path, stability=args.stability)
            else:
                url, script = scripts[system]
                # wrk only counts responses that arrive before its end: run several latencies long
                latency_s = concurrency / expected if expected else 1.0
                duration = int(max(args.wrk_seconds, min(60, 5 * latency_s)))
                row = loadgen.wrk(url, script, concurrency, duration, log_path)
            quiet = max(0.5, min(8.0, row["p99_ms"] / 1000.0)) if row else 2.0
            loadgen.drain(http, metrics, quiet_s=quiet)
            after = {m: loadgen.model_stats(http, m) for m in watched}
            if row is None:
                progress(f"({done}/{total}) {system} c={concurrency}: no measurement (see {log_path})")
                continue
            row["stats"] = {m: loadgen.stats_delta(before[m], after[m]) for m in watched}
            row["texts_per_s"] = row["requests_per_s"]  # one text per request
            rate[system] = row["texts_per_s"]
            results[system][concurrency] = row
            batch = row["stats"]["embedding"]["mean_batch"] if system != "pytorch_baseline" else \
                row["stats"]["pytorch_baseline"]["mean_batch"]
            progress(f"({done}/{total}) {system:19s} c={concurrency:<3d} {row['texts_per_s']:7.1f} texts/s  "
                     f"p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  mean batch {batch:5.2f}  "
                     f"[{time.monotonic() - started:.0f}s]")
    return results


if __name__ == "__main__":
    sys.exit(main())
