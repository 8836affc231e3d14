"""TEI's and Cohere's routes (issue 38) on the proxy app over the fake service (tests/proxy_fakes.py): each
answers in its dialect's shape with what the other routes answer for the same texts, refuses what it cannot serve
with a 4xx naming the field, and TEI's routes answer errors in TEI's shape and statuses. The real clients against the
real server: tests/test_drop_in_clients.py."""
import re

import numpy as np
import pytest

from model_library.in_process import model_module
from proxy_fakes import Card, error_of, fake_vectors, make_client, model_error


@pytest.fixture
def client():
    client = make_client()
    client.service.models["fake-xe"] = Card("fake-xe", "fake-xe", ("logits", "scores"), kind="cross-encoder",
                                            num_labels=1)
    return client


def openai_vectors(client, texts, **extra):
    response = client.post("/v1/embeddings", json={"input": texts, **extra})
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_tei_embed_gives_the_openai_routes_vectors(client):
    texts = ["a b", "c d e"]
    expected = openai_vectors(client, texts)
    for body in ({"inputs": texts}, {"inputs": texts, "normalize": True, "truncate": True,
                                     "truncation_direction": "Right"}):
        response = client.post("/embed", json=body)
        assert response.status_code == 200, response.text
        assert np.array_equal(np.array(response.json(), dtype=np.float32), expected)
    single = client.post("/embed", json={"inputs": "a b"}).json()
    assert len(single) == 1 and np.array_equal(np.array(single[0], dtype=np.float32), expected[0])
    assert client.service.calls[-1][2] == ("dense",)


def test_tei_normalize_false_asks_the_model_for_its_unnormalized_vectors(client):
    """Haystack's TEI embedder sends normalize: false: the model's pooled vectors before its L2 step (the fake's:
    the unit vector times 2 + its length), asked of the service as the "unnormalized" output."""
    texts = ["a b", "c d e"]
    for path in ("/embed", "/"):
        response = client.post(path, json={"inputs": texts, "normalize": False})
        assert response.status_code == 200, response.text
        got = np.array(response.json(), dtype=np.float32)
        np.testing.assert_allclose(got, [fake_vectors(t) * (2.0 + len(t)) for t in texts], rtol=1e-6)
        assert client.service.calls[-1][2] == ("unnormalized",)


def test_tei_root_answers_as_the_served_models_kind(client):
    expected = openai_vectors(client, ["a b"])
    embedded = client.post("/", json={"inputs": "a b"})  # huggingface_hub's feature_extraction
    assert embedded.status_code == 200 and np.array_equal(np.array(embedded.json(), dtype=np.float32), expected)
    reranked = client.post("/", json={"model": "fake-xe", "query": "q", "texts": ["a", "b"]})
    assert reranked.status_code == 200 and {tuple(sorted(r)) for r in reranked.json()} == {("index", "score")}


def test_tei_errors_are_teis_shape_and_status(client):
    long = " ".join(["w"] * 20)  # over the fake model's 16 tokens
    error = error_of(client.post("/embed", json={"inputs": ["ok", long]}), 422, "inputs[1]")  # truncate: TEI's false
    assert (error["type"], error["code"]) == ("Validation", "too_long")
    assert client.post("/embed", json={"inputs": ["ok", long], "truncate": True}).status_code == 200
    for body, field in (({"inputs": "x", "normalize": False, "model": "fake-m3"}, "normalize"),  # an older export
                        ({"inputs": "x", "truncation_direction": "Left"}, "truncation_direction"),
                        ({"inputs": []}, "inputs"), ({"inputs": ["ok", " "]}, "inputs")):
        assert error_of(client.post("/embed", json=body), 422)["param"] == field, body
    too_many = error_of(client.post("/embed", json={"inputs": ["x"] * 17}), 413)  # max_inputs_per_request 16
    assert too_many["code"] == "too_many"
    assert error_of(client.post("/embed", json={"inputs": "x", "model": "nope"}), 404)["type"] == "NotFound"
    assert error_of(client.post("/embed", content=b"{no", headers={"content-type": "application/json"}),
                    422)["code"] == "invalid_json"
    keyed = make_client(api_key="s3cret")
    assert error_of(keyed.post("/embed", json={"inputs": "x"}), 401)["type"] == "Unauthorized"


