"""The encoders bench/gpu.py serves as `embedding` (--encoder): the bge-m3-shaped stand-in (bench/models/torch_encoder:
an XLM-R-shaped transformer with random weights, seed 0) either

  python       in a Python-backend model (the default, and the fallback): every request's tensors go through a
               stub process, ~0.65 ms of Python per request (docs/benchmarks-gpu.md, item 4)
  torchscript  the same module, torch.jit.script-ed into model.pt, in Triton's C++ PyTorch backend
               (bench/build_pytorch_backend.sh builds libtriton_pytorch.so r24.07 against the machine's torch): no
               stub, the way the container's C++ onnxruntime backend runs the real export

Same contract (input_ids, attention_mask INT64 [-1] -> CLS-pooled, L2-normalized `embedding` FP32 [hidden]) and
the same batching: max_batch_size 256, the dynamic batcher without delay, one instance with the rate limiter's
"cores" resource, the token budget (batchstrategy.so with max_batch_tokens).

Each also comes ragged (bench.gpu --arms ragged; what export --ragged-batch gives the real encoder): input_ids and
attention_mask `allow_ragged_batch`, so Triton's batcher joins requests of any widths into one run.
  python       the Python backend still hands each request over with its own shape: the model (RAGGED_PYTHON_MODEL,
               around the stand-in) pads every request's rows to the widest and runs them as one batch
  torchscript  pytorch_backend r24.07 hands the module every request's tokens flat (1-D) and, as the batch input
               `row_lengths` (BATCH_ITEM_SHAPE of input_ids, INT32 [rows, 1]), each row's width; the inputs bind to
               forward's arguments by name (its FORWARD_ARGUMENT convention: config names equal to the argument
               names, batch inputs counted with the inputs), so RaggedEncoder.forward(input_ids, attention_mask,
               row_lengths) rebuilds the padded batch as exporter/graph.py's add_ragged_inputs does, then runs
               the encoder

    python -m bench.gpu_encoders --device cpu --tiny     # all four in one tritonserver: the same request to the two
                                                         # padded ones, compared with each other and with the module
                                                         # in-process; then requests of mixed widths sent at once to
                                                         # each ragged one, compared with the padded answers
    python -m bench.gpu_encoders --device cuda           # the same on a GPU (bge-m3's shape, fp16)

The TorchScript file is written where the bench runs (bge-m3's shape in fp16 is ~1.1 GB: never carried).
"""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import threading
import time
import types
import urllib.request
import warnings

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench import common  # noqa: E402

try:  # where the launcher keeps its backends folder's layout (local_triton/backends.py since it was split up)
    from local_triton import backends as triton_backends  # noqa: E402
except ImportError:
    from local_triton import launch as triton_backends  # noqa: E402

