"""The supervisor's hang rules as units (model_source/supervisor/1/model.py, with a fake pb_utils), and a long
encoder run through tritonserver that is not taken for a hang; the whole path, a stopped stub killed and reloaded
under load, is in tests/test_faults.py."""
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import import_python_model, serve_until_done
from local_triton import launch
from triton_clients import client, text_input

pytestmark = pytest.mark.serial  # `make test` runs it alone: a long encoder run against the hang timeout

supervisor = import_python_model("supervisor")

METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
nv_inference_pending_request_count{{model="tokenizer",version="1"}} {tokenizer_pending}
nv_inference_pending_request_count{{model="ensemble_bls",version="1"}} {bls_pending}
nv_inference_exec_count{{model="tokenizer",version="1"}} {tokenizer_runs}
nv_inference_exec_count{{model="ensemble_bls",version="1"}} 7
nv_inference_count{{model="tokenizer",version="1"}} 99
"""


class FakeTriton:
    """The one call model_work makes of the client (model_library/triton_server.py), answered with `text`."""

    def __init__(self, text):
        self.text = text

    def call(self, method, path, body=None, headers=None, timeout=5.0, port=None):
        return 200, self.text.encode()


def work(**values):
    return supervisor.model_work(FakeTriton(METRICS.format(**values)), 8002)


def test_metrics_are_read_per_model():
    assert work(tokenizer_pending=3, bls_pending=1, tokenizer_runs=42) == {"tokenizer": (3.0, 42.0),
                                                                           "ensemble_bls": (1.0, 7.0)}
    assert supervisor.model_work(FakeTriton(""), 0) == {}  # metrics off: nothing is judged hung


def test_a_model_hangs_when_requests_wait_and_nothing_completes_for_the_timeout():
    clock = supervisor.HangClock(timeout_s=30)
    assert clock.update(work(tokenizer_pending=2, bls_pending=1, tokenizer_runs=5), now=0) == []
    assert clock.update(work(tokenizer_pending=2, bls_pending=1, tokenizer_runs=5), now=29) == []
    assert sorted(clock.update(work(tokenizer_pending=2, bls_pending=1, tokenizer_runs=5), now=30)) == \
        ["ensemble_bls", "tokenizer"]
    clock.reset(now=30)  # after a kill, every model gets the full timeout again
    assert clock.update(work(tokenizer_pending=2, bls_pending=1, tokenizer_runs=5), now=59) == []


def test_progress_or_an_empty_queue_is_not_a_hang():
    clock = supervisor.HangClock(timeout_s=30)
    clock.update(work(tokenizer_pending=2, bls_pending=0, tokenizer_runs=5), now=0)
    assert clock.update(work(tokenizer_pending=2, bls_pending=0, tokenizer_runs=6), now=40) == []  # it completed one
    assert clock.update(work(tokenizer_pending=0, bls_pending=0, tokenizer_runs=6), now=80) == []  # nothing waits
    assert clock.update(work(tokenizer_pending=1, bls_pending=0, tokenizer_runs=6), now=100) == []  # waits since 80
    assert clock.update(work(tokenizer_pending=1, bls_pending=0, tokenizer_runs=6), now=110) == ["tokenizer"]


def test_the_metrics_it_reads_exist_in_tritonserver(server):
    """The two metrics are Triton 2.48's own names: read from the real server, every Python model has both."""
    triton = supervisor.triton_client({"http-port": str(server.http_port)})
    work = supervisor.model_work(triton, server.metrics_port)
    assert {"tokenizer", "ensemble_bls", "embedding"} <= set(work), work
    assert all(pending >= 0 and executions >= 0 for pending, executions in work.values())


def test_a_long_execution_on_a_busy_server_is_not_a_hang():
    """Issue 72: while one execution runs for minutes (an 8,000-token text on 2 cores holding the rate limiter), the
    other models' requests wait and nothing completes, but the server uses its cores: the clock stops. It runs again
    once the server is idle, and completions anywhere end the pause (a stub hung beside busy traffic is still found)."""
    clock = supervisor.HangClock(timeout_s=30)
    waiting = {"tokenizer_pending": 2, "bls_pending": 0, "tokenizer_runs": 5}
    assert clock.update(work(**waiting), now=0, cores=1.9) == []
    assert clock.update(work(**waiting), now=100, cores=1.9) == [] and clock.long_waits == ["tokenizer"]
    assert clock.update(work(**waiting), now=200, cores=1.9) == [] and clock.long_waits == []  # logged once
    assert clock.update(work(**waiting), now=220, cores=0.0) == []  # idle 20 s of the 30
    assert clock.update(work(**waiting), now=230, cores=0.1) == ["tokenizer"]  # idle 30 s: hung
    busy_elsewhere = supervisor.HangClock(timeout_s=30)
    busy_elsewhere.update(work(**waiting), now=0, cores=1.9)
    assert busy_elsewhere.update({"tokenizer": (2.0, 5.0), "embedding": (0.0, 9.0)}, now=10, cores=1.9) == []
    assert busy_elsewhere.update({"tokenizer": (2.0, 5.0), "embedding": (0.0, 20.0)}, now=40, cores=1.9) == \
        ["tokenizer"]  # the embedding model completes runs from 10 s on: the tokenizer's wait is no long execution's


