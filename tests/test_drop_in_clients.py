"""Clients nobody here wrote, pointed at the HTTP front as their own docs say to point them at a server of their kind
(issue 38), against the real server: huggingface_hub's InferenceClient, LlamaIndex's TextEmbeddingsInference and
LangChain's HuggingFaceEndpointEmbeddings (TEI's API), Cohere's SDK v2 and v1 (embed, rerank, tokenize), the OpenAI SDK
with a hard-coded model name (a served name); then TEI's other routes in their raw shapes. Every vector and score is
compared with the same models called directly over KServe gRPC.

The server is the cross-encoder one (tests/conftest.py ce_server): named exports only, `emb` (a tiny XLM-R embedder,
the default, served also as text-embedding-3-small by its export) beside the cross-encoders `xr` (served also as
rerank-v3.5 by the setting) and `bert2`."""
import os

import httpx
import numpy as np
import pytest

from conftest import CE_SERVED_NAMES
from triton_clients import client, cosine, infer, rerank, text_input, url_for

TEXTS = ["The capital of France is Paris.", "Der Eiffelturm steht in Paris.", "寿司は日本の料理です。",
         "a", "Rivers flow to the sea " * 8, "print('hello')  # code is text too"]
QUERY = "Where is the Eiffel tower?"
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def proxy(ce_server):
    return ce_server.proxy_url


@pytest.fixture(scope="module")
def direct_vectors(ce_server):
    """emb's vectors of TEXTS over KServe gRPC, one text per request (no padding beside another text)."""
    return np.concatenate([infer("grpc", url_for(ce_server, "grpc"), [text], model="emb",
                                 names=("embedding",))["embedding"] for text in TEXTS])


def direct_scores(server, query, documents, output="scores", model="xr_rerank"):
    """The rerank model over KServe gRPC, as tests/test_cross_encoder.py calls it."""
    return rerank("grpc", server, query, documents, model)[output]


def assert_same_vectors(got, expected, what):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    assert cosine(got, expected).min() >= MIN_COSINE, what


def test_huggingface_hub_inference_client(proxy, direct_vectors):
    """InferenceClient(base_url).feature_extraction posts TEI's body to the server's root."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=proxy)
    rows = [client.feature_extraction(text) for text in TEXTS]
    assert all(row.shape == (1, direct_vectors.shape[1]) for row in rows)
    assert_same_vectors(np.concatenate(rows), direct_vectors, "huggingface_hub feature_extraction")
    truncated = client.feature_extraction(TEXTS[4] * 40, truncate=True)  # over the 128 tokens: cut, as asked
    assert truncated.shape == (1, direct_vectors.shape[1])
    with pytest.raises(Exception) as refused:  # TEI's default: an over-long text is a 422, not cut silently
        client.feature_extraction(TEXTS[4] * 40)
    assert "422" in str(refused.value)


def test_tei_normalize_false_is_the_graphs_pooled_vector_through_both_doors(ce_server, proxy, direct_vectors):
    """Haystack's HuggingFaceAPITextEmbedder sends `normalize: false` (huggingface_hub's feature_extraction): the
    pooled vector before the graph's L2 step, as KServe's `embedding_unnormalized` gives it, on a named export with
    a cross-encoder loaded beside it; normalized, it is the usual vector. One text (the ensemble) and a batch (the
    BLS model) alike."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=proxy)
    kserve = np.concatenate([infer("grpc", url_for(ce_server, "grpc"), [text], model="emb",
                                   names=("embedding_unnormalized",))["embedding_unnormalized"] for text in TEXTS])
    norms = np.linalg.norm(kserve, axis=1)
    assert np.all(np.abs(norms - 1) > 1e-3), norms  # not unit vectors: the pooled ones
    np.testing.assert_allclose(kserve / norms[:, None], direct_vectors, atol=1e-5)
    one = np.concatenate([client.feature_extraction(text, normalize=False) for text in TEXTS])
    np.testing.assert_allclose(one, kserve, rtol=1e-4, atol=1e-5)
    with httpx.Client(base_url=proxy, timeout=60) as http:
        batch = http.post("/embed", json={"inputs": TEXTS, "normalize": False})
        assert batch.status_code == 200, batch.text
        np.testing.assert_allclose(np.array(batch.json(), dtype=np.float32), kserve, rtol=1e-4, atol=1e-5)
        normalized = http.post("/embed", json={"inputs": TEXTS, "normalize": True}).json()
    assert_same_vectors(normalized, direct_vectors, "TEI /embed normalize true")


