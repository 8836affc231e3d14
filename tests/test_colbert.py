"""PyLate ColBERT checkpoints (issue 68 item 2): tiny folders laid out as lightonai/answerai-colbert-small-v1
(tiny_checkpoints.build_colbert: BERT → pylate Dense, [unused0] / [unused1] markers, query expansion to 32 with
[MASK], the punctuation skiplist, documents cut at 180) and lightonai/GTE-ModernColBERT-v1 (build_modern_colbert:
ModernBERT, BPE, "[Q] " / "[D] " added tokens, documents cut at 300), the FAMILIES rows this module checks, exported
by name beside the default MiniLM export, and served through both doors equal to PyLate 1.6.0's own encoder (run in
its own process: requirements-pylate.txt, PYLATE_SITE): per side (input_type query / document), the same token ids
and counts, each token vector at cosine >= 0.9999, over KServe (NAME_bls: colbert_vectors / colbert_length) and the
HTTP front (/v1/encode); the MaxSim rerank (NAME_rerank, /v1/rerank) as PyLate's colbert_scores ranks (the sum over
query vectors); compact ColBERT from the same vectors. What the graph would serve otherwise is refused at export in
one line."""
import os
import subprocess
import sys

import numpy as np
import pytest

import suite_stats
from conftest import PROJECT, fastembed_muvera, serve_exports
from tiny_checkpoints import FAMILIES, build_colbert
from triton_clients import bytes_input, client, outputs, post, text_input

# {export name: its FAMILIES row}: the rows this module serves and checks
EXPORTS = {row.export_name: row for row in FAMILIES.values() if row.checked_in == "tests/test_colbert.py"}
QUERY = "What is the capital of France?"
TEXTS = [
    "Paris is the capital and most populous city of France.",
    "short",
    "Hello, world! (Punctuation: dropped from documents; kept in queries.)",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "A query that is longer than thirty-two tokens: it is cut at the query length, one token left for the marker, "
    "so nothing of it is expanded at all.",
    "The Seine flows through Paris, past the Louvre. " * 30,  # over 180 tokens: the document is cut
]


FIGURES = {}  # {(export, side, door): the smallest token cosine with PyLate; (export, "rerank", door): max |diff|}


@pytest.fixture(scope="module", autouse=True)
def report_figures():
    """The served figures, printed at the end of the run (suite_stats.report)."""
    yield
    if FIGURES:
        suite_stats.report(["", "PyLate ColBERT vs PyLate 1.6.0 (per token cosine, min; MaxSim rerank: max |diff|):",
                            *(f"  {' / '.join(key)}: {value:.12f}" for key, value in sorted(FIGURES.items()))])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: row.build(tmp_path_factory.mktemp(name)) for name, row in EXPORTS.items()}


@pytest.fixture(scope="module")
def pylates(folders):
    """{export name: PyLate's ColBERT.encode of TEXTS and the query, both sides} (exporter/pylate_reference.py)."""
    from exporter.families.colbert import run_pylate

    return {name: run_pylate(folder, [*TEXTS, QUERY]) for name, folder in folders.items()}


@pytest.fixture(scope="module")
def served(server, folders):
    with serve_exports(server, {name: ["--model", folder] for name, folder in folders.items()}):
        yield server


@pytest.fixture(params=list(EXPORTS))
def name(request):
    return request.param


@pytest.fixture
def pylate(pylates, name):
    return pylates[name]


def kserve(server, name, side, names=("colbert_vectors", "colbert_length"), parameters=None, texts=TEXTS):
    connection = client("grpc", server.grpc_url)
    try:
        result = connection.infer(f"{name}_bls", [text_input("grpc", texts)], outputs=outputs("grpc", names),
                                  parameters={"input_type": side, **(parameters or {})})
        return {n: result.as_numpy(n) for n in names}
    finally:
        connection.close()


def assert_pylates(rows, want, label):
    """Each row's vectors as many as PyLate's, in its order, cosine >= 0.9999 each; FIGURES[label] the smallest."""
    assert len(rows) == len(want), label
    FIGURES[label] = 1.0
    for i, (got, expected) in enumerate(zip(rows, want)):
        got, expected = np.asarray(got, np.float64), np.asarray(expected["vectors"], np.float64)
        assert got.shape == expected.shape, (label, i, got.shape, expected.shape)
        cos = (got * expected).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
        assert cos.min() >= 0.9999, (label, i, cos.min())
        FIGURES[label] = min(FIGURES[label], float(cos.min()))


