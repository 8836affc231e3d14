"""Vectors for a store over KServe (issue 17, items 1-3), through the real tritonserver: quantized outputs of
`ensemble_bls` bit-identical to sentence_transformers' quantize_embeddings with the ranges calibrated at export,
Matryoshka `dimensions` against SentenceTransformer.encode(truncate_dim=...), prompts (`prompt_name`,
`input_type`) against SentenceTransformer.encode(prompt_name=...), and the 400s naming a bad parameter.

The prompt and Matryoshka model is a tiny random BERT with MiniLM's tokenizer, saved as a sentence-transformers
folder with e5-style prompts ("query: ", "passage: ", default "passage") and `matryoshka_dimensions` [8, 16] in its
config.json (prompts are tokens: random weights show whether they were applied), exported by name (`e5`: models `e5`
and `e5_bls`) beside MiniLM on the suite's shared server."""
import base64
import json
import os

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import serve_exports, tiny_sentence_transformer
from exporter.vectors import CALIBRATION_CORPUS
from triton_clients import PROTOCOLS, VARIED_TEXTS, client, outputs, text_input, url_for

TYPES = ("int8", "uint8", "binary", "ubinary")
TEXTS = VARIED_TEXTS[:6] + VARIED_TEXTS[-3:]  # short to over max length (truncated)
E5_MAX_LENGTH = 64
E5, E5_BLS = "e5", "e5_bls"  # the export's name (its ensemble's) and its BLS model
E5_PROMPTS = {"query": "query: ", "passage": "passage: "}


def quantize(vectors, precision, ranges):
    from sentence_transformers.util.quantization import quantize_embeddings

    return quantize_embeddings(vectors, precision=precision, ranges=ranges)


def request(server, protocol, texts, model="ensemble_bls", names=("embedding",), parameters=None):
    connection = client(protocol, url_for(server, protocol))
    try:
        result = connection.infer(model, [text_input(protocol, texts)], outputs=outputs(protocol, names),
                                  parameters=parameters)
        return {name: result.as_numpy(name) for name in names}
    finally:
        connection.close()


def error_of(server, protocol, texts, model="ensemble_bls", names=("embedding",), parameters=None):
    with pytest.raises(InferenceServerException) as caught:
        request(server, protocol, texts, model, names, parameters)
    error = caught.value
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (error.status(), error.message())
    return error.message()


def ranges_of(repository, width, bls_model="ensemble_bls"):
    with open(os.path.join(repository, bls_model, "1", "vectors.json"), encoding="utf-8") as handle:
        return np.asarray(json.load(handle)["calibration"]["ranges"][str(width)], dtype=np.float32)


# ---------------------------------------------------------------- the tiny e5-style model
@pytest.fixture(scope="module")
def e5_dir(tmp_path_factory, minilm_model_dir):
    return tiny_sentence_transformer(tmp_path_factory.mktemp("e5"), minilm_model_dir, seed=5, prompts=E5_PROMPTS,
                                     default_prompt_name="passage", max_length=E5_MAX_LENGTH, matryoshka=[8, 16])


@pytest.fixture(scope="module")
def e5(e5_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(e5_dir), device="cpu")


@pytest.fixture(scope="module")
def e5_server(server, e5_dir):
    """The e5-style model exported by name (E5) beside MiniLM: the shared server."""
    with serve_exports(server, {E5: ["--model", e5_dir]}):
        yield server


