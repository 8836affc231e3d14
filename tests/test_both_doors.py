"""Each rule lives in one model, so both doors give the same answer (issue 36). One table: each bad input or limit is
sent to the model over KServe HTTP and to the HTTP front's route; both must refuse it with the same kind (the
error contract's tag over KServe, `code` over HTTP), about the same field (the model's name for it, and the route's
`param`), with the status of that kind, and the message the model wrote."""
import json

import httpx
import pytest

from model_library import model_errors

OVER_LIMIT = ("too_long", "too_many")  # HTTP 422, as the proxy's own limits; the other client kinds 400
LONG_TEXT = "word " * 400  # over MiniLM's 256 tokens
DOCUMENTS_OVER = 2049  # the rerank models' max_documents is 2048


def texts(name, values, rank=2):
    return {"name": name, "datatype": "BYTES", "shape": [len(values), 1] if rank == 2 else [len(values)],
            "data": values}


# (id, KServe model, inputs, parameters, HTTP route, body, kind, the model's field, the route's param)
CASES = [
    ("empty text", "ensemble_bls", [texts("text", ["fine", "  "])], {},
     "/v1/embeddings", {"input": ["fine", "  "]}, "invalid_input", "text[1]", "input"),
    ("empty text, one", "ensemble", [texts("text", [" "])], {},
     "/v1/embeddings", {"input": " "}, "invalid_input", "text[0]", "input"),
    ("width not served", "ensemble_bls", [texts("text", ["a"])], {"dimensions": 12},
     "/v1/embeddings", {"input": ["a"], "dimensions": 12}, "not_served", "dimensions", "dimensions"),
    ("prompt not served", "ensemble_bls", [texts("text", ["a"])], {"prompt_name": "poem"},
     "/v1/embeddings", {"input": ["a"], "prompt_name": "poem"}, "not_served", "prompt_name", "prompt_name"),
    ("input type not served", "ensemble_bls", [texts("text", ["a"])], {"input_type": "poem"},
     "/v1/embeddings", {"input": ["a"], "input_type": "poem"}, "not_served", "input_type", "input_type"),
    ("empty query", "rerank", [texts("query", [" "], 1), texts("documents", ["a"], 1)], {},
     "/v1/rerank", {"query": " ", "documents": ["a"]}, "invalid_input", "query", "query"),
    ("empty document", "rerank", [texts("query", ["q"], 1), texts("documents", ["a", " "], 1)], {},
     "/v1/rerank", {"query": "q", "documents": ["a", " "]}, "invalid_input", "documents[1]", "documents"),
    ("too many documents", "rerank",
     [texts("query", ["q"], 1), texts("documents", ["d"] * DOCUMENTS_OVER, 1)], {},
     "/v1/rerank", {"query": "q", "documents": ["d"] * DOCUMENTS_OVER}, "too_many", "documents", "documents"),
    ("overlapping spans", "late_chunking",
     [texts("text", ["one two three"], 1), {"name": "spans", "datatype": "INT64", "shape": [2, 2],
                                              "data": [0, 5, 3, 8]}], {},
     "/v1/chunk_embeddings", {"input": "one two three", "spans": [[0, 5], [3, 8]]}, "invalid_input", "spans[1]",
     "spans"),
    ("no chunks asked", "late_chunking", [texts("text", ["one two three"], 1)], {},
     "/v1/chunk_embeddings", {"input": "one two three"}, "invalid_input", "spans", "spans"),
    ("text over the max length", "late_chunking", [texts("text", [LONG_TEXT], 1)], {"chunk_tokens": 8},
     "/v1/chunk_embeddings", {"input": LONG_TEXT, "chunk_tokens": 8}, "too_long", "text", "input"),
]


@pytest.fixture(scope="module")
def front(server):
    with httpx.Client(base_url=server.proxy_url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_both_doors_refuse_alike(server, front, case):
    _, model, inputs, parameters, route, body, kind, field, param = case
    kserve = httpx.post(f"http://{server.http_url}/v2/models/{model}/infer", timeout=120,
                        content=json.dumps({"inputs": inputs, "parameters": parameters}))
    assert kserve.status_code == 400, (case[0], kserve.status_code, kserve.text[:300])  # INVALID_ARG
    info = model_errors.parse(kserve.json()["error"])
    assert (info.kind, info.field) == (kind, field), (case[0], kserve.json()["error"])
    http = front.post(route, json=body)
    assert http.status_code == (422 if kind in OVER_LIMIT else 400), (case[0], http.status_code, http.text[:300])
    error = http.json()["error"]
    assert (error["code"], error["param"]) == (kind, param), (case[0], error)
    # the model's own words after the field, over both doors (the route names the field in its terms)
    assert model_errors.problem(info) in error["message"], (case[0], error["message"], info.message)
    assert "[" + kind not in error["message"], error["message"]  # the tag is for programs: HTTP carries it apart