def test_export_is_checked_against_pylate(served, name):
    import json

    with open(os.path.join(served.repository, name, "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    assert manifest["pipeline"] == "colbert" and manifest["outputs"] == ["colbert"], manifest
    assert manifest["modules"] == ["Transformer", "Dense"] and manifest["colbert_size"] == 16
    reference = manifest["parity"]["reference"]
    assert reference["against"].startswith("pylate 1.6.0"), reference
    assert min(reference["query"]["min_cosine"], reference["document"]["min_cosine"]) >= 0.9999, reference
    assert set(reference["query"]["vectors"]) == {32}, reference  # every query expanded to query_length


@pytest.mark.parametrize("side", ["query", "document"])
def test_kserve_gives_pylates_vectors(served, name, pylate, side):
    got = kserve(served, name, side)
    lengths = got["colbert_length"].reshape(-1)
    assert lengths.tolist() == [len(row["ids"]) for row in pylate[side][:len(TEXTS)]], side
    assert_pylates([v[:n] for v, n in zip(got["colbert_vectors"], lengths)], pylate[side][:len(TEXTS)],
                   (name, side, "kserve"))


@pytest.mark.parametrize("side", ["query", "document"])
def test_the_ensemble_gives_pylates_vectors_too(served, name, pylate, side):
    """KServe's ensemble NAME (tokenizer → encoder, no BLS model): the request's input_type reaches the tokenizer."""
    connection = client("grpc", served.grpc_url)
    try:
        result = connection.infer(name, [text_input("grpc", TEXTS)],
                                  outputs=outputs("grpc", ("colbert_vectors", "colbert_length")),
                                  parameters={"input_type": side})
    finally:
        connection.close()
    lengths = result.as_numpy("colbert_length").reshape(-1)
    assert_pylates([v[:n] for v, n in zip(result.as_numpy("colbert_vectors"), lengths)], pylate[side][:len(TEXTS)],
                   (name, side, "kserve ensemble"))


@pytest.mark.parametrize("side", ["query", "document"])
def test_token_ids_are_pylates(served, name, pylate, side):
    """The tokenizer model's rows (NAME_tokenizer) are PyLate's: the marker, the cut, the expansion; the document's
    skiplist tokens are in the row (the encoder reads them) but not among its vectors."""
    connection = client("grpc", served.grpc_url)
    try:
        result = connection.infer(f"{name}_tokenizer", [text_input("grpc", TEXTS)],
                                  outputs=outputs("grpc", ("input_ids", "attention_mask")),
                                  parameters={"input_type": side})
    finally:
        connection.close()
    ids, mask = result.as_numpy("input_ids"), result.as_numpy("attention_mask").astype(bool)
    skiplist = set(pylate["skiplist"])
    rows = [row[keep].tolist() for row, keep in zip(ids, mask)]
    kept = [row if side == "query" else [t for t in row if t not in skiplist] for row in rows]
    assert kept == [row["ids"] for row in pylate[side][:len(TEXTS)]], side
    assert all(row[1] == pylate[f"{side}_prefix_id"] for row in rows)


@pytest.mark.parametrize("side", ["query", "document"])
def test_http_encode_gives_pylates_vectors(served, name, pylate, side):
    status, answer = post(served, "/v1/encode", {"model": name, "input": TEXTS, "input_type": side,
                                                 "return_dense": False, "return_colbert": True})
    assert status == 200, answer
    assert_pylates([item["colbert"] for item in answer["data"]], pylate[side][:len(TEXTS)], (name, side, "http"))
    # the long query is cut at query_length (a short one too in the small BPE vocabulary); the long document on
    # both sides
    cut = [item["truncated"] for item in answer["data"]]
    assert cut[4:] == [True, True] if side == "query" else cut == [False] * 5 + [True], cut


def test_no_side_is_the_document(served, name, pylate):
    status, answer = post(served, "/v1/encode", {"model": name, "input": TEXTS[:3], "return_dense": False,
                                                 "return_colbert": True})
    assert status == 200, answer
    assert_pylates([item["colbert"] for item in answer["data"]], pylate["document"][:3], (name, "none", "http"))


def test_maxsim_rerank_is_pylates_score_through_both_doors(served, name, pylate):
    """/v1/rerank and NAME_rerank: the query embedded as a query, the documents as documents, scored as PyLate's
    colbert_scores (the sum over query vectors of the best dot product)."""
    query = np.asarray(pylate["query"][-1]["vectors"])
    want = [float((query @ np.asarray(doc["vectors"]).T).max(axis=1).sum()) for doc in pylate["document"][:-1]]
    status, answer = post(served, "/v1/rerank", {"model": name, "query": QUERY, "documents": TEXTS})
    assert status == 200, answer
    got = {item["index"]: item["relevance_score"] for item in answer["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(TEXTS))], want, atol=1e-4, rtol=1e-5)
    FIGURES[(name, "rerank", "http")] = float(np.abs(np.subtract([got[i] for i in range(len(TEXTS))], want)).max())
    connection = client("grpc", served.grpc_url)
    try:
        from tritonclient import grpc as grpcclient

        result = connection.infer(f"{name}_rerank", [bytes_input(grpcclient, "query", [QUERY], [1]),
                                                     bytes_input(grpcclient, "documents", TEXTS, [len(TEXTS)])])
    finally:
        connection.close()
    np.testing.assert_allclose(result.as_numpy("scores").reshape(-1), want, atol=1e-4, rtol=1e-5)
    FIGURES[(name, "rerank", "kserve")] = float(np.abs(result.as_numpy("scores").reshape(-1) - want).max())


def test_compact_colbert_is_the_served_vectors_and_pools_as_pylate(served, name, pylate):
    """colbert_vectors_int8 of a document: round(v * 127) of its float vectors. Token pooling (colbert_pool_factor
    2) gives PyLate's encode(pool_factor=2) clusters ([CLS]'s vector kept first, alone), each mean L2-normalized
    here (PyLate keeps their norms) and in first-token order (PyLate's: fcluster's labels): compared as sets."""
    got = kserve(served, name, "document", ("colbert_vectors", "colbert_vectors_int8", "colbert_length"))
    n = int(got["colbert_length"][0, 0])
    np.testing.assert_array_equal(got["colbert_vectors_int8"][0, :n],
                                  np.round(got["colbert_vectors"][0, :n] * 127).astype(np.int8))
    pooled = kserve(served, name, "document", parameters={"colbert_pool_factor": 2})
    for row, (vectors, count) in enumerate(zip(pooled["colbert_vectors"], pooled["colbert_length"].reshape(-1))):
        want = np.asarray(pylate["document_pooled"][row], np.float64)
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        ours = vectors[:count].astype(np.float64)
        assert len(ours) == len(want), (name, row, len(ours), len(want))
        np.testing.assert_allclose(ours[0], want[0], atol=1e-5)  # [CLS]'s, protected
        similarity = ours @ want.T
        assert similarity.max(axis=1).min() >= 0.9999 and similarity.max(axis=0).min() >= 0.9999, (name, row)


@pytest.mark.parametrize("side", ["query", "document"])
def test_muvera_of_the_served_vectors_is_fastembeds(served, name, side):
    """Issue 70: MUVERA from a ColBERT checkpoint's vectors (NAME_bls's `muvera`, the side by input_type) equals
    fastembed's Muvera with the export's recorded parameters over the vectors served with it."""
    import json

    with open(os.path.join(served.repository, name, "1", "export.json"), encoding="utf-8") as handle:
        recorded = json.load(handle)["muvera"]
    got = kserve(served, name, side, names=("colbert_vectors", "colbert_length", "muvera"))
    sets = [(vectors[:n], side) for vectors, n in zip(got["colbert_vectors"], got["colbert_length"].reshape(-1))]
    np.testing.assert_allclose(got["muvera"], fastembed_muvera(recorded, 16, sets), atol=1e-5, rtol=0,
                               err_msg=side)


def test_pooling_a_query_is_refused_naming_the_field(served, name):
    status, answer = post(served, "/v1/encode", {"model": name, "input": [QUERY], "input_type": "query",
                                                 "return_dense": False, "return_colbert": True,
                                                 "colbert_pool_factor": 2})
    assert status == 400 and answer["error"]["param"] == "colbert_pool_factor", answer
    assert "documents only" in answer["error"]["message"], answer


def export_line(folder, *extra):
    done = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--model", str(folder),
                           "--name", "refused", "--repository", os.path.join(str(folder), "repository"), *extra],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": PROJECT})
    return done.returncode, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def test_what_the_graph_does_not_build_is_refused_in_one_line(tmp_path):
    """A Dense with an activation, a query marker the tokenizer lacks, prompts, --max-length: one line, exit 1."""
    import json

    cases = []
    folder = build_colbert(tmp_path / "activation")
    config = os.path.join(folder, "1_Dense", "config.json")
    with open(config, encoding="utf-8") as handle:
        data = json.load(handle)
    with open(config, "w", encoding="utf-8") as handle:
        json.dump({**data, "activation_function": "torch.nn.modules.activation.Tanh"}, handle)
    cases.append((folder, (), "plain Linear only"))
    folder = build_colbert(tmp_path / "marker")
    path = os.path.join(folder, "config_sentence_transformers.json")
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({**data, "query_prefix": "[Q] "}, handle)
    cases.append((folder, (), "untrained embedding"))
    cases.append((build_colbert(tmp_path / "length"), ("--max-length", "64"), "leave --max-length out"))
    for folder, extra, words in cases:
        code, line = export_line(folder, *extra)
        assert code != 0 and line.startswith("export: ") and words in line, (folder, line)