def test_llama_index_tei_embedding(proxy, direct_vectors):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embedder = TextEmbeddingsInference(model_name="emb", base_url=proxy, timeout=60, embed_batch_size=4)
    assert_same_vectors(embedder.get_text_embedding_batch(TEXTS), direct_vectors, "LlamaIndex TEI batch")
    assert_same_vectors([embedder.get_query_embedding(TEXTS[0])], direct_vectors[:1], "LlamaIndex TEI query")


def test_langchain_huggingface_endpoint_embeddings(proxy, direct_vectors):
    """LangChain's TEI client: HuggingFaceEndpointEmbeddings(model=<the server's URL>) posts to the root."""
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    embedder = HuggingFaceEndpointEmbeddings(model=proxy, huggingfacehub_api_token="unused")
    assert_same_vectors(embedder.embed_documents(TEXTS), direct_vectors, "LangChain embed_documents")
    assert_same_vectors([embedder.embed_query(TEXTS[1])], direct_vectors[1:2], "LangChain embed_query")


def test_cohere_v2_embed_and_rerank_by_served_names(ce_server, proxy, direct_vectors):
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=proxy)
    embedded = client.embed(texts=TEXTS, model=CE_SERVED_NAMES["emb"][0], input_type="search_document",
                            embedding_types=["float"])
    assert_same_vectors(embedded.embeddings.float_, direct_vectors, "Cohere v2 embed")
    ranked = client.rerank(model=CE_SERVED_NAMES["xr"][0], query=QUERY, documents=TEXTS, top_n=4)
    expected = direct_scores(ce_server, QUERY, TEXTS)
    assert [r.index for r in ranked.results] == list(np.argsort(-expected, kind="stable")[:4])
    for result in ranked.results:
        assert result.relevance_score == pytest.approx(float(expected[result.index]), abs=1e-6)


def test_cohere_v1_embed_and_rerank(ce_server, proxy, direct_vectors):
    import cohere

    client = cohere.Client(api_key="unused", base_url=proxy)
    embedded = client.embed(texts=TEXTS, model="emb", input_type="search_document")
    assert embedded.response_type == "embeddings_floats"
    assert_same_vectors(embedded.embeddings, direct_vectors, "Cohere v1 embed")
    ranked = client.rerank(model="xr", query=QUERY, documents=TEXTS, top_n=2)
    expected = direct_scores(ce_server, QUERY, TEXTS)
    assert [r.index for r in ranked.results] == list(np.argsort(-expected, kind="stable")[:2])
    assert ranked.results[0].relevance_score == pytest.approx(float(expected.max()), abs=1e-6)


def test_cohere_tokenize_as_its_sdk_tokenizes(ce_server, proxy):
    """Cohere's Client.tokenize (its offline default asks GET /v1/models/{model} for a tokenizer file, finds none and
    posts /v1/tokenize): emb's own ids without special tokens, as the SDK's local tokenizer encodes, and each
    token's text; an empty text is Cohere's 400 naming `text`."""
    import cohere

    hf = emb_tokenizer(ce_server)
    client = cohere.Client(api_key="unused", base_url=proxy)
    for text, offline in ((TEXTS[0], True), (TEXTS[2], False)):
        answer = client.tokenize(text=text, model="emb", offline=offline)
        expected = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert answer.tokens == expected["input_ids"], text
        assert answer.token_strings == [text[start:stop] for start, stop in expected["offset_mapping"]], text
    with pytest.raises(cohere.BadRequestError) as refused:
        client.tokenize(text="", model="emb", offline=False)
    body = refused.value.body
    assert (body["error"]["code"], body["error"]["field"], body["message"]) == ("invalid_input", "text",
                                                                               "text is empty")


