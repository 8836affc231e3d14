"""Where one short request's time goes, and where the stubs spend theirs under load.

Three sources, each for what it measures best:
  - Triton's trace API (level TIMESTAMPS, switched on at run time through the restricted trace API): per request,
    when the gRPC frontend, the ensemble, the tokenizer and the encoder start and end each stage. Sequential
    single-query requests (concurrency 1), so nothing queues behind anything else.
  - micro-benchmarks, in this process, of the code the stubs run on the same queries: the tokenizer model's own
    decode / encode / grouping / numpy + tensor building (model.py loaded with a stand-in triton_python_backend_utils
    whose tensors and response sender cost nothing), and onnxruntime's run on the same [1, L] inputs. The trace
    interval minus the micro-benchmarked work is what the Python backend's IPC and the response path cost.
  - py-spy on the tokenizer's and the encoder stand-in's stubs during a saturated queries run: which lines hold them.
The encoder stand-in (local_triton/onnxruntime) is a Python stub; the container's C++ onnxruntime backend runs the
same ONNX in-process, so the rows marked "stand-in" are what the container does not pay.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

from bench import common

TRACED_REQUESTS = 200
WARMUP_REQUESTS = 30
SHORT = {"traced": 30, "warmup": 10, "py_spy_s": 2}  # --short: enough requests for complete traces, briefly


def trace_setting(http, admin_key, **settings):
    body = json.dumps(settings).encode()
    request = urllib.request.Request(f"http://{http}/v2/trace/setting", data=body, method="POST",
                                     headers={"admin-key": admin_key, "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def traced_requests(grpc, texts, count):
    """`count` single-text requests in turn; returns client-side latencies (ms)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc)
    latencies = []
    try:
        for i in range(count):
            tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[texts[i % len(texts)].encode()]], dtype=np.object_))
            started = time.perf_counter()
            client.infer("ensemble", [tensor])
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        client.close()
    return latencies


def read_traces(pattern):
    """{trace id: {"model", "parent", timestamp name: ns}} from Triton's trace files."""
    traces = {}
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="utf-8") as handle:
                entries = json.load(handle)
        except (OSError, ValueError):
            continue  # the file being written
        for entry in entries:
            trace = traces.setdefault(entry["id"], {})
            if "model_name" in entry:
                trace.update(model=entry["model_name"], parent=entry.get("parent_id"))
            for stamp in entry.get("timestamps", []):
                trace[stamp["name"]] = stamp["ns"]
    return traces


SEGMENTS = [  # (key, label, start (model, stamp), end (model, stamp), who pays it in the container)
    ("grpc_in", "gRPC request read → ensemble scheduled", ("ensemble", "GRPC_WAITREAD_END"),
     ("ensemble", "REQUEST_START"), "yes"),
    ("to_tokenizer", "ensemble → tokenizer request", ("ensemble", "REQUEST_START"), ("tokenizer", "REQUEST_START"),
     "yes"),
    ("tokenizer_queue", "tokenizer queue (dynamic batcher delay)", ("tokenizer", "QUEUE_START"),
     ("tokenizer", "COMPUTE_START"), "yes"),
    ("tokenizer_input", "tokenizer: inputs copied to the stub's shared memory", ("tokenizer", "COMPUTE_START"),
     ("tokenizer", "COMPUTE_INPUT_END"), "yes"),
    ("tokenizer_to_encoder", "tokenizer stub: request loaded, execute() up to its send, response IPC, ensemble → "
     "encoder request", ("tokenizer", "COMPUTE_INPUT_END"), ("embedding", "REQUEST_START"), "yes"),
    ("encoder_queue", "encoder queue (waits for the tokenizer's execute to end: rate limiter)",
     ("embedding", "REQUEST_START"), ("embedding", "COMPUTE_START"), "yes"),
    ("encoder_input", "encoder: inputs copied to the stand-in's shared memory", ("embedding", "COMPUTE_START"),
     ("embedding", "COMPUTE_INPUT_END"), "stand-in"),
    ("encoder_to_response", "encoder: stand-in stub + onnxruntime run + response IPC → ensemble response",
     ("embedding", "COMPUTE_INPUT_END"), ("ensemble", "INFER_RESPONSE_COMPLETE"), "partly"),
    ("grpc_out", "ensemble response → gRPC write done", ("ensemble", "INFER_RESPONSE_COMPLETE"),
     ("ensemble", "GRPC_SEND_END"), "yes"),
]


