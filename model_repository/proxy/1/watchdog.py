"""Keeps the proxy's view of the served models current, and recovers a dead Python-backend stub.

Triton 24.07 neither notices nor restarts a dead stub (python_backend r24.07 has no restart and no health check on
its execute path): requests to it hang, and every readiness endpoint stays 200. This thread, in the proxy's own
stub, looks at the server's child processes every `interval` seconds; a stub that turned zombie is dead. Its model
is then unloaded and loaded again (fresh stubs, about 2 s; the ensemble follows), and so are the BLS models that
were waiting on it (callers_of). That needs explicit model control
and no rate limiter: a stub that died mid-execute keeps its rate-limiter resource for good, so nothing can run
again in that server. And each call the dead stub had keeps one of the proxy's BLS threads blocked for good (Triton
neither answers nor cancels it; its client gets a 503), so once half of them are lost a reload is not enough either.
Then the watchdog has tritonserver restarted: it asks the launcher (local_triton/launch.py,
SIGUSR1), which kills the server at once and starts a new one; without the launcher it stops tritonserver (SIGTERM),
so the container exits after Triton's exit timeout and the orchestrator starts a new one. /health and /health/live
say why in the meantime.

Readiness and reloads go through Triton's own HTTP API (address, port and admin key from tritonserver's command
line; Ensembles.model_ready and model_control), not pb_utils: pb_utils' model calls hold this process's GIL for
their whole round trip (a 2-3 s reload froze every answer of the proxy, /health included), and is_model_ready from
this thread crashed the stub (SIGSEGV, seen at start-up). pb_utils remains the fallback when Triton's HTTP is off.
"""
import os
import signal
import socket
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


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def server_flags():
    """tritonserver's --name=value flags (the watchdog runs in a stub, a child of tritonserver)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
        return dict(arg.decode(errors="replace").split("=", 1) for arg in handle.read().split(b"\0") if b"=" in arg)


def exit_code(pid):
    """A zombie's exit status (/proc/<pid>/stat field 52): 0 for a stub that finished normally (an unload)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[49])
    except (OSError, ValueError, IndexError):
        return None