def test_openai_sdk_with_a_hard_coded_model_name(proxy, direct_vectors):
    import openai

    sdk = openai.OpenAI(base_url=proxy + "/v1", api_key="unused", max_retries=0)
    result = sdk.embeddings.create(model=CE_SERVED_NAMES["emb"][0], input=TEXTS)
    assert_same_vectors([d.embedding for d in result.data], direct_vectors, "OpenAI SDK, served name")
    listed = {m.id for m in sdk.models.list().data}
    assert {"emb", "xr", "bert2", *CE_SERVED_NAMES["emb"], *CE_SERVED_NAMES["xr"]} <= listed
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="text-embedding-ada-002", input=["x"])  # no such name: 404, as OpenAI answers


def test_tei_rerank_raw_and_normalized_scores_on_a_named_cross_encoder(ce_server, proxy):
    """TEI's /rerank body on `xr` (the body's model) and `bert2`: scores as the rerank model's KServe outputs."""
    for model in ("xr", "bert2"):
        for raw in (False, True):
            response = httpx.post(proxy + "/rerank", json={"model": model, "query": QUERY, "texts": TEXTS,
                                                           "raw_scores": raw, "return_text": True}, timeout=60)
            assert response.status_code == 200, response.text
            expected = direct_scores(ce_server, QUERY, TEXTS, "logits" if raw else "scores", f"{model}_rerank")
            answer = response.json()
            assert [r["index"] for r in answer] == list(np.argsort(-expected, kind="stable"))
            assert [r["score"] for r in answer] == pytest.approx([float(expected[r["index"]]) for r in answer],
                                                                abs=1e-6)
            assert all(r["text"] == TEXTS[r["index"]] for r in answer)