def test_the_server_cpu_it_reads_moves_with_work():
    """server_cpu_s reads /proc: this process's own CPU time grows while it computes."""
    pid = os.getpid()
    before = supervisor.process_info(pid).cpu_s
    sum(i * i for i in range(3_000_000))
    assert supervisor.process_info(pid).cpu_s > before


LONG_RUN_ENV = {"SUPERVISOR_HANG_TIMEOUT_S": "0.5", "SUPERVISOR_INTERVAL_S": "0.1", "PROXY_REQUEST_TIMEOUT_S": "1"}


@pytest.fixture(scope="module")
def long_run_server(minilm_repository, tmp_path_factory):
    """The rate limiter on (the CPU default): one encoder run at a time. A hang timeout of 0.5 s, checked every
    0.1 s, and a request deadline of 1 s, so that one run of the encoder's whole token budget (64 texts of 256
    tokens, 16,384; ~2 s on 2 cores) outlasts both."""
    yield from serve_until_done(minilm_repository, tmp_path_factory.mktemp("long_run_server"), LONG_RUN_ENV)


def live_stubs(server_pid):
    return {child for child, (state, _) in launch.children(server_pid).items() if state != "Z"}


def test_a_long_encoder_run_is_busy_not_hung(long_run_server):
    """Issue 72: during one long encoder run the rate limiter holds every model: short queries wait and nothing
    completes. The supervisor used to take that for a hang (requests waiting, no execution completed for
    hang_timeout_s) and kill the waiting tokenizer's stub, and with the rate limiter on, restart tritonserver,
    dropping every connection. Now: no stub killed, no restart, the short KServe queries answered; /health says the
    server is busy (503) once the run is past the request deadline, /health/live stays 200, /health is 200 after."""
    server = long_run_server
    pid = server.process.pid
    stubs = live_stubs(pid)
    long_text = " ".join(f"word{i}" for i in range(400))  # truncated to 256 tokens
    health, live, queries = [], [], []

    def long_request():
        with httpx.Client(timeout=120) as client:
            return client.post(server.proxy_url + "/v1/embeddings", json={"input": [long_text] * 64}).status_code

    def short_query(text):
        started = time.monotonic()
        connection = client("grpc", server.grpc_url)  # KServe, no server-side deadline: it waits for the long run
        try:  # (the client's own timeout only ends the test: a restarted server never answers, it does not hang it)
            result = connection.infer("ensemble", [text_input("grpc", [text])], client_timeout=120)
        finally:
            connection.close()
        queries.append(time.monotonic() - started)
        return result.as_numpy("embedding").shape

    with ThreadPoolExecutor(4) as pool:
        long_run = pool.submit(long_request)
        time.sleep(0.3)  # the long run is in the encoder
        shorts = [pool.submit(short_query, text) for text in ("a short query", "another one")]
        with httpx.Client(timeout=5) as probe:
            while not long_run.done() or not all(s.done() for s in shorts):
                health.append((probe.get(server.proxy_url + "/health").status_code,
                               probe.get(server.proxy_url + "/health").text))
                live.append(probe.get(server.proxy_url + "/health/live").status_code)
                time.sleep(0.2)
        assert long_run.result() == 504  # its deadline (1 s) passed; the run itself went on in Triton
        assert [s.result() for s in shorts] == [(1, 384), (1, 384)]
    log = server.log()
    assert min(queries) > 1.0, queries  # they waited for the long run: the case was real (else it proves nothing)
    assert "a long execution, not a hang" in log, log[-3000:]  # the supervisor saw the wait, and let it be
    assert "is hung" not in log and "asking the launcher to restart" not in log and \
        "for the orchestrator to start it again" not in log, log[-3000:]
    assert server.process.poll() is None and server.process.pid == pid and live_stubs(pid) == stubs
    assert any(code == 503 and text.startswith("busy: a model call has run") for code, text in health), health
    assert set(live) == {200}, live
    with httpx.Client(timeout=5) as probe:
        deadline = time.monotonic() + 30
        while probe.get(server.proxy_url + "/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)  # the long run's call returns; /health is 200 again
        assert probe.get(server.proxy_url + "/health").text == "ok"
