"""Keeps the proxy's view of the served models current, and recovers a dead Python-backend stub.

Triton 24.07 neither notices nor restarts a dead stub (python_backend r24.07 has no restart and no health check on
its execute path): requests to it hang, and every readiness endpoint stays 200. This thread, in the proxy's own
stub, looks at the server's child processes every `interval` seconds; a stub that turned zombie is dead. Its model
is then unloaded and loaded again (fresh stubs, about 2 s; the ensemble follows). That needs explicit model control
and no rate limiter: a stub that died mid-execute keeps its rate-limiter resource for good, so nothing can run
again in that server. Then the watchdog stops tritonserver (SIGTERM), so the container exits and the orchestrator
starts a new one; /health and /health/live say why in the meantime.
"""
import os
import signal
import threading
import time

STUB = b"triton_python_backend_stub"


def process_table(parent):
    """{pid: (state, argv)} of the processes whose parent is `parent` (argv is empty for a zombie)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                table[int(entry)] = (fields[0].decode(), handle.read().split(b"\0"))
        except (OSError, ValueError, IndexError):
            continue
    return table


class Watchdog:
    def __init__(self, ensembles, metrics, settings, pb_utils, server, log=print):
        self.ensembles, self.metrics, self.settings, self.pb_utils, self.server = \
            ensembles, metrics, settings, pb_utils, server
        self.log = log
        self.repository = os.path.realpath(ensembles.repository)
        self.models = {}  # stub pid -> model name, learnt while the stub lives (a zombie's argv is gone)
        self.handled = set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="proxy-watchdog", daemon=True)
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            self.rate_limited = b"--rate-limit=execution_count" in handle.read().split(b"\0")

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join(5.0)

    def wait_for_triton(self):
        """pb_utils' model calls work only once initialize() has returned (before, is_model_ready brings the server
        down): BLS says when, refusing until then, and a request for no model is a cheap question."""
        while not self.stopping.is_set():
            probe = self.pb_utils.InferenceRequest(model_name="", requested_output_names=[], inputs=[])
            try:
                probe.exec()
                return True
            except Exception:  # noqa: BLE001 - "BLS is only supported during the 'execute' function"
                self.stopping.wait(0.1)
        return False

    def run(self):
        if not self.wait_for_triton():
            return
        while not self.stopping.is_set():
            try:
                self.ensembles.refresh_readiness()
                self.check_stubs()
                if not self.server.alive() and not self.stopping.is_set():
                    self.log("proxy: the HTTP server thread stopped; starting it again")
                    self.server.restart()
            except Exception as error:  # noqa: BLE001 - the watchdog must outlive anything it watches
                self.log(f"proxy: watchdog: {error!r}")
            self.stopping.wait(self.settings.watchdog_interval_s)

    def model_of(self, argv):
        """The model a stub serves: its first argument is <repository>/<model>/<version>/<file>."""
        if len(argv) < 2 or not argv[0].endswith(STUB):
            return None
        path = os.path.realpath(argv[1].decode(errors="replace"))
        relative = os.path.relpath(path, self.repository)
        return None if relative.startswith("..") else relative.split(os.sep)[0]

    def check_stubs(self):
        for pid, (state, argv) in process_table(os.getppid()).items():
            model = self.model_of(argv)
            if model:
                self.models[pid] = model
            if state == "Z" and pid not in self.handled and pid in self.models:
                self.handled.add(pid)
                self.recover(self.models[pid], pid)

    def recover(self, model, pid):
        started = time.monotonic()
        self.ensembles.recovering[model] = f"the stub of '{model}' (pid {pid}) died"
        self.ensembles.abort_inflight(model, self.ensembles.recovering[model])
        if self.settings.model_control != "explicit" or self.rate_limited:
            why = "MODEL_CONTROL is not explicit" if self.settings.model_control != "explicit" else \
                "the rate limiter (RATE_LIMIT=on) keeps the dead stub's resource"
            self.metrics.recoveries.labels(model, "restart").inc()
            return self.restart(f"the stub of '{model}' (pid {pid}) died and cannot be reloaded in place ({why}): "
                                f"stopping tritonserver so that it is restarted")
        self.log(f"proxy: the stub of '{model}' (pid {pid}) died: reloading '{model}'")
        self.metrics.recoveries.labels(model, "reload").inc()
        try:
            self.pb_utils.unload_model(model_name=model)
            deadline = time.monotonic() + self.settings.recovery_timeout_s
            while self.pb_utils.is_model_ready(model) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.pb_utils.load_model(model_name=model)
        except Exception as error:  # noqa: BLE001
            return self.restart(f"reloading '{model}' after its stub died failed ({error}): stopping tritonserver")
        self.ensembles.recovering.pop(model, None)
        self.ensembles.refresh_readiness()
        self.log(f"proxy: '{model}' reloaded {time.monotonic() - started:.1f} s after its stub was found dead")

    def restart(self, reason):
        self.ensembles.failed = reason
        self.log(f"proxy: {reason}")
        os.kill(os.getppid(), signal.SIGTERM)