def segment_times(traces):
    """Per traced ensemble request: {segment key: ms}."""
    children = {}
    for trace in traces.values():
        if trace.get("parent") is not None:
            children.setdefault(trace["parent"], {})[trace.get("model")] = trace
    rows = []
    for trace_id, trace in traces.items():
        if trace.get("model") != "ensemble" or trace_id not in children:
            continue
        models = {"ensemble": trace, **children[trace_id]}
        try:
            rows.append({key: (models[end[0]][end[1]] - models[start[0]][start[1]]) / 1e6
                         for key, _, start, end, _ in SEGMENTS})
        except KeyError:
            continue  # a trace cut by the file boundary
    return rows


class Tensor:
    """The stand-in triton_python_backend_utils' Tensor."""

    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


def tokenizer_model(scratch):
    """(the tokenizer model's module, its TritonPythonModel initialized from the scratch repository's config), with a
    stand-in triton_python_backend_utils."""
    module = common.import_python_model(
        os.path.join(scratch, "tokenizer", "1", "model.py"), "tokenizer_under_bench",
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=1, Tensor=Tensor,
        InferenceResponse=lambda output_tensors=None, error=None: output_tensors,
        get_input_tensor_by_name=lambda request, name: request.inputs.get(name))  # None: an optional input
    model = module.TritonPythonModel()
    parameters = {k: {"string_value": v} for k, v in common.config_parameters(scratch, "tokenizer").items()}
    model.initialize({"model_config": json.dumps({"parameters": parameters}),
                      "model_repository": os.path.join(scratch, "tokenizer"), "model_version": "1"})
    return module, model


def tokenizer_micro(scratch, texts):
    """The tokenizer model's own Python work per single-text execute (ms, medians): decode, encode, grouping,
    building the response (numpy + tensor objects), with a stand-in triton_python_backend_utils."""
    module, model = tokenizer_model(scratch)

    class Sender:
        def send(self, response, flags=0):
            pass

    class Request:
        def __init__(self, raw):
            self.inputs = {"text": Tensor("text", np.array([[raw]], dtype=np.object_))}

        def get_response_sender(self):
            return Sender()

        def parameters(self):
            return "{}"

        def requested_output_names(self):
            return []

    timings = {"decode": [], "encode": [], "grouping": [], "response": []}
    for text in texts:
        request = Request(text.encode())
        t0 = time.perf_counter()
        decoded, _, _, _ = model.decode_with_prompt(request, {})
        t1 = time.perf_counter()
        encodings = [model.tokenizer.encode(decoded[0])]
        model.check(encodings, split=False)
        t2 = time.perf_counter()
        lengths = [[len(encodings[0].ids)]]
        groups = module.plan_groups(lengths, model.multiple, model.overhead, model.min_efficiency,
                                    model.max_batch_tokens)
        t3 = time.perf_counter()
        model.send(request, request.requested_output_names(), encodings, None, lengths[0], groups[0][1])
        t4 = time.perf_counter()
        for key, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            timings[key].append(value * 1000)
    return {key: statistics.median(values) for key, values in timings.items()}


