"""GPU benchmark: a bge-m3-sized encoder on a GPU, served by the real tritonserver 2.48 -> docs/benchmarks-gpu.md.

    python -m bench.gpu                                # on a GPU machine: the full matrix
    python -m bench.gpu --device cpu --tiny --short    # the same pipeline on CPU with a tiny model (tests/test_bench)
    python -m bench.gpu --encoder torchscript ...      # the encoder in Triton's C++ PyTorch backend (no Python stub)
    python -m bench.gpu --arms widths,ragged ...       # each configuration with the encoder's batches of equal
                                                       # widths, then with ragged batching (--ragged: ragged only)

Written for the lent GPU machines: Python 3.12, torch with CUDA, tokenizers and numpy, but no onnxruntime-gpu, no
transformers, no network. So the encoder is bench/models/torch_encoder (a 24-layer, 1024-wide XLM-R-shaped
transformer with random weights, PyTorch fp16) instead of the container's onnxruntime backend: in a Python-backend
model by default, or with --encoder torchscript the same module as TorchScript in Triton's C++ PyTorch backend, which
bench/build_pytorch_backend.sh builds against the machine's torch (bench/gpu_encoders.py: both encoders, their one
config, and a check that they answer alike). The tokenizer is the project's own model with the 250k XLM-R tokenizer
(tests/fixtures), and the load is plain KServe HTTP from this process's threads. tritonserver comes from the
nvidia-pytriton wheel (`pip install --no-deps` of the carried wheel is enough: local_triton/launch.py needs only its
binaries).

Workloads (bench/corpus.py): queries, passages and mixed (both, shuffled; only with --mixed), one text per request
to `ensemble`, and client-batched, 32 mixed texts per request to `ensemble_bls` and to `ensemble`. Matrix
(--matrix): rate limiter, tokenizer instances, max_batch_tokens and the tokenizer's length grouping; by default the
GPU grouping export writes (GPU_TOKENIZER in exporter/repository.py) against the tracked CPU one, RATE_LIMIT
off, and the CPU default (on) once, which fits a lent machine's 15 minutes. GPU utilisation is sampled with
nvidia-smi during every run.

Arms (--arms): `widths`, the encoder as shipped (Triton's batcher joins requests of equal widths only, hence the
tokenizer's width groups), and `ragged`, the encoder with ragged batching (what export --ragged-batch gives the real
encoder: one run holds requests of any widths; bench/gpu_encoders.py). Each configuration of the matrix is served
once per arm, arms in turn, the same tokenizer config for both; every row says its arm.
"""
import argparse
import http.client
import itertools
import json
import lzma
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tokenizers import Tokenizer  # noqa: E402

from bench import common, gpu_encoders  # noqa: E402
from bench import corpus as corpus_lib  # noqa: E402

MAX_LENGTH = 8192
# The tokenizer's length-grouping parameters --matrix can set, in its order.
GROUPING = ("pad_to_multiple_of", "batch_overhead_tokens", "split_overhead_tokens", "min_padding_efficiency",
            "pad_to_power_of_two")
# The models each workload is sent to: many-text requests to the BLS model (length groups) and to the ensemble (one
# tensor padded to the request's longest text), so the two are compared in one run.
WORKLOAD_MODELS = {"queries": ("ensemble",), "passages": ("ensemble",), "mixed": ("ensemble",),
                   "client-batched": ("ensemble_bls", "ensemble")}


def progress(message):
    print(f"[gpu bench] {message}", flush=True)


def xlmr_tokenizer():
    """bge-m3's XLM-R tokenizer (tests/fixtures), truncating at MAX_LENGTH, no padding: read once per run (17 MB)."""
    with lzma.open(os.path.join(PROJECT, "tests", "fixtures", "xlmr-tokenizer", "tokenizer.json.xz")) as packed:
        tokenizer = Tokenizer.from_str(packed.read().decode())
    tokenizer.enable_truncation(MAX_LENGTH)
    tokenizer.no_padding()
    return tokenizer


