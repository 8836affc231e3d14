"""Clients nobody here wrote, pointed at the HTTP front as their own docs say to point them at a server of their kind
(issue 38), against the real server: huggingface_hub's InferenceClient and LlamaIndex's TextEmbeddingsInference
(TEI's API), Cohere's SDK v2 and v1 (embed and rerank), the OpenAI SDK with a hard-coded model name (a served name).
Every vector and score is compared with the same models called directly over KServe gRPC.

The server is the cross-encoder one (tests/conftest.py ce_server): named exports only, `emb` (a tiny XLM-R embedder,
the default, served also as text-embedding-3-small by its export) beside the cross-encoders `xr` (served also as
rerank-v3.5 by the setting) and `bert2`."""
import httpx
import numpy as np
import pytest

from conftest import CE_SERVED_NAMES
from triton_clients import cosine, infer, url_for

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
    from test_cross_encoder import rerank
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


def test_llama_index_tei_embedding(proxy, direct_vectors):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embedder = TextEmbeddingsInference(model_name="emb", base_url=proxy, timeout=60, embed_batch_size=4)
    assert_same_vectors(embedder.get_text_embedding_batch(TEXTS), direct_vectors, "LlamaIndex TEI batch")
    assert_same_vectors([embedder.get_query_embedding(TEXTS[0])], direct_vectors[:1], "LlamaIndex TEI query")


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