def onnxruntime_micro(scratch, manifest, encodings, pad_id):
    """onnxruntime's run on each query alone ([1, L], padded as the tokenizer pads it): median ms."""
    import onnxruntime as ort

    multiple = int(common.config_parameter(scratch, "tokenizer", "pad_to_multiple_of", "1"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = common.encoder_threads(scratch)
    session = ort.InferenceSession(os.path.join(scratch, manifest["onnx"]), options,
                                   providers=["CPUExecutionProvider"])
    times = []
    for i, ids in enumerate(encodings):
        width = -(-len(ids) // multiple) * multiple
        batch = np.full((1, width), pad_id, dtype=np.int64)
        batch[0, :len(ids)] = ids
        mask = (np.arange(width) < len(ids)).astype(np.int64)[None]
        started = time.perf_counter()
        session.run(None, {"input_ids": batch, "attention_mask": mask})
        if i >= 5:  # the first runs warm onnxruntime up
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def stub_pids(server_pid):
    """{model: pid} of the server's Python-backend stubs."""
    pids = {}
    for pid, (_, argv) in common.launch.children(server_pid).items():
        if len(argv) > 1 and argv[0].endswith(b"triton_python_backend_stub"):
            pids[os.path.basename(os.path.dirname(os.path.dirname(argv[1].decode())))] = pid
    return pids


def py_spy_profile(pids, seconds, work_dir):
    """Sample each stub with py-spy while the caller loads the server; returns {model: [(share, frame)]}: the
    innermost frame of the model's own code in each sample, or "waiting (outside Python)" when no Python runs."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return {}
    processes = {}
    for model, pid in pids.items():
        path = os.path.join(work_dir, f"py-spy-{model}.txt")
        processes[model] = (path, subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200", "--format", "raw",
             "--nonblocking", "--output", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return processes


def summarize_py_spy(processes, top=6):
    summary = {}
    for model, (path, process) in processes.items():
        process.wait(timeout=120)
        counts = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    stack, _, n = line.rstrip().rpartition(" ")
                    frames = [f for f in stack.split(";") if f]
                    own = [f for f in frames if "/model_repository/" in f or "/1/model.py" in f or "model.py" in f
                           or "grouping.py" in f]
                    label = own[-1] if own else (frames[-1] if frames else "waiting (outside Python)")
                    counts[label] = counts.get(label, 0) + int(n or 0)
        total = sum(counts.values()) or 1
        summary[model] = [(count / total, label) for label, count in
                          sorted(counts.items(), key=lambda kv: -kv[1])[:top]]
    return summary


def micro_benchmarks(args, scratch, queries):
    """The stubs' work on the same queries, in this process, before the server starts (the machine to itself)."""
    count = SHORT["traced"] if args.short else TRACED_REQUESTS
    texts = [t["text"] for t in queries["texts"]][:count]
    with open(os.path.join(scratch, "ensemble", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    with open(os.path.join(scratch, "tokenizer", "1", "tokenizer.json"), encoding="utf-8") as handle:
        pad_id = json.load(handle)["padding"]["pad_id"]
    micro = tokenizer_micro(scratch, texts)
    micro["onnxruntime"] = onnxruntime_micro(scratch, manifest, queries["encodings"][:count], pad_id)
    return micro


def measure(args, ports, server_pid, queries, micro, admin_key, progress):
    """Step 6 of bench/run.py: the breakdown of one short request (with `micro` from micro_benchmarks), and py-spy
    under load. Returns a dict for the report, or None when tracing is unavailable."""
    http, grpc = f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}"
    texts = [t["text"] for t in queries["texts"]]
    count = SHORT["traced"] if args.short else TRACED_REQUESTS
    trace_dir = os.path.join(args.work_dir, "trace")  # the server's --trace-config file (bench/run.py)
    progress(f"breakdown: {count} single queries in turn, traced (Triton trace API, TIMESTAMPS)")
    traced_requests(grpc, texts, SHORT["warmup"] if args.short else WARMUP_REQUESTS)
    try:
        trace_setting(http, admin_key, trace_level=["TIMESTAMPS"], trace_rate="1", trace_count=str(count + 10),
                      log_frequency="10")
    except OSError as error:
        progress(f"breakdown: the trace API refused ({error}); left out")
        return None
    latencies = traced_requests(grpc, texts, count)
    trace_setting(http, admin_key, trace_level=["OFF"])
    time.sleep(1.0)
    rows = segment_times(read_traces(os.path.join(trace_dir, "trace.json*")))
    if not rows:
        progress("breakdown: no complete trace was written; left out")
        return None
    traced = {key: statistics.median(r[key] for r in rows) for key, *_ in SEGMENTS}
    result = {"requests": len(rows), "client_p50_ms": statistics.median(latencies), "traced": traced,
              "micro": micro, "segments": [(key, label, paid) for key, label, _, _, paid in SEGMENTS]}
    progress(f"breakdown: client p50 {result['client_p50_ms']:.2f} ms over {len(rows)} traced requests")
    # py-spy during a saturated queries run
    from bench import loadgen

    pids = {m: p for m, p in stub_pids(server_pid).items() if m in ("tokenizer", "embedding")}
    seconds = SHORT["py_spy_s"] if args.short else 10
    progress(f"breakdown: py-spy on {', '.join(pids)} for {seconds} s under queries at concurrency 64")
    processes = py_spy_profile(pids, seconds, args.work_dir)
    # windows of 64 x `seconds` responses: at the 100-200 queries/s of 2 cores, the load outlasts py-spy's sampling
    # (short: 3 time windows, as long as the sampling)
    loadgen.perf_analyzer("ensemble", grpc, queries["perf_data"], 64,
                          os.path.join(args.work_dir, "data", "py-spy.csv"), 64 * seconds, 3,
                          os.path.join(args.work_dir, "loadgen.log"), stability=1000,
                          window_ms=1000 * seconds / 3 if args.short else None)
    result["py_spy"] = summarize_py_spy(processes)
    loadgen.drain(http, f"127.0.0.1:{ports['metrics']}")
    return result