def loaded_config(http_port, model):
    """The config tritonserver loaded for `model` (GET /v2/models/<model>/config): {"instances": the instance
    groups' counts summed, "parameters": {key: string_value}}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{model}/config", timeout=30) as response:
        config = json.load(response)
    return {"instances": sum(int(group.get("count", 1)) for group in config.get("instance_group", [])),
            "parameters": {key: value.get("string_value") for key, value in config.get("parameters", {}).items()}}


def build_repository(work_dir, shape, device, tokenizer, tokenizer_instances, max_batch_tokens,
                     tokenizer_parameters=None, encoder="python", torchscript_file=None, ragged=False):
    """tokenizer (the project's model + `tokenizer`), embedding (torch_encoder: in a Python-backend model, or as
    TorchScript in the C++ PyTorch backend, bench/gpu_encoders.py), ensemble and ensemble_bls (the project's
    templates and BLS model).
    tokenizer_parameters: {name: value} replacing the tracked config's. torchscript_file: the encoder exported once
    for the run (gpu_encoders.export_torchscript, of the same raggedness). ragged: the encoder takes ragged batches
    (the `ragged` arm). Returns (the repository path, the tokenizer model's parameters as
    written)."""
    from exporter import repository as export_repository  # (the editable install; PYTHONPATH=. on the GPU machine)

    repository = os.path.join(work_dir, "repository")
    shutil.rmtree(repository, ignore_errors=True)
    tokenizer_dir = os.path.join(repository, "tokenizer")
    export_repository.copy_model_code("tokenizer", tokenizer_dir)  # the tracked code and config, as export copies it
    tokenizer.enable_padding(pad_id=1, pad_token="<pad>")  # the tokenizer model requires it in the file
    tokenizer.save(os.path.join(tokenizer_dir, "1", "tokenizer.json"))
    tokenizer.no_padding()
    config_path = os.path.join(tokenizer_dir, "config.pbtxt")
    # through Triton's ModelConfig (exporter/pbtxt.py), never a text replace (one stopped matching when the
    # tracked count became 2)
    config = common.pbtxt.with_instance_count(common.pbtxt.read(config_path), tokenizer_instances)
    config = common.pbtxt.with_parameters(config, {"max_batch_tokens": max_batch_tokens,
                                                   **(tokenizer_parameters or {})})
    common.pbtxt.write(config_path, config)

    # the encoder, its config (the same batching for both encoders) and its token budget
    gpu_encoders.write_encoder(encoder, os.path.join(repository, "embedding"), shape, device, max_batch_tokens,
                               torchscript_file, ragged)
    # The tokenizer's per-text outputs, public in both models; the BLS model's embedding is as wide as asked.
    per_text = ['  { name: "num_tokens", data_type: TYPE_INT32, dims: [ 1 ] }',
                '  { name: "truncated", data_type: TYPE_BOOL, dims: [ 1 ] }']
    ensemble_dir = os.path.join(repository, "ensemble")
    os.makedirs(os.path.join(ensemble_dir, "1"))
    with open(os.path.join(ensemble_dir, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(export_repository.render(
            os.path.join(PROJECT, "model_source", "ensemble", "config.pbtxt.template"), tokenizer="tokenizer",
            encoder="embedding",
            outputs=",\n".join([f'  {{ name: "embedding", data_type: TYPE_FP32, dims: [ {shape["hidden"]} ] }}']
                               + per_text),
            output_maps='      output_map { key: "embedding", value: "embedding" }'))
    bls_dir = os.path.join(repository, "ensemble_bls")
    export_repository.copy_model_code("ensemble_bls", bls_dir)
    with open(os.path.join(bls_dir, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(export_repository.render(
            os.path.join(PROJECT, "model_source", "ensemble_bls", "config.pbtxt.template"), tokenizer="tokenizer",
            encoder="embedding", inputs=export_repository.TEXT_INPUT, sparse_width="tokens", colbert_width="tokens-1",
            outputs=",\n".join(['  { name: "embedding", data_type: TYPE_FP32, dims: [ -1 ] }'] + per_text)))
    return repository, common.pbtxt.parameters(config)


class GpuSampler:
    """nvidia-smi's utilization.gpu every 0.5 s while running."""

    def __init__(self):
        self.samples, self.stopping = [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stopping.is_set() and shutil.which("nvidia-smi"):
            result = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                     "--format=csv,noheader,nounits"], capture_output=True, text=True)
            try:
                util, memory = result.stdout.strip().splitlines()[0].split(",")
                self.samples.append((float(util), float(memory)))
            except (ValueError, IndexError):
                pass
            self.stopping.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(5)

    def summary(self):
        if not self.samples:
            return None, None
        return statistics.mean(s[0] for s in self.samples), max(s[1] for s in self.samples)


