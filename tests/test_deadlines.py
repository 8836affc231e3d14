"""Deadlines travel into Triton (issue 16): a KServe request's own `timeout` is honoured by the models' queue
policies (allow_timeout_override) and by the BLS model, which passes what is left of it to each step. Work whose
time is up is refused, not run: the steps' success counters prove it."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.serial  # `make test` runs it alone: requests whose time runs out


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


def rerank_inputs(query, documents):
    tensors = []
    for name, values in (("query", [query]), ("documents", documents)):
        tensor = grpcclient.InferInput(name, [len(values)], "BYTES")
        tensor.set_data_from_numpy(np.array(values, dtype=np.object_))
        tensors.append(tensor)
    return tensors


LONG_DOCUMENTS = [f"document {i}: " + "a long passage about deadlines and the work they bound " * 20 for i in range(64)]


def test_kserve_rerank_honours_its_timeout(server):
    """Issue 36: KServe `rerank` answered 64 documents with a 50 ms timeout after 1.4 s (its BLS calls carried no
    timeout). Now each call carries what is left, and the steps behind it refuse work past it."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    scores = client.infer("rerank", rerank_inputs("what bounds the work?", LONG_DOCUMENTS)).as_numpy("scores")
    assert scores.shape == (64,)  # the work itself is fine: answered without a timeout
    with pytest.raises(InferenceServerException) as error:
        client.infer("rerank", rerank_inputs("what bounds the work?", LONG_DOCUMENTS), timeout=50_000)
    assert "timeout" in error.value.message().lower(), error.value.message()


def test_both_doors_refuse_more_documents_than_the_limit(server):
    """Issue 36: KServe `rerank` took 100,000 documents while /v1/rerank refused 2,049. The rerank model holds the
    limit (its parameter max_documents, 2048, the proxy's max_inputs_per_request)."""
    import httpx

    documents = [f"doc {i}" for i in range(2049)]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as error:
        client.infer("rerank", rerank_inputs("q", documents))
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT", error.value
    assert error.value.message().startswith("documents holds 2049 documents, over the limit of 2048"), error.value
    response = httpx.post(server.proxy_url + "/v1/rerank", json={"query": "q", "documents": documents}, timeout=60)
    assert response.status_code == 422 and response.json()["error"]["param"] == "documents", response.text[:300]
    assert "over the limit of 2048" in response.json()["error"]["message"], response.text[:300]
    assert client.infer("rerank", rerank_inputs("q", documents[:2048])).as_numpy("scores").shape == (2048,)
