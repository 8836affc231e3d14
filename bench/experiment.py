"""Tuning experiments: serve a copy of a bench run's scratch repository with config edits, drive the ensemble with
perf_analyzer on one workload at some concurrencies, and print Triton's per-step statistics (what TUNING.md quotes).

    python -m bench.run --short                         # once: builds bench/results/short/{repository,data}
    python -m bench.experiment --workload queries --concurrency 16,64 \\
        --edit 'embedding:dynamic_batching { max_queue_delay_microseconds: 2000 }'
    python -m bench.experiment --server-env RATE_LIMIT=off

Each --edit is MODEL:TEXT, ModelConfig text merged into MODEL/config.pbtxt of the copy through Triton's own schema
(exporter/pbtxt.py, merged: a value it names replaces the config's, a repeated field gets entries appended);
the copy's config is then written without its comments. The project's current model code replaces the copy's.
"""
import argparse
import json
import os
import sys

from bench import common, loadgen
from bench import corpus as corpus_lib

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scratch_export(source_arg, output, edits, progress):
    """The export to measure (--repository, or the default one) copied into output/repository with the --edit
    changes: (that repository, its export.json, its tokenizer untruncated: true counts, as the routes that take
    truncate false refuse a text over the max length)."""
    source, _ = common.find_export(source_arg, progress)
    os.makedirs(output, exist_ok=True)
    repository = common.scratch_repository(source, os.path.join(output, "repository"))
    edit_configs(repository, edits)
    with open(os.path.join(repository, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    tokenizer = corpus_lib.load_tokenizer(os.path.join(repository, "tokenizer", "1", "tokenizer.json"))
    tokenizer.no_truncation()
    return repository, manifest, tokenizer


def edit_configs(repository, edits):
    for edit in edits:
        model, text = edit.split(":", 1)
        path = os.path.join(repository, model, "config.pbtxt")
        config = common.pbtxt.read(path)
        changed = common.pbtxt.merged(config, text, f"--edit {edit!r}")
        if changed == config:
            raise SystemExit(f"experiment: --edit {edit!r} changed nothing")
        common.pbtxt.write(path, changed)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=os.path.join(common.RESULTS, "short"),
                        help="a bench work dir holding repository/ and data/ (default bench/results/short)")
    parser.add_argument("--work-dir", default=os.path.join(common.RESULTS, "experiment"))
    parser.add_argument("--workload", default="queries")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--edit", action="append", default=[],
                        help="MODEL:TEXT, ModelConfig text merged into MODEL's config (repeatable)")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)

    source = os.path.join(args.source, "repository")
    # Every model of the bench run's repository (its bench-only ones too), with the current tracked code and configs.
    repository = common.scratch_repository(source, os.path.join(args.work_dir, "repository"), os.listdir(source))
    edit_configs(repository, args.edit)
    ports = common.free_ports()
    env = dict(kv.split("=", 1) for kv in args.server_env)
    data = os.path.join(args.source, "data", f"{args.workload}.json")
    batch = corpus_lib.WORKLOADS[args.workload].texts_per_request
    http, grpc, metrics = (f"127.0.0.1:{ports[name]}" for name in ("http", "grpc", "metrics"))
    server = common.start_server(repository, ports, os.path.join(args.work_dir, "tritonserver.log"), env)
    try:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            before = {m: loadgen.model_stats(http, m) for m in ("tokenizer", "embedding")}
            row = loadgen.perf_analyzer("ensemble", grpc, data, concurrency, os.path.join(args.work_dir, "perf.csv"),
                                        max(40, 3 * concurrency), 4, os.path.join(args.work_dir, "perf.log"),
                                        batch=batch)
            loadgen.drain(http, metrics)
            d = {m: loadgen.stats_delta(before[m], loadgen.model_stats(http, m)) for m in ("tokenizer", "embedding")}
            speed = f"{row['requests_per_s']:.1f} texts/s p50 {row['p50_ms']:.0f} ms p99 {row['p99_ms']:.0f} ms" \
                if row else "no measurement"
            print(f"c={concurrency} {speed} | tokenizer batch {d['tokenizer']['mean_batch']:.2f} infer "
                  f"{d['tokenizer']['compute_infer_ms_per_request']:.2f} ms | encoder batch "
                  f"{d['embedding']['mean_batch']:.2f} queue {d['embedding']['queue_ms_per_request']:.0f} ms infer "
                  f"{d['embedding']['compute_infer_ms_per_request']:.1f} ms", flush=True)
    finally:
        common.stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
