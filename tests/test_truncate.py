"""`truncate` false is the tokenizer's rule (issue 58, item 2): with the request parameter false, a text over the max
length is refused as `too_long` naming it, before the encoder runs; the BLS, rerank and late chunking models pass
the parameter on, and every dialect of the HTTP front asks it of them instead of throwing an encoder's answer away.
Checked on the real server by the encoder's execution count (Triton's statistics), which must not move."""
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import CE_MAX_LENGTH
from model_library import model_errors
from proxy_fakes import error_of
from triton_clients import PROTOCOLS, TOKENIZER_OUTPUTS, bytes_input, client, outputs, text_input, url_for

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max tokens, as exported
LONG_TEXT = "Paris is the capital of France. " * 80  # far over 256 tokens
SHORT = "A short text."
EMBED_OUTPUTS = ("embedding", "num_tokens", "truncated")
NAMES = {"tokenizer": TOKENIZER_OUTPUTS, "ensemble_bls": EMBED_OUTPUTS, "ensemble": EMBED_OUTPUTS}


def words(field):
    return f"{field} is longer than the model's maximum of {MAX_LENGTH} tokens (truncate is false)"


def encoder_runs(server, model="embedding"):
    """The encoder's (execution_count, inference_count), once settled: Triton counts a run after its responses are
    sent, so a count read at once may miss the run that just answered."""
    def read():
        stats = server.stats(model)
        return int(stats["execution_count"]), int(stats["inference_count"])
    last = read()
    while True:
        time.sleep(0.3)
        now = read()
        if now == last:
            return now
        last = now


def kserve(protocol, server, model, texts, parameters=None, names=None):
    """One request of `texts` (rows) to `model` -> {output: array}; raises InferenceServerException."""
    connection = client(protocol, url_for(server, protocol))
    try:
        result = connection.infer(model, [text_input(protocol, texts)], parameters=parameters,
                                  outputs=outputs(protocol, names or NAMES[model]))
        return {name: result.as_numpy(name) for name in names or NAMES[model]}
    finally:
        connection.close()


def refusal(call):
    """The model error a call gets (model_errors.parse of its message: kind, field, message)."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return model_errors.parse(caught.value.message())


def rerank(server, query, documents, parameters, model="rerank"):
    connection = client("grpc", server.grpc_url)
    try:
        return connection.infer(model, [bytes_input(grpcclient, "query", [query], [1]),
                                        bytes_input(grpcclient, "documents", documents, [len(documents)])],
                                parameters=parameters)
    finally:
        connection.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["tokenizer", "ensemble_bls", "ensemble"])
def test_truncate_false_is_too_long_before_the_encoder_runs(server, protocol, model):
    """KServe with truncate false: the over-long row is too_long naming it; the encoder never ran. Triton 24.07's
    ensemble passes a request's parameters to its steps, so `ensemble` answers the same."""
    before = encoder_runs(server)
    error = refusal(lambda: kserve(protocol, server, model, [SHORT, LONG_TEXT], {"truncate": False}))
    assert (error.kind, error.field) == ("too_long", "text[1]"), error
    assert words("text[1]") in error.message, error
    assert encoder_runs(server) == before
    # the same texts within the max length go through, and a short text with truncate false is served
    result = kserve(protocol, server, model, [SHORT], {"truncate": False})
    assert not result["truncated"].any()


@pytest.mark.parametrize("model", ["tokenizer", "ensemble_bls", "ensemble"])
def test_truncate_true_or_absent_still_cuts_and_says_so(server, model):
    for parameters in (None, {"truncate": True}):
        result = kserve("grpc", server, model, [SHORT, LONG_TEXT], parameters)
        assert result["truncated"].reshape(-1).tolist() == [False, True]
        assert int(result["num_tokens"].reshape(-1)[1]) == MAX_LENGTH