def test_export_calibrates_each_width_on_the_shipped_corpus(e5_server, e5):
    """vectors.json: the widths from the model's config (8, 16 and the full 32), and per width the min / max of the
    corpus's embeddings (default prompt, truncated, re-normalized), as sentence-transformers computes them."""
    with open(os.path.join(e5_server.repository, E5_BLS, "1", "vectors.json"), encoding="utf-8") as handle:
        vectors = json.load(handle)
    assert vectors["dimensions"] == [8, 16, 32]
    with open(CALIBRATION_CORPUS, encoding="utf-8") as handle:
        corpus = [line.strip() for line in handle if line.strip()]
    assert vectors["calibration"]["texts"] == len(corpus) >= 400 and vectors["calibration"]["prompt"] == "passage: "
    for width in (8, 16, 32):
        expected = e5.encode(corpus, truncate_dim=width, normalize_embeddings=True, batch_size=64)
        got = ranges_of(e5_server.repository, width, E5_BLS)
        np.testing.assert_allclose(got, np.stack([expected.min(0), expected.max(0)]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("prompt_name", [None, "query", "passage"])
def test_prompts_match_sentence_transformers(e5_server, e5, protocol, prompt_name):
    """prompt_name (none: the default, "passage: ") through ensemble_bls and ensemble: the vectors of
    SentenceTransformer.encode(prompt_name=...), token counts and truncation including the prompt."""
    expected = e5.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True)
    prompt = E5_PROMPTS[prompt_name or "passage"]
    ids = e5.tokenizer([prompt + text for text in TEXTS], truncation=True, max_length=E5_MAX_LENGTH)["input_ids"]
    parameters = {"prompt_name": prompt_name} if prompt_name else None
    for model in (E5_BLS, E5):
        got = request(e5_server, protocol, TEXTS, model, ("embedding", "num_tokens", "truncated"), parameters)
        np.testing.assert_allclose(got["embedding"], expected, atol=1e-5, rtol=0, err_msg=model)
        assert got["num_tokens"].reshape(-1).tolist() == [len(i) for i in ids], model
        assert got["truncated"].reshape(-1).tolist() == [len(e5.tokenizer(prompt + t)["input_ids"]) > E5_MAX_LENGTH
                                                         for t in TEXTS], model


@pytest.mark.parametrize("input_type, prompt_name", [("query", "query"), ("search_query", "query"),
                                                     ("passage", "passage"), ("clustering", "passage")])
def test_input_type_picks_the_prompt(e5_server, e5, input_type, prompt_name):
    """input_type: a prompt name, or Cohere's names for query / document; one the model has no prompt for
    (clustering) gets the default prompt."""
    expected = e5.encode(TEXTS[:3], prompt_name=prompt_name, normalize_embeddings=True)
    got = request(e5_server, "grpc", TEXTS[:3], E5_BLS, parameters={"input_type": input_type})["embedding"]
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("width", [8, 16])
def test_matryoshka_width_and_its_quantized_forms(e5_server, e5, protocol, width):
    """dimensions: SentenceTransformer.encode(truncate_dim=..., normalize) to 1e-5 (with a prompt), and the
    quantized forms of that vector bit-identical to quantize_embeddings with the width's calibrated ranges."""
    expected = e5.encode(TEXTS, prompt_name="query", truncate_dim=width, normalize_embeddings=True)
    names = ("embedding", *(f"embedding_{t}" for t in TYPES))
    got = request(e5_server, protocol, TEXTS, E5_BLS, names, {"dimensions": width, "prompt_name": "query"})
    assert got["embedding"].shape == (len(TEXTS), width)
    np.testing.assert_allclose(got["embedding"], expected, atol=1e-5, rtol=0)
    ranges = ranges_of(e5_server.repository, width, E5_BLS)
    for kind in TYPES:
        want = quantize(got["embedding"], kind, ranges)
        assert got[f"embedding_{kind}"].dtype == want.dtype and got[f"embedding_{kind}"].shape == want.shape
        np.testing.assert_array_equal(got[f"embedding_{kind}"], want, err_msg=kind)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dimensions_truncate_embedding_unnormalized_without_normalizing(e5_server, e5, protocol):
    """`embedding_unnormalized` with `dimensions` (ensemble_bls): the pooled vector cut to the width, not normalized
    (TEI: truncate, then normalize only if asked), i.e. SentenceTransformer.encode(truncate_dim=...,
    normalize_embeddings=False) (this model has no Normalize module); normalized, it is the width's `embedding`.
    `ensemble` (no `dimensions`) gives the full vector."""
    for width in (8, 16, 32):
        expected = e5.encode(TEXTS, prompt_name="query", truncate_dim=width, normalize_embeddings=False)
        got = request(e5_server, protocol, TEXTS, E5_BLS, names=("embedding_unnormalized", "embedding"),
                      parameters={"dimensions": width, "prompt_name": "query"})
        vectors = got["embedding_unnormalized"]
        assert vectors.shape == (len(TEXTS), width) and vectors.dtype == np.float32
        norms = np.linalg.norm(vectors, axis=1)
        assert np.abs(norms - 1).max() > 0.1, norms
        np.testing.assert_allclose(vectors, expected, atol=1e-5 * max(1.0, norms.max()), rtol=0, err_msg=str(width))
        np.testing.assert_allclose(vectors / norms[:, None], got["embedding"], atol=1e-6, rtol=0, err_msg=str(width))
    full = request(e5_server, protocol, TEXTS, E5, ("embedding_unnormalized",), {"prompt_name": "query"})
    np.testing.assert_allclose(full["embedding_unnormalized"], expected, atol=1e-5 * max(1.0, norms.max()), rtol=0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("parameters, words", [
    ({"dimensions": 12}, ["dimensions 12", "8, 16, 32"]),
    ({"dimensions": "wide"}, ["dimensions \"wide\"", "8, 16, 32"]),
    ({"prompt_name": "title"}, ["prompt_name \"title\"", "query", "passage"]),
    ({"input_type": "poem"}, ["input_type \"poem\"", "search_query", "passage"]),
    ({"input_type": "query", "prompt_name": "query"}, ["prompt_name and input_type"]),
])
def test_bad_parameters_are_400_naming_the_cause(e5_server, protocol, parameters, words):
    for model in (E5_BLS, E5) if "dimensions" not in parameters else (E5_BLS,):
        message = error_of(e5_server, protocol, TEXTS[:2], model, parameters=parameters)
        assert all(word in message for word in words), (model, message)
    # the server serves on
    assert request(e5_server, protocol, TEXTS[:1], E5_BLS)["embedding"].shape == (1, 32)


# ---------------------------------------------------------------- all-MiniLM-L6-v2: not Matryoshka, no prompts
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_quantized_types_are_quantize_embeddings_of_the_served_vector(server, protocol):
    """Every type at once, full width: bit-identical to quantize_embeddings of the float vector served with them
    (int8 / uint8 with the ranges export calibrated); the float vector is the ensemble's."""
    names = ("embedding", *(f"embedding_{t}" for t in TYPES))
    got = request(server, protocol, TEXTS, names=names)
    plain = request(server, protocol, TEXTS, model="ensemble")["embedding"]
    np.testing.assert_array_equal(got["embedding"], plain)
    ranges = ranges_of(server.repository, 384)
    for kind in TYPES:
        want = quantize(got["embedding"], kind, ranges)
        np.testing.assert_array_equal(got[f"embedding_{kind}"], want, err_msg=kind)
    assert got["embedding_binary"].shape == (len(TEXTS), 48) and got["embedding_int8"].shape == (len(TEXTS), 384)
    # the calibrated range is not the batch's own: int8 values use the whole scale but not every text hits the ends
    assert got["embedding_int8"].min() < -64 and got["embedding_int8"].max() > 64


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dimensions_on_a_model_that_is_not_matryoshka(server, protocol):
    message = error_of(server, protocol, TEXTS[:1], parameters={"dimensions": 128})
    assert "dimensions 128" in message and "384" in message and "not Matryoshka" in message
    full = request(server, protocol, TEXTS[:1], parameters={"dimensions": 384})["embedding"]
    assert full.shape == (1, 384)
    message = error_of(server, protocol, TEXTS[:1], model="ensemble", parameters={"prompt_name": "query"})
    assert "prompt_name \"query\"" in message and "none" in message


# ---------------------------------------------------------------- the same over HTTP (the proxy translates)
@pytest.fixture(scope="module")
def e5_http(e5_server):
    import httpx

    from conftest import wait_for_proxy

    wait_for_proxy(e5_server)
    with httpx.Client(base_url=e5_server.proxy_url, timeout=60) as http:
        yield http


def test_cohere_embed_gives_several_types_of_a_prompted_matryoshka_vector(e5_http, e5_server, e5):
    """/v2/embed: input_type search_query ("query: "), output_dimension 16, float + int8 + binary + base64 at once:
    what ensemble_bls gives a KServe client for the same parameters, and SentenceTransformer's vector."""
    body = {"model": E5, "texts": TEXTS[:4], "input_type": "search_query", "output_dimension": 16,
            "embedding_types": ["float", "int8", "binary", "base64"]}
    response = e5_http.post("/v2/embed", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert set(result["embeddings"]) == {"float", "int8", "binary", "base64"} and result["texts"] == TEXTS[:4]
    names = ("embedding", "embedding_int8", "embedding_binary", "num_tokens")
    kserve = request(e5_server, "grpc", TEXTS[:4], E5_BLS, names, {"dimensions": 16, "input_type": "query"})
    floats = np.asarray(result["embeddings"]["float"], dtype=np.float32)
    np.testing.assert_allclose(floats, kserve["embedding"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(floats, e5.encode(TEXTS[:4], prompt_name="query", truncate_dim=16,
                                                 normalize_embeddings=True), atol=1e-5, rtol=0)
    decoded = np.stack([np.frombuffer(base64.b64decode(v), "<f4") for v in result["embeddings"]["base64"]])
    np.testing.assert_array_equal(decoded, floats)
    np.testing.assert_array_equal(np.asarray(result["embeddings"]["int8"]), kserve["embedding_int8"])
    np.testing.assert_array_equal(np.asarray(result["embeddings"]["binary"]), kserve["embedding_binary"])
    assert result["meta"]["billed_units"]["input_tokens"] == int(kserve["num_tokens"].sum())


@pytest.mark.parametrize("texts", [TEXTS[:1], TEXTS[:3]])  # one text goes to the ensemble, several to ensemble_bls
def test_openai_encoding_format_dimensions_and_prompt_name(e5_http, e5_server, texts):
    for fmt in ("float", "uint8", "ubinary"):
        body = {"model": E5, "input": texts, "encoding_format": fmt, "dimensions": 8, "prompt_name": "query"}
        response = e5_http.post("/v1/embeddings", json=body)
        assert response.status_code == 200, response.text
        got = np.asarray([item["embedding"] for item in response.json()["data"]])
        name = "embedding" if fmt == "float" else f"embedding_{fmt}"
        want = request(e5_server, "http", texts, E5_BLS, (name,), {"dimensions": 8, "prompt_name": "query"})
        np.testing.assert_allclose(got, want[name], atol=1e-6, rtol=0, err_msg=fmt)
    # a prompt alone on one text: the ensemble's answer (the tokenizer applies it)
    one = e5_http.post("/v1/embeddings", json={"model": E5, "input": texts[0], "input_type": "query"}).json()["data"][0]
    plain = request(e5_server, "http", texts[:1], model=E5, parameters={"prompt_name": "query"})
    np.testing.assert_allclose(one["embedding"], plain["embedding"][0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("route, body, param, words", [
    ("/v1/embeddings", {"input": ["a b"], "dimensions": 12}, "dimensions", ["8, 16, 32"]),
    ("/v1/embeddings", {"input": "a b", "prompt_name": "title"}, "prompt_name", ["query", "passage"]),
    ("/v2/embed", {"texts": ["a b"], "input_type": "poem"}, "input_type", ["search_query"]),
    ("/v2/embed", {"texts": ["a b"], "embedding_types": ["int4"]}, "embedding_types", ["int8", "ubinary"]),
    ("/v1/embeddings", {"input": "a b", "encoding_format": "int4"}, "encoding_format", ["int8", "ubinary"]),
])
def test_http_bad_combinations_are_400_naming_the_cause(e5_http, route, body, param, words):
    response = e5_http.post(route, json={"model": E5, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param or param in error["message"], error
    assert all(word in response.text for word in words), response.text


def test_http_dimensions_on_a_model_that_is_not_matryoshka(server):
    import httpx

    from conftest import wait_for_proxy

    wait_for_proxy(server)
    response = httpx.post(server.proxy_url + "/v2/embed", json={"texts": ["hi"], "output_dimension": 128}, timeout=60)
    assert response.status_code == 400 and "not Matryoshka" in response.text and "384" in response.text
