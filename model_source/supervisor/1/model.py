"""The supervisor: finds Python stubs that died and recovers them, in the same way with or without the launcher.

Triton 24.07's Python backend neither notices nor restarts a dead stub (python_backend r24.07 has no health check
on its execute path): requests to it hang and every readiness endpoint stays 200. This model's thread looks at
tritonserver's child processes every `interval_s` (a stub's first argument is its model's file, so a zombie names
its model) and, for a stub that died while its model is READY:
- reloads that model through Triton's repository API (fresh stubs, a few seconds), then the BLS models that were
  waiting on it (an export's BLS model calls its tokenizer and encoder, its rerank model the BLS model: their calls
  to the dead stub never return, so their instances stay blocked for good);
- restarts tritonserver instead when a reload cannot help: the rate limiter is on (a stub that died mid-execute
  keeps its resource for good, so nothing can run again), MODEL_CONTROL is not explicit, the dead stub is a BLS
  caller's (the proxy, an export's BLS or rerank model: tritonserver 2.48 aborts, "terminate called without an
  active exception", in one reload of such a model in three, and did in tests/test_faults.py), the reload failed, or
  the proxy says it is not live (its own BLS threads stranded on dead stubs, GET /health/live).
A restart is a SIGUSR1 to the launcher (TRITON_LAUNCHER_PID, when it is tritonserver's parent), which kills the
server and starts a new one at once; without the launcher a SIGTERM to tritonserver, which then exits after its
exit timeout, and the orchestrator starts the container again.

A hung stub counts as a dead one: it is killed (SIGKILL), and the round after recovers it as above. Hung is a stub
stopped (state T: SIGSTOP, a debugger) for `stopped_s`, or a model whose requests wait (Triton's metric
nv_inference_pending_request_count > 0) while it completes no execution (nv_inference_exec_count) for
`hang_timeout_s` of time the server was idle (while tritonserver and its stubs use a fifth of a core or more and no
model completes anything, one long execution runs: the clock stops); of several such models at once, those that make no
BLS calls go first (their callers only wait).

Stubs that exit cleanly (code 0: an unload) and models that are not READY (loading, unloading, failed to load) are
left to Triton. Everything goes through Triton's HTTP frontend, whose address and admin key are on tritonserver's
command line, not through pb_utils (whose model calls hold the GIL for their round trip and, in 24.07, corrupt the
stub's shared memory now and then).
"""
import glob
import json
import os
import re
import signal
import sys
import threading
import time

import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library.triton_server import TritonHttp, process_info, process_table, server_flags

STUB = b"triton_python_backend_stub"
SETTINGS = {"interval_s": "SUPERVISOR_INTERVAL_S", "recovery_timeout_s": "SUPERVISOR_RECOVERY_TIMEOUT_S",
            "stopped_s": "SUPERVISOR_STOPPED_S", "hang_timeout_s": "SUPERVISOR_HANG_TIMEOUT_S"}
METRIC = re.compile(r'^(nv_inference_pending_request_count|nv_inference_exec_count)\{[^}]*model="([^"]+)"[^}]*\} '
                    r'([0-9.e+]+)$', re.M)


def log(message):
    print(f"supervisor: {message}", flush=True)


def stubs(parent):
    """{pid: (state, exit code, the file it serves)} of the Python stubs whose parent is `parent` (the file is None
    once it is a zombie: its command line is gone)."""
    found = {}
    for pid, info in process_table(lambda info: info.ppid == parent).items():
        argv = info.argv
        if info.state == "Z" or (argv[0].endswith(STUB) and len(argv) > 1):
            found[pid] = (info.state, info.exit_code, argv[1].decode(errors="replace") if len(argv) > 1 else None)
    return found


def triton_client(flags):
    """The client of the server whose flags these are: its HTTP address, and the repository API's key header."""
    headers = {}
    apis, _, header = flags.get("http-restricted-api", "").partition(":")
    if "model-repository" in apis.split(","):
        name, _, key = header.partition("=")
        headers[name] = key
    return TritonHttp(flags.get("http-address", "0.0.0.0"), flags.get("http-port", "8000"), headers)


