"""Run the real tritonserver 2.48.0 (the one in nvcr.io/nvidia/tritonserver:24.07-py3) without Docker.

The binary, its Python backend and the Python backend stubs come from the nvidia-pytriton==0.5.10
wheel. This module assembles a backend directory outside model_repository/ (Python backend + the
onnxruntime stand-in in local_triton/onnxruntime/), sets the environment the stub needs, starts the
server, waits until it is ready and stops it cleanly on Ctrl-C / SIGTERM.

    python -m local_triton.launch --model-repository model_repository --http-port 8000
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)
BACKEND_DIR = os.path.join(PROJECT, ".triton", "backends")


def _pytriton_root():
    import pytriton  # the wheel that carries tritonserver; imported only to locate it

    return os.path.dirname(os.path.abspath(pytriton.__file__))


def prepare_backends(backend_dir=BACKEND_DIR):
    """Lay out <backend_dir>/python (wheel's backend + stub for this interpreter) and onnxruntime/."""
    root = _pytriton_root()
    python_dir = os.path.join(backend_dir, "python")
    os.makedirs(python_dir, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": os.path.join(root, "tritonserver", "backends", "python", "libtriton_python.so"),
        "triton_python_backend_utils.py": os.path.join(
            root, "tritonserver", "backends", "python", "triton_python_backend_utils.py"),
        "triton_python_backend_stub": os.path.join(
            root, "tritonserver", "python_backend_stubs", version, "triton_python_backend_stub"),
    }
    for name, source in sources.items():
        if not os.path.exists(source):
            raise SystemExit(f"{source} is missing: is nvidia-pytriton==0.5.10 installed for Python {version}?")
        target = os.path.join(python_dir, name)
        if not os.path.exists(target) or os.path.getmtime(target) < os.path.getmtime(source):
            shutil.copy2(source, target)
    ort_dir = os.path.join(backend_dir, "onnxruntime")
    os.makedirs(ort_dir, exist_ok=True)
    shutil.copy2(os.path.join(HERE, "onnxruntime", "model.py"), os.path.join(ort_dir, "model.py"))
    return backend_dir


def server_env():
    """Environment for tritonserver: the wheel's bundled libraries; this interpreter's own libpython, which the
    stub links (the loader would otherwise pick the system one, another patch release whose symbols the venv's
    extension modules, `_ssl` among them, do not all find); and this venv first on PATH (the stub finds its
    site-packages through the `python3` on PATH)."""
    root = _pytriton_root()
    env = dict(os.environ)
    libs = [os.path.join(os.path.dirname(root), "nvidia_pytriton.libs")]
    libdir, libpython = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and libpython and os.path.exists(os.path.join(libdir, libpython)):
        libs.append(libdir)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (*libs, env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join((os.path.dirname(sys.executable), env.get("PATH", "")))
    return env


def server_command(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=()):
    binary = os.path.join(_pytriton_root(), "tritonserver", "bin", "tritonserver")
    return [
        binary,
        f"--model-repository={os.path.abspath(model_repository)}",
        f"--backend-directory={prepare_backends()}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--allow-cpu-metrics=true",
        "--exit-timeout-secs=20",
        # Honour the configs' rate_limiter sections (ignored without it): the tokenizer runs only while the CPU
        # encoder has nothing to do, so one tokenizer execute sees many requests to group by length.
        "--rate-limit=execution_count",
        *extra_args,
    ]


def start(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(), log_file=None,
          extra_env=None):
    env = server_env()
    env.update(extra_env or {})
    return subprocess.Popen(
        server_command(model_repository, http_port, grpc_port, metrics_port, extra_args),
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT if log_file else None,
        start_new_session=True,  # our signal handling decides when it stops
    )


def wait_ready(process, http_port, timeout_s=300.0):
    """Block until /v2/health/ready answers 200; raise if the server exits or the time runs out."""
    url = f"http://127.0.0.1:{http_port}/v2/health/ready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"tritonserver not ready on port {http_port} after {timeout_s:.0f} s")


def stop(process, timeout_s=30.0):
    """SIGTERM (Triton unloads models and finalizes stubs), then SIGKILL if it hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", default=os.path.join(PROJECT, "model_repository"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("extra", nargs="*", help="further tritonserver arguments (after --)")
    args = parser.parse_args(argv)

    process = start(args.model_repository, args.http_port, args.grpc_port, args.metrics_port, args.extra)
    stopping = []

    def on_signal(signum, _frame):
        # Only forward the signal: waiting here (stop()) deadlocks when the signal interrupts the main thread's
        # process.wait(), which holds Popen's non-reentrant wait lock. The loop below waits and escalates.
        if not stopping and process.poll() is None:
            print(f"\nlaunch: signal {signum}, stopping tritonserver", flush=True)
            process.send_signal(signal.SIGTERM)
        stopping.append(time.monotonic())

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        wait_ready(process, args.http_port)
        print(f"launch: tritonserver ready: HTTP {args.http_port}, gRPC {args.grpc_port}, "
              f"metrics {args.metrics_port}", flush=True)
    except (RuntimeError, TimeoutError) as error:
        if not stopping:
            stop(process)
            raise SystemExit(f"launch: {error}")
    while process.poll() is None:
        if stopping and time.monotonic() - stopping[0] > 30:  # SIGTERM ignored: kill it, as stop() does
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        time.sleep(0.2)
    return 0 if stopping else process.returncode


if __name__ == "__main__":
    sys.exit(main())