def test_tei_rerank_orders_by_score_and_names_texts(client):
    texts = ["red apple", "green tree", "apple pie"]
    cohere = client.post("/v1/rerank", json={"query": "apple", "documents": texts}).json()["results"]
    tei = client.post("/rerank", json={"query": "apple", "texts": texts, "return_text": True}).json()
    assert [r["index"] for r in tei] == [r["index"] for r in cohere]
    assert [r["score"] for r in tei] == pytest.approx([r["relevance_score"] for r in cohere])
    assert [r["text"] for r in tei] == [texts[r["index"]] for r in tei]
    error = error_of(client.post("/rerank", json={"query": "q", "texts": ["a", " "]}), 422, "texts[1]")
    assert (error["param"], error["type"]) == ("texts", "Validation")


def test_tei_rerank_raw_scores_are_a_cross_encoders_logits(client):
    body = {"model": "fake-xe", "query": "apple", "texts": ["red apple", "green tree"]}
    scores = {r["index"]: r["score"] for r in client.post("/rerank", json=body).json()}
    raw = {r["index"]: r["score"] for r in client.post("/rerank", json={**body, "raw_scores": True}).json()}
    for i in scores:
        assert scores[i] == pytest.approx(1 / (1 + np.exp(-raw[i])), rel=1e-6)


def test_unversioned_rerank_speaks_cohere_with_documents(client):
    """A body with Cohere's `documents` is answered as /v1/rerank; its errors, on TEI's path, in TEI's shape and
    statuses whatever the body (issue 49)."""
    body = {"query": "apple", "documents": ["red apple", "green tree"], "top_n": 1}
    answer = client.post("/rerank", json=body)
    assert answer.status_code == 200 and len(answer.json()["results"]) == 1
    error = error_of(client.post("/rerank", json={**body, "documents": ["a", ""]}), 422, "documents[1]")
    assert (error["param"], error["type"]) == ("documents", "Validation")
    assert error_of(client.post("/v1/rerank", json={**body, "documents": ["a", ""]}), 400)["type"] == \
        "invalid_request_error"  # the same body on OpenAI's path: OpenAI's shape
    for bad, param in (({**body, "documents": "x"}, "documents"), ({**body, "top_n": -1}, "top_n"),
                       ({**body, "documents": [{"text": 5}]}, "documents"), ({**body, "query": None}, "query")):
        error = error_of(client.post("/rerank", json=bad), 422)
        assert (error["param"], error["type"]) == (param, "Validation"), (bad, error)
    keyed = make_client(api_key="s3cret")
    assert error_of(keyed.post("/rerank", json=body), 401)["type"] == "Unauthorized"


