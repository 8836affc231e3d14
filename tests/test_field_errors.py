"""The HTTP front answers no number with a 500, and every error names the field the client sent, in its route's
vocabulary (issue 41). One table, sent to the app over the fake service (every case, fast) and to the real server
(the cases that reached Triton), with the KServe twin of each case that has one: a 4xx naming the field, never a 5xx.
"""
import json
from urllib.parse import quote

import httpx
import pytest

from proxy_fakes import CLIP, PNG, b64, make_client

BIG = [2**63, 2**64 - 1]  # from 2^63 up they passed validation and failed inside Triton (Unsupported value type)
ADMIN_KEY = "admin"

# (route, body, status, param, words in the message); model None: the server's default export
CASES = [
    *[("/v1/embeddings", {"input": ["a"], "dimensions": n}, 400, "dimensions", ["dimensions"]) for n in BIG],
    *[("/v2/embed", {"texts": ["a"], "output_dimension": n}, 400, "output_dimension", ["output_dimension"])
      for n in BIG],
    *[("/v1/chunk_embeddings", {"input": "one text. two.", "chunk_tokens": n}, 400, "chunk_tokens",
       ["chunk_tokens"]) for n in BIG],
    ("/v1/chunk_embeddings", {"input": "one text. two.", "spans": [[0, 2**63]]}, 400, "spans", ["spans"]),
    ("/v1/chunk_embeddings", {"input": "one text. two.", "spans": [[-1, 3]]}, 400, "spans", ["spans"]),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 2**63}, 400, "top_n", ["top_n"]),
    # Cohere's routes name Cohere's field, not OpenAI's `dimensions`
    ("/v2/embed", {"texts": ["a"], "output_dimension": 0}, 400, "output_dimension", ["output_dimension"]),
    ("/v2/embed", {"texts": ["a"], "output_dimension": 12}, 400, "output_dimension", ["output_dimension 12"]),
    # lone surrogates: the text's index
    ("/v1/embeddings", {"input": ["fine", "\ud800"]}, 400, "input", ["input[1] is not valid Unicode"]),
    ("/v2/embed", {"texts": ["\udfff x"]}, 400, "texts", ["texts[0] is not valid Unicode"]),
    ("/v1/rerank", {"query": "q\ud800", "documents": ["a"]}, 400, "query", ["query is not valid Unicode"]),
    ("/v1/rerank", {"query": "q", "documents": ["a", "\ud800"]}, 400, "documents", ["documents[1]"]),
]
M3_CASES = [  # a bge-m3 export's route
    *[("/v1/encode", {"input": ["a"], "return_colbert": True, "colbert_pool_factor": n}, 400, "colbert_pool_factor",
       ["colbert_pool_factor"]) for n in BIG],
]
DENSE_ONLY_CASES = [  # /v1/encode names the flag that asked for an output the model lacks
    ("/v1/encode", {"input": ["a"], "return_colbert": True}, 400, "return_colbert", ["not colbert"]),
    ("/v1/encode", {"input": ["a"], "return_sparse": True}, 400, "return_sparse", ["not sparse"]),
]
CLIP_CASES = [  # a data URI must be of an image type
    ("/v1/embeddings", {"input": [{"image": "data:text/plain;base64," + b64(PNG)}]}, 400, "input",
     ["input[0] is a data URI of text/plain"]),
    ("/infer", {"image": ["data:;base64," + b64(PNG)]}, 400, "image", ["image[0] is a data URI of text/plain"]),
]


def check(response, status, param, words, case):
    assert response.status_code == status, (case, response.status_code, response.text[:400])
    assert response.headers["content-type"].startswith("application/json"), (case, response.text[:200])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code", "field"}, (case, error)
    assert error["param"] == param, (case, error)
    assert all(word in error["message"] for word in words), (case, error)


def send(client, route, body, model=None):
    body = {**body, **({"model": model} if model else {})}
    return client.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})


# ---------------------------------------------------------------- the app over the fake service (every case)
@pytest.mark.parametrize("case", CASES + M3_CASES + DENSE_ONLY_CASES, ids=lambda c: f"{c[0]} {c[3]}")
def test_each_case_is_a_400_naming_the_clients_field(case):
    route, body, status, param, words = case
    client = make_client()
    model = "fake-m3" if case in M3_CASES else "fake-dense" if case in DENSE_ONLY_CASES else None
    check(send(client, route, body, model), status, param, words, case)
    assert send(client, "/v1/embeddings", {"input": ["still serving"]}).status_code == 200


@pytest.mark.parametrize("case", CLIP_CASES, ids=lambda c: c[0])
def test_a_data_uri_of_another_media_type_is_a_400_naming_the_item(case):
    route, body, status, param, words = case
    client = make_client()
    client.service.models["fake-clip"] = CLIP
    check(send(client, route, body, "fake-clip"), status, param, words, case)


@pytest.mark.parametrize("model_id", ["../../etc/passwd", "nul\x00byte", "x" * 10_000])
def test_metrics_label_only_exports_that_exist(model_id):
    """An admin request for an id no export has is counted under one fixed label, never under the id it sent."""
    client = make_client(admin_api_key=ADMIN_KEY)
    client.post(f"/v1/models/{quote(model_id, safe='')}/load", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    metrics = client.get("/metrics").text
    assert 'model="(unknown)"' in metrics
    assert model_id not in metrics and "passwd" not in metrics and "xxxxxxxxxx" not in metrics
    client.post("/v1/models/fake-m3/unload", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert 'model="fake-m3",route="/v1/models/{model_id}/unload"' in client.get("/metrics").text


# ---------------------------------------------------------------- the real server, and the KServe twins
@pytest.fixture(scope="module")
def front(server):
    with httpx.Client(base_url=server.proxy_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("case", CASES + DENSE_ONLY_CASES, ids=lambda c: f"{c[0]} {c[3]}")
def test_the_real_server_answers_each_case_alike(server, front, case):
    route, body, status, param, words = case
    check(send(front, route, body), status, param, words, case)


def kserve(server, model, parameters):
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1] if model == "late_chunking" else [1, 1],
                        "data": ["one text. two."]}], "parameters": parameters}
    return httpx.post(f"http://{server.http_url}/v2/models/{model}/infer", content=json.dumps(body), timeout=60)


@pytest.mark.parametrize("model, field", [("ensemble_bls", "dimensions"), ("late_chunking", "chunk_tokens")])
@pytest.mark.parametrize("value", BIG + [0])
def test_kserve_twins_refuse_the_same_numbers_with_a_4xx(server, model, field, value):
    """KServe clients send the parameter as they like: a 400 naming it (Triton's parser or the model's), never a
    5xx, and the model serves on."""
    response = kserve(server, model, {field: value})
    assert response.status_code == 400, (model, field, value, response.text[:300])
    assert field in response.json()["error"] or "parameters" in response.json()["error"], response.text[:300]
    good = kserve(server, model, {"chunk_tokens": 8} if model == "late_chunking" else {})
    assert good.status_code == 200, good.text[:300]