def test_tei_raw_shapes_and_errors(proxy, direct_vectors):
    """TEI's published examples: /embed with a string and a list, /info, and TEI's error body."""
    single = httpx.post(proxy + "/embed", json={"inputs": TEXTS[0]}, timeout=60).json()
    assert_same_vectors(single, direct_vectors[:1], "/embed, a string")
    info = httpx.get(proxy + "/info", timeout=10).json()
    assert info["model_type"] == {"embedding": {"pooling": "cls"}} and info["max_input_length"] == 128
    assert httpx.get(proxy + "/info?model=bert2", timeout=10).json()["model_type"] == {
        "classifier": {"id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}}}
    empty = httpx.post(proxy + "/embed", json={"inputs": ["ok", ""]}, timeout=60)
    assert empty.status_code == 422 and empty.json()["error_type"] == "Validation"
    assert empty.json()["error"].startswith("inputs[1]") and empty.json()["param"] == "inputs"
    root = httpx.post(proxy + "/", json={"model": "xr", "query": QUERY, "texts": TEXTS[:2]}, timeout=60)
    assert root.status_code == 200 and {r["index"] for r in root.json()} == {0, 1}  # a cross-encoder: /rerank


# ---------------------------------------------------------------- TEI's other routes (issue 38's rest)
def emb_tokenizer(ce_server):
    """emb's own tokenizer.json, as Hugging Face's fast tokenizer reads it (no truncation)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(ce_server.repository, "emb_tokenizer", "1",
                                                               "tokenizer.json"))


def test_tei_tokenize_and_decode_as_hugging_face_tokenizes(ce_server, proxy):
    """/tokenize lists every token (not truncated: the long text passes emb's 128 tokens) with the text of its bytes;
    /decode gives back what Hugging Face's decode gives."""
    hf = emb_tokenizer(ce_server)
    texts = TEXTS + ["Über die Brücke — 東京 🚀 " * 30]
    answer = httpx.post(proxy + "/tokenize", json={"inputs": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    for text, tokens in zip(texts, answer.json()):
        expected = hf(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert [t["id"] for t in tokens] == expected["input_ids"], text[:30]
        assert [t["special"] for t in tokens] == [bool(m) for m in expected["special_tokens_mask"]]
        data = text.encode("utf-8")
        for token, (start, stop), special in zip(tokens, expected["offset_mapping"], expected["special_tokens_mask"]):
            if special:
                assert token["start"] is None and token["text"] == hf.convert_ids_to_tokens(token["id"])
            else:  # TEI's offsets count bytes; Hugging Face's count characters
                assert (token["start"], token["stop"]) == (len(text[:start].encode()), len(text[:stop].encode()))
                assert token["text"] == data[token["start"]:token["stop"]].decode("utf-8", "replace")
    assert len(answer.json()[-1]) > 128  # not cut to max_length
    plain = httpx.post(proxy + "/tokenize", json={"inputs": TEXTS[0], "add_special_tokens": False}, timeout=60).json()
    assert [t["id"] for t in plain[0]] == hf(TEXTS[0], add_special_tokens=False)["input_ids"]

    ids = [hf(text)["input_ids"] for text in texts]
    decoded = httpx.post(proxy + "/decode", json={"ids": ids}, timeout=60).json()
    assert decoded == [hf.decode(row, skip_special_tokens=True) for row in ids]
    kept = httpx.post(proxy + "/decode", json={"ids": ids[0], "skip_special_tokens": False}, timeout=60).json()
    assert kept == [hf.decode(ids[0], skip_special_tokens=False)]
    bert = httpx.post(proxy + "/decode", json={"ids": [101, 7592, 102], "model": "bert2"}, timeout=60).json()
    assert bert == ["hello"]  # another export's own vocabulary


def test_tei_embed_all_is_the_encoders_token_vectors(ce_server, proxy, direct_vectors):
    """/embed_all: one vector per token (special tokens included); emb pools by CLS, so each text's first token
    vector, normalized, is its /embed vector."""
    hf = emb_tokenizer(ce_server)
    answer = httpx.post(proxy + "/embed_all", json={"inputs": TEXTS}, timeout=60)
    assert answer.status_code == 200, answer.text
    for i, (text, vectors) in enumerate(zip(TEXTS, answer.json())):
        vectors = np.asarray(vectors, dtype=np.float32)
        assert vectors.shape == (len(hf(text)["input_ids"]), direct_vectors.shape[1]), text[:30]
        assert cosine(vectors[:1], direct_vectors[i:i + 1]).min() >= MIN_COSINE
    one = httpx.post(proxy + "/embed_all", json={"inputs": TEXTS[1]}, timeout=60).json()  # alone: no padding
    assert np.allclose(one[0], answer.json()[1], atol=1e-5)
    long = httpx.post(proxy + "/embed_all", json={"inputs": TEXTS[4] * 40}, timeout=60)
    assert long.status_code == 422 and long.json()["error_type"] == "Validation"  # TEI's default: not cut
    cut = httpx.post(proxy + "/embed_all", json={"inputs": TEXTS[4] * 40, "truncate": True}, timeout=60).json()
    assert len(cut[0]) == 128
    refused = httpx.post(proxy + "/embed_all", json={"inputs": "x", "model": "xr"}, timeout=60)
    assert refused.status_code == 422 and refused.json()["param"] == "model", refused.text


def direct_classifier(server, model, texts, firsts=None):
    """A cross-encoder's BLS model over KServe gRPC: (logits, scores) [n, labels]; firsts: each pair's first text."""
    import tritonclient.grpc as grpcclient

    connection = client("grpc", url_for(server, "grpc"))
    try:
        inputs = [text_input("grpc", texts)]
        if firsts is not None:
            query = grpcclient.InferInput("query", [len(firsts), 1], "BYTES")
            query.set_data_from_numpy(np.array([[t.encode()] for t in firsts], dtype=np.object_))
            inputs.append(query)
        result = connection.infer(f"{model}_bls", inputs, outputs=[grpcclient.InferRequestedOutput(n)
                                                                   for n in ("logits", "scores")])
        return result.as_numpy("logits"), result.as_numpy("scores")
    finally:
        connection.close()


def test_tei_predict_on_a_classifier_and_a_reranker(ce_server, proxy):
    """/predict: every label's score, best first, equal to the cross-encoder's BLS model over KServe; a pair is the
    rerank model's (query, document) pair."""
    logits, scores = direct_classifier(ce_server, "bert2", TEXTS[:3])
    answer = httpx.post(proxy + "/predict", json={"model": "bert2", "inputs": [[t] for t in TEXTS[:3]]}, timeout=60)
    assert answer.status_code == 200, answer.text
    for row, expected in zip(answer.json(), scores):
        assert [p["label"] for p in row] == [f"LABEL_{k}" for k in np.argsort(-expected, kind="stable")]
        assert [p["score"] for p in row] == pytest.approx(sorted(expected.tolist(), reverse=True), abs=1e-6)
    single = httpx.post(proxy + "/predict", json={"model": "bert2", "inputs": TEXTS[0], "raw_scores": True},
                        timeout=60).json()
    assert {p["label"]: p["score"] for p in single} == pytest.approx(
        {f"LABEL_{k}": float(v) for k, v in enumerate(logits[0])}, abs=1e-6)
    pair_logits, pair_scores = direct_classifier(ce_server, "bert2", [TEXTS[1]], [QUERY])
    mixed = httpx.post(proxy + "/predict", json={"model": "bert2", "inputs": [[TEXTS[0]], [QUERY, TEXTS[1]]]},
                       timeout=60).json()
    assert max(p["score"] for p in mixed[0]) == pytest.approx(float(scores[0].max()), abs=1e-6)
    assert max(p["score"] for p in mixed[1]) == pytest.approx(float(pair_scores[0].max()), abs=1e-6)

    expected = direct_scores(ce_server, QUERY, TEXTS)  # xr: one label, its rerank model's scores
    pairs = httpx.post(proxy + "/predict", json={"model": "xr", "inputs": [[QUERY, t] for t in TEXTS]},
                       timeout=60).json()
    assert [row[0]["score"] for row in pairs] == pytest.approx(expected.tolist(), abs=1e-6)
    assert {row[0]["label"] for row in pairs} == {"LABEL_0"}
    refused = httpx.post(proxy + "/predict", json={"inputs": "x"}, timeout=60)  # emb, the default: no classifier
    assert refused.status_code == 422 and refused.json()["param"] == "model", refused.text
    bad = httpx.post(proxy + "/predict", json={"model": "bert2", "inputs": [["a"], ["", "b"]]}, timeout=60)
    assert bad.status_code == 422 and bad.json()["error"].startswith("inputs[1]"), bad.text


def test_tei_similarity_and_huggingface_hub_sentence_similarity(ce_server, proxy, direct_vectors):
    """/similarity (and huggingface_hub's sentence_similarity, which posts to the root) = the cosine of the
    vectors /embed gives."""
    from huggingface_hub import InferenceClient

    expected = (direct_vectors[1:] @ direct_vectors[0]).tolist()
    answer = httpx.post(proxy + "/similarity", json={"inputs": {"source_sentence": TEXTS[0],
                                                                "sentences": TEXTS[1:]}}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json() == pytest.approx(expected, abs=1e-5)
    hub = InferenceClient(base_url=proxy).sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    assert hub == pytest.approx(expected, abs=1e-5)
    empty = httpx.post(proxy + "/similarity", json={"inputs": {"source_sentence": "a", "sentences": ["b", " "]}},
                       timeout=60)
    assert empty.status_code == 422 and empty.json()["error"].startswith("inputs.sentences[1]"), empty.text


# ---------------------------------------------------------------- issue 49: the TEI surface agrees with itself
def tei_error(response, status, *words):
    """TEI's error body on the real server: {error, error_type} (and ours, code and param), `status`."""
    assert response.status_code == status, (status, response.status_code, response.text[:300])
    body = response.json()
    assert set(body) == {"error", "error_type", "code", "param", "field"} and isinstance(body["error"], str), body
    for word in words:
        assert word in body["error"], body["error"]
    return body


def test_tei_statuses_are_one_per_error_kind_on_every_route(proxy):
    """Too many inputs is 413 on every TEI route (the proxy's count, max_inputs_per_request 2048, and the rerank
    model's, max_documents 2048), /rerank with Cohere's `documents` included; every error on a TEI path is in
    TEI's shape whatever the body; /decode refuses empty rows and rows over max_input_chars; validation messages
    name the client's fields."""
    many, texts = ["a"] * 2049, ["a"] * 3000
    with httpx.Client(base_url=proxy, timeout=120) as http:
        for path, body in (("/embed", {"inputs": many}), ("/", {"inputs": many}), ("/embed_all", {"inputs": many}),
                           ("/embed_sparse", {"inputs": many}), ("/tokenize", {"inputs": many}),
                           ("/predict", {"inputs": [[t] for t in many], "model": "xr"}),
                           ("/decode", {"ids": [[5]] * 2049})):
            error = tei_error(http.post(path, json=body), 413, "2049 inputs", "max_inputs_per_request")
            assert (error["error_type"], error["code"]) == ("Validation", "too_many"), path
        for path, body, param in (("/rerank", {"query": "q", "texts": texts}, "texts"),
                                  ("/rerank", {"query": "q", "documents": texts}, "documents"),
                                  ("/rerank", {"query": "q", "texts": texts, "model": "xr"}, "texts"),
                                  ("/similarity", {"inputs": {"source_sentence": "q", "sentences": texts}},
                                   "inputs.sentences")):
            error = tei_error(http.post(path, json=body), 413, "3000 documents", "max_documents")
            assert (error["error_type"], error["param"]) == ("Validation", param), (path, body.keys())
        cohere = http.post("/v1/rerank", json={"query": "q", "documents": texts})  # OpenAI's path: its 422
        assert cohere.status_code == 422 and cohere.json()["error"]["code"] == "too_many", cohere.text

        # /rerank with Cohere's documents: TEI's shape for the rerank model's error and for validation
        tei_error(http.post("/rerank", json={"query": "q", "documents": ["a", ""]}), 422, "documents[1]")
        tei_error(http.post("/rerank", json={"query": "q", "documents": "a"}), 422, "documents")
        tei_error(http.post("/rerank", json={"query": "q", "documents": ["a"], "top_n": 0}), 422, "top_n")

        # /decode: empty, over the cap (262144 ids a row, as a text's characters), and validation
        for body, field in (({"ids": []}, "ids"), ({"ids": [[5], []]}, "ids[1]")):
            assert tei_error(http.post("/decode", json=body), 422, f"{field} is empty")["param"] == "ids"
        over = tei_error(http.post("/decode", json={"ids": [5] * 300_000}), 422, "ids holds 300000 ids",
                         "max_input_chars")
        assert over["code"] == "too_long"
        for body, field in (({"ids": ["a"]}, "ids[0]"), ({"ids": [[5], [-1]]}, "ids[1][0]")):
            message = tei_error(http.post("/decode", json=body), 422, field)["error"]
            assert "constrained" not in message and "list[" not in message, message
        openai = http.post("/v1/embeddings", json={"input": [{"image": 1}]}).json()["error"]["message"]
        assert "input[0]" in openai and "union[" not in openai and "TextItem" not in openai, openai


def test_tei_embed_all_answer_is_bounded(proxy):
    """/embed_all: at most max_embed_all_numbers (4,000,000) numbers, tokens x hidden size (emb: 32), a 413 naming
    `inputs` and the setting before the encoder runs; 2048 short inputs (8.4 M numbers at the max length of 128,
    under 0.4 M as tokenized) are served."""
    long = "word " * 150  # over 128 tokens: counted at 128, cut or not
    with httpx.Client(base_url=proxy, timeout=120) as http:
        for truncate in (True, None):
            body = {"inputs": [long] * 1000, **({"truncate": truncate} if truncate else {})}
            error = tei_error(http.post("/embed_all", json=body), 413, "4096000 numbers", "max_embed_all_numbers")
            assert (error["param"], error["code"], error["error_type"]) == ("inputs", "answer_too_large", "Validation")
        short = http.post("/embed_all", json={"inputs": [f"text {i}" for i in range(2048)]})
        assert short.status_code == 200, short.text[:300]
        assert len(short.json()) == 2048 and all(len(row[0]) == 32 for row in short.json())