ENCODERS = ("python", "torchscript")
# The stand-in's shapes, here rather than in bench/gpu.py (which imports this module): the encoders are built from
# them, and both benches measure the same ones.
BGE_M3_SHAPE = {"vocab": 250002, "hidden": 1024, "layers": 24, "heads": 16, "ffn": 4096, "positions": 8194}
TINY_SHAPE = {"vocab": 250002, "hidden": 32, "layers": 2, "heads": 2, "ffn": 64, "positions": 514}
MAX_BATCH_SIZE = 256
STAND_IN = os.path.join(PROJECT, "bench", "models", "torch_encoder")
DEFAULT_PYTORCH_BACKEND = os.path.join(PROJECT, ".triton", "pytorch-backend")
BACKEND_DIR = os.path.join(PROJECT, ".triton", "backends-pytorch")
# Triton's PyTorch backend's own parameters: inference mode (its default, written out), and the TorchScript
# profiling executor off, so the many widths the tokenizer pads to do not each re-profile and re-specialize the
# graph during a measurement (the encoder's work is its matmuls and the fused encoder-layer op either way).
TORCHSCRIPT_PARAMETERS = {"INFERENCE_MODE": "true", "DISABLE_OPTIMIZED_EXECUTION": "true"}
PAD_ID = 1  # the XLM-R tokenizer's <pad>, what the tokenizer model pads with (bench/gpu.py)
RAGGED_LENGTHS = "row_lengths"  # the batch input's name, as the product's ragged export names it (graph.RAGGED_LENGTHS)
# The ragged Python-backend encoder's model.py: the stand-in's model (copied beside it as stand_in.py), with an
# execute that takes requests of any widths (the batcher joins them: allow_ragged_batch) as one batch padded to the
# widest, `pad_id` and mask 0 in the added columns.
RAGGED_PYTHON_MODEL = '''"""Written by bench/gpu_encoders.py: bench/models/torch_encoder (stand_in.py beside this file)
with ragged batching: requests of any widths in one execute (allow_ragged_batch), padded to the widest and run as
one batch."""
import os
import sys

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True
import stand_in  # noqa: E402  (beside this file: the Python backend puts the model's folder on the path)

PAD_ID = {pad_id}


class TritonPythonModel(stand_in.TritonPythonModel):
    @torch.inference_mode()
    def execute(self, requests):
        ids = [pb_utils.get_input_tensor_by_name(r, "input_ids").as_numpy() for r in requests]
        masks = [pb_utils.get_input_tensor_by_name(r, "attention_mask").as_numpy() for r in requests]
        width = max(a.shape[1] for a in ids)
        batch_ids = np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=PAD_ID) for a in ids])
        batch_mask = np.concatenate([np.pad(m, ((0, 0), (0, width - m.shape[1]))) for m in masks])
        vectors = self.model(torch.from_numpy(batch_ids).to(self.device),
                             torch.from_numpy(batch_mask).to(self.device)).cpu().numpy()
        responses, start = [], 0
        for a in ids:
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("embedding", vectors[start:start + a.shape[0]])]))
            start += a.shape[0]
        return responses
'''


