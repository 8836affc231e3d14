"""Issue 59 item 4: SIGTERM to the launcher serving the default export, a cross-encoder and a bge-m3 (keys on) left
`rerank`, `NAME_rerank` and `NAME_bls` UNLOADING for good; tritonserver's exit timed out, their stubs died
("Non-graceful termination", "Fatal Python error") and the launcher said "not clean" after ~70 s.

The cause: a request whose step failed in another thread (a BLS piece, an encoder run) left a reference cycle through
its Future and the error's traceback, holding the request's Python object; the Python backend frees the request's
response factory, which holds its model, only with that object, and an idle stub never runs the cyclic GC. So the
model could never unload (model_common.forget_frames now drops those frames). And the drain said "requests still
running" whenever its wait passed a third of the bound, running or not (readiness.Activity now looks)."""
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import MODEL_PYTHON, PROJECT, build_m3, export, free_port, wait_for_launched_proxy
from local_triton import readiness
from model_library.in_process import import_python_model

pytestmark = pytest.mark.serial  # `make test` runs it alone: drains and stops within their bounds

BOUND_S = 30  # EXIT_TIMEOUT_S's default: the drain's bound, which the launcher's exit must keep


@pytest.fixture(scope="module")
def three_exports(minilm_repository, ce_repository, xlmr_tokenizer_dir, tmp_path_factory):
    """The default MiniLM export, the cross-encoder `xr` and a tiny bge-m3 `m3`, side by side: the first two copied
    from the session's repositories (an export's folders hold all it needs), the bge-m3 exported by name."""
    repository = tmp_path_factory.mktemp("three_exports") / "repository"
    shutil.copytree(minilm_repository, repository)
    with open(os.path.join(ce_repository, "xr", "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    for key in ("name", "tokenizer_model", "encoder_model", "bls_model", "rerank_model"):
        shutil.copytree(os.path.join(ce_repository, manifest[key]), repository / manifest[key])
    m3 = build_m3(tmp_path_factory.mktemp("m3_model"), xlmr_tokenizer_dir)
    export(repository, "--model", str(m3), "--name", "m3", "--max-length", "128")
    return repository


def failing_reranks(grpc_port, seconds=3.0, clients=6):
    """Rerank requests to each rerank model whose error comes back from a BLS piece (an empty document: the
    tokenizer refuses it), several at once as under load: each used to leave its request behind (the cycle above)."""
    import tritonclient.grpc as grpcclient

    documents = np.array([f"document {i} about pandas and bamboo".encode() for i in range(40)] + [b""],
                         dtype=np.object_)
    answers = []

    def client(model):
        connection = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            inputs = [grpcclient.InferInput("query", [1], "BYTES"),
                      grpcclient.InferInput("documents", [len(documents)], "BYTES")]
            inputs[0].set_data_from_numpy(np.array([b"a panda"], dtype=np.object_))
            inputs[1].set_data_from_numpy(documents)
            try:
                connection.infer(model, inputs, client_timeout=30)
                answers.append("answered")
            except Exception as error:  # noqa: BLE001 - what it says is checked below
                answers.append(str(error))
        connection.close()

    threads = [threading.Thread(target=client, args=(model,))
               for model in ("rerank", "xr_rerank", "m3_rerank") for _ in range(clients // 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return answers


def test_sigterm_unloads_every_model_of_three_idle_exports_within_the_bound(three_exports, tmp_path):
    """SIGTERM with three exports loaded, keys on, idle after traffic whose requests failed in a step: every model
    unloads, no stub dies, the launcher says `stopped` and exits 0 within the bound, and the drain does not claim
    that requests are running."""
    ports = [free_port() for _ in range(4)]
    log_path = tmp_path / "launch.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "local_triton.launch", "--model-repository", str(three_exports),
         "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
         "--model-python", MODEL_PYTHON, "--no-restart"],
        cwd=PROJECT, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        env={**os.environ, "PROXY_PORT": str(ports[3]), "PROXY_HOST": "127.0.0.1", "API_KEY": "clean-stop-key",
             "EXIT_TIMEOUT_S": str(BOUND_S)})
    try:
        wait_for_launched_proxy(process, ports[3], log_path)  # the default export is ready
        answers = failing_reranks(ports[1])
        assert answers and all("is empty" in answer for answer in answers), set(answers)
        time.sleep(2.0)  # idle: nothing in flight, no client connected
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=BOUND_S + 60)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = log_path.read_text(errors="replace")
    loaded = set(re.findall(r"successfully loaded '([^']+)'", log))
    unloaded = set(re.findall(r"successfully unloaded '([^']+)'", log))
    print(f"\nSIGTERM with three idle exports: exit {code} after {took:.1f} s (bound {BOUND_S} s); "
          f"{len(unloaded)} of {len(loaded)} models unloaded")
    assert {"rerank", "xr_rerank", "xr_bls", "m3_rerank", "m3_bls"} <= loaded, sorted(loaded)
    assert loaded - unloaded == set(), (sorted(loaded - unloaded), log[-4000:])
    assert "Non-graceful termination" not in log and "Fatal Python error" not in log, log[-4000:]
    assert "requests still running" not in log, log[-4000:]
    assert code == 0 and "launch: stopped\n" in log, log[-4000:]
    assert took < BOUND_S, log[-4000:]


# ---------------------------------------------------------------- the leak, without a server
class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = 3, 14, 13, 1

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class Request:
    """What the models' library reads of a request: its timeout (none) and cancellation."""

    def timeout(self):
        return 0

    def is_cancelled(self):
        return False


@pytest.fixture(scope="module")
def library():
    return import_python_model(os.path.join(PROJECT, "model_library", "model_common.py"), "model_common_clean_stop",
                               TritonError=TritonError,
                               InferenceResponse=lambda output_tensors=None, error=None: error or output_tensors)


@pytest.mark.parametrize("shape", ["rerank pieces", "encoder runs"])
def test_a_request_whose_step_failed_in_another_thread_is_freed_without_the_cyclic_gc(library, shape):
    """The rerank models' pieces (RerankModel.pieces) and a BLS model's encoder runs (futures, then result()): a
    step's error raised in the pool's thread. With the cyclic GC off, as in an idle stub, the request must be gone
    once answer() returns, or its model never unloads."""
    pool = ThreadPoolExecutor(4)

    def step(deadline):  # model_common.call, when the step answers with an error
        deadline.left_us()
        raise library.ModelError("invalid_input", "text[0]", "is empty")

    def work(request):
        deadline = library.Deadline(request)
        if shape == "rerank pieces":
            model = library.RerankModel()
            model.pool = pool
            return model.pieces(lambda i: step(deadline), 3, deadline)
        runs = [pool.submit(step, deadline) for _ in range(3)]
        return [run.result() for run in runs]

    gc.collect()
    gc.disable()
    try:
        request = Request()
        alive = weakref.ref(request)
        error = library.answer(request, work)
        del request
        assert alive() is None, gc.get_referrers(alive())
    finally:
        gc.enable()
        pool.shutdown()
    assert "text[0] is empty" in error.message


# ---------------------------------------------------------------- the drain's words, without a server
class FakeTriton:
    """Triton's statistics: `moving` makes a model finish a request at each read."""

    def __init__(self, moving):
        self.moving, self.done = moving, 0

    def call(self, method, path, timeout=5.0):
        assert (method, path) == ("GET", "/v2/models/stats")
        self.done += 1 if self.moving else 0
        stats = {"name": "embedding", "version": "1", "execution_count": self.done,
                 "inference_stats": {"success": {"count": self.done}, "fail": {"count": 0}}}
        return 200, json.dumps({"model_stats": [stats]}).encode()

    def control(self, action, model, timeout=5.0):
        assert action == "unload"


class FakeServer:
    """A server whose `rerank` stays UNLOADING for `unloading_s` after the drain unloads it."""

    def __init__(self, moving, unloading_s, stop_file):
        self.triton, self.stop_file, self.unloading_s, self.asked = FakeTriton(moving), stop_file, unloading_s, None

    def model_states(self):
        if self.asked is None:
            return {"rerank": {"READY"}}
        return {"rerank": {"UNLOADING" if time.monotonic() - self.asked < self.unloading_s else "UNAVAILABLE"}}

    def poll(self):
        return None


@pytest.mark.parametrize("moving", [False, True])
def test_the_drain_says_requests_run_only_when_some_do(tmp_path, monkeypatch, capsys, moving):
    """Past a third of its bound the drain creates the stop file either way; it says "requests still running"
    only when Triton's statistics move (some request finishes steps), else which models it waits for."""
    server = FakeServer(moving, unloading_s=2.2, stop_file=str(tmp_path / "stopping"))
    monkeypatch.setattr(readiness, "public_tiers", lambda repository: [["rerank"]])
    original_control = server.triton.control

    def control(action, model, timeout=5.0):
        server.asked = time.monotonic()
        return original_control(action, model, timeout)
    server.triton.control = control
    assert readiness.drain(server, str(tmp_path), bound_s=4.5) is True  # stop feeding at 1.5 s
    said = capsys.readouterr().out
    assert os.path.exists(server.stop_file)
    if moving:
        assert "requests still running start no next piece" in said, said
    else:
        assert "requests still running" not in said and "waiting for rerank to unload (no request is running)" \
            in said, said
