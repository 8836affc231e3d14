"""The tail of direct KServe calls with several exports loaded (issue 37): short queries, one text per request, to
the default export through Triton's KServe HTTP (wrk), KServe gRPC (perf_analyzer) and the HTTP front
(/v1/embeddings, wrk), at 16 and 64 connections, in interleaved rounds (the doors' order rotates each round), with
named exports loaded beside it: a 2-layer XLM-R embedder (bge-m3's tokenizer, `m3`) and a 2-layer XLM-R
cross-encoder (`xr`). Their stubs, queues and threads are what the default export's requests share the machine with.

Target: KServe HTTP's p99 within 3x its p50 at every level in every round. Every reading is printed, not an average
over rounds: the stall this looks for comes in some rounds only.

    python -m bench.tail                          # 3 rounds, 5 s per reading, on the bench's export
    python -m bench.tail --repository R --extra m3=FOLDER --rounds 1 --seconds 1 --levels 2,4 --short   # a smoke
"""
import argparse
import json
import os
import shutil
import sys
import time

from bench import common, loadgen, overhead
from bench import corpus as corpus_lib
from bench import rerank as rerank_bench
from bench.experiment import edit_configs

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DOORS = ("kserve_http", "grpc", "proxy_http")
LEVELS = (16, 64)
TARGET = 3.0  # KServe HTTP's p99 / p50, at every level, in every round


def build_extras(work_dir, progress):
    """{name: Hugging Face folder}: the named exports loaded beside the default one, built with random weights."""
    folders = {"m3": os.path.join(work_dir, "tiny-xlmr"), "xr": os.path.join(work_dir, "tiny-xlmr-cross-encoder")}
    if not os.path.exists(os.path.join(folders["m3"], "config.json")):
        progress("tail: building a 2-layer, 64-wide random XLM-R embedder (m3)")
        overhead.tiny_model(folders["m3"])
    if not os.path.exists(os.path.join(folders["xr"], "config.json")):
        progress("tail: building a 2-layer, 64-wide random XLM-R cross-encoder (xr)")
        rerank_bench.build_model("tiny", folders["xr"])
    return folders


def build_repository(source, work_dir, extras, progress, edits=()):
    """The export at `source` (current tracked code) with each extra exported beside it under its name, then the
    config edits (MODEL:TEXT merged into MODEL's config, bench/experiment.py's) for an A/B."""
    repository = common.scratch_repository(source, os.path.join(work_dir, "repository"))
    for name, folder in extras.items():
        progress(f"tail: exporting {name} beside the default export")
        common.run_export(folder, repository, "--name", name, "--max-length", "128", who="bench tail")
    edit_configs(repository, list(edits))
    return repository


def queries(repository, count, seed=0):
    with open(os.path.join(repository, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    tokenizer = corpus_lib.load_tokenizer(os.path.join(repository, "tokenizer", "1", "tokenizer.json"))
    texts = corpus_lib.build(tokenizer, corpus_lib.WORKLOADS["queries"], count, seed, int(manifest["max_length"]))
    return manifest, texts


def load_files(data_dir, manifest, texts):
    """The doors' request files: perf_analyzer's data, and one wrk script per HTTP door."""
    os.makedirs(data_dir, exist_ok=True)
    grpc_data = os.path.join(data_dir, "queries.json")
    loadgen.write_ensemble_data(grpc_data, texts)
    plain = [t["text"] for t in texts]
    return grpc_data, {
        "kserve_http": ("http", loadgen.write_wrk_script(
            os.path.join(data_dir, "kserve.lua"),
            [{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [t]}]} for t in plain],
            "/v2/models/ensemble/infer")),
        "proxy_http": ("proxy", loadgen.write_wrk_script(
            os.path.join(data_dir, "proxy.lua"), [{"input": t, "model": manifest["id"]} for t in plain],
            "/v1/embeddings")),
    }


def reading(door, level, seconds, ports, grpc_data, scripts, work_dir, log_path, short=False):
    """One door at one level: {requests_per_s, p50_ms, p99_ms, ...} or None (the log says why). short: gRPC read in
    3 time windows of `seconds` in all, HTTP with no wrk warm-up before the reading."""
    if door == "grpc":  # a window of about `seconds` at a conservative 100 requests/s, never under 4 per connection
        window = max(4 * level, int(100 * seconds))
        return loadgen.perf_analyzer("ensemble", f"127.0.0.1:{ports['grpc']}", grpc_data, level,
                                     os.path.join(work_dir, f"grpc-{level}.csv"), window, 3, log_path,
                                     stability=1000, window_ms=1000 * seconds / 3 if short else None)
    port, script = scripts[door]
    return loadgen.wrk(f"http://127.0.0.1:{ports[port]}", script, level, max(1, int(seconds)), log_path,
                       warmup_s=0 if short else 1.0)