@pytest.mark.parametrize("model", ["tokenizer", "ensemble_bls"])
def test_a_truncate_that_is_not_a_boolean_is_invalid_value(server, model):
    error = refusal(lambda: kserve("http", server, model, [SHORT], {"truncate": "no"}))
    assert (error.kind, error.field) == ("invalid_value", "truncate"), error


def test_an_over_long_request_leaves_the_others_of_its_batch_served(server):
    """Concurrent requests, the tokenizer batching them into one execute: each over-long one is refused alone, every
    other one served. Tried until a round was batched (fewer tokenizer executions than requests)."""
    batched, long_rows = False, [i % 2 == 0 for i in range(16)]

    def one(i):
        texts = [SHORT, LONG_TEXT] if long_rows[i] else [SHORT, f"fine {i}"]
        try:
            return kserve("grpc", server, "tokenizer", texts, {"truncate": False})
        except InferenceServerException as error:
            return model_errors.parse(error.message())
    for _ in range(5):
        before = int(server.stats("tokenizer")["execution_count"])
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, range(16)))
        for over, answer in zip(long_rows, answers):
            if over:
                assert (answer.kind, answer.field) == ("too_long", "text[1]"), answer
            else:
                assert isinstance(answer, dict) and not answer["truncated"].any(), answer
        batched = int(server.stats("tokenizer")["execution_count"]) - before < len(long_rows)
        if batched:
            break
    assert batched, "no round of 16 concurrent requests shared a tokenizer execute"


def test_rerank_and_late_chunking_pass_it_on(server):
    """The rerank model (over ensemble_bls): the query or a document over the max length, named as the rerank model
    names them; late chunking asks the tokenizer with truncate false always. The encoder never runs."""
    before = encoder_runs(server)
    for query, documents, field in ((SHORT, [SHORT, LONG_TEXT], "documents[1]"), (LONG_TEXT, [SHORT], "query")):
        error = refusal(lambda q=query, d=documents: rerank(server, q, d, {"truncate": False}))
        assert (error.kind, error.field) == ("too_long", field), error
    connection = client("http", server.http_url)
    try:
        error = refusal(lambda: connection.infer(
            "late_chunking", [bytes_input(httpclient, "text", [LONG_TEXT], [1])], parameters={"chunk_tokens": 16}))
    finally:
        connection.close()
    assert (error.kind, error.field) == ("too_long", "text") and words("text") in error.message, error
    assert encoder_runs(server) == before


# ---------------------------------------------------------------- the HTTP front: the statuses and bodies of before
FRONT = [  # route, body, the field named, TEI's shape
    ("/v1/embeddings", {"input": ["ok", LONG_TEXT], "truncate": False}, "input[1]", False),
    ("/v1/embeddings", {"input": LONG_TEXT, "truncate": False}, "input[0]", False),  # one text: the ensemble
    ("/v1/embed", {"texts": ["ok", LONG_TEXT], "input_type": "search_query", "truncate": "NONE"}, "texts[1]", False),
    ("/embed", {"inputs": ["ok", LONG_TEXT]}, "inputs[1]", True),  # TEI: truncate false unless asked
    ("/embed", {"inputs": LONG_TEXT, "truncate": False}, "inputs[0]", True),
    ("/v1/rerank", {"query": "q", "documents": ["a", LONG_TEXT], "truncate": False}, "documents[1]", False),
    ("/v1/rerank", {"query": LONG_TEXT, "documents": ["a"], "truncate": False}, "query", False),
    ("/v1/chunk_embeddings", {"input": LONG_TEXT, "chunk_tokens": 16}, "input", False),
]


@pytest.mark.parametrize("route, body, field, tei", FRONT, ids=[f"{r[0]} {r[2]}" for r in FRONT])
def test_the_front_answers_as_before_without_an_encoder_run(server, route, body, field, tei):
    before = encoder_runs(server)
    with httpx.Client(base_url=server.proxy_url, timeout=60) as http:
        response = http.post(route, json=body)
    error = error_of(response, 422)
    assert isinstance(response.json()["error"], str) == tei, response.text
    assert (error["code"], error["field"]) == ("too_long", field), error
    assert error["message"] == words(field), error
    assert encoder_runs(server) == before