def _client(port, model, texts, per_request, threads, seconds, offset, results):
    """One client process: `threads` closed loops, `per_request` texts per KServe HTTP request to `model` ->
    (latencies ms, errors)."""
    latencies, errors, lock = [], [0], threading.Lock()
    deadline = time.monotonic() + seconds
    counter = itertools.count(offset)

    def worker():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while time.monotonic() < deadline:
            first = next(counter) * per_request
            batch = [texts[(first + i) % len(texts)] for i in range(per_request)]
            body = json.dumps({"inputs": [{"name": "text", "shape": [per_request, 1], "datatype": "BYTES",
                                           "data": batch}], "outputs": [{"name": "embedding"}]})
            started = time.perf_counter()
            try:
                connection.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            with lock:
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors[0] += 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    results.put((latencies, errors[0]))


def load(port, texts, concurrency, seconds, processes=1, model="ensemble", per_request=1):
    """`concurrency` closed loops spread over `processes` client processes (one Python process's GIL caps what its
    threads can send: a fast GPU encoder would otherwise measure the client): (texts/s, p50 ms, p99 ms, errors);
    latencies are per request."""
    processes = max(1, min(processes, concurrency))
    results = multiprocessing.get_context("fork").Queue()
    started = time.monotonic()
    workers = [multiprocessing.get_context("fork").Process(
        target=_client, args=(port, model, texts, per_request, concurrency // processes + (i < concurrency % processes),
                              seconds, i * 7919, results)) for i in range(processes)]
    for worker in workers:
        worker.start()
    latencies, errors = [], 0
    for _ in workers:
        part, failed = results.get()
        latencies += part
        errors += failed
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    if not latencies:
        return 0.0, None, None, errors
    latencies.sort()
    return (len(latencies) * per_request / elapsed, latencies[len(latencies) // 2],
            latencies[int(len(latencies) * 0.99) - 1], errors)


def executions(port):
    """{model: (inferences, executions)} from Triton's metrics: their ratio is the mean rows per model run."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts = {}
    for metric, index in (("nv_inference_count", 0), ("nv_inference_exec_count", 1)):
        for model, value in re.findall(rf'^{metric}{{model="([^"]+)"[^}}]*}} ([0-9.e+]+)$', text, re.M):
            counts.setdefault(model, [0.0, 0.0])[index] += float(value)
    return counts


def rows_per_run(before, after, model):
    runs = after.get(model, [0, 0])[1] - before.get(model, [0, 0])[1]
    return (after[model][0] - before[model][0]) / runs if runs else None


def encoder_class():
    """The served encoder's own class (bench/models/torch_encoder), loaded without Triton's utils module."""
    return gpu_encoders.stand_in_module()


def ceiling(shape, device, tokenizer, workloads, batches, seconds):
    """The encoder alone, in this process, on the same texts (tokenized once, sorted by length so each batch pads
    little), at each batch size: {workload: (best texts/s, its batch size)}. What serving is measured against."""
    import torch

    module = encoder_class()
    dev = torch.device(device if device == "cpu" or torch.cuda.is_available() else "cpu")
    model = module.build_encoder(shape, dev)
    best = {}
    for name, texts in workloads.items():
        ids = sorted((e.ids for e in tokenizer.encode_batch(texts)), key=len)
        for batch in batches[name]:
            runs = []
            for first in range(0, len(ids), batch):
                rows = ids[first:first + batch]
                width = max(len(r) for r in rows)
                input_ids = torch.full((len(rows), width), 1, dtype=torch.int64)
                for row, r in enumerate(rows):
                    input_ids[row, :len(r)] = torch.tensor(r)
                runs.append((input_ids.to(dev), (input_ids != 1).to(torch.int64).to(dev), len(rows)))
            with torch.inference_mode():
                for input_ids, mask, _ in runs[:2]:  # warm-up
                    model(input_ids, mask)
                done, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds:
                    for input_ids, mask, rows in runs:
                        model(input_ids, mask).cpu()
                        done += rows
                rate = done / (time.perf_counter() - started)
            progress(f"ceiling: {name} batch {batch}: {rate:,.1f} texts/s")
            if rate > best.get(name, (0, 0))[0]:
                best[name] = (rate, batch)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return best


def levels(text):
    return [int(x) for x in text.split(",") if x]


ARMS = ("widths", "ragged")


def arm_list(text):
    arms = [x for x in text.split(",") if x]
    if not arms or set(arms) - set(ARMS) or len(set(arms)) < len(arms):
        raise argparse.ArgumentTypeError(f"{text!r}: some of {', '.join(ARMS)}, each once")
    return arms


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny encoder instead of bge-m3's shape (smoke test)")
    parser.add_argument("--short", action="store_true", help="one configuration, short runs (smoke test)")
    parser.add_argument("--seconds", type=float, help="seconds per measurement (default 6; short 3)")
    parser.add_argument("--ceiling-seconds", type=float, help="seconds per batch size of the in-process ceiling "
                                                              "(default: --seconds, at most 10; short 0.25)")
    parser.add_argument("--matrix", help="configurations, RATE_LIMIT:tokenizers:max_batch_tokens[:GROUPING...] "
                                         "(GROUPING: pad_to_multiple_of, batch_overhead_tokens, split_overhead_tokens, "
                                         "min_padding_efficiency, pad_to_power_of_two, in that order), "
                                         "comma-separated (default: off with the GPU grouping, off and on with the "
                                         "tracked one; 1 tokenizer, 16384)")
    parser.add_argument("--queries", type=levels, help="requests in flight, comma-separated (default 16,64,256)")
    parser.add_argument("--passages", type=levels, help="requests in flight, comma-separated (default 8,32,64)")
    parser.add_argument("--mixed", type=levels, help="requests in flight, comma-separated (default: none)")
    parser.add_argument("--client-batched", type=levels, help="requests of 32 texts in flight, comma-separated "
                                                              "(default 2,8,16); an empty list skips a workload")
    parser.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                        help="load generator processes (default: half the cores, at most 8)")
    parser.add_argument("--encoder", choices=gpu_encoders.ENCODERS, default="python",
                        help="how `embedding` serves the stand-in encoder: python (a Python-backend model, the "
                             "default) or torchscript (Triton's C++ PyTorch backend, bench/build_pytorch_backend.sh)")
    parser.add_argument("--pytorch-backend", help="with --encoder torchscript: the folder holding "
                                                  "libtriton_pytorch.so (default: PYTORCH_BACKEND, else "
                                                  ".triton/pytorch-backend)")
    parser.add_argument("--arms", type=arm_list, default=["widths"],
                        help="the encoder's batching, comma-separated, each configuration served once per arm: widths "
                             "(equal widths only, as shipped; the default) and ragged (ragged batching, any widths in "
                             "one run)")
    parser.add_argument("--ragged", dest="arms", action="store_const", const=["ragged"],
                        help="the ragged arm alone (--arms ragged)")
    parser.add_argument("--work-dir", default=os.path.join(PROJECT, "bench", "results", "gpu"))
    parser.add_argument("--output", help="report path (default docs/benchmarks-gpu.md; short: in --work-dir)")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (3.0 if args.short else 6.0)
    args.ceiling_seconds = args.ceiling_seconds or (0.25 if args.short else min(args.seconds, 10.0))
    args.output = args.output or (os.path.join(args.work_dir, "benchmarks-gpu.md") if args.short
                                  else os.path.join(PROJECT, "docs", "benchmarks-gpu.md"))
    if args.matrix:
        args.matrix = [(fields[0], int(fields[1]), int(fields[2]),
                        dict(zip(GROUPING, fields[3:])))
                       for fields in (c.split(":") for c in args.matrix.split(","))]
    else:
        from exporter.repository import GPU_TOKENIZER  # (the editable install; PYTHONPATH=. on the GPU machine)

        args.matrix = [("on", 1, 16384, {})] if args.short else \
            [("off", 1, 16384, dict(GPU_TOKENIZER)), ("off", 1, 16384, {}), ("on", 1, 16384, {})]
    chosen = {"queries": (args.queries, [4], [16, 64, 256]), "passages": (args.passages, [2], [8, 32, 64]),
              "mixed": (args.mixed, [], []),
              "client-batched": (args.client_batched, [1], [2, 8, 16])}
    args.levels = {name: (given if given is not None else short if args.short else full)
                   for name, (given, short, full) in chosen.items()}
    args.levels = {name: level for name, level in args.levels.items() if level}
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    shape = gpu_encoders.encoder_shape(args.tiny)
    machine = ""
    if shutil.which("nvidia-smi"):
        machine = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
    tokenizer = xlmr_tokenizer()
    workloads = {name: [t["text"] for t in corpus_lib.build(tokenizer, corpus_lib.WORKLOADS[name],
                                                            64 if args.short else 600)]
                 for name in args.levels}
    # The ceiling's batch sizes: the served encoder's own (up to max_batch_size 256) and smaller; short: the smallest
    # (its corpora are 64 texts).
    batches = {"queries": [16, 64, 256], "passages": [8, 32, 64], "mixed": [16, 64, 256],
               "client-batched": [32, 64, 256]}
    if args.short:
        batches = {name: sizes[:1] for name, sizes in batches.items()}
    # The C++ backend's layout first (a missing build fails here, before any measurement)
    server_args, server_env = gpu_encoders.server_options(args.encoder, args.pytorch_backend)
    best = ceiling(shape, args.device, tokenizer, workloads, batches, args.ceiling_seconds)
    torchscript_files = dict.fromkeys(args.arms)
    if args.encoder == "torchscript":  # exported once for every server of the run (one file per arm)
        for arm in args.arms:
            torchscript_files[arm] = os.path.join(args.work_dir, "torchscript", f"{arm}.pt")
            started = time.monotonic()
            gpu_encoders.export_torchscript(shape, args.device, torchscript_files[arm], arm == "ragged")
            progress(f"TorchScript encoder ({arm}) exported in {time.monotonic() - started:.1f} s: "
                     f"{torchscript_files[arm]}")
    rows, results = [], os.path.join(args.work_dir, "results.json")

    def save():  # after every row: a run cut short keeps what it measured
        with open(results, "w", encoding="utf-8") as handle:
            json.dump({"rows": rows, "machine": machine, "shape": shape, "device": args.device, "encoder": args.encoder,
                       "arms": args.arms,
                       "ceiling": {name: {"texts_per_s": rate, "batch": batch} for name, (rate, batch) in best.items()},
                       "client_processes": args.client_processes}, handle, indent=1)
    save()
    for (rate_limit, instances, budget, padding), arm in itertools.product(args.matrix, args.arms):
        progress(f"arm {arm}: rate limiter {rate_limit}, {instances} tokenizer(s), {budget} tokens, {padding}")
        repository, _ = build_repository(args.work_dir, shape, args.device, tokenizer, instances, budget,
                                         padding, args.encoder, torchscript_files[arm], arm == "ragged")
        ports = common.free_ports()
        server = common.start_server(repository, ports, os.path.join(args.work_dir, "tritonserver.log"),
                                     {"RATE_LIMIT": rate_limit,
                                      "LOAD_MODELS": "tokenizer,embedding,ensemble,ensemble_bls", **server_env},
                                     server_args, timeout_s=900)
        try:
            loaded = loaded_config(ports["http"], "tokenizer")  # what the server runs, not what was meant
            progress(f"tokenizer as loaded: {loaded['instances']} instance(s), {loaded['parameters']}")
            if gpu_encoders.loaded_ragged(ports["http"]) != (arm == "ragged"):
                raise SystemExit(f"bench: the encoder as loaded does not match the arm {arm} (its config's inputs)")
            for (name, concurrencies), model in ((item, model) for item in args.levels.items()
                                                 for model in WORKLOAD_MODELS[item[0]]):
                per_request = corpus_lib.WORKLOADS[name].texts_per_request
                load(ports["http"], workloads[name], 4, 0.3 if args.short else 1.0, 1, model, per_request)  # warm-up
                for concurrency in concurrencies:
                    before = executions(ports["metrics"])
                    with GpuSampler() as sampler:
                        rate, p50, p99, errors = load(ports["http"], workloads[name], concurrency, args.seconds,
                                                      args.client_processes, model, per_request)
                    util, memory = sampler.summary()
                    after = executions(ports["metrics"])
                    row = {"workload": name, "model": model, "texts_per_request": per_request, "encoder": args.encoder,
                           "arm": arm, "rate_limit": rate_limit, "tokenizers": loaded["instances"],
                           "max_batch_tokens": int(loaded["parameters"]["max_batch_tokens"]),
                           "pad_to_multiple_of": int(loaded["parameters"]["pad_to_multiple_of"]),
                           "batch_overhead_tokens": int(loaded["parameters"]["batch_overhead_tokens"]),
                           "split_overhead_tokens": int(loaded["parameters"]["split_overhead_tokens"]),
                           "min_padding_efficiency": float(loaded["parameters"]["min_padding_efficiency"]),
                           "pad_to_power_of_two": loaded["parameters"]["pad_to_power_of_two"] == "true",
                           "concurrency": concurrency, "texts_per_s": rate,
                           "encoder_rows_per_run": rows_per_run(before, after, "embedding"),
                           "tokenizer_requests_per_run": rows_per_run(before, after, "tokenizer"),
                           "ratio": rate / best[name][0], "p50_ms": p50, "p99_ms": p99, "errors": errors,
                           "gpu_util": util, "gpu_memory_mb": memory}
                    rows.append(row)
                    save()
                    progress(json.dumps(row))
        finally:
            common.stop_server(server, drain=not args.short)  # short: killed, nothing left to measure in it
    write_report(args, rows, machine, shape, best)
    return 0


def write_report(args, rows, machine, shape, best):
    def num(value, digits=1):
        return "—" if value is None else f"{value:,.{digits}f}"

    flags = (f"{' --device cpu' if args.device == 'cpu' else ''}{' --tiny' if args.tiny else ''}"
             f"{' --short' if args.short else ''}{' --encoder torchscript' if args.encoder == 'torchscript' else ''}"
             f"{'' if args.arms == ['widths'] else ' --arms ' + ','.join(args.arms)}")
    lines = [f"# GPU benchmark: a bge-m3-sized encoder ({args.device})", "",
             f"Generated by `python -m bench.gpu{flags}` "
             f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; GPU: {machine or 'none'}. Encoder: "
             f"{shape['layers']} layers, hidden {shape['hidden']}, vocabulary {shape['vocab']:,}, random weights, "
             f"{gpu_encoders.describe(args.encoder, args.device, args.pytorch_backend)} (the lent machines have no "
             "onnxruntime-gpu): the container's "
             "onnxruntime backend would run the exported ONNX instead. Tokenizer: the project's model with the 250k "
             "XLM-R tokenizer. Load: KServe HTTP, closed loops in client processes; queries, passages, mixed one text "
             "per request, client-batched 32 mixed texts per request (in flight: requests). Arm: `widths`, the "
             "encoder's batcher joins requests of equal widths only (as shipped); `ragged`, ragged batching (one run "
             "holds requests of any widths, padded to the widest in the encoder: export --ragged-batch).", "",
             "Ceiling: the same encoder in the bench's own process on the same texts, sorted by length, at its best "
             "batch size: " + "; ".join(f"{name} {rate:,.1f} texts/s (batch {batch})"
                                        for name, (rate, batch) in best.items()) +
             f". Load: {args.client_processes} client processes.", "",
             "| workload | model | arm | rate limiter | tokenizers | max_batch_tokens | pad to | power of two | "
             "run overhead | split overhead | min efficiency | in flight | texts/s | of ceiling | p50 ms | p99 ms | "
             "encoder rows/run | GPU util % | GPU MiB | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['model']} | {r.get('arm', 'widths')} | {r['rate_limit']} | "
                     f"{r['tokenizers']} | "
                     f"{r['max_batch_tokens']} | "
                     f"{r['pad_to_multiple_of']} | {'yes' if r.get('pad_to_power_of_two') else 'no'} | "
                     f"{r['batch_overhead_tokens']} | {r['split_overhead_tokens']} | "
                     f"{r['min_padding_efficiency']} | "
                     f"{r['concurrency']} | {num(r['texts_per_s'])} | {num(r['ratio'], 2)} | {num(r['p50_ms'])} | "
                     f"{num(r['p99_ms'])} | {num(r['encoder_rows_per_run'])} | "
                     f"{num(r['gpu_util'], 0)} | {num(r['gpu_memory_mb'], 0)} | {r['errors']} |")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    progress(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(main())
