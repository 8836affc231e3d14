"""What the bench scripts share: free ports, the export to measure and its scratch copy, the tritonserver they
start, and the configs' parameters. Imports nothing from the other bench modules, so any of them may import it."""
import glob
import json
import lzma
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

from exporter import pbtxt
from exporter.repository import refresh_code, templates_digest
from local_triton import launch
from local_triton.settings import SERVING_REPOSITORY
from model_library.in_process import import_python_model  # noqa: F401 (bench's scripts call common.import_python_model)

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RESULTS = os.path.join(PROJECT, "bench", "results")
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
EXPORTED_MODELS = ("tokenizer", "embedding", "ensemble", "ensemble_bls", "rerank", "late_chunking", "proxy",
                   "supervisor")


XLMR_TOKENIZER = os.path.join(PROJECT, "tests", "fixtures", "xlmr-tokenizer")  # bge-m3's (README.md there)


def write_xlmr_tokenizer(folder):
    """tests/fixtures/xlmr-tokenizer into `folder`, its tokenizer.json decompressed: the tokenizer of the XLM-R
    checkpoints the bench builds (random weights, no network)."""
    with lzma.open(os.path.join(XLMR_TOKENIZER, "tokenizer.json.xz")) as packed, \
            open(os.path.join(folder, "tokenizer.json"), "wb") as out:
        shutil.copyfileobj(packed, out)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(XLMR_TOKENIZER, name), os.path.join(folder, name))


# ---------------------------------------------------------------- ports
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports():
    """Ports for one server: never the defaults, which another server on this machine may hold."""
    return {name: free_port() for name in ("http", "grpc", "metrics", "proxy")}


# ---------------------------------------------------------------- the export and its scratch copy
def run_export(model, repository, *options, who="bench"):
    """build/export.py in a subprocess (as a user runs it); SystemExit with its output when it fails."""
    command = [sys.executable, os.path.join(PROJECT, "build", "export.py"), "--model", model,
               "--repository", repository, *options]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{who}: export failed:\n{result.stdout}\n{result.stderr}")


def find_export(repository=None, progress=print):
    """The repository to benchmark, and whether it is the bench-owned one: `repository`, else the serving repository
    (model_repository/) if it holds an export, else all-MiniLM-L6-v2 exported into bench/results/repository."""
    if repository:
        if not glob.glob(os.path.join(repository, "*", "1", "export.json")):
            raise SystemExit(f"bench: {repository} holds no export (*/1/export.json)")
        return check_current(os.path.abspath(repository)), False
    if os.path.exists(os.path.join(SERVING_REPOSITORY, "ensemble", "1", "export.json")):
        return check_current(SERVING_REPOSITORY), False
    owned = os.path.join(RESULTS, "repository")
    progress(f"no export in model_repository/: exporting {DEFAULT_MODEL} into {os.path.relpath(owned, PROJECT)}")
    run_export(DEFAULT_MODEL, owned, "--skip-if-exported")
    return owned, True


def check_current(repository):
    """`repository`, unless an export in it was rendered from other config templates or another token_budget.c
    than this checkout's (export.json's digest): it would measure code that is no longer the project's."""
    current = templates_digest()
    for path in sorted(glob.glob(os.path.join(repository, "*", "1", "export.json"))):
        with open(path, encoding="utf-8") as handle:
            if json.load(handle).get("templates") != current:
                raise SystemExit(f"bench: {os.path.relpath(path, PROJECT)} was made from other config templates or "
                                 f"another token_budget.c than this checkout's: export again (`make export`, or "
                                 f"`make serve`, which redoes a stale export) before measuring it")
    return repository


