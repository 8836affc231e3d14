"""Bulk embedding (issue 39): the bulk command (`python -m bulk_embed`, what `make embed` runs) on the mixed corpus
against the onnxruntime ceiling on the same texts, and the command's memory on a small and a large corpus.

    python -m bench.bulk                 # 10,000 mixed texts; memory at 10,000 and 100,000 rows (own server)
    python -m bench.bulk --short         # 200 texts, one ceiling pass; memory at 600 and 2,400 rows (windows of 200)
    (also step 11 of python -m bench.run, on its server)

The ceiling is onnxruntime in-process on the served model.onnx: the texts tokenized by the served tokenizer, sorted
by length over the whole corpus, at the best batch size and thread count of a sampled sweep, then run in full once
before and once after the bulk run (the better of the two is the ceiling: the baseline at its best). The bulk figure
is the command's own wall time, start to output written: reading, requests, writing Parquet, all of it. The
machine's other load moves both alike only when they are interleaved, hence the two passes around it.

Memory: the command's peak RSS (wait4's ru_maxrss) embedding N short texts (the queries corpus repeated), at two
sizes; flat means the larger within 20 % of the smaller.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from bench import baselines, common
from bench import corpus as corpus_lib

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BATCH_SIZES = (4, 8, 16, 32, 64)
SHORT_BATCH_SIZES = (8, 16)  # --short: the sweep's middle (a batch of 64 mixed texts alone takes seconds)
TARGET = 0.9  # x the ceiling (issue 39)
FLAT = 1.2  # peak RSS at the large size within 20 % of the small one


def write_jsonl(path, texts, rows=None):
    """`rows` rows (default: one per text) of {"id", "text"}, the texts repeated as needed."""
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows or len(texts)):
            handle.write(json.dumps({"id": f"doc-{i}", "text": texts[i % len(texts)]}, ensure_ascii=False) + "\n")


def run_command(corpus_path, output, grpc_port, repository, *extra):
    """The bulk command as a user runs it: (seconds, peak RSS in MiB, its stderr's last line)."""
    command = [sys.executable, "-m", "bulk_embed", corpus_path, output, "--grpc-url", f"127.0.0.1:{grpc_port}",
               "--repository", repository, "--restart", *extra]
    started = time.perf_counter()
    with open(output + ".log", "w+", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=PROJECT, stdout=log, stderr=log)
        peak = 0
        while process.poll() is None:  # not wait4's ru_maxrss: a child inherits its parent's at fork
            peak = max(peak, high_water_mark(process.pid))
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        log.seek(0)
        stderr = log.read()
    if process.returncode != 0:
        raise SystemExit(f"bench: the bulk command failed:\n{stderr[-3000:]}")
    return seconds, peak / 1024, stderr.strip().splitlines()[-1]


def high_water_mark(pid):
    """The process's peak resident memory so far (VmHWM, KiB), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            return next((int(line.split()[1]) for line in handle if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def measure(work_dir, repository, grpc_port, short, progress=print, sizes=None):
    """The bulk command against the ceiling on the mixed corpus, and its memory at two sizes; `sizes`: (mixed
    texts, small, large) instead of the run's own."""
    os.makedirs(work_dir, exist_ok=True)
    texts_n, small, large = sizes or ((200, 600, 2400) if short else (10000, 10000, 100000))
    window = ("--window", "200") if short else ()  # short: both sizes over a window, as the full run's are
    with open(os.path.join(repository, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    tokenizer_json = os.path.join(repository, "tokenizer", "1", "tokenizer.json")
    tokenizer = corpus_lib.load_tokenizer(tokenizer_json, manifest["max_length"])
    with open(tokenizer_json, encoding="utf-8") as handle:
        pad_id = json.load(handle)["padding"]["pad_id"]
    progress(f"bulk: building {texts_n} mixed texts")
    mixed = corpus_lib.build(tokenizer, corpus_lib.WORKLOADS["mixed"], texts_n, max_length=manifest["max_length"])
    texts = [t["text"] for t in mixed]
    encodings = [e.ids for e in tokenizer.encode_batch(texts)]
    corpus_path = os.path.join(work_dir, "mixed.jsonl")
    write_jsonl(corpus_path, texts)
    onnx = os.path.join(repository, "embedding", "1", "model.onnx")
    threads = common.encoder_threads(repository)
    best, _ = baselines.ceiling(onnx, encodings, pad_id, sorted({threads, 0}), "cpu",
                                SHORT_BATCH_SIZES if short else BATCH_SIZES, 0.25 if short else 3.0, progress)
    setting = (best["threads"], best["batch_size"])

    def full_pass():
        result, _ = baselines.ceiling(onnx, encodings, pad_id, [setting[0]], "cpu", (setting[1],), float("inf"),
                                      lambda _: None)
        progress(f"bulk: ceiling, full pass at batch {setting[1]}: {result['texts_per_s']:.1f} texts/s")
        return result["texts_per_s"]

    passes = [] if short else [full_pass()]  # short: the pass after the command only
    seconds, rss, line = run_command(corpus_path, os.path.join(work_dir, "mixed.parquet"), grpc_port, repository)
    bulk = len(texts) / seconds
    progress(f"bulk: the command, {len(texts)} mixed texts: {bulk:.1f} texts/s ({seconds:.1f} s); {line}")
    passes.append(full_pass())
    ceiling = max(passes)
    queries = [t["text"] for t in corpus_lib.build(tokenizer, corpus_lib.WORKLOADS["queries"], 1000 if not short
                                                   else 200, max_length=manifest["max_length"])]
    memory = {}
    for rows in (small, large):
        path = os.path.join(work_dir, f"queries-{rows}.jsonl")
        write_jsonl(path, queries, rows)
        took, peak, line = run_command(path, os.path.join(work_dir, f"queries-{rows}.parquet"), grpc_port, repository,
                                       *window)
        memory[rows] = {"peak_rss_mib": peak, "seconds": took, "texts_per_s": rows / took}
        progress(f"bulk: memory at {rows} rows: peak RSS {peak:.0f} MiB ({rows / took:.0f} texts/s)")
    return {"model": manifest["model"], "texts": len(texts), "corpus_sha256": corpus_lib.digest(mixed),
            "mean_tokens": sum(len(e) for e in encodings) / len(encodings), "bulk_texts_per_s": bulk,
            "bulk_seconds": seconds, "bulk_peak_rss_mib": rss, "ceiling_texts_per_s": ceiling,
            "ceiling_passes": passes, "ceiling_batch_size": setting[1], "ceiling_threads": setting[0],
            "ratio": bulk / ceiling, "target": TARGET, "memory": memory,
            "memory_ratio": memory[large]["peak_rss_mib"] / memory[small]["peak_rss_mib"], "memory_limit": FLAT}


def section(result):
    """The report's lines for the bulk step."""
    memory = result["memory"]
    small, large = sorted(memory, key=int)
    met = "met" if result["ratio"] >= result["target"] else "**missed**"
    flat = "met" if result["memory_ratio"] <= result["memory_limit"] else "**missed**"
    passes = ", ".join(f"{p:.1f}" for p in result["ceiling_passes"])
    passes = (f"full passes before and after: {passes} texts/s; the better counts" if len(result["ceiling_passes"]) > 1
              else f"a full pass after it: {passes} texts/s")  # --short
    return [
        "## Bulk embedding (`make embed`)", "",
        f"{result['texts']} mixed texts (sha256 `{result['corpus_sha256'][:12]}…`, mean {result['mean_tokens']:.1f} "
        f"tokens) through the bulk command over KServe gRPC, timed from its start to its Parquet file written, "
        f"against onnxruntime in-process on the same texts sorted by length (batch {result['ceiling_batch_size']}, "
        f"threads {result['ceiling_threads'] or 'all'}, {passes}).", "",
        "| measure | value | target | |", "|---|---|---|---|",
        f"| bulk command, texts/s | {result['bulk_texts_per_s']:.1f} | | |",
        f"| ceiling, texts/s | {result['ceiling_texts_per_s']:.1f} | | |",
        f"| bulk / ceiling | {result['ratio']:.2f} | ≥ {result['target']} | {met} |",
        f"| peak RSS at {small} rows | {memory[small]['peak_rss_mib']:.0f} MiB | | |",
        f"| peak RSS at {large} rows | {memory[large]['peak_rss_mib']:.0f} MiB | | |",
        f"| RSS {large} / {small} | {result['memory_ratio']:.2f} | ≤ {result['memory_limit']} | {flat} |", ""]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--repository", help="an export to serve (default: as bench.run finds one)")
    parser.add_argument("--work-dir", default=os.path.join(common.RESULTS, "bulk"))
    parser.add_argument("--output", help="the report (default: docs/benchmarks-bulk.md; --short: in --work-dir)")
    args = parser.parse_args(argv)
    report = args.output or os.path.join(args.work_dir if args.short else os.path.join(PROJECT, "docs"),
                                         "benchmarks-bulk.md")
    repository, _ = common.find_export(args.repository)
    ports = common.free_ports()
    os.makedirs(args.work_dir, exist_ok=True)
    server = common.start_server(repository, ports, os.path.join(args.work_dir, "tritonserver.log"))
    try:
        result = measure(args.work_dir, repository, ports["grpc"], args.short)
    finally:
        common.stop_server(server, drain=not args.short)
    with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    machine = common.machine_info()
    lines = ["# Bulk embedding benchmark", "", f"`python -m bench.bulk{' --short' if args.short else ''}` on "
             f"{machine['cpu']} ({machine['cores']} cores), {time.strftime('%Y-%m-%d', time.gmtime())}; "
             f"export: {result['model']}. `make bench` runs the same measurement as its step 11, on its own "
             f"server.", "",
             *section(result)[1:]]
    with open(report, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