def stand_in_module():
    """bench/models/torch_encoder/1/model.py (Encoder, build_encoder), loaded without Triton's utils module."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("torch_encoder_model", os.path.join(STAND_IN, "1", "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_device(device):
    import torch

    return torch.device("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")


def ragged_encoder(encoder, pad_id=PAD_ID):
    """`encoder` behind forward(input_ids, attention_mask, row_lengths), the inputs pytorch_backend r24.07 gives a
    ragged batch: every row's tokens back to back (1-D), and each row's width ([rows, 1] INT32, BATCH_ITEM_SHAPE of
    input_ids). Rebuilds the padded [rows, widest] batch as exporter/graph.py's add_ragged_inputs does
    (token at start of row + column where the column is inside the row, else `pad_id` and a mask of 0), then runs
    `encoder` on it. Scriptable (torch.jit.script)."""
    import torch

    class RaggedEncoder(torch.nn.Module):
        def __init__(self, inner, pad: int):
            super().__init__()
            self.inner = inner
            self.pad = pad

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, row_lengths: torch.Tensor):
            lengths = row_lengths.reshape(-1).to(device=input_ids.device, dtype=torch.int64)
            starts = torch.cumsum(lengths, 0) - lengths
            columns = torch.arange(int(lengths.max()), device=input_ids.device).unsqueeze(0)
            inside = columns < lengths.unsqueeze(1)
            index = torch.where(inside, starts.unsqueeze(1) + columns, torch.zeros_like(columns))
            ids = torch.where(inside, input_ids[index], torch.full_like(index, self.pad))
            mask = torch.where(inside, attention_mask[index], torch.zeros_like(index))
            return self.inner(ids, mask)

    return RaggedEncoder(encoder, pad_id)


def export_torchscript(shape, device, path, ragged=False):
    """The stand-in of `shape`, built as the Python model builds it (build_encoder: seed 0, fp16 on a GPU), scripted
    and saved to `path`; ragged: behind ragged_encoder. Scripted, not traced: the widths vary per batch, and
    scripting keeps nn.TransformerEncoder's own choice of its fused path (it takes it under the backend's inference
    mode, as the Python model does under torch.inference_mode)."""
    import torch

    model = stand_in_module().build_encoder(shape, torch_device(device))
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if ragged:
        model = ragged_encoder(model).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated (torch >= 2.10), once per submodule
        scripted = torch.jit.script(model)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.jit.save(scripted, path)
    del model, scripted
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def encoder_config(encoder, shape, device, max_batch_tokens, ragged=False, queue_delay_us=0):
    """config.pbtxt of the encoder: the backend's lines, then what both share. Ragged: both inputs
    `allow_ragged_batch`; the TorchScript module also gets the batch input `row_lengths` (the Python backend hands
    each request over whole, and its model pads them itself). queue_delay_us: the dynamic batcher's delay (the
    bench's 0; the check's ragged models wait, so that the requests it sends at once share runs)."""
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    if encoder == "python":
        head = 'backend: "python"\n'
        parameters = {**shape, "device": device, "max_batch_tokens": max_batch_tokens}
    else:
        head = 'platform: "pytorch_libtorch"\n'
        parameters = {**TORCHSCRIPT_PARAMETERS, "max_batch_tokens": max_batch_tokens}
    flag = ", allow_ragged_batch: true" if ragged else ""
    batch_input = (f'batch_input [ {{ kind: BATCH_ITEM_SHAPE, target_name: "{RAGGED_LENGTHS}", data_type: TYPE_INT32, '
                   'source_input: "input_ids" } ]\n') if ragged and encoder == "torchscript" else ""
    return (head + f"max_batch_size: {MAX_BATCH_SIZE}\n"
            f'input [ {{ name: "input_ids", data_type: TYPE_INT64, dims: [ -1 ]{flag} }},\n'
            f'        {{ name: "attention_mask", data_type: TYPE_INT64, dims: [ -1 ]{flag} }} ]\n'
            + batch_input +
            f'output [ {{ name: "embedding", data_type: TYPE_FP32, dims: [ {shape["hidden"]} ] }} ]\n'
            f"dynamic_batching {{ max_queue_delay_microseconds: {int(queue_delay_us)} }}\n"
            f'instance_group [ {{ kind: {kind}, count: 1, rate_limiter {{ resources [ {{ name: "cores", count: 1 }} ] '
            "priority: 1 } } ]\n"
            + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items()))


def write_encoder(encoder, encoder_dir, shape, device, max_batch_tokens, torchscript_file=None, ragged=False,
                  queue_delay_us=0):
    """The encoder model folder: code (python) or model.pt (torchscript), config.pbtxt, batchstrategy.so.
    torchscript_file: an export_torchscript file of this shape, device and raggedness, linked as model.pt (a bench
    run exports once for all its servers); without it the module is exported into the folder. ragged: the encoder
    takes Triton's ragged batches (the python one: RAGGED_PYTHON_MODEL as model.py, the stand-in's beside it as
    stand_in.py; the torchscript one: ragged_encoder)."""
    from exporter import repository as export_repository  # (the editable install; PYTHONPATH=. on the GPU machine)

    if encoder == "python":
        common.copy_model(STAND_IN, encoder_dir)
        if ragged:
            version = os.path.join(encoder_dir, "1")
            os.replace(os.path.join(version, "model.py"), os.path.join(version, "stand_in.py"))
            with open(os.path.join(version, "model.py"), "w", encoding="utf-8") as handle:
                handle.write(RAGGED_PYTHON_MODEL.replace("{pad_id}", str(PAD_ID)))
    elif encoder == "torchscript":
        model_file = os.path.join(encoder_dir, "1", "model.pt")
        if torchscript_file:
            os.makedirs(os.path.dirname(model_file), exist_ok=True)
            os.symlink(os.path.abspath(torchscript_file), model_file)
        else:
            export_torchscript(shape, device, model_file, ragged)
    else:
        raise ValueError(f"encoder {encoder!r}: one of {ENCODERS}")
    with open(os.path.join(encoder_dir, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(encoder_config(encoder, shape, device, max_batch_tokens, ragged, queue_delay_us))
    export_repository.build_batch_strategy(encoder_dir)  # the token budget, as export builds it


def pytorch_backend(folder=None):
    """The folder holding libtriton_pytorch.so: `folder`, else PYTORCH_BACKEND, else .triton/pytorch-backend."""
    folder = os.path.abspath(folder or os.environ.get("PYTORCH_BACKEND") or DEFAULT_PYTORCH_BACKEND)
    if not os.path.isfile(os.path.join(folder, "libtriton_pytorch.so")):
        raise SystemExit(f"bench: {folder} holds no libtriton_pytorch.so: build it with "
                         f"`bash bench/build_pytorch_backend.sh {os.path.relpath(folder, PROJECT)}` "
                         f"(docs/benchmarks-gpu.md), or use --encoder python")
    return folder


def server_options(encoder, folder=None, python=sys.executable):
    """(extra_args, env) for common.start_server so that tritonserver serves `encoder`: nothing for python; for
    torchscript a backend directory of its own, laid out as the launcher lays out the onnxruntime one
    (prepare_backends: the wheel's Python backend and stub; pytorch/ -> the built folder; lib/libtritonserver.so ->
    the wheel's server library, which the C++ backend links by that name), given after the launcher's own
    --backend-directory (the last one counts), and that lib/ first on LD_LIBRARY_PATH."""
    if encoder == "python":
        return (), {}
    folder = pytorch_backend(folder)
    backend_dir = triton_backends.prepare_backends(python, backend_dir=BACKEND_DIR)
    triton_backends.relink(folder, os.path.join(backend_dir, "pytorch"))
    lib_dir = triton_backends.server_library_link(backend_dir)
    library_path = triton_backends.server_env(python).get("LD_LIBRARY_PATH", "")
    return ((f"--backend-directory={backend_dir}",),
            {"LD_LIBRARY_PATH": os.pathsep.join(p for p in (lib_dir, library_path) if p)})


def loaded_ragged(http_port, model="embedding"):
    """Whether the encoder tritonserver loaded takes ragged batches (its config as loaded: allow_ragged_batch on
    every input)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{model}/config", timeout=30) as response:
        inputs = json.load(response)["input"]
    return all(i.get("allow_ragged_batch") for i in inputs)


def describe(encoder, device, folder=None):
    """The encoder in words, for reports."""
    precision = "fp16" if device == "cuda" else "fp32"
    if encoder == "python":
        return f"PyTorch {precision} in a Python-backend model (bench/models/torch_encoder)"
    built = ""
    path = os.path.join(pytorch_backend(folder), "BUILT_FROM")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            built = f" ({handle.read().split(', RUNPATH')[0].strip()})"
    return (f"the same module as TorchScript ({precision}) in Triton's C++ PyTorch backend{built}, "
            "no Python stub")


# ------------------------------------- the check: both encoders, one request each; the ragged ones, mixed widths
def infer(http_port, model, input_ids, attention_mask):
    """One KServe HTTP request of INT64 input_ids / attention_mask rows -> (embedding rows, seconds)."""
    rows, width = len(input_ids), len(input_ids[0])
    body = json.dumps({"inputs": [
        {"name": "input_ids", "shape": [rows, width], "datatype": "INT64", "data": [x for r in input_ids for x in r]},
        {"name": "attention_mask", "shape": [rows, width], "datatype": "INT64",
         "data": [x for r in attention_mask for x in r]}], "outputs": [{"name": "embedding"}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/models/{model}/infer", body,
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.load(response)
    elapsed = time.perf_counter() - started
    output = next(o for o in answer["outputs"] if o["name"] == "embedding")
    hidden = output["shape"][1]
    return [output["data"][i * hidden:(i + 1) * hidden] for i in range(output["shape"][0])], elapsed


def sample_batch(vocab, rows=3, width=24, seed=1):
    """Random ids (not the pad id 1, the CLS position 0 included) with each row padded at its end by a different
    amount, so padding masks are part of the comparison."""
    import random

    generator = random.Random(seed)
    lengths = [width - (i * width) // (rows + 1) for i in range(rows)]
    ids = [[0] + [generator.randrange(5, vocab) for _ in range(n - 1)] + [1] * (width - n) for n in lengths]
    return ids, [[1] * n + [0] * (width - n) for n in lengths]


def max_difference(a, b):
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


def model_runs(http_port, model):
    """(requests, rows, runs) `model` has answered: Triton's statistics (GET /v2/models/<model>/stats)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{model}/stats", timeout=30) as response:
        stats = json.load(response)["model_stats"][0]
    return (int(stats["inference_stats"]["success"]["count"]), int(stats["inference_count"]),
            int(stats["execution_count"]))


# The check's requests of mixed widths: every width its own (so any run of two requests or more joined widths), one
# to three rows each, rows padded inside a request by different amounts (sample_batch).
MIXED_WIDTHS = (5, 9, 14, 19, 24, 31, 40, 48, 57, 66, 80, 97)
RAGGED_CHECK_DELAY_US = 200_000  # the check's ragged models wait this long for more requests, so they join


def mixed_requests(vocab):
    return [sample_batch(vocab, rows=1 + i % 3, width=width, seed=10 + i) for i, width in enumerate(MIXED_WIDTHS)]


def all_at_once(http_port, model, requests):
    """Every request of `requests` in its own thread, released together -> their answers, in order."""
    answers, start = [None] * len(requests), threading.Barrier(len(requests))

    def send(i):
        start.wait()
        answers[i] = infer(http_port, model, *requests[i])[0]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(answer is None for answer in answers):
        raise SystemExit(f"bench: {model} failed a request (its server log says why)")
    return answers


def check(args):
    import torch

    shape = encoder_shape(args.tiny)
    work = os.path.abspath(args.work_dir)
    repository = os.path.join(work, "repository")
    shutil.rmtree(repository, ignore_errors=True)
    for encoder in ENCODERS:
        write_encoder(encoder, os.path.join(repository, f"{encoder}_encoder"), shape, args.device, 16384)
        write_encoder(encoder, os.path.join(repository, f"{encoder}_ragged"), shape, args.device, 16384, ragged=True,
                      queue_delay_us=RAGGED_CHECK_DELAY_US)
    extra_args, env = server_options("torchscript", args.pytorch_backend)
    ports = common.free_ports()
    log = os.path.join(work, "tritonserver.log")
    started = time.monotonic()
    server = common.start_server(repository, ports, log, {"RATE_LIMIT": "off", **env}, extra_args, timeout_s=900)
    print(f"[encoders] tritonserver ready in {time.monotonic() - started:.1f} s (log: {log})", flush=True)
    try:
        ids, mask = sample_batch(shape["vocab"])
        answers = {encoder: infer(ports["http"], f"{encoder}_encoder", ids, mask)[0] for encoder in ENCODERS}
        # Ragged: requests of mixed widths, each alone to the padded encoders, then all at once to the ragged ones
        # (the batcher joins them, any widths); each request's rows must come back as the padded encoder answered.
        mixed = mixed_requests(shape["vocab"])
        alone = {encoder: [infer(ports["http"], f"{encoder}_encoder", *request)[0] for request in mixed]
                 for encoder in ENCODERS}
        ragged, ragged_runs = {}, {}
        for encoder in ENCODERS:
            before = model_runs(ports["http"], f"{encoder}_ragged")
            ragged[encoder] = all_at_once(ports["http"], f"{encoder}_ragged", mixed)
            after = model_runs(ports["http"], f"{encoder}_ragged")
            ragged_runs[encoder] = dict(zip(("requests", "rows", "runs"), (b - a for a, b in zip(before, after))))
            print(f"[encoders] {encoder}_ragged: {json.dumps(ragged_runs[encoder])}", flush=True)
        model = stand_in_module().build_encoder(shape, torch_device(args.device))
        with torch.inference_mode():
            dev = next(model.parameters()).device
            local = model(torch.tensor(ids, device=dev), torch.tensor(mask, device=dev)).cpu().tolist()
            local_mixed = [model(torch.tensor(i, device=dev), torch.tensor(m, device=dev)).cpu().tolist()
                           for i, m in mixed]
        del model
        one_ids, one_mask = sample_batch(shape["vocab"], rows=1, width=16, seed=2)
        # One short request at a time: mostly the per-request cost of each path. Both warmed up first (the
        # TorchScript module's first calls are slow), then timed in alternating rounds, so a noisy neighbour on
        # the machine costs both alike.
        times = {encoder: [] for encoder in ENCODERS}
        for encoder in ENCODERS:
            for _ in range(20):
                infer(ports["http"], f"{encoder}_encoder", one_ids, one_mask)
        for _ in range(10):
            for encoder in ENCODERS:
                times[encoder] += [infer(ports["http"], f"{encoder}_encoder", one_ids, one_mask)[1]
                                   for _ in range(max(1, args.requests // 10))]
        latency = {encoder: statistics.median(spent) * 1000 for encoder, spent in times.items()}
    finally:
        common.stop_server(server)

    def mixed_difference(a, b):
        return max(max_difference(x, y) for x, y in zip(a, b))

    tolerance = 2e-3 if args.device == "cuda" else 1e-5  # fp16 on a GPU; fp32 on the CPU
    result = {"device": args.device, "shape": shape, "rows": len(ids), "width": len(ids[0]),
              "torchscript_vs_python": max_difference(answers["torchscript"], answers["python"]),
              "torchscript_vs_in_process": max_difference(answers["torchscript"], local),
              "python_vs_in_process": max_difference(answers["python"], local),
              "ragged": {"requests": len(mixed), "widths": list(MIXED_WIDTHS),
                         "rows": sum(len(i) for i, _ in mixed),
                         **{f"{encoder}_ragged_vs_padded": mixed_difference(ragged[encoder], alone[encoder])
                            for encoder in ENCODERS},
                         **{f"{encoder}_ragged_vs_in_process": mixed_difference(ragged[encoder], local_mixed)
                            for encoder in ENCODERS},
                         "runs": ragged_runs},
              "tolerance": tolerance,
              "median_ms_one_request": latency, "requests": args.requests}
    differences = [result[k] for k in ("torchscript_vs_python", "torchscript_vs_in_process", "python_vs_in_process")]
    differences += [v for k, v in result["ragged"].items() if k.endswith(("_vs_padded", "_vs_in_process"))]
    # the ragged runs must have joined requests (of different widths: each request has its own)
    result["ragged"]["joined"] = all(runs["runs"] < runs["requests"] for runs in ragged_runs.values())
    result["ok"] = all(d <= tolerance for d in differences) and result["ragged"]["joined"]
    with open(os.path.join(work, "check.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps(result, indent=1), flush=True)
    return 0 if result["ok"] else 1


def encoder_shape(tiny):
    """The stand-in's shape (a copy): the tiny one for CPU checks, else bge-m3's."""
    return dict(TINY_SHAPE if tiny else BGE_M3_SHAPE)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny shape (as bench.gpu --tiny) instead of bge-m3's")
    parser.add_argument("--pytorch-backend", help="folder holding libtriton_pytorch.so (default: PYTORCH_BACKEND, "
                                                  "else .triton/pytorch-backend)")
    parser.add_argument("--requests", type=int, default=300, help="one-row requests timed per encoder, in 10 "
                                                                   "alternating rounds (default 300)")
    parser.add_argument("--work-dir", default=os.path.join(PROJECT, "bench", "results", "gpu-encoders"))
    return check(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
