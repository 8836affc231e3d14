"""First-request latency on a freshly started server, with and without the exports' warm-up (issue 12).

    python -m bench.studies.warm_start                      # 3 fresh starts each way -> docs/warm-start.md
    python -m bench.studies.warm_start --starts 1 --output /tmp/warm.md

For each start: a scratch copy of the export (model_repository/ if it holds one, else all-MiniLM-L6-v2 exported
into bench/results/repository, as bench.run does), either as exported or with every `model_warmup` block removed
from the tokenizer's and the encoder's configs; tritonserver started by the launcher; once /v2/health/ready is 200,
one short text (a query) and then one long text (a passage) through the ensemble over KServe HTTP, each first timed,
then 20 more of each for the steady state. The long text matters: onnxruntime's first run at a new sequence length
pays its own allocations.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request

from bench import common

PROJECT = common.PROJECT

SHORT = "how do I reset my password"
LONG = " ".join(["The committee reviewed the proposal in detail and asked for a revised budget before the vote."] * 12)


def scratch_copy(source, target, warm):
    """The export as it is (its configs and code, not the tracked ones), maybe without warm-up."""
    common.copy_models(source, target, ("tokenizer", "embedding", "ensemble", "proxy"))
    if not warm:
        for model in ("tokenizer", "embedding"):
            path = os.path.join(target, model, "config.pbtxt")
            config = common.pbtxt.read(path)
            assert config.model_warmup, f"{path}: no model_warmup to remove"
            common.pbtxt.write(path, common.pbtxt.without_warmup(config))


def infer_ms(port, text):
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/ensemble/infer", body,
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


def one_start(source, warm, work_dir):
    repository = os.path.join(work_dir, "warm" if warm else "cold")
    scratch_copy(source, repository, warm)
    ports = common.free_ports()
    started = time.monotonic()
    server = common.start_server(repository, ports, os.path.join(work_dir, "tritonserver.log"))
    ready_s = time.monotonic() - started
    try:
        first = {"short": infer_ms(ports["http"], SHORT), "long": infer_ms(ports["http"], LONG)}
        steady = {name: statistics.median(infer_ms(ports["http"], text) for _ in range(20))
                  for name, text in (("short", SHORT), ("long", LONG))}
    finally:
        common.stop_server(server)
    return {"ready_s": ready_s, "first": first, "steady": steady}


def markdown(runs, argv):
    lines = ["# First request after start, with and without warm-up", "",
             f"`python -m bench.studies.warm_start {' '.join(argv)}` on {platform.machine()}, {os.cpu_count()} cores; "
             "tritonserver 2.48 started fresh for every row; one request at a time through the ensemble over KServe "
             "HTTP. Cold: the same export with its `model_warmup` blocks (tokenizer and encoder) removed. Steady: "
             "median of the 20 requests that follow. Times in ms; ready: seconds from start to /v2/health/ready.", "",
             "| configs | start | ready (s) | first short | steady short | first long | steady long |",
             "|---|---|---|---|---|---|---|"]
    for warm in (False, True):
        for i, run in enumerate(runs[warm], 1):
            lines.append(f"| {'warm-up' if warm else 'cold'} | {i} | {run['ready_s']:.1f} | "
                         f"{run['first']['short']:.1f} | {run['steady']['short']:.1f} | "
                         f"{run['first']['long']:.1f} | {run['steady']['long']:.1f} |")
    lines.append("")
    for warm in (False, True):
        ratio = {k: statistics.median(r["first"][k] / r["steady"][k] for r in runs[warm]) for k in ("short", "long")}
        lines.append(f"- {'warm-up' if warm else 'cold'}: first request / steady, median over starts: short "
                     f"{ratio['short']:.1f}x, long {ratio['long']:.1f}x")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=3, help="fresh starts each way")
    parser.add_argument("--repository", help="an exported repository (default: as bench.run finds one)")
    parser.add_argument("--output", default=os.path.join(PROJECT, "docs", "warm-start.md"))
    args = parser.parse_args(argv)
    source, _ = common.find_export(args.repository)
    runs = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="warm-start-") as work_dir:
        for i in range(args.starts):
            for warm in (False, True):  # interleaved: machine drift hits both alike
                runs[warm].append(one_start(source, warm, work_dir))
                print(f"start {i + 1} {'warm-up' if warm else 'cold'}: {runs[warm][-1]}", flush=True)
    text = markdown(runs, argv)
    with open(args.output, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