def model_work(triton, metrics_port):
    """{model: (requests waiting, executions completed)} from Triton's metrics; {} when they are off."""
    answer = triton.call("GET", "/metrics", port=metrics_port, timeout=2.0) if metrics_port else None
    if answer is None or answer[0] != 200:
        return {}
    work = {}
    for name, model, value in METRIC.findall(answer[1].decode(errors="replace")):
        pending, executions = work.get(model, (0.0, 0.0))  # (summed over the model's versions)
        work[model] = (pending + float(value), executions) if name == "nv_inference_pending_request_count" \
            else (pending, executions + float(value))
    return work


BUSY_CORES = 0.2  # the server's CPU use (cores) that makes a wait with nothing completed a long execution: an
# idle server uses a few hundredths; a long run on 2 cores shared with other work got about half a core


def server_cpu_s(server, own=None):
    """CPU seconds tritonserver and its live stubs (but `own`, the supervisor's) have used. A long execution uses
    them (the C++ onnxruntime backend in tritonserver's process, the Python stand-in in its stub); a hang does not."""
    total = 0.0
    for pid, info in process_table(lambda info: info.ppid == server and info.state != "Z", argv=False).items():
        total += info.cpu_s if pid != own else 0.0
    try:
        return total + process_info(server).cpu_s
    except OSError:
        return total


