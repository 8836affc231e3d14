"""Deadlines travel into Triton (issue 16): a KServe request's own `timeout` is honoured by the models' queue
policies (allow_timeout_override) and by the BLS model, which passes what is left of it to each step. Work whose
time is up is refused, not run: the steps' success counters prove it."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def text_input(texts):
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=np.object_).reshape(-1, 1))
    return tensor


def successes(server, model):
    return server.stats(model)["inference_stats"]["success"]["count"]


def test_a_request_past_its_timeout_is_refused_and_never_run(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = {step: successes(server, step) for step in ("tokenizer", "embedding")}
    with pytest.raises(InferenceServerException) as error:
        client.infer("ensemble_bls", [text_input(["a deadline of one microsecond", "is over before it is queued"])],
                     timeout=1)
    assert "timeout expired" in error.value.message().lower(), error.value.message()
    assert {step: successes(server, step) for step in before} == before  # nothing was tokenized or encoded


def test_a_request_within_its_timeout_is_answered_exactly(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    texts = ["the deadline is ten seconds", "every step gets what is left of it", "short"]
    timed = client.infer("ensemble_bls", [text_input(texts)], timeout=10_000_000).as_numpy("embedding")
    untimed = client.infer("ensemble_bls", [text_input(texts)]).as_numpy("embedding")
    np.testing.assert_allclose(timed, untimed, atol=1e-6)
