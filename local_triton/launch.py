"""Start tritonserver 2.48.0 (= nvcr.io/nvidia/tritonserver:24.07-py3) on the model repository, with the project's
flags, and stop it cleanly on Ctrl-C / SIGTERM.

    python -m local_triton.launch --model-repository model_repository          # what `make serve` runs
    python -m local_triton.launch --model-repository /models                   # the image's CMD

Two places, one set of flags: in the tritonserver container it runs the image's own server and backends; on a
machine without Docker it runs the server from the nvidia-pytriton==0.5.10 wheel, with a backend directory
assembled outside model_repository/: the wheel's Python backend, and for `backend: "onnxruntime"` either Triton's
own C++ backend (ONNXRUNTIME_BACKEND: a folder holding libtriton_onnxruntime.so, as `make onnxruntime-backend`
builds it) or, since the wheel has none, the stand-in in local_triton/onnxruntime/.

Settings (environment variables; docs/reference.md's "Security" and "Deploying" sections explain them):
  TRITON_ADDRESS          address of Triton's HTTP/gRPC ports (default 127.0.0.1: closed to other hosts)
  TRITON_METRICS_ADDRESS  address of the metrics port (default: TRITON_ADDRESS)
  ADMIN_API_KEY(_FILE)    key for Triton's restricted APIs (repository, shared memory, trace, logging); unset: a
                          random key, so nobody can call them
  API_KEY, ADMIN_API_KEY  plain values reach tritonserver (and its stubs) only as *_FILE files: keys_to_files
  MODEL_CONTROL           explicit (default: models load and unload at run time) or none
  LOAD_MODELS             models to load at start in explicit mode, comma-separated (default *: all, but the
                          default export's folders while they hold no export: every_model); an export's
                          ensemble brings its BLS and rerank models
  RATE_LIMIT              on (default; see model_source/tokenizer/config.pbtxt) or off
  MODEL_CONFIG_NAME       Triton's --model-config-name: models with configs/<name>.pbtxt load it (e.g. gpu)
  EXIT_TIMEOUT_S          the bound of the drain at SIGTERM (see drain()), and of Triton's own wait for
                          in-flight requests after it (default 30)
  ONNXRUNTIME_BACKEND     outside the container: a folder holding Triton's libtriton_onnxruntime.so (and the
                          libonnxruntime it links, beside it); unset: the stand-in (onnxruntime_backend())
  MALLOC                  jemalloc (default: preloaded where the encoders run in tritonserver's process and it is
                          installed; preload_allocator) or system

Dead Python stubs are the supervisor model's (model_source/supervisor, which works the same without the
launcher). The launcher restarts tritonserver when the supervisor asks (SIGUSR1, to the pid in the server's
TRITON_LAUNCHER_PID: it kills the server at once, where a SIGTERM would wait the exit timeout for calls a dead stub
never answers) and when tritonserver exits on its own (--no-restart: exit instead); a restart that fails is tried
again with backoff, for ever (the first start's failure is a configuration error: it exits). A server with a dead
stub would only stop at its exit timeout (Server.has_dead_stub): a stop gives it DEAD_STUB_GRACE_S for the requests
in flight, then kills it.

tritonserver never outlives the launcher: it dies with it (die_with_this_process: PR_SET_PDEATHSIG), and the
Watchdog kills its whole process group (its stubs, the proxy's port) when the launcher ends without stopping it
(kill -9, the OOM killer). SIGTERM / Ctrl-C still drain. A first start whose ports are taken (server_ports) starts
nothing: one line names each port, its role and its holder (local_triton/ports.py), and the launcher exits 1.

This module is the entry point and main()'s loop; the launcher's parts live beside it, one concern each:
  settings.py       the settings above, and the keys as files (keys_to_files)
  backends.py       where tritonserver and its backends come from: the backends folder, the onnxruntime backend
                    chosen (onnxruntime_backend()), its links, the server's environment, the allocator preloaded
  server.py         tritonserver's command line (the flags, the models it loads: every_model) and its start
  process_group.py  the server as a process group: Server, die_with_this_process, the Watchdog, stop()
  readiness.py      wait_ready() after a start, drain() at SIGTERM
  ports.py          which ports the server binds (server_ports) and who holds a taken one
  watchdog.py       the Watchdog's own process
The names tests and the bench call (start, wait_ready, stop, children, server_command...) are importable from here.
"""
import argparse
import atexit
import os
import signal
import sys
import time

from . import ports
from .backends import describe_onnxruntime_backend, onnxruntime_backend, python_version
from .ports import server_ports
from .process_group import DEAD_STUB_GRACE_S, Server, Watchdog, children, stop
from .readiness import drain, wait_ready
from .server import server_command, start
from .settings import SERVING_REPOSITORY, setting

# What callers outside the launcher use (tests, bench), each defined in its concern's module.
__all__ = ["DEAD_STUB_GRACE_S", "Server", "children", "describe_onnxruntime_backend", "main", "onnxruntime_backend",
           "python_version", "server_command", "server_ports", "setting", "start", "stop", "wait_ready"]

RESTART_GRACE_S = 1.0  # a restart the supervisor asked for: time for the proxy's 503 answers to go out first
RETRY_MAX_S = 30.0  # a failed restart is tried again after 2, 4, 8... s, at most this long


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", default=SERVING_REPOSITORY)
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("--model-python", default=sys.executable,
                        help="the Python whose venv runs the Python models (default: this one)")
    parser.add_argument("--no-restart", action="store_true",
                        help="exit when tritonserver exits on its own, instead of starting it again")
    parser.add_argument("extra", nargs="*", help="further tritonserver arguments (after --)")
    args = parser.parse_args(argv)
    # Ports first: a tritonserver started on a taken port dies on its bind after loading every model (or, the proxy's
    # port, serves without the proxy), and an orphan server's readiness would answer for ours meanwhile.
    listed = server_ports(args.model_repository, args.http_port, args.grpc_port, args.metrics_port, args.extra)
    taken = ports.taken_line(listed)
    if taken:
        raise SystemExit(taken)
    watchdog = Watchdog()
    try:
        return serve(args, listed, watchdog)
    finally:
        watchdog.close()


