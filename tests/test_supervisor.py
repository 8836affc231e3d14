"""The supervisor's hang rules as units (model_source/supervisor/1/model.py, with a fake pb_utils); the whole
path, a stopped stub killed and reloaded under load, is in tests/test_faults.py."""
from conftest import import_python_model

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