class HangClock:
    """When each model last made progress: a model hangs when requests wait for it and it completes no execution
    for `timeout_s` of time the server was idle. The clock stops while the server uses BUSY_CORES or more and no
    model completes an execution: one long execution is running (issue 72: one 8,000-token text on 2 cores holds the
    rate limiter every model shares, so every other model's requests wait and nothing completes for minutes)."""

    def __init__(self, timeout_s):
        self.timeout_s, self.last = timeout_s, {}  # model -> (executions, when they last changed or nothing waited)
        self.updated = None
        self.waiting_since = {}  # model -> when its requests began to wait with nothing completed (wall time)
        self.long_waits = []  # models the last update found waiting timeout_s or more, the server busy (logged once)

    def update(self, work, now, cores=0.0):
        """Models hung now. `work`: model_work(); `cores`: the server's CPU use since the last update."""
        elapsed, self.updated = (0.0 if self.updated is None else now - self.updated), now
        completed = any(model in self.last and self.last[model][0] != executions
                        for model, (_, executions) in work.items())
        busy = cores >= BUSY_CORES and not completed
        hung, self.long_waits = [], []
        for model, (pending, executions) in work.items():
            seen = self.last.get(model)
            if seen is None or pending == 0 or executions != seen[0]:
                self.last[model] = (executions, now)
                self.waiting_since.pop(model, None)
                continue
            since = self.waiting_since.setdefault(model, seen[1])
            if busy:  # its wait does not count: the clock moves on with now
                self.last[model] = (executions, seen[1] + elapsed)
                if now - since >= self.timeout_s and now - elapsed - since < self.timeout_s:
                    self.long_waits.append(model)  # crossed timeout_s of waiting at this update
            elif now - seen[1] >= self.timeout_s:
                hung.append(model)
        return hung

    def reset(self, now):
        self.last = {model: (executions, now) for model, (executions, _) in self.last.items()}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.settings = {name: float(os.environ.get(variable) or config["parameters"][name]["string_value"])
                         for name, variable in SETTINGS.items()}
        self.repository = os.path.realpath(os.path.dirname(os.path.abspath(args["model_repository"])))
        self.server = os.getppid()
        flags = server_flags(self.server)
        self.triton = triton_client(flags)
        self.reloads_allowed = flags.get("model-control-mode") == "explicit" and \
            flags.get("rate-limit") != "execution_count"
        self.models = {}  # stub pid -> model, learnt while the stub lives (a zombie's command line is gone)
        self.handled = set()
        self.proxy_not_live = 0  # rounds in a row the proxy said it is not live
        self.metrics_port = 0 if flags.get("allow-metrics") == "false" else int(flags.get("metrics-port") or 8002)
        self.stopped_since = {}  # stub pid -> when it was first seen stopped
        self.progress = HangClock(self.settings["hang_timeout_s"])
        self.cpu_seen = (0.0, None)  # (the server's CPU seconds, when read)
        self.scraped = 0.0  # when Triton's metrics were last read
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="supervisor", daemon=True)
        self.thread.start()

    def execute(self, requests):
        error = pb_utils.TritonError("the supervisor takes no inference requests", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]

    def finalize(self):
        self.stopping.set()
        self.thread.join(5.0)

    def run(self):
        while not self.stopping.wait(self.settings["interval_s"]):
            try:
                self.check()
            except Exception as error:  # noqa: BLE001 - the supervisor must outlive anything it watches
                log(f"{error!r}")

    def model_of(self, path):
        relative = os.path.relpath(os.path.realpath(path), self.repository)
        return None if relative.startswith("..") else relative.split(os.sep)[0]

    def check(self):
        dead, now, alive = [], time.monotonic(), {}
        for pid, (state, code, path) in stubs(self.server).items():
            if path:
                self.models[pid] = self.model_of(path)
            if state == "Z" and pid not in self.handled and self.models.get(pid):
                if code != 0:  # 0: a stub that finished normally (an unload)
                    dead.append((self.models[pid], pid))
                else:
                    self.handled.add(pid)
            elif state != "Z":
                alive.setdefault(self.models.get(pid), []).append(pid)
                if state not in "Tt":
                    self.stopped_since.pop(pid, None)
                elif now - self.stopped_since.setdefault(pid, now) >= self.settings["stopped_s"]:
                    self.kill_hung(self.models.get(pid), [pid], f"stopped (state {state}) for "
                                                                  f"{now - self.stopped_since.pop(pid):.0f} s")
        states = self.triton.states() if dead else {}
        for model, pid in dead if states is not None else ():  # (Triton did not answer: asked again next round)
            self.handled.add(pid)
            if states.get(model) == {"READY"}:  # else Triton is loading or unloading it, or its load failed
                return self.recover(model, pid)
        # Triton's metrics: read a tenth of hang_timeout_s apart, not every round (each read renders every metric)
        scraped = now - self.scraped >= self.settings["hang_timeout_s"] / 10
        self.scraped = now if scraped else self.scraped
        hung = self.progress.update(model_work(self.triton, self.metrics_port), now, self.cores(now)) if scraped else []
        for model in self.progress.long_waits if scraped else ():
            log(f"'{model}' has had requests waiting for {self.settings['hang_timeout_s']:g} s with no execution "
                f"completed while the server works: a long execution, not a hang")
        callers = self.bls_callers() if hung else set()  # (reads the exports' files: only when needed)
        for model in sorted(hung, key=lambda m: m in callers)[:1]:  # a callee first: its callers only wait for it
            self.progress.reset(now)
            self.kill_hung(model, alive.get(model, []), f"had requests waiting and completed no execution for "
                                                        f"{self.settings['hang_timeout_s']:g} s")
        self.check_proxy()

    def cores(self, now):
        """The server's CPU use, in cores, since the last call (0 at the first)."""
        used, (before, then) = server_cpu_s(self.server, os.getpid()), self.cpu_seen
        self.cpu_seen = (used, now)
        return (used - before) / (now - then) if then is not None and now > then else 0.0

    def kill_hung(self, model, pids, why):
        """A hung stub is killed: the next round finds it dead and recovers it like any dead stub."""
        if not pids:  # not a Python model's (an ensemble waits on its steps; a C++ backend has no stub)
            return
        log(f"the stub of '{model}' (pid {', '.join(map(str, pids))}) is hung: {why}; killing it to recover it")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def recover(self, model, pid):
        started = time.monotonic()
        why = f"the stub of '{model}' (pid {pid}) died"
        if model in self.bls_callers() or not self.reloads_allowed:
            reason = "a BLS caller: reloading it can abort tritonserver 2.48" if model in self.bls_callers() else \
                "MODEL_CONTROL is not explicit, or the rate limiter keeps the dead stub's resource"
            return self.restart(f"{why} and cannot be reloaded in place ({reason})")
        log(f"{why}: reloading '{model}'")
        try:
            for name in [model, *self.callers_of(model)]:
                self.reload(name)
                if self.check_proxy():  # its threads stranded on the dead stub: the rest of the reloads would be lost
                    return
        except Exception as error:  # noqa: BLE001
            return self.restart(f"{why} and its reload failed ({error})")
        log(f"'{model}' reloaded {time.monotonic() - started:.1f} s after its stub was found dead")

    def reload(self, model):
        """Fresh stubs for `model`. The dead instance's unload never finishes (Triton waits for its stub's answer for
        ever), but the new version loads beside it once the model stops being ready."""
        self.triton.control("unload", model, timeout=10.0)
        deadline = time.monotonic() + self.settings["recovery_timeout_s"]
        while self.triton.ready(model) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.triton.control("load", model, timeout=self.settings["recovery_timeout_s"])

    def exports(self):
        for path in glob.glob(os.path.join(self.repository, "*", "1", "export.json")):
            try:
                with open(path, encoding="utf-8") as handle:
                    yield json.load(handle)
            except (OSError, ValueError):
                continue

    def bls_callers(self):
        return {"proxy"} | {export.get(key) for export in self.exports()
                            for key in ("bls_model", "rerank_model", "chunks_model")}

    def callers_of(self, model):
        """The BLS models that call `model`, from the exports' export.json files."""
        callers = []
        for export in self.exports():
            if model in (export.get("tokenizer_model"), export.get("encoder_model")):
                callers += [export.get("bls_model"), export.get("rerank_model"), export.get("chunks_model")]
            elif model == export.get("bls_model"):
                callers.append(export.get("rerank_model"))
        return [c for c in dict.fromkeys(callers) if c and c != model]

    def check_proxy(self):
        """The proxy's liveness (its BLS threads stranded on dead stubs): two checks in a row not live: restart (then
        True). Checked every round, and after each step of a reload, whose calls may be what stranded them."""
        if not self.triton.ready("proxy"):
            return False
        port = os.environ.get("PROXY_PORT") or self.proxy_config_port()
        answer = self.triton.call("GET", "/health/live", port=int(port), timeout=2.0) if port else None
        self.proxy_not_live = self.proxy_not_live + 1 if answer is not None and answer[0] == 503 else 0
        if self.proxy_not_live < 2:
            return False
        self.proxy_not_live = 0
        self.restart(f"the proxy is not live ({answer[1].decode(errors='replace')[:200]})")
        return True

    def proxy_config_port(self):
        answer = self.triton.call("GET", "/v2/models/proxy/config")
        try:
            return json.loads(answer[1])["parameters"]["port"]["string_value"]
        except (TypeError, ValueError, KeyError):
            return None

    def restart(self, reason):
        launcher = int(os.environ.get("TRITON_LAUNCHER_PID") or 0)
        try:
            parent = process_info(self.server).ppid
        except (OSError, ValueError, IndexError):
            parent = 0
        if launcher and parent == launcher:
            log(f"{reason}: asking the launcher to restart tritonserver")
            os.kill(launcher, signal.SIGUSR1)  # it kills the server at once: the dead stub's calls never finish
        else:
            log(f"{reason}: stopping tritonserver (SIGTERM) for the orchestrator to start it again")
            os.kill(self.server, signal.SIGTERM)
        self.stopping.set()  # this server is going: nothing more to do here
