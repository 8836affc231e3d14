"""Compact ColBERT (issue 17, item 4): token pooling (`colbert_pool_factor`) and the fp16 / int8 / binary ColBERT
outputs of `ensemble_bls`, and /v1/encode's `colbert_pool_factor` / `colbert_type`, through the real tritonserver.

References, written here independently of the model's code:
- pooling: colbert-ai's / PyLate's pool_embeddings_hierarchical with scipy (linkage(1 - V V^T, method="ward"),
  fcluster(t=max(n // factor, 1), criterion="maxclust"), cluster means), then L2-normalized, clusters in the order of
  their first token (the served order); within 1e-5 of the vectors served unpooled;
- types: fp16 = a cast, int8 = round(v * 127) clipped to +-127, binary = np.packbits(v > 0): bit for bit from the
  (pooled) float vectors served in the same response.
The model is test_m3's tiny bge-m3 layout (conftest's build_m3: heads fitted so token vectors are centred and
differ); the same folder exported again with --outputs dense is the model without ColBERT.
"""
import json
import os
import warnings

import httpx
import numpy as np
import pytest
from scipy.cluster.hierarchy import ClusterWarning, fcluster, linkage
from tritonclient.utils import InferenceServerException

from conftest import M3_MAX_LENGTH, build_m3, fastembed_muvera, import_python_model, pbtxt, serve_exports
from triton_clients import PROTOCOLS, VARIED_TEXTS, client, outputs, text_input, url_for

NAME, DENSE_ONLY = "m3", "m3-dense"
TEXTS = VARIED_TEXTS[3:12] + VARIED_TEXTS[-4:-1]  # 10 to 128 tokens (the last one truncated)
TYPES = {"fp16": "colbert_vectors_fp16", "int8": "colbert_vectors_int8", "binary": "colbert_vectors_binary"}
COLBERT = ("colbert_vectors", "colbert_length")
ALL = COLBERT + tuple(TYPES.values())


