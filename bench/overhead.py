"""The serving floor (issue 15): what the tokenizer and the encoder's glue cost per request when the model itself
costs nearly nothing, the regime a GPU leaves. Single-text requests (the queries corpus) at one concurrency through
`ensemble` of a 2-layer, 64-wide random XLM-R (the 250k XLM-R tokenizer), against `echo_ensemble`: two bare
Python-backend models that only pass their input on, in the same server, measured alternately.

The server runs as on a GPU: RATE_LIMIT=off (docs/reference.md, deploying.md). The CPU default (on) makes the tokenizer
and the encoder take turns, which the echo models do not: --rate-limit on measures that (bench/TUNING.md has both).

    python -m bench.overhead [--concurrency 64] [--rounds 2] [--rate-limit on]  # also a step of python -m bench.run
    python -m bench.overhead --export DIR   # another tiny model's export instead (the test suite's: no export here)
"""
import argparse
import json
import os
import shutil
import sys

from bench import common, loadgen

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QUERIES = os.path.join(PROJECT, "bench", "data", "queries.json")  # perf_analyzer input data, one text per entry
TINY_MODEL = "2-layer 64-wide XLM-R"  # what tiny_model builds, as the report names it
ECHO_MODEL = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Passes its input on: the bare cost of a Python-backend step."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("{output}", pb_utils.get_input_tensor_by_name(
            request, "{input}").as_numpy())]) for request in requests]
'''
ECHO_CONFIG = '''backend: "python"
max_batch_size: 256
input [ {{ name: "{input}", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [ {{ name: "{output}", data_type: TYPE_STRING, dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
'''
ECHO_ENSEMBLE = '''platform: "ensemble"
max_batch_size: 256
input [ { name: "text", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "text_out", data_type: TYPE_STRING, dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "echo_first" model_version: -1 input_map { key: "text" value: "text" }
    output_map { key: "echoed" value: "echoed" } },
  { model_name: "echo_second" model_version: -1 input_map { key: "echoed" value: "echoed" }
    output_map { key: "text_out" value: "text_out" } } ] }
'''


def tiny_model(folder):
    """A 2-layer, 64-wide XLM-RoBERTa with random weights and the real 250,002-piece tokenizer."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=250002, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=128, max_position_embeddings=514)
    XLMRobertaModel(config).eval().save_pretrained(folder)
    common.write_xlmr_tokenizer(folder)


def write_model(repository, name, config, code=None):
    os.makedirs(os.path.join(repository, name, "1"), exist_ok=True)
    with open(os.path.join(repository, name, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(config)
    if code:
        with open(os.path.join(repository, name, "1", "model.py"), "w", encoding="utf-8") as handle:
            handle.write(code)


def build_repository(work_dir, progress, export=None):
    """The tiny model's export (or a copy of `export`, an existing one, with the checkout's code) and the echo
    models beside it."""
    folder, repository = os.path.join(work_dir, "tiny-xlmr-64"), os.path.join(work_dir, "repository")
    shutil.rmtree(repository, ignore_errors=True)
    if export:
        progress(f"serving floor: the export at {export}")
        common.scratch_repository(export, repository)
    else:
        progress("serving floor: exporting a 2-layer, 64-wide random XLM-R")
        tiny_model(folder)
        common.run_export(folder, repository, "--pooling", "cls", "--max-length", "128", who="bench overhead")
    for name, (given, returned) in {"echo_first": ("text", "echoed"), "echo_second": ("echoed", "text_out")}.items():
        write_model(repository, name, ECHO_CONFIG.format(input=given, output=returned),
                    ECHO_MODEL.format(input=given, output=returned))
    write_model(repository, "echo_ensemble", ECHO_ENSEMBLE)
    return repository


def measure(work_dir, concurrency=64, rounds=2, window_requests=2000, max_trials=6, stability=25, progress=print,
            rate_limit="off", export=None, drain=True, window_ms=None):
    """{"ensemble": best row, "echo_ensemble": best row, "ratio", "concurrency", "rate_limit", "model"}: the models
    measured alternately, `rounds` times each, best of each kept (background noise on a shared machine only ever
    slows a round). export: an existing export of a tiny model to measure instead of exporting tiny_model's;
    drain=False, window_ms (time windows instead of count windows: loadgen.perf_analyzer): a smoke run's."""
    os.makedirs(work_dir, exist_ok=True)
    repository = build_repository(work_dir, progress, export)
    if export:
        with open(os.path.join(repository, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
            described = f"{json.load(handle)['model']} (exported into {export})"
    else:
        described = TINY_MODEL
    ports, log_path = common.free_ports(), os.path.join(work_dir, "loadgen.log")
    server = common.start_server(repository, ports, os.path.join(work_dir, "tritonserver.log"),
                                 env={"RATE_LIMIT": rate_limit})
    best = {}
    try:
        for _ in range(rounds):
            for model in ("ensemble", "echo_ensemble"):
                csv_path = os.path.join(work_dir, f"{model}-{concurrency}.csv")
                row = loadgen.perf_analyzer(model, f"127.0.0.1:{ports['grpc']}", QUERIES, concurrency, csv_path,
                                            window_requests, max_trials, log_path, stability=stability,
                                            window_ms=window_ms)
                if row:
                    progress(f"serving floor: {model:14s} c={concurrency} {row['requests_per_s']:7.1f} requests/s "
                             f"p50 {row['p50_ms']:.1f} ms")
                    if row["requests_per_s"] > best.get(model, {}).get("requests_per_s", 0):
                        best[model] = row
    finally:
        common.stop_server(server, drain)
    ratio = best["ensemble"]["requests_per_s"] / best["echo_ensemble"]["requests_per_s"] if len(best) == 2 else None
    return {"concurrency": concurrency, "rounds": rounds, "rate_limit": rate_limit, **best, "ratio": ratio,
            "model": described}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=os.path.join(common.RESULTS, "overhead"))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate-limit", choices=["on", "off"], default="off",
                        help="the launcher's RATE_LIMIT (default off: the GPU setting, the regime this measures)")
    parser.add_argument("--export", help="an existing export of a tiny model (default: a 2-layer, 64-wide random "
                        "XLM-R exported here)")
    args = parser.parse_args(argv)
    result = measure(args.work_dir, args.concurrency, args.rounds, rate_limit=args.rate_limit, export=args.export)
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