def measure(work_dir, source, extras=None, rounds=3, seconds=5.0, levels=LEVELS, progress=print, edits=(),
            short=False):
    """{"rounds": [[row, ...] per round], "levels", "extras", "target", "met"}: row = door, level, p50, p99, ratio.
    short: a smoke's readings (`reading`), and the server killed at the end."""
    os.makedirs(work_dir, exist_ok=True)
    extras = build_extras(work_dir, progress) if extras is None else extras
    repository = build_repository(source, work_dir, extras, progress, edits)
    manifest, texts = queries(repository, 300)
    grpc_data, scripts = load_files(os.path.join(work_dir, "data"), manifest, texts)
    ports, log_path = common.free_ports(), os.path.join(work_dir, "loadgen.log")
    open(log_path, "w").close()
    have_wrk = shutil.which("wrk") is not None
    doors = [d for d in DOORS if have_wrk or d == "grpc"]
    if not have_wrk:
        progress("tail: wrk is not installed (Debian package wrk; `make setup` installs it): HTTP doors left out")
    progress(f"tail: starting tritonserver with {', '.join(['the default export', *extras])}")
    server = common.start_server(repository, ports, os.path.join(work_dir, "tritonserver.log"))
    common.wait_for_proxy(ports["proxy"])
    every = []
    try:
        for index in range(rounds):
            rows = []
            for level in levels:
                for door in doors[index % len(doors):] + doors[:index % len(doors)]:  # each goes first once
                    row = reading(door, level, seconds, ports, grpc_data, scripts, work_dir, log_path, short)
                    loadgen.drain(f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['metrics']}",
                                  models=("ensemble", "embedding"), quiet_s=0.5)
                    if row is None:
                        progress(f"tail: round {index + 1} {door} c={level}: no measurement (see {log_path})")
                        continue
                    entry = {"round": index + 1, "door": door, "level": level, "requests_per_s": row["requests_per_s"],
                             "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"],
                             "ratio": row["p99_ms"] / row["p50_ms"] if row["p50_ms"] else None}
                    rows.append(entry)
                    progress(f"tail: round {index + 1} {door:11s} c={level:<3d} {row['requests_per_s']:7.1f} "
                             f"requests/s  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
                             f"p99/p50 {entry['ratio']:.2f}")
            every.append(rows)
    finally:
        common.stop_server(server, drain=not short)
    kserve = [r for rows in every for r in rows if r["door"] == "kserve_http"]
    met = bool(kserve) and all(r["ratio"] is not None and r["ratio"] <= TARGET for r in kserve)
    return {"rounds": every, "levels": list(levels), "seconds": seconds, "extras": sorted(extras),
            "target": TARGET, "met": met if have_wrk else None}


def table(result):
    """Markdown: one line per round and level, each door's p50 / p99 (ms) and ratio."""
    doors = [d for d in DOORS if any(r["door"] == d for rows in result["rounds"] for r in rows)]
    lines = ["| Round | Connections | " + " | ".join(f"{d} p50 / p99 (p99/p50)" for d in doors) + " |",
             "|---|---|" + "---|" * len(doors)]
    for rows in result["rounds"]:
        for level in result["levels"]:
            cells = []
            for door in doors:
                row = next((r for r in rows if r["door"] == door and r["level"] == level), None)
                cells.append(f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f} ({row['ratio']:.2f})" if row else "-")
            lines.append(f"| {rows[0]['round'] if rows else '-'} | {level} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(result):
    """One line: the worst KServe HTTP ratio against the target."""
    kserve = [r for rows in result["rounds"] for r in rows if r["door"] == "kserve_http"]
    if not kserve:
        return "tail: no KServe HTTP reading"
    worst = max(kserve, key=lambda r: r["ratio"])
    return (f"tail: KServe HTTP p99/p50 at most {worst['ratio']:.2f} (round {worst['round']}, c={worst['level']}) "
            f"over {len(kserve)} readings with {', '.join(result['extras']) or 'no other export'} loaded: target "
            f"<= {TARGET:g}, {'met' if result['met'] else 'NOT met'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", help="the export to measure (default: as make bench finds it)")
    parser.add_argument("--work-dir", default=os.path.join(common.RESULTS, "tail"))
    parser.add_argument("--extra", action="append", metavar="NAME=FOLDER",
                        help="a Hugging Face folder exported beside the default one as NAME (repeatable; default: "
                             "the random m3 embedder and xr cross-encoder built here)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per reading (default 5)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="connections (default 16,64)")
    parser.add_argument("--edit", action="append", default=[], help="MODEL:TEXT, ModelConfig text merged "
                        "into the scratch copy's MODEL/config.pbtxt (bench/experiment.py's --edit), for an "
                        "A/B")
    parser.add_argument("--short", action="store_true", help="a smoke: gRPC read in time windows, no wrk warm-up "
                        "before each reading, the server killed at the end")
    args = parser.parse_args(argv)
    source, _ = common.find_export(args.repository)
    extras = dict(item.split("=", 1) for item in args.extra) if args.extra else None
    started = time.monotonic()
    result = measure(args.work_dir, source, extras, args.rounds, args.seconds,
                     [int(level) for level in args.levels.split(",")], edits=args.edit, short=args.short)
    with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(table(result))
    print(summary(result))
    print(f"tail: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