# ---------------------------------------------------------------- the independent references
def reference_pool(vectors, pool_factor):
    """PyLate's pooling of one text's vectors (no protected token), each mean L2-normalized, clusters in the order
    of their first token."""
    n = len(vectors)
    if n == 1:  # linkage needs two points; one is its own cluster
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    with warnings.catch_warnings():  # PyLate passes the n x n matrix as n points on purpose; scipy warns about it
        warnings.simplefilter("ignore", ClusterWarning)
        tree = linkage(1 - vectors @ vectors.T, method="ward")
    labels = fcluster(tree, t=max(n // pool_factor, 1), criterion="maxclust")
    clusters = sorted((np.flatnonzero(labels == c) for c in np.unique(labels)), key=lambda members: members[0])
    means = np.stack([vectors[members].astype(np.float64).mean(0) for members in clusters])
    return means / np.linalg.norm(means, axis=1, keepdims=True)


def reference_type(vectors, kind):
    if kind == "fp16":
        return vectors.astype(np.float16)
    if kind == "int8":
        return np.clip(np.round(vectors * np.float32(127)), -127, 127).astype(np.int8)
    return np.packbits(vectors > 0, axis=-1)


# ---------------------------------------------------------------- the clustering alone, against scipy
def unit_rows(rng, n, d):
    vectors = rng.standard_normal((n, d)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def bls_model():
    return import_python_model("ensemble_bls")


@pytest.mark.parametrize("n, d", [(2, 8), (7, 32), (32, 32), (33, 32), (150, 16), (300, 1024)])
def test_ward_merges_are_scipys_linkage(bls_model, n, d):
    """Both ways of computing the points' distances (n <= d: the rows of 1 - V V^T; n > d: through V^T V) give
    scipy's Ward merge heights (random vectors: no ties)."""
    vectors = unit_rows(np.random.default_rng(n * d), n, d)
    merges = bls_model.ward_merges(bls_model.row_distances(vectors))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClusterWarning)
        expected = linkage(1 - vectors @ vectors.T, method="ward")
    np.testing.assert_allclose(np.sort(np.sqrt(merges[:, 0])), expected[:, 2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("pool_factor", [1, 2, 3, 4, 1000])
@pytest.mark.parametrize("n, d", [(1, 32), (2, 32), (9, 32), (64, 32), (127, 1024), (400, 48)])
def test_pool_tokens_is_pylates_pooling(bls_model, n, d, pool_factor):
    vectors = unit_rows(np.random.default_rng(n + d + pool_factor), n, d)
    got = bls_model.pool_tokens(vectors, pool_factor)
    assert got.dtype == np.float32 and got.shape == (max(n // pool_factor, 1), d)
    np.testing.assert_allclose(got, reference_pool(vectors, pool_factor), atol=1e-5, rtol=0)


def test_compact_types_are_the_documented_formulas(bls_model):
    vectors = np.concatenate([unit_rows(np.random.default_rng(3), 50, 1024), np.zeros((2, 1024), np.float32)])
    for kind in TYPES:
        got, want = bls_model.compact(vectors, kind), reference_type(vectors, kind)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=kind)
        assert not got[-2:].any()  # zero padding stays zero


# ---------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def m3_server(server, tmp_path_factory, xlmr_tokenizer_dir):
    """Both exports beside MiniLM on the shared server (HTTP requests name theirs)."""
    folder = build_m3(tmp_path_factory.mktemp("tiny_m3"), xlmr_tokenizer_dir)
    m3 = ["--model", folder, "--max-length", M3_MAX_LENGTH]
    with serve_exports(server, {NAME: m3, DENSE_ONLY: [*m3, "--outputs", "dense"]}):
        yield server


@pytest.fixture(scope="module")
def http(m3_server):
    with httpx.Client(base_url=m3_server.proxy_url, timeout=120) as session:
        yield session


def request(server, protocol, texts, names, parameters=None, model=f"{NAME}_bls"):
    connection = client(protocol, url_for(server, protocol))
    try:
        result = connection.infer(model, [text_input(protocol, texts)], outputs=outputs(protocol, names),
                                  parameters=parameters)
        return {name: result.as_numpy(name) for name in names}
    finally:
        connection.close()


def rows(result, name="colbert_vectors"):
    return [result[name][i, :n] for i, n in enumerate(result["colbert_length"].reshape(-1))]


def error_of(server, protocol, names, parameters, model=f"{NAME}_bls"):
    with pytest.raises(InferenceServerException) as caught:
        request(server, protocol, TEXTS[:2], names, parameters, model)
    return caught.value


def test_export_declares_the_compact_outputs_only_with_colbert(m3_server):
    def declared(model):
        return pbtxt.declared(pbtxt.read(f"{m3_server.repository}/{model}/config.pbtxt"))
    config = declared(f"{NAME}_bls")
    for tensor in (("colbert_vectors_fp16", "TYPE_FP16", "-1, 32"), ("colbert_vectors_int8", "TYPE_INT8", "-1, 32"),
                   ("colbert_vectors_binary", "TYPE_UINT8", "-1, 4")):
        assert tensor in config
    assert ("muvera", "TYPE_FP32", "10240") in config  # MUVERA's default parameters: 20 x 2^5 x 16
    assert not any("colbert" in name or name == "muvera" for name, _, _ in declared(f"{DENSE_ONLY}_bls"))
    assert "colbert_vectors_int8" not in [name for name, _, _ in declared(NAME)]


@pytest.fixture(scope="module")
def unpooled(m3_server):
    """The float vectors as served without pooling (the references' input)."""
    return request(m3_server, "grpc", TEXTS, COLBERT)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("pool_factor", [None, 1, 2, 3])
def test_pooled_and_compact_vectors_match_the_references(m3_server, unpooled, protocol, pool_factor):
    parameters = None if pool_factor is None else {"colbert_pool_factor": pool_factor}
    got = request(m3_server, protocol, TEXTS, ALL, parameters)
    lengths = got["colbert_length"].reshape(-1)
    full = rows(unpooled)
    factor = pool_factor or 1
    assert lengths.tolist() == [max(len(v) // factor, 1) for v in full]
    assert got["colbert_vectors"].shape[1] == lengths.max()  # padded to the longest pooled row
    for i, (vectors, want) in enumerate(zip(rows(got), full)):
        if factor == 1:
            np.testing.assert_array_equal(vectors, want)  # untouched: the ensemble's vectors
        else:
            np.testing.assert_allclose(vectors, reference_pool(want, factor), atol=1e-5, rtol=0, err_msg=f"row {i}")
        assert not got["colbert_vectors"][i, lengths[i]:].any()
    for kind, name in TYPES.items():
        want = reference_type(got["colbert_vectors"], kind)  # padding included: zero in every type
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    assert got["colbert_vectors_binary"].shape[2] == 4  # 32 dimensions, 8 sign bits per byte


def test_a_compact_type_alone_is_the_same(m3_server):
    """Asking only for one type (the float vectors are computed inside, not sent) changes nothing."""
    both = request(m3_server, "grpc", TEXTS, ALL, {"colbert_pool_factor": 2})
    alone = request(m3_server, "http", TEXTS, ("colbert_vectors_int8", "colbert_length"), {"colbert_pool_factor": 2})
    np.testing.assert_array_equal(alone["colbert_vectors_int8"], both["colbert_vectors_int8"])
    np.testing.assert_array_equal(alone["colbert_length"], both["colbert_length"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", [0, -2, 2.5, "two", True])
def test_bad_pool_factor_is_invalid_argument_naming_it(m3_server, protocol, value):
    error = error_of(m3_server, protocol, COLBERT, {"colbert_pool_factor": value})
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (error.status(), error.message())
    assert "colbert_pool_factor must be a whole number from 1 to 2147483647" in error.message(), error.message()
    assert request(m3_server, protocol, TEXTS[:1], COLBERT)["colbert_length"].shape == (1, 1)  # serves on


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_without_colbert_refuses_pooling_and_types(m3_server, protocol):
    error = error_of(m3_server, protocol, ("embedding",), {"colbert_pool_factor": 2}, model=f"{DENSE_ONLY}_bls")
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT") and "no ColBERT output" in error.message()
    error = error_of(m3_server, protocol, ("colbert_vectors_int8",), None, model=f"{DENSE_ONLY}_bls")
    assert "colbert_vectors_int8" in error.message()  # Triton's own: the model has no such output
    assert request(m3_server, protocol, TEXTS[:1], ("embedding",), model=f"{DENSE_ONLY}_bls")["embedding"].shape == \
        (1, 32)


# ---------------------------------------------------------------- HTTP: /v1/encode
@pytest.mark.parametrize("texts", [TEXTS[:1], TEXTS])  # one text: through ensemble_bls too (the ensemble cannot)
@pytest.mark.parametrize("pool_factor", [None, 2])
@pytest.mark.parametrize("colbert_type", ["float", "fp16", "int8", "binary"])
def test_encode_gives_what_ensemble_bls_gives(m3_server, http, unpooled, texts, pool_factor, colbert_type):
    body = {"model": NAME, "input": texts, "return_dense": False, "return_colbert": True, "colbert_type": colbert_type}
    if pool_factor:
        body["colbert_pool_factor"] = pool_factor
    response = http.post("/v1/encode", json=body)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    name = TYPES.get(colbert_type, "colbert_vectors")
    kserve = request(m3_server, "grpc", texts, (name, "colbert_length"),
                     {"colbert_pool_factor": pool_factor} if pool_factor else None)
    for i, (item, want) in enumerate(zip(data, rows(kserve, name))):
        assert set(item) == {"index", "colbert", "truncated"}
        got = np.asarray(item["colbert"]).astype(want.dtype)  # JSON numbers back in the served type, exactly
        np.testing.assert_array_equal(got, want, err_msg=f"{colbert_type} row {i}")
        if colbert_type == "float" and pool_factor:
            np.testing.assert_allclose(got, reference_pool(rows(unpooled)[i], pool_factor), atol=1e-5, rtol=0)


@pytest.mark.parametrize("body, param, words", [
    ({"model": DENSE_ONLY, "colbert_type": "int8"}, "colbert_type", ["no ColBERT output", DENSE_ONLY]),
    ({"model": DENSE_ONLY, "colbert_pool_factor": 2}, "colbert_pool_factor", ["no ColBERT output"]),
    ({"colbert_pool_factor": 2, "return_colbert": False}, "colbert_pool_factor", ["return_colbert"]),
    ({"colbert_type": "binary", "return_colbert": False}, "colbert_type", ["return_colbert"]),
    ({"colbert_pool_factor": 0}, "colbert_pool_factor", ["greater than or equal to 1"]),
    ({"colbert_pool_factor": 2.5}, "colbert_pool_factor", []),
    ({"colbert_pool_factor": "2"}, "colbert_pool_factor", []),
    ({"colbert_type": "int4"}, "colbert_type", ["fp16", "binary"]),
])
def test_encode_bad_combinations_are_400_naming_the_cause(http, body, param, words):
    response = http.post("/v1/encode", json={"model": NAME, "input": ["a b c"], "return_colbert": True, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert all(word in error["message"] for word in words), error
    assert http.post("/v1/encode", json={"model": NAME, "input": "a b c", "return_colbert": True}).status_code == 200


# ---------------------------------------------------------------- MUVERA (issue 70 item 1)
@pytest.fixture(scope="module")
def recorded_muvera(m3_server):
    """MUVERA's parameters the export recorded (export.json)."""
    with open(os.path.join(m3_server.repository, NAME, "1", "export.json"), encoding="utf-8") as handle:
        return json.load(handle)["muvera"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_muvera_is_fastembeds_encoding_of_the_served_colbert_vectors(m3_server, recorded_muvera, protocol):
    """NAME_bls's `muvera` equals fastembed's Muvera (the export's recorded parameters and seed) over the ColBERT
    vectors served in the same answer: process_document by default, process_query with input_type query; pooled
    vectors encoded as served."""
    assert recorded_muvera == {"k_sim": 5, "dim_proj": 16, "r_reps": 20, "seed": 42, "size": 10240}
    answers, sets = [], []
    for parameters, side in ((None, "document"), ({"input_type": "query"}, "query"),
                             ({"colbert_pool_factor": 2}, "document")):
        got = request(m3_server, protocol, TEXTS, (*COLBERT, "muvera"), parameters)
        assert got["muvera"].shape == (len(TEXTS), 10240)
        answers.append(got["muvera"])
        sets += [(vectors, side) for vectors in rows(got)]
    np.testing.assert_allclose(np.concatenate(answers), fastembed_muvera(recorded_muvera, 32, sets), atol=1e-5,
                               rtol=0)


def test_encode_returns_muvera_as_ensemble_bls_does(m3_server, http):
    """/v1/encode's return_muvera: each item's `muvera`, what NAME_bls answers for the same side; alone (no ColBERT
    vectors in the answer) or beside them; a model without ColBERT refuses it naming return_muvera."""
    for extra, side in (({}, None), ({"input_type": "query", "return_colbert": True}, {"input_type": "query"})):
        body = {"model": NAME, "input": TEXTS, "return_dense": False, "return_muvera": True, **extra}
        response = http.post("/v1/encode", json=body)
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert set(data[0]) == {"index", "muvera", "truncated", *(["colbert"] if "return_colbert" in extra else [])}
        kserve = request(m3_server, "grpc", TEXTS, ("muvera",), side)
        np.testing.assert_allclose([item["muvera"] for item in data], kserve["muvera"], atol=1e-6, rtol=0)
    response = http.post("/v1/encode", json={"model": DENSE_ONLY, "input": "a b c", "return_muvera": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "return_muvera", response.text