def copy_model(source, target, *ignore):
    """A model folder, without bytecode (and without `ignore` patterns)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", *ignore))


def copy_models(source, target, models=EXPORTED_MODELS):
    """A fresh `target` with those of `models` that `source` holds."""
    shutil.rmtree(target, ignore_errors=True)
    for model in models:
        if os.path.exists(os.path.join(source, model)):
            copy_model(os.path.join(source, model), os.path.join(target, model))


def scratch_repository(source, target, models=EXPORTED_MODELS):
    """A copy of the export at `source` with the checkout's current model code and configs (refresh_code, as export
    installs them: code changes are measured)."""
    copy_models(source, target, models)
    refresh_code(target)
    return target


# ---------------------------------------------------------------- configs
def config_parameter(repository, model, key, default=None):
    """One `parameters` entry of MODEL/config.pbtxt (exporter/pbtxt.py reads it)."""
    return pbtxt.parameter(os.path.join(repository, model, "config.pbtxt"), key, default)


def config_parameters(repository, model):
    """Every `parameters` entry of MODEL/config.pbtxt: {key: string_value}."""
    return pbtxt.parameters(pbtxt.read(os.path.join(repository, model, "config.pbtxt")))


def encoder_threads(repository):
    """The encoder's intra-op threads (0: onnxruntime's default, all cores)."""
    return int(config_parameter(repository, "embedding", "intra_op_thread_count", "0") or 0)


# ---------------------------------------------------------------- the server
def start_server(repository, ports, log_path, env=None, extra_args=(), timeout_s=300):
    """tritonserver (local_triton/launch.py) on `repository`, ready; the proxy on ports["proxy"]. When it does not
    get ready it is stopped and SystemExit carries its log's tail."""
    env = {"PROXY_PORT": str(ports["proxy"]), **(env or {})}
    with open(log_path, "w", encoding="utf-8") as log_file:
        server = launch.start(repository, ports["http"], ports["grpc"], ports["metrics"], extra_args=list(extra_args),
                              log_file=log_file, extra_env=env)
    try:
        launch.wait_ready(server, ports["http"], timeout_s=timeout_s)
    except Exception:
        launch.stop(server)
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            raise SystemExit("bench: tritonserver did not start:\n" + handle.read()[-4000:]) from None
    return server


def stop_server(server, drain=True):
    """SIGTERM: Triton finishes what is in flight and unloads every model (seconds). drain=False, a smoke run's stop:
    killed at once with its stubs, then what they leave (their /dev/shm regions) removed; nothing is measured after
    a smoke's last reading, so its drain would only cost seconds per server."""
    if drain:
        launch.stop(server)
        return
    if server.poll() is None:
        server.note_regions()  # every stub's region (their argv names them), read while they live
        server.kill()
    server.cleanup()


def wait_for_proxy(port, timeout_s=60):
    """The proxy answers /health once its own startup is done, after Triton's readiness."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


# ---------------------------------------------------------------- answers
def error_of(content):
    """(code, message) of an error body in any dialect's shape: OpenAI's and Cohere's {"error": {code, message}},
    TEI's {error, error_type, code}; ("", the body's start) when it is not JSON."""
    try:
        body = json.loads(content)
    except (ValueError, TypeError):
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
        return "", text[:200]
    if not isinstance(body, dict):
        return "", str(body)[:200]
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or ""), str(error.get("message") or body.get("message")
                                                                       or "")
    return str(body.get("code") or body.get("error_type") or ""), str(error or body.get("message") or "")


# ---------------------------------------------------------------- the machine, for the reports
def machine_info():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            memory = f"{int(handle.readline().split()[1]) / 1024 ** 2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    gpu = ""
    if shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True)
        gpu = result.stdout.strip().replace("\n", "; ")
    os_name = platform.platform()
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"') + f" ({platform.release()})"
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": memory, "gpu": gpu or "none", "os": os_name}


def put_section(block, heading, path=None):
    """`block` (a markdown section starting with `heading`) in place of that section of an existing benchmarks.md
    (default docs/), or inserted before the ceiling sweeps when it has none. Returns the path."""
    path = path or os.path.join(PROJECT, "docs", "benchmarks.md")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + block + (text[end + 1:] if end >= 0 else "")
    else:
        anchor = text.find("## onnxruntime ceiling sweeps")
        anchor = anchor if anchor >= 0 else len(text)
        text = text[:anchor] + block + "\n" + text[anchor:]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
