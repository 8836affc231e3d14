"""Keeps the proxy's view of the served models current, in its own thread, so requests never wait on it.

Every `readiness_interval_s` it asks Triton which models are ready (Service.refresh_readiness, Triton's HTTP API).
A model that stops being ready while no admin action of the proxy's is changing it is being recovered by the
supervisor model (the supervisor model: its stub died): the calls waiting on it fail at once (503 with
Retry-After). Triton neither answers nor cancels such a call, so each keeps one of the proxy's BLS threads for good;
once half of them are stranded the proxy says it is not live (/health/live 503), and the supervisor has the server
restarted. It also restarts the HTTP server's thread should it stop, and fails everything once tritonserver is gone.

Triton's HTTP port is read only once it answers as this stub's own tritonserver (answers_as: the server's --id): an
orphan server left on the port (or any other process) would otherwise answer for ours, and /health would say 200
for a server that is still loading, or that never gets the port and dies.

ModelReadiness is the service's part of it (service.Service): what Triton says of each model, kept where requests
read it without a question to Triton. No import of the proxy's own modules: tests/test_launch_lifecycle.py loads
this file alone.
"""
import json
import os
import socket
import threading

from model_library.model_errors import ErrorKind


def answers_as(triton, server_id):
    """Whether Triton's HTTP port answers as the server this stub runs in: its server metadata (GET /v2) names
    `server_id`, the --id the launcher gave it (TRITON_SERVER_ID, which the stubs inherit). Without one (a plain
    tritonserver) the port is trusted, as before."""
    if not server_id:
        return True
    answer = triton.call("GET", "/v2")
    if answer is None or answer[0] != 200:
        return False
    try:
        return json.loads(answer[1]).get("name") == server_id
    except (ValueError, AttributeError):
        return False


class ModelReadiness:
    """Service's readiness state: registry.ready (model -> ready), bls_rows (a BLS or image model's max_batch_size)
    and max_documents (a rerank model's parameter), learnt off the request path while the model is ready."""

    def refresh_readiness(self):
        """From the readiness thread (and after admin actions): one question per model, so requests never wait."""
        for card in list(self.registry.cards_by_name.values()):
            for name in card.models:
                ready = bool(self.triton.ready(name))
                if not ready:
                    self.bls_rows.pop(name, None)
                    self.max_documents.pop(name, None)
                elif name in (card.bls, card.image) and name not in self.bls_rows:  # learnt off the request path
                    self.bls_rows[name] = max(1, int((self.triton.config(name) or {}).get("max_batch_size") or 1))
                elif name == card.rerank and name not in self.max_documents:
                    self.max_documents[name] = rerank_limit(self.triton.config(name))
                self.registry.ready[name] = ready


def rerank_limit(config):
    """A rerank model's max_documents from Triton's config of it, as the model reads it (model_common.RerankModel:
    empty or absent, 2048); None: no config (the model's own rule then answers alone)."""
    if not config:
        return None
    value = ((config.get("parameters") or {}).get("max_documents") or {}).get("string_value")
    return int(value or 2048)


class Readiness:
    def __init__(self, service, triton, settings, pb_utils, server, log=print, own_model="proxy"):
        self.service, self.triton, self.settings, self.pb_utils, self.server, self.log = \
            service, triton, settings, pb_utils, server, log
        self.own_model, self.own_ready = own_model, False
        self.stranded = set()  # BLS calls failed because their model stopped being ready, still not returned
        self.server_pid = os.getppid()  # tritonserver started this stub
        self.server_id = os.environ.get("TRITON_SERVER_ID", "")  # its --id (the launcher's), if any
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="proxy-readiness", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join(5.0)

    def wait_for_triton(self):
        """pb_utils' calls (BLS) must wait: during the server's start-up they kill the calling stub. The frontends
        open once start-up is over; then BLS says whether initialize() has returned (it refuses until then), and a
        request for no model is a cheap question."""
        said = False
        while not self.stopping.is_set():
            try:
                socket.create_connection((self.triton.host, self.triton.port), timeout=1).close()
                if answers_as(self.triton, self.server_id):
                    break
                if not said:
                    said = True
                    self.log(f"proxy: port {self.triton.port} answers, but not as this proxy's tritonserver (its "
                             f"--id {self.server_id}): another server holds it; not ready until ours does")
            except OSError:
                pass
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
        self.service.triton_started = True  # admin load/unload may now call Triton
        while not self.stopping.is_set():
            try:
                self.refresh()
                if not self.server.alive() and not self.stopping.is_set():
                    self.log("proxy: the HTTP server thread stopped; starting it again")
                    self.server.restart()
            except Exception as error:  # noqa: BLE001 - this thread must outlive anything it watches
                self.log(f"proxy: readiness: {error!r}")
            self.stopping.wait(self.settings.readiness_interval_s)

    def refresh(self):
        if os.getppid() != self.server_pid:
            return self.server_gone()
        # This model is being unloaded (a drain: the launcher's SIGTERM handling, or an admin): stop taking requests
        # now. Triton runs finalize() only once the BLS calls of the requests in flight are answered.
        own_ready = self.triton.ready(self.own_model)
        if self.own_ready and own_ready is False and not self.service.registry.draining:
            self.log("proxy: this model is being unloaded: new requests get 503, those in flight finish")
            self.service.registry.draining = True
        self.own_ready = self.own_ready or bool(own_ready)
        ready = self.service.registry.ready
        was_ready = {name for name, up in ready.items() if up}
        self.service.refresh_readiness()
        lost = {name for name in was_ready if not ready.get(name)} - self.service.changing_models
        if lost and not self.triton.server_ready():  # tritonserver is stopping: its calls still get answers
            return
        for model in lost:  # (a call on several of them is counted once)
            self.stranded.update(self.service.abort_inflight(model, f"model '{model}' stopped being ready (the "
                                                                      f"supervisor is recovering it)"))
        self.stranded = {call for call in self.stranded if not call.done()}
        threads = self.settings.bls_concurrency
        stranded = len(self.stranded)
        self.service.registry.failed = f"{stranded} of the {threads} BLS threads wait for ever on dead stubs" \
            if 2 * stranded >= threads else ""

    def server_gone(self):
        """tritonserver died (an abort) and its parent has not reaped it yet: the stub's own check (kill(parent, 0))
        ends this process only once it is reaped, and until then the calls in flight would wait request_timeout_s for
        answers that never come, and new requests would join them. Fail them all now (503)."""
        why = f"tritonserver (pid {self.server_pid}) exited"
        if self.service.registry.failed != why:
            self.log(f"proxy: {why}: every request gets 503 until this process ends")
            self.service.registry.failed = why
        self.service.abort_inflight(None, why, ErrorKind.SERVER_EXITED)
