"""What OpenTelemetry tracing costs queries through the HTTP front (issue 57): the same export served by three
servers at once (tracing off; on, sampling one request in 1000; on for every request), an OTLP/HTTP receiver on this
machine taking their spans, and rounds that alternate the three servers, so drift on a noisy machine hits all alike.
Ratios are against `off`, in the same run.

Workload: queries, one text per request (`POST /v1/embeddings`), the case where per-request work weighs most; the
multilingual corpus's whole sentences and their openings (bench/corpus.py, 2-90 tokens), by wrk with --clients
connections for --seconds per server per round. Only one server is loaded at a time; the other two sit idle.
The receiver (bench/otlp_receiver.py) decodes what it gets (opentelemetry-proto) and counts spans per server
(`service.name`), so a row whose server sent nothing when it should have (or sent spans with tracing off) is caught,
not measured as free.

    python -m bench.studies.tracing_cost [--seconds 20] [--rounds 3] [--clients 4] [--repository DIR] [--write-docs]
"""
import argparse
import json
import os
import statistics
import time

from bench import common, loadgen
from bench import corpus as corpus_lib
from bench.otlp_receiver import Receiver

# name -> the server's tracing settings (the standard OpenTelemetry variables; unset: tracing off)
MODES = {
    "off": {},
    "sampled 1/1000": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.001"},
    "every request": {"OTEL_TRACES_SAMPLER": "always_on"},
}
HEADING = "## Tracing cost\n"


def progress(message):
    print(f"[tracing_cost {time.strftime('%H:%M:%S')}] {message}", flush=True)


def service_name(mode):
    return "bench-" + mode.replace(" ", "-").replace("/", "-")


def markdown(summary, args, queries, machine):
    base = summary["off"]
    lines = [HEADING.rstrip("\n"), "",
             f"`python -m bench.studies.tracing_cost --seconds {args.seconds:g} --rounds {args.rounds} --clients "
             f"{args.clients}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine}). Workload: queries, "
             f"one text per request to `POST /v1/embeddings` ({len(queries)} multilingual queries, "
             f"{min(q['tokens'] for q in queries)}-{max(q['tokens'] for q in queries)} tokens), {args.clients} wrk "
             f"connections, three servers of the same export at once (tracing off / sampled / every request, spans "
             f"to an OTLP receiver on the same machine), {args.rounds} rounds of {args.seconds:g} s per server "
             f"alternating; medians over rounds. Ratio: requests/s against `off` (1.00: free).", "",
             "| tracing | requests/s | × off | p50 ms | p99 ms | p99 × off | spans received |",
             "|---|---|---|---|---|---|---|"]
    for mode, row in summary.items():
        lines.append(f"| {mode} | {row['requests_per_s']:.1f} | {row['requests_per_s'] / base['requests_per_s']:.3f} "
                     f"| {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['p99_ms'] / base['p99_ms']:.2f} "
                     f"| {row['spans']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=20, help="each server's load per round (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the three servers (default %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="wrk connections (default %(default)s)")
    parser.add_argument("--repository", help="an exported repository (default: model_repository/ if it holds an "
                        "export, else all-MiniLM-L6-v2 exported into bench/results/repository)")
    parser.add_argument("--output", default=os.path.join(common.RESULTS, "tracing_cost"), help="results folder")
    parser.add_argument("--write-docs", action="store_true", help="put the table in docs/benchmarks.md")
    args = parser.parse_args(argv)

    source, _ = common.find_export(args.repository, progress)
    os.makedirs(args.output, exist_ok=True)
    repository = common.scratch_repository(source, os.path.join(args.output, "repository"))
    with open(os.path.join(repository, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    tokenizer = corpus_lib.load_tokenizer(os.path.join(repository, "tokenizer", "1", "tokenizer.json"))
    queries, _ = corpus_lib.multilingual(tokenizer, 400, 0, max_length=manifest["max_length"])
    script = loadgen.write_wrk_script(os.path.join(args.output, "queries.lua"),
                                      [{"input": q["text"], "model": manifest["id"]} for q in queries],
                                      "/v1/embeddings")
    sink = Receiver()
    servers, ports = {}, {}
    try:
        for mode, settings in MODES.items():
            env = dict(settings)
            if settings:
                env.update(OTEL_EXPORTER_OTLP_ENDPOINT=sink.url, OTEL_SERVICE_NAME=service_name(mode))
            ports[mode] = common.free_ports()
            progress(f"starting the server with tracing {mode}")
            servers[mode] = common.start_server(repository, ports[mode],
                                                os.path.join(args.output, f"{service_name(mode)}.log"), env=env)
            common.wait_for_proxy(ports[mode]["proxy"])
        rounds = {mode: [] for mode in MODES}
        log = os.path.join(args.output, "wrk.log")
        for number in range(args.rounds):
            order = list(MODES)[number % len(MODES):] + list(MODES)[:number % len(MODES)]
            for mode in order:
                result = loadgen.wrk(f"http://127.0.0.1:{ports[mode]['proxy']}", script, args.clients,
                                     args.seconds, log)
                if result is None or result["errors"]:
                    raise SystemExit(f"tracing_cost: the {mode} server failed requests (wrk.log: {result})")
                rounds[mode].append(result)
                progress(f"round {number + 1} {mode}: {result['requests_per_s']:.1f} req/s, "
                         f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms")
        time.sleep(6)  # the batch span processors' last exports (5 s by default)
    finally:
        for server in servers.values():
            common.stop_server(server)
        counts = sink.services()
        sink.close()
    summary = {mode: {key: statistics.median(r[key] for r in rounds[mode]) for key in
                      ("requests_per_s", "p50_ms", "p99_ms")} | {"spans": counts.get(service_name(mode), 0),
                                                                 "rounds": rounds[mode]}
               for mode in MODES}
    # A measurement of nothing is not a cost of zero: the traced servers must have sent spans, the other none.
    if summary["every request"]["spans"] == 0 or summary["off"]["spans"]:
        raise SystemExit(f"tracing_cost: spans received {counts}: tracing did not behave as configured")
    with open(os.path.join(args.output, "tracing_cost.json"), "w", encoding="utf-8") as handle:
        json.dump({"summary": summary, "spans": counts}, handle, indent=1)
    machine = common.machine_info()
    table = markdown(summary, args, queries, f"{machine['cpu']}, {machine['cores']} cores")
    print(table)
    if args.write_docs:
        progress(f"wrote {common.put_section(table, HEADING)}")


if __name__ == "__main__":
    main()