class Watchdog:
    def __init__(self, ensembles, metrics, settings, pb_utils, server, log=print):
        self.ensembles, self.metrics, self.settings, self.pb_utils, self.server = \
            ensembles, metrics, settings, pb_utils, server
        self.log = log
        self.repository = os.path.realpath(ensembles.repository)
        self.models = {}  # stub pid -> model name, learnt while the stub lives (a zombie's argv is gone)
        self.handled = set()
        self.stranded = 0  # BLS calls that were waiting on a stub when it died: each holds a BLS thread for ever
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="proxy-watchdog", daemon=True)
        self.rate_limited = server_flags().get("--rate-limit") == "execution_count"

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join(5.0)

    def server_port(self):
        """Where the server's own frontends listen (its command line), to learn when its start-up is over."""
        flags = server_flags()
        for kind, default in (("http", "8000"), ("grpc", "8001")):
            if flags.get(f"--allow-{kind}", "true") != "false":
                address = flags.get(f"--{kind}-address", "0.0.0.0")
                return ("127.0.0.1" if address in ("0.0.0.0", "") else address), int(flags.get(f"--{kind}-port",
                                                                                             default))
        return None

    def wait_for_triton(self):
        """pb_utils' calls (BLS, is_model_ready, load_model) must wait: during the server's start-up they kill the
        calling stub, and before initialize() has returned is_model_ready brings the server down. The frontends
        open once start-up is over; then BLS says whether initialize() has returned (it refuses until then), and a
        request for no model is a cheap question."""
        port = self.server_port()
        while port and not self.stopping.is_set():
            try:
                socket.create_connection(port, timeout=1).close()
                break
            except OSError:
                self.stopping.wait(0.2)
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
        self.ensembles.triton_started = True  # admin load/unload may now call Triton
        while not self.stopping.is_set():
            try:
                self.refresh_readiness()
                self.check_stubs()
                if not self.server.alive() and not self.stopping.is_set():
                    self.log("proxy: the HTTP server thread stopped; starting it again")
                    self.server.restart()
            except Exception as error:  # noqa: BLE001 - the watchdog must outlive anything it watches
                self.log(f"proxy: watchdog: {error!r}")
            self.stopping.wait(self.settings.watchdog_interval_s)

    def refresh_readiness(self):
        self.ensembles.refresh_readiness()

    def reload(self, model):
        """Fresh stubs for `model` (Triton reloads the ensembles that use it). The dead instance's unload never
        finishes (Triton waits for its stub's answer for ever), but the new version loads beside it."""
        self.ensembles.model_control("unload", model)
        deadline = time.monotonic() + self.settings.recovery_timeout_s
        while self.ensembles.model_ready(model) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.ensembles.model_control("load", model)

    def callers_of(self, model):
        """The BLS models that call `model` (an export's BLS model calls its tokenizer and encoder, its rerank model
        the BLS model): their calls to the dead stub never return, so their instances stay blocked for good and get
        fresh stubs too."""
        callers = []
        for card in list(self.ensembles.cards_by_name.values()):
            if model in (card.tokenizer, card.encoder):
                callers += [card.bls, card.rerank]
            elif model == card.bls:
                callers.append(card.rerank)
        return list(dict.fromkeys(c for c in callers if c != model))

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
                # A stub that exited cleanly, or whose model an admin load/unload is changing, was unloaded.
                if exit_code(pid) != 0 and self.models[pid] not in self.ensembles.changing_models:
                    self.recover(self.models[pid], pid)

    def recover(self, model, pid):
        started = time.monotonic()
        self.ensembles.recovering[model] = f"the stub of '{model}' (pid {pid}) died"
        # Triton neither answers nor cancels the calls the dead stub had: their clients get a 503 now, but their
        # BLS threads stay blocked for good. Once half of them are lost, only a restart gives them back.
        self.stranded += sum(model in models for models, _ in list(self.ensembles.inflight))
        self.ensembles.abort_inflight(model, self.ensembles.recovering[model])
        threads = self.settings.bls_concurrency
        if self.settings.model_control != "explicit" or self.rate_limited or 2 * self.stranded >= threads:
            why = "MODEL_CONTROL is not explicit" if self.settings.model_control != "explicit" else \
                "the rate limiter (RATE_LIMIT=on) keeps the dead stub's resource" if self.rate_limited else \
                f"{self.stranded} of the {threads} BLS threads wait for ever on dead stubs"
            self.metrics.recoveries.labels(model, "restart").inc()
            return self.restart(f"the stub of '{model}' (pid {pid}) died and cannot be reloaded in place ({why}): "
                                f"restarting tritonserver")
        self.log(f"proxy: the stub of '{model}' (pid {pid}) died: reloading '{model}'")
        self.metrics.recoveries.labels(model, "reload").inc()
        try:
            self.reload(model)
            for caller in self.callers_of(model):
                self.reload(caller)
        except Exception as error:  # noqa: BLE001
            return self.restart(f"reloading '{model}' after its stub died failed ({error}): restarting tritonserver")
        self.ensembles.recovering.pop(model, None)
        self.refresh_readiness()
        self.log(f"proxy: '{model}' reloaded {time.monotonic() - started:.1f} s after its stub was found dead")

    def restart(self, reason):
        self.ensembles.failed = reason
        self.log(f"proxy: {reason}")
        # The launcher names itself (TRITON_LAUNCHER_PID) to the server it starts: it restarts it at once, where a
        # SIGTERM would make Triton wait its whole exit timeout for requests the dead stub never answers.
        launcher = int(os.environ.get("TRITON_LAUNCHER_PID") or 0)
        if launcher and parent_of(os.getppid()) == launcher:
            os.kill(launcher, signal.SIGUSR1)
        else:
            os.kill(os.getppid(), signal.SIGTERM)