def serve(args, listed, watchdog):
    """main()'s loop: start, restart, drain and stop tritonserver; the watchdog is armed while a server runs."""
    stopping = []
    server = None

    def on_signal(signum, _frame):
        # Only note it (or forward it): waiting here deadlocks when the signal interrupts the main thread's wait(),
        # which holds Popen's non-reentrant wait lock. The loop below drains, stops and escalates. Before the server
        # is ready (nothing admitted yet) and at a second signal, tritonserver is stopped at once.
        if server is not None and server.process.poll() is None and (not serving or stopping):
            print(f"\nlaunch: signal {signum}, stopping tritonserver now", flush=True)
            server.process.send_signal(signal.SIGTERM)
        elif not stopping:
            print(f"\nlaunch: signal {signum}: draining (new work refused, admitted work finishes), then stopping",
                  flush=True)
        stopping.append(time.monotonic())

    restart = []

    def on_restart(_signum, _frame):
        # The supervisor model found a dead stub it cannot recover from in place (model_source/supervisor); a
        # SIGTERM would make Triton wait its whole exit timeout for the calls the dead stub never answers.
        restart.append((time.monotonic(), "the supervisor asked (a dead stub)"))

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_restart)
    # Each server's key files go with it (Server.cleanup); these are the current one's, whatever ends the launcher.
    atexit.register(lambda: server is not None and server.remove_keys())
    exit_timeout_s = int(setting("EXIT_TIMEOUT_S", "30"))
    started, failures, serving = False, 0, []
    while True:
        # The supervisor asks for a restart (SIGUSR1) only when the launcher named itself to the server.
        server = start(args.model_repository, args.http_port, args.grpc_port, args.metrics_port, args.extra,
                       python=args.model_python, extra_env={"TRITON_LAUNCHER_PID": str(os.getpid())})
        watchdog.arm(server)
        try:
            wait_ready(server, args.http_port)
            print(f"launch: tritonserver ready: HTTP {args.http_port}, gRPC {args.grpc_port}, "
                  f"metrics {args.metrics_port} on {setting('TRITON_ADDRESS', '127.0.0.1')}; onnxruntime models "
                  f"served by {describe_onnxruntime_backend()}", flush=True)
            started, failures, serving[:] = True, 0, [True]
        except (RuntimeError, TimeoutError) as error:
            if stopping:
                pass
            elif not started:  # the first start: a configuration to fix, not a fault to outlast
                stop(server)
                watchdog.disarm()
                # A port taken since the check ("Address already in use" in Triton's log): named, with its owner.
                raise SystemExit(ports.taken_line(listed) or f"launch: {error}") from None
            else:  # a restart failed (/dev/shm full, a port still taken...): try again, never give up
                stop(server)
                watchdog.disarm()
                failures += 1
                backoff = min(RETRY_MAX_S, 2.0 ** failures)
                found = ports.taken(listed)
                error = f"{error}; {ports.describe(found)}" if found else error
                print(f"launch: restart failed ({error}); trying again in {backoff:.0f} s", flush=True)
                deadline = time.monotonic() + backoff
                while not stopping and time.monotonic() < deadline:
                    time.sleep(0.2)
                if stopping:
                    return 1
                continue
        checked, dead, drained, terminated = time.monotonic(), False, None, False
        while server.poll() is None:
            now = time.monotonic()
            if stopping and serving and not terminated:
                if len(stopping) == 1 and not dead:  # (a dead stub's calls never finish: no drain)
                    drained = drain(server, args.model_repository, exit_timeout_s, lambda: len(stopping) > 1)
                if server.poll() is None:
                    server.process.send_signal(signal.SIGTERM)
                terminated, stopping[0] = True, time.monotonic()  # the escalation below counts from this SIGTERM
                continue
            # SIGTERM ignored: kill it, as stop() does (after a drain: nothing is left in flight, only unloads); a
            # dead stub: see has_dead_stub; a restart was asked for: the calls on the dead stub never finish
            grace = DEAD_STUB_GRACE_S if dead else 30 if drained else exit_timeout_s + 30
            if (stopping and now - stopping[0] > grace) or \
                    (restart and now - restart[0][0] > RESTART_GRACE_S):
                server.kill()
            elif not stopping and not restart and now - checked > 1.0:  # own clock: poll() refreshes server.noted
                checked = now
                dead = server.has_dead_stub()  # as it was before a stop began
            time.sleep(0.2)
        server.cleanup()
        watchdog.disarm()
        serving.clear()
        if stopping:  # clean: everything admitted finished (the drain) and tritonserver exited 0
            clean = drained is not False and server.returncode == 0
            detail = "" if clean else f" (not clean: admitted work was cut, or tritonserver exited {server.returncode})"
            print(f"launch: stopped{detail}", flush=True)
            return 0 if clean else 1
        if args.no_restart and not restart:
            return server.returncode
        why = restart[0][1] if restart else f"it exited by itself (code {server.returncode})"
        print(f"launch: starting tritonserver again: {why}", flush=True)
        restart.clear()


if __name__ == "__main__":
    sys.exit(main())
