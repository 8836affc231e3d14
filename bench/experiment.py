"""Tuning experiments: serve a copy of the bench's scratch repository with config edits, drive one model with
perf_analyzer at some concurrencies, and print Triton's per-step statistics (what bench/TUNING.md quotes).

    python -m bench.run --short                       # once: builds bench/results/short/repository
    python -m bench.experiment --concurrency 32 \\
        --edit 'tokenizer:"pad_to_multiple_of" value: \\{ string_value: "8"=>"pad_to_multiple_of" value: { string_value: "16"'
    python -m bench.experiment --model embedding --concurrency 1,8    # pre-tokenized requests, no tokenizer

Each --edit is MODEL:REGEX=>REPLACEMENT applied to MODEL/config.pbtxt of the copy (re.sub, multiline).
"""
import argparse
import os
import re
import shutil
import sys

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PROJECT not in sys.path:
    sys.path.insert(0, PROJECT)

from bench import loadgen  # noqa: E402
from bench import run as bench_run
from local_triton import launch  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=os.path.join(bench_run.RESULTS, "short"),
                        help="a bench work dir holding repository/ and data/ (default bench/results/short)")
    parser.add_argument("--work-dir", default=os.path.join(bench_run.RESULTS, "experiment"))
    parser.add_argument("--model", default="ensemble", help="ensemble | embedding | pytorch_baseline")
    parser.add_argument("--concurrency", default="32")
    parser.add_argument("--edit", action="append", default=[], help="MODEL:REGEX=>REPLACEMENT (repeatable)")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args(argv)

    repository = os.path.join(args.work_dir, "repository")
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(os.path.join(args.source, "repository"), repository)
    for code in ("tokenizer/1/model.py",):  # the project's current model code
        shutil.copy2(os.path.join(PROJECT, "model_repository", code), os.path.join(repository, code))
    for edit in args.edit:
        model, rest = edit.split(":", 1)
        pattern, replacement = rest.split("=>", 1)
        path = os.path.join(repository, model, "config.pbtxt")
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        changed = re.sub(pattern, replacement, text, flags=re.M)
        if changed == text:
            raise SystemExit(f"experiment: --edit {edit!r} matched nothing")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(changed)
    ports = [bench_run.free_port() for _ in range(4)]
    env = {"PROXY_PORT": str(ports[3])}
    server_args = list(args.server_arg or [])
    data = os.path.join(args.source, "data", "tokens.json" if args.model == "embedding" else "ensemble.json")
    http, grpc, metrics = (f"127.0.0.1:{p}" for p in ports[:3])
    with open(os.path.join(args.work_dir, "tritonserver.log"), "w") as log:
        server = launch.start(repository, *ports[:3], extra_args=server_args, log_file=log, extra_env=env)
    try:
        launch.wait_ready(server, ports[0])
        watched = ("tokenizer", "embedding", "pytorch_baseline")
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            before = {m: loadgen.model_stats(http, m) for m in watched}
            row = loadgen.perf_analyzer(args.model, grpc, data, concurrency,
                                        os.path.join(args.work_dir, "perf.csv"), max(40, 3 * concurrency), 4,
                                        os.path.join(args.work_dir, "perf.log"))
            loadgen.drain(http, metrics)
            d = {m: loadgen.stats_delta(before[m], loadgen.model_stats(http, m)) for m in watched}
            speed = f"{row['requests_per_s']:.1f} texts/s p50 {row['p50_ms']:.0f} ms p99 {row['p99_ms']:.0f} ms" \
                if row else "no measurement"
            print(f"c={concurrency} {speed} | tokenizer batch {d['tokenizer']['mean_batch']:.2f} "
                  f"queue {d['tokenizer']['queue_ms_per_request']:.1f} ms | encoder batch "
                  f"{d['embedding']['mean_batch']:.2f} queue {d['embedding']['queue_ms_per_request']:.0f} ms "
                  f"infer {d['embedding']['compute_infer_ms_per_request']:.1f} ms", flush=True)
            print("   encoder batch sizes", dict(sorted(d["embedding"]["batch_stats"].items())), flush=True)
    finally:
        launch.stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
