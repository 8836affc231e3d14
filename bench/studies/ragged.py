"""Ragged batching against width groups, on this machine's CPU (issue 51): which one an export should ship with.

    .venv/bin/python -m bench.studies.ragged [--model M] [--rounds 2] [--onnxruntime-backend FOLDER|none] [--short]

Three exports of one model in one scratch repository, served by one tritonserver (Triton's C++ onnxruntime backend
when ONNXRUNTIME_BACKEND or --onnxruntime-backend names it, else the stand-in):
- `ensemble` (widths): as shipped for CPUs: the tokenizer pads each length group to a multiple of 8 and Triton's
  batcher joins equal widths only;
- `pow2` (powers of two): the same with pad_to_power_of_two (the GPU overlay's grouping: fewer, wider widths);
- `ragged` (export --ragged-batch): one encoder run holds any widths, padded in the graph to the widest.
Each workload (bench/corpus.py: queries, passages, mixed single texts; client-batched, 32 mixed texts a request to
the BLS model) goes through perf_analyzer at a fixed load, arms alternating within each round, so that the machine's
drift hits all three alike. Printed per workload: texts/s of each arm in each round, the ratio of each arm to the
shipped arm (widths) in the same round, and the encoder's rows and padded tokens per run (Triton's statistics and
the tokenizer's num_tokens), which say why.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from bench import common, loadgen
from bench import corpus as corpus_lib

ARMS = (("widths", "ensemble", "ensemble_bls", "embedding"),
        ("pow2", "pow2", "pow2_bls", "pow2_embedding"),
        ("ragged", "ragged", "ragged_bls", "ragged_embedding"))
READINGS = (("queries", 32), ("passages", 8), ("mixed", 32), ("client-batched", 8))


def progress(message):
    print(f"[{time.strftime('%H:%M:%S')}] ragged: {message}", file=sys.stderr, flush=True)


def build_repository(model, scratch):
    """The three exports; pow2's tokenizer gets pad_to_power_of_two through the config module."""
    common.run_export(model, scratch, who="bench.studies.ragged")
    common.run_export(model, scratch, "--name", "pow2", who="bench.studies.ragged")
    common.run_export(model, scratch, "--name", "ragged", "--ragged-batch", who="bench.studies.ragged")
    path = os.path.join(scratch, "pow2_tokenizer", "config.pbtxt")
    common.pbtxt.write(path, common.pbtxt.with_parameters(common.pbtxt.read(path), {"pad_to_power_of_two": "true"}))


def window(args, spec, concurrency):
    """Requests per measurement window: about --window-requests texts' worth of requests (a client-batched request
    holds 32), at least two per client in flight."""
    return max(2 * concurrency, -(-args.window_requests // spec.texts_per_request))


def measure(args, scratch, work_dir):
    with open(os.path.join(scratch, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        max_length = int(json.load(handle)["max_length"])
    tokenizer = corpus_lib.load_tokenizer(os.path.join(scratch, "tokenizer", "1", "tokenizer.json"))
    data = {}
    for name, _ in READINGS:
        spec = corpus_lib.WORKLOADS[name]
        texts = corpus_lib.build(tokenizer, spec, max(64, spec.texts_per_request * 8) if args.short else spec.texts,
                                 args.seed, max_length)
        data[name] = (spec, os.path.join(work_dir, f"{name}.json"))
        loadgen.write_ensemble_data(data[name][1], texts)
    backend = "" if args.onnxruntime_backend == "none" else args.onnxruntime_backend
    ports = common.free_ports()
    server = common.start_server(scratch, ports, os.path.join(work_dir, "tritonserver.log"),
                                 {"ONNXRUNTIME_BACKEND": backend})
    log_path = os.path.join(work_dir, "perf_analyzer.log")
    http = f"127.0.0.1:{ports['http']}"
    rows = []
    try:
        for round_index in range(args.rounds):
            for name, concurrency in READINGS:
                spec, perf_data = data[name]
                for arm, single, bls, encoder in ARMS:
                    model = bls if spec.texts_per_request > 1 else single
                    before = loadgen.model_stats(http, encoder)
                    row = loadgen.perf_analyzer(model, f"127.0.0.1:{ports['grpc']}", perf_data, concurrency,
                                                os.path.join(work_dir, f"{arm}-{name}-{round_index}.csv"),
                                                window(args, spec, concurrency), args.max_trials, log_path,
                                                batch=spec.texts_per_request)
                    loadgen.drain(http, f"127.0.0.1:{ports['metrics']}", models=(model, encoder))
                    runs = loadgen.stats_delta(before, loadgen.model_stats(http, encoder))
                    if row is None:
                        progress(f"{arm} {name}: no measurement (see {log_path})")
                        continue
                    rows_per_run = runs["inference_count"] / max(1, runs["execution_count"])
                    rows.append({"round": round_index, "workload": name, "arm": arm, "model": model,
                                 "concurrency": concurrency, "texts_per_s": row["requests_per_s"],
                                 "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"], "rows_per_run": rows_per_run})
                    progress(f"round {round_index} {name:14s} {arm:6s} c={concurrency:<3d} "
                             f"{row['requests_per_s']:7.1f} texts/s, p50 {row['p50_ms']:7.1f} ms, "
                             f"{rows_per_run:5.1f} rows per encoder run")
    finally:
        common.stop_server(server)
    return rows


def table(rows):
    lines = ["| workload | in flight | arm | texts/s (each round) | vs widths (each round) | p50 ms | rows per run |",
             "|---|---|---|---|---|---|---|"]
    for name, concurrency in READINGS:
        base = {r["round"]: r["texts_per_s"] for r in rows if r["workload"] == name and r["arm"] == "widths"}
        for arm, *_ in ARMS:
            mine = sorted((r for r in rows if r["workload"] == name and r["arm"] == arm), key=lambda r: r["round"])
            if not mine:
                continue
            ratios = [r["texts_per_s"] / base[r["round"]] for r in mine if base.get(r["round"])]
            speeds = ", ".join(f"{r['texts_per_s']:.1f}" for r in mine)
            lines.append(
                f"| {name} | {concurrency} | {arm} | {speeds} | "
                f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}) | "
                f"{statistics.median(r['p50_ms'] for r in mine):.1f} | "
                f"{statistics.median(r['rows_per_run'] for r in mine):.1f} |")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=common.DEFAULT_MODEL, help="hub id or folder (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short", action="store_true", help="small corpora (a smoke run)")
    parser.add_argument("--window-requests", type=int, default=200)
    parser.add_argument("--max-trials", type=int, default=6)
    parser.add_argument("--onnxruntime-backend", default=os.environ.get("ONNXRUNTIME_BACKEND", "") or "none",
                        help="Triton's C++ onnxruntime backend folder (default: ONNXRUNTIME_BACKEND; none: the "
                             "stand-in)")
    parser.add_argument("--work-dir", help="default: a temporary folder")
    parser.add_argument("--json", help="write the rows here")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ragged-") as temporary:
        work_dir = args.work_dir or temporary
        scratch = os.path.join(work_dir, "repository")
        os.makedirs(scratch, exist_ok=True)
        progress(f"exporting {args.model} three times into {scratch}")
        build_repository(args.model, scratch)
        progress(f"serving with {'the stand-in' if args.onnxruntime_backend == 'none' else args.onnxruntime_backend}")
        rows = measure(args, scratch, work_dir)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"model": args.model, "backend": args.onnxruntime_backend, "machine": common.machine_info(),
                       "rows": rows}, handle, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