def test_tei_info(client):
    info = client.get("/info").json()
    assert info["model_id"] == "fake/source" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 16 and info["max_client_batch_size"] == 16
    assert client.get("/info?model=fake-xe").json()["model_type"] == {
        "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}


def test_cohere_v1_embed_floats_and_by_type(client):
    texts = ["a b", "c"]
    expected = openai_vectors(client, texts)
    floats = client.post("/v1/embed", json={"texts": texts}).json()
    assert floats["response_type"] == "embeddings_floats" and floats["meta"]["api_version"]["version"] == "1"
    assert np.array_equal(np.array(floats["embeddings"], dtype=np.float32), expected)
    by_type = client.post("/v1/embed", json={"texts": texts, "embedding_types": ["float"]}).json()
    assert by_type["response_type"] == "embeddings_by_type"
    assert np.array_equal(np.array(by_type["embeddings"]["float"], dtype=np.float32), expected)
    assert error_of(client.post("/v1/embed", json={"texts": texts, "truncate": "START"}), 400)["param"] == "truncate"


def test_cohere_v2_rerank(client):
    texts = ["red apple", "green tree", "apple pie"]
    v1 = client.post("/v1/rerank", json={"query": "apple", "documents": texts}).json()["results"]
    v2 = client.post("/v2/rerank", json={"model": "fake-dense", "query": "apple", "documents": texts, "top_n": 2,
                                         "max_tokens_per_doc": 4096}).json()
    assert [(r["index"], r["relevance_score"]) for r in v2["results"]] == \
        [(r["index"], r["relevance_score"]) for r in v1[:2]]
    assert set(v2["results"][0]) == {"index", "relevance_score"} and v2["meta"]["api_version"]["version"] == "2"
    error = error_of(client.post("/v2/rerank", json={"query": "q", "documents": ["a"], "max_tokens_per_doc": 8}),
                     400, "16 tokens")
    assert error["param"] == "max_tokens_per_doc"


def test_unversioned_openai_routes(client):
    assert np.array_equal(openai_vectors(client, ["a"]), np.array(
        [d["embedding"] for d in client.post("/embeddings", json={"input": ["a"]}).json()["data"]], dtype=np.float32))
    assert client.get("/models").json() == client.get("/v1/models").json()
    assert client.get("/models/fake-m3").json()["id"] == "fake-m3"


def test_served_names_are_listed_and_resolve_to_their_export(client):
    card = client.service.models["fake-m3"]
    client.service.models["fake-m3"] = Card(**{**card.__dict__, "served_names": ("text-embedding-3-small",)})
    client.service.resolve = lambda model, resolve=client.service.resolve: resolve(
        "fake-m3" if model == "text-embedding-3-small" else model)
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert listed["text-embedding-3-small"]["root"] == "fake-m3" and "root" not in listed["fake-m3"]
    assert client.get("/v1/models/text-embedding-3-small").json()["id"] == "text-embedding-3-small"
    assert np.array_equal(openai_vectors(client, ["a"], model="text-embedding-3-small"),
                          openai_vectors(client, ["a"], model="fake-m3"))


def test_new_routes_are_in_the_openapi_document(client):
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {"/embed", "/", "/rerank", "/info", "/embed_sparse", "/v1/embed", "/v2/embed", "/v2/rerank", "/v1/rerank",
            "/embeddings", "/models", "/models/{model_id}"} <= paths


def test_registry_served_names_never_shadow_an_export(tmp_path):
    """Names from export.json (--served-name) and from the setting served_model_names resolve to their export; one
    that is another export's id or name is dropped, so that id keeps naming its own export."""
    import json
    from types import SimpleNamespace

    registry = model_module("proxy", "http_front.registry")

    def manifest(name, model_id, served):
        folder = tmp_path / name / "1"
        folder.mkdir(parents=True)
        (folder / "export.json").write_text(json.dumps({
            "id": model_id, "name": name, "tokenizer_model": f"{name}_t", "encoder_model": f"{name}_e",
            "bls_model": f"{name}_b", "rerank_model": f"{name}_r", "outputs": ["dense"], "max_length": 8,
            "model": model_id, "served_names": served}))
    manifest("a", "org/a", ["alias-a", "org/b"])
    manifest("b", "org/b", [])
    settings = SimpleNamespace(load_models="*", default_model="",
                               served_model_names="text-embedding-3-small=org/a, b=org/a")
    found = registry.Registry(str(tmp_path), settings)
    assert found.find("alias-a").id == found.find("text-embedding-3-small").id == "org/a"
    assert found.find("org/b").id == "org/b" and found.find("b").id == "org/b"  # an export's name wins
    assert found.find("a").served_names == ("alias-a", "text-embedding-3-small")
    with pytest.raises(ValueError, match="name=export-id"):
        registry.served_names("alias-only")


# ---------------------------------------------------------------- TEI's /predict, /similarity, /tokenize, /decode
def test_tei_predict_reads_texts_pairs_and_batches(client):
    """A string is one input, a list of strings one input of one or two texts, a list of lists a batch; every label
    comes back, best first, named as the export recorded (LABEL_i where it did not)."""
    client.service.models["fake-cls"] = Card("fake-cls", "fake-cls", ("logits", "scores"), kind="cross-encoder",
                                             num_labels=3, labels=("neg", "neutral", "pos"))
    one = client.post("/predict", json={"model": "fake-cls", "inputs": "a b"})
    assert one.status_code == 200, one.text
    assert sorted(p["label"] for p in one.json()) == ["neg", "neutral", "pos"]
    assert [p["score"] for p in one.json()] == sorted((p["score"] for p in one.json()), reverse=True)
    assert abs(sum(p["score"] for p in one.json()) - 1) < 1e-5  # softmax over the labels
    assert client.service.calls[-1][1] == [("a b",)]
    pair = client.post("/predict", json={"model": "fake-cls", "inputs": ["q", "d"]}).json()
    assert isinstance(pair[0], dict) and client.service.calls[-1][1] == [("q", "d")]
    batch = client.post("/predict", json={"model": "fake-xe", "inputs": [["a"], ["q", "d"]], "raw_scores": True})
    assert batch.status_code == 200 and [len(row) for row in batch.json()] == [1, 1]
    assert batch.json()[0][0]["label"] == "LABEL_0"
    assert client.service.calls[-1][1] == [("a",), ("q", "d")]
    assert error_of(client.post("/predict", json={"model": "fake-cls", "inputs": [["a", "b", "c"]]}), 422,
                    "inputs[0]")["param"] == "inputs"
    assert error_of(client.post("/predict", json={"inputs": "a"}), 422)["param"] == "model"  # an embedding model
    assert error_of(client.post("/predict", json={"model": "fake-cls", "inputs": [["a"], ["x" * 201, "d"]]}),
                    422, "inputs[1]")["code"] == "too_long"
    root = client.post("/", json={"model": "fake-cls", "inputs": "a b"})  # a classifier's root: /predict
    assert root.status_code == 200 and root.json() == one.json()


def test_tei_similarity_is_the_rerank_models_dense_score(client):
    expected = [float(np.dot(openai_vectors(client, ["s"])[0], v)) for v in openai_vectors(client, ["a", "b c"])]
    body = {"inputs": {"source_sentence": "s", "sentences": ["a", "b c"]}, "parameters": {"prompt_name": "query"}}
    response = client.post("/similarity", json=body)
    assert response.status_code == 200, response.text
    assert np.allclose(response.json(), expected, atol=1e-6)
    assert client.service.calls[-1] == ("fake-dense", ["s", "a", "b c"], (1.0, 0.0, 0.0))
    assert client.post("/", json=body).json() == response.json()  # sentence_similarity posts to the root
    error = error_of(client.post("/similarity", json={"inputs": {"source_sentence": "s", "sentences": ["a", " "]}}),
                     422, "inputs.sentences[1]")
    assert error["param"] == "inputs.sentences"
    assert error_of(client.post("/similarity", json={"model": "fake-xe", **body}), 422)["param"] == "model"


def test_tei_tokenize_and_decode_answer_in_teis_shape(client):
    tokens = client.post("/tokenize", json={"inputs": "héllo world"})
    assert tokens.status_code == 200, tokens.text
    assert [(t["text"], t["special"], t["start"], t["stop"]) for t in tokens.json()[0]] == [
        ("<s>", True, None, None), ("héllo", False, 0, 6), ("world", False, 7, 12), ("</s>", True, None, None)]
    assert client.service.calls[-1][3] == {"add_special_tokens": True, "prompt_name": None}
    assert error_of(client.post("/tokenize", json={"inputs": ["a", " "]}), 422, "inputs[1]")["param"] == "inputs"
    assert client.post("/decode", json={"ids": [1, 2]}).json() == ["1 2"]
    assert client.post("/decode", json={"ids": [[1], [2, 3]], "skip_special_tokens": False}).json() == ["1", "2 3"]
    assert client.service.calls[-1][3] == {"skip_special_tokens": False}
    assert error_of(client.post("/decode", json={"ids": [[1], [1000]]}), 422, "ids[1]")["param"] == "ids"
    assert error_of(client.post("/decode", json={"ids": [[1]] * 17}), 413)["code"] == "too_many"
    assert error_of(client.post("/decode", json={"ids": [-1]}), 422)["param"] == "ids"


# ---------------------------------------------------------------- issue 49: the TEI surface agrees with itself
def tei_error(response, status, *words):
    """TEI's error body ({error, error_type} and ours, code and param) with `status`; its fields as error_of's."""
    assert response.status_code == status, response.text
    assert isinstance(response.json()["error"], str), response.text  # TEI's shape, never OpenAI's
    return error_of(response, status, *words)


def too_many_documents(client):
    """The rerank model's answer to more documents than its max_documents (the fake counts none itself)."""
    async def rerank(card, query, documents, weights, parameters=None):
        raise model_error("too_many", "documents", f"holds {len(documents)} documents, over the limit of 16 (rerank "
                                                   f"parameter max_documents)", card, None)
    client.service.rerank = rerank


def test_tei_too_many_inputs_is_413_on_every_tei_route(client):
    """One status per error kind on TEI's routes: too many inputs is TEI's documented 413 (Validation) on every
    route, the proxy's own count (max_inputs_per_request 16 here) as the rerank model's (max_documents)."""
    many = ["x"] * 17
    for path, body in (("/embed", {"inputs": many}), ("/", {"inputs": many}), ("/embed_all", {"inputs": many}),
                       ("/embed_sparse", {"inputs": many, "model": "fake-m3"}),
                       ("/predict", {"inputs": [[t] for t in many], "model": "fake-xe"}),
                       ("/tokenize", {"inputs": many}), ("/decode", {"ids": [[1]] * 17})):
        error = tei_error(client.post(path, json=body), 413, "17 inputs", "max_inputs_per_request")
        assert (error["type"], error["code"]) == ("Validation", "too_many"), path
    too_many_documents(client)
    for path, body, param in (("/rerank", {"query": "q", "texts": many}, "texts"),
                              ("/rerank", {"query": "q", "documents": many}, "documents"),
                              ("/similarity", {"inputs": {"source_sentence": "q", "sentences": many}},
                               "inputs.sentences")):
        error = tei_error(client.post(path, json=body), 413, "17 documents", "max_documents")
        assert (error["type"], error["param"]) == ("Validation", param), (path, body)
    # OpenAI's and Cohere's paths keep their 422
    assert error_of(client.post("/v1/rerank", json={"query": "q", "documents": many}), 422)["code"] == "too_many"
    assert error_of(client.post("/v1/embeddings", json={"input": many}), 422)["code"] == "too_many"


def test_tei_truncate_is_false_unless_asked_on_every_route(client):
    """TEI's routes cut an over-long input only when asked (truncate true): /embed_sparse as the others."""
    long = " ".join(["w"] * 20)  # over the fake models' 16 tokens
    for path, body, field in (
            ("/embed_sparse", {"inputs": ["ok", long], "model": "fake-m3"}, "inputs[1]"),
            ("/embed", {"inputs": ["ok", long]}, "inputs[1]"),
            ("/rerank", {"query": "q", "texts": ["ok", long]}, "texts[1]"),
            ("/similarity", {"inputs": {"source_sentence": "q", "sentences": ["ok", long]}}, "inputs.sentences[1]"),
            ("/predict", {"inputs": [["ok"], [long]], "model": "fake-xe"}, "inputs[1]")):
        error = tei_error(client.post(path, json=body), 422, field, "truncate is false")
        assert error["code"] == "too_long", path
        if path == "/similarity":
            body = {**body, "parameters": {"truncate": True}}
        else:
            body = {**body, "truncate": True}
        cut = client.post(path, json=body)
        assert cut.status_code == 200 and cut.headers["x-truncated-inputs"] == "1", (path, cut.text)
    sparse = client.post("/embed_sparse", json={"inputs": "a b", "model": "fake-m3", "truncate": False})
    assert sparse.status_code == 200 and sparse.headers["x-truncated-inputs"] == "0"
    assert tei_error(client.post("/embed_sparse", json={"inputs": "x", "model": "fake-m3",
                                                        "truncation_direction": "Left"}), 422)["param"] == \
        "truncation_direction"


def with_token_vectors(client, width=None):
    """The fake service's embed with the BLS model's token_embeddings: one `width` vector per token."""
    original = client.service.embed

    async def embed(card, texts, outputs, param, parameters=None):
        result = await original(card, texts, outputs, param, parameters)
        result.token_vectors = [np.ones((int(n), width or card.embedding_size), np.float32) for n in result.tokens]
        return result
    client.service.embed = embed


def test_tei_embed_all_answer_is_bounded_before_the_work():
    """/embed_all's answer (tokens x hidden size numbers) is bounded by max_embed_all_numbers: over it a 413 naming
    `inputs` and the setting, decided before the encoder runs (no embed call); inputs that fit at the model's max
    length need no count, others are counted by the tokenizer model."""
    client = make_client(max_embed_all_numbers=200)  # the fake: max length 16, hidden 8 -> 128 numbers per input
    with_token_vectors(client)
    one = client.post("/embed_all", json={"inputs": "a b"})
    assert one.status_code == 200 and np.asarray(one.json()).shape == (1, 4, 8)
    assert [call[2] for call in client.service.calls] == [("tokens",)]  # 128 <= 200: no count needed
    two = client.post("/embed_all", json={"inputs": ["a b", "c d"]})  # 256 at most: counted, 2 x 4 x 8 = 64
    assert two.status_code == 200 and [call[2] for call in client.service.calls[1:]] == ["tokenize", ("tokens",)]
    calls = len(client.service.calls)
    words = " ".join(["w"] * 8)  # 10 tokens each: 3 x 10 x 8 = 240
    error = tei_error(client.post("/embed_all", json={"inputs": [words] * 3}), 413, "240 numbers",
                      "max_embed_all_numbers")
    assert (error["param"], error["code"], error["type"]) == ("inputs", "answer_too_large", "Validation")
    assert [call[2] for call in client.service.calls[calls:]] == ["tokenize"]  # refused before the encoder
    wide = make_client(max_embed_all_numbers=200)
    with_token_vectors(wide, width=64)  # wider than the export's embedding size: the answer itself is checked too
    tei_error(wide.post("/embed_all", json={"inputs": "a b"}), 413, "4 tokens x 64", "max_embed_all_numbers")


def test_tei_decode_refuses_empty_rows_and_rows_over_the_limit(client):
    """/decode: an empty list or row is a 422 naming it (TEI decodes it to ""); a row over max_input_chars ids (200
    here) is a 422 naming it; the count of rows is TEI's 413."""
    for body, field in (({"ids": []}, "ids"), ({"ids": [[]]}, "ids[0]"), ({"ids": [[1], []]}, "ids[1]")):
        error = tei_error(client.post("/decode", json=body), 422, f"{field} is empty")
        assert (error["param"], error["code"], error["type"]) == ("ids", "invalid_input", "Validation"), body
    for body, field in (({"ids": [1] * 201}, "ids"), ({"ids": [[1], [1] * 201]}, "ids[1]")):
        error = tei_error(client.post("/decode", json=body), 422, f"{field} holds 201 ids", "max_input_chars")
        assert (error["param"], error["code"]) == ("ids", "too_long"), body
    assert client.post("/decode", json={"ids": [1] * 200}).status_code == 200
    assert all(call[2] != "decode" or call[1] == [[1] * 200] for call in client.service.calls)  # none sent before


VALIDATOR_WORDS = re.compile(r"constrained|function-|union\[|list\[|lax-or-strict|json-or-python|TextItem|ImageItem|"
                             r"RerankDocument|\.str\b|\.int\b")


@pytest.mark.parametrize("path, body, status, field", [
    ("/decode", {"ids": ["a"]}, 422, "ids[0]"), ("/decode", {"ids": [-1]}, 422, "ids[0]"),
    ("/decode", {"ids": [[1], ["x"]]}, 422, "ids[1][0]"),
    ("/embed", {"inputs": [1]}, 422, "inputs[0]"), ("/predict", {"inputs": [[1]]}, 422, "inputs[0][0]"),
    ("/similarity", {"inputs": {"source_sentence": 1, "sentences": ["a"]}}, 422, "inputs.source_sentence"),
    ("/rerank", {"query": "q", "documents": [{"text": 5}]}, 422, "documents[0].text"),
    ("/v1/embeddings", {"input": [{"image": 1}]}, 400, "input[0]"),
    ("/v1/rerank", {"query": "q", "documents": [{"text": 5}]}, 400, "documents[0].text"),
    ("/v1/chunk_embeddings", {"input": "x", "spans": [[-1, 2]]}, 400, "spans[0][0]"),
    ("/v2/embed", {"texts": [1]}, 400, "texts[0]"), ("/v1/embedding", [{"query": 5}], 400, "body[0].query")])
def test_validation_errors_name_the_clients_fields(client, path, body, status, field):
    """A validation error's message names each field as the client wrote it, never pydantic's validator parts
    (`ids.list[constrained-int].0`), in every dialect."""
    error = error_of(client.post(path, json=body), status, field)
    assert not VALIDATOR_WORDS.search(error["message"]), error["message"]
    expected = "query" if field.startswith("body") else re.split(r"[.\[]", field)[0]  # a list body: its items' field
    assert error["param"] == expected, error