def test_the_front_still_cuts_when_asked(server):
    with httpx.Client(base_url=server.proxy_url, timeout=60) as http:
        for route, body in (("/v1/embeddings", {"input": ["ok", LONG_TEXT]}),
                            ("/embed", {"inputs": ["ok", LONG_TEXT], "truncate": True})):
            response = http.post(route, json=body)
            assert response.status_code == 200 and response.headers["x-truncated-inputs"] == "1", response.text


# ---------------------------------------------------------------- named exports: an embedder and a cross-encoder
CE_LONG = "Paris is the capital of France. " * 40  # over the named exports' 128 tokens


def ce_words(field):
    return f"{field} is longer than the model's maximum of {CE_MAX_LENGTH} tokens (truncate is false)"


def test_named_exports_refuse_before_their_encoders_run(ce_server):
    """`emb_bls` (an embedder's BLS model) and `xr_rerank` (a cross-encoder's rerank model, the query sent once for
    every pair) with truncate false: too_long naming the text, the document or the query; neither encoder runs."""
    before = [encoder_runs(ce_server, "emb_embedding"), encoder_runs(ce_server, "xr_embedding")]
    error = refusal(lambda: kserve("grpc", ce_server, "emb_bls", [SHORT, CE_LONG], {"truncate": False},
                                   EMBED_OUTPUTS))
    assert (error.kind, error.field) == ("too_long", "text[1]") and ce_words("text[1]") in error.message, error
    for query, documents, field in ((SHORT, [SHORT, CE_LONG], "documents[1]"), (CE_LONG, [SHORT], "query")):
        error = refusal(lambda q=query, d=documents: rerank(ce_server, q, d, {"truncate": False}, "xr_rerank"))
        assert (error.kind, error.field) == ("too_long", field) and ce_words(field) in error.message, error
    assert [encoder_runs(ce_server, "emb_embedding"), encoder_runs(ce_server, "xr_embedding")] == before
    cut = rerank(ce_server, SHORT, [SHORT, CE_LONG], {"truncate": True}, "xr_rerank")  # cut and said, as before
    assert cut.as_numpy("truncated").reshape(-1).tolist() == [False, True]


CE_FRONT = [  # route, body, the field named, TEI's shape
    ("/v1/embeddings", {"model": "emb", "input": ["ok", CE_LONG], "truncate": False}, "input[1]", False),
    ("/v1/rerank", {"model": "xr", "query": "q", "documents": ["a", CE_LONG], "truncate": False}, "documents[1]",
     False),
    ("/v1/rerank", {"model": "xr", "query": CE_LONG, "documents": ["a"], "truncate": False}, "query", False),
    ("/predict", {"model": "xr", "inputs": [["q", "a"], [CE_LONG, "a"]]}, "inputs[1]", True),  # a pair's query
    ("/predict", {"model": "xr", "inputs": [["fine"], [CE_LONG]]}, "inputs[1]", True),
]


@pytest.mark.parametrize("route, body, field, tei", CE_FRONT, ids=[f"{r[0]} {r[2]}" for r in CE_FRONT])
def test_the_front_over_named_exports_answers_as_before(ce_server, route, body, field, tei):
    encoder = "emb_embedding" if body["model"] == "emb" else "xr_embedding"
    before = encoder_runs(ce_server, encoder)
    with httpx.Client(base_url=ce_server.proxy_url, timeout=60) as http:
        response = http.post(route, json=body)
    error = error_of(response, 422)
    assert isinstance(response.json()["error"], str) == tei, response.text
    assert (error["code"], error["field"], error["message"]) == ("too_long", field, ce_words(field)), error
    assert encoder_runs(ce_server, encoder) == before
