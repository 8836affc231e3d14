"""Ragged batching (issue 51): an export made with --ragged-batch takes requests of any widths into one encoder run
(Triton's allow_ragged_batch; the graph rebuilds the padded batch from the flat tokens and each row's width), and
answers what the padded export answers.

One server, the suite's shared one: MiniLM as the default export, and a tiny bge-m3 (dense, sparse, ColBERT) exported
twice beside it, `m3_padded` (width groups, as shipped) and `m3_ragged`. The suite runs it on whichever backend serves
`onnxruntime` models: the stand-in, or Triton's C++ backend (ONNXRUNTIME_BACKEND, as CI runs it), which hands ragged
inputs to the graph.
"""
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import pbtxt, serve_exports, tiny_xlmr
from triton_clients import PROTOCOLS, VARIED_TEXTS, client, infer, settled_stats, url_for

MAX_LENGTH = 128
PADDED, RAGGED = "m3_padded", "m3_ragged"
M3_OUTPUTS = ("embedding", "sparse_indices", "sparse_values", "sparse_count", "colbert_vectors", "colbert_length",
              "num_tokens", "truncated")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def ragged_server(server, xlmr_tokenizer_dir, tmp_path_factory):
    model = tiny_xlmr(tmp_path_factory.mktemp("tiny_m3_ragged"), xlmr_tokenizer_dir, seed=77, scale=0.2, heads=True)
    padded = ["--model", model, "--max-length", MAX_LENGTH]
    with serve_exports(server, {PADDED: padded, RAGGED: [*padded, "--ragged-batch"]}):
        encoder = pbtxt.read(f"{server.repository}/{RAGGED}_embedding/config.pbtxt")
        assert all(tensor.allow_ragged_batch for tensor in encoder.input)
        yield server


def sparse_rows(result):
    return [{int(i): float(v) for i, v in zip(ids[:n], values[:n])} for ids, values, n in
            zip(result["sparse_indices"], result["sparse_values"], result["sparse_count"].reshape(-1))]


def assert_same(got, want, where):
    """The ragged export's outputs against the padded one's: dense, sparse as {token: weight}, ColBERT per row up to
    its length (what past it is padding may be wider in a ragged run)."""
    assert np.abs(got["embedding"] - want["embedding"]).max() < TOLERANCE, where
    for key in ("num_tokens", "truncated", "sparse_count", "colbert_length"):
        assert np.array_equal(got[key], want[key]), f"{where}: {key}"
    for row, (a, b) in enumerate(zip(sparse_rows(got), sparse_rows(want))):
        assert a.keys() == b.keys(), f"{where}: sparse ids of row {row}"
        assert max([abs(a[k] - b[k]) for k in a] + [0.0]) < TOLERANCE, f"{where}: sparse weights of row {row}"
    for row, n in enumerate(want["colbert_length"].reshape(-1)):
        difference = np.abs(got["colbert_vectors"][row, :n] - want["colbert_vectors"][row, :n]).max()
        assert difference < TOLERANCE, f"{where}: ColBERT vectors of row {row}"


def test_one_encoder_run_takes_requests_of_different_widths(ragged_server):
    """Direct KServe calls to the ragged encoder, every request of its own width, sent together: runs of several
    requests happen (so of several widths), and each row's outputs are the padded encoder's for the same tokens."""
    tokens = infer("grpc", ragged_server.grpc_url, VARIED_TEXTS, model=f"{RAGGED}_tokenizer",
                   names=("input_ids", "attention_mask", "num_tokens"))
    lengths = tokens["num_tokens"].reshape(-1)
    rows = sorted({int(n): i for i, n in enumerate(lengths)}.values())  # one text per width
    assert len(rows) >= 12, lengths

    def run(model, row):
        from tritonclient.grpc import InferInput, InferRequestedOutput

        n = int(lengths[row])
        inputs = []
        for name in ("input_ids", "attention_mask"):
            tensor = InferInput(name, [1, n], "INT64")
            tensor.set_data_from_numpy(np.ascontiguousarray(tokens[name][row:row + 1, :n]))
            inputs.append(tensor)
        connection = client("grpc", ragged_server.grpc_url)
        result = connection.infer(model, inputs, outputs=[InferRequestedOutput(o) for o in M3_OUTPUTS[:6]])
        return {o: result.as_numpy(o) for o in M3_OUTPUTS[:6]}

    before = settled_stats(ragged_server, f"{RAGGED}_embedding")
    for _ in range(3):
        with ThreadPoolExecutor(len(rows)) as pool:
            ragged = list(pool.map(lambda row: run(f"{RAGGED}_embedding", row), rows))
    after = settled_stats(ragged_server, f"{RAGGED}_embedding")
    padded = [run(f"{PADDED}_embedding", row) for row in rows]
    for row, got, want in zip(rows, ragged, padded):
        for key in ("num_tokens", "truncated"):
            got[key] = want[key] = np.zeros(1)
        assert_same(got, want, f"text {row} ({lengths[row]} tokens)")
    requests = after["inference_count"] - before["inference_count"]
    runs = after["execution_count"] - before["execution_count"]
    assert requests == 3 * len(rows) and runs < requests, (requests, runs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_ragged_export_answers_what_the_padded_one_answers(ragged_server, protocol):
    """Many texts in one request (the BLS model's length groups), and each text alone, all at once (the ensemble:
    the tokenizer's requests of several widths meet in the encoder's queue)."""
    url = url_for(ragged_server, protocol)
    want = infer(protocol, url, VARIED_TEXTS, model=f"{PADDED}_bls", names=M3_OUTPUTS)
    got = infer(protocol, url, VARIED_TEXTS, model=f"{RAGGED}_bls", names=M3_OUTPUTS)
    assert_same(got, want, f"{protocol}: {RAGGED}_bls")
    with ThreadPoolExecutor(16) as pool:
        singles = list(pool.map(lambda text: infer(protocol, url, [text], model=RAGGED, names=M3_OUTPUTS),
                                VARIED_TEXTS))
    for i, single in enumerate(singles):
        alone = {key: value[i:i + 1] for key, value in want.items()}
        for key in ("sparse_indices", "sparse_values", "colbert_vectors"):  # each request's own width
            alone[key] = alone[key][:, :single[key].shape[1]]
        assert_same(single, alone, f"{protocol}: {RAGGED}, text {i}")


def post(server, path, body):
    request = urllib.request.Request(server.proxy_url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def test_the_http_front_serves_the_ragged_export_like_the_padded_one(ragged_server):
    """OpenAI's embeddings, bge-m3's rerank score and late chunking, by the export's name."""
    texts = VARIED_TEXTS[:20]
    vectors = {name: np.array([d["embedding"] for d in post(ragged_server, "/v1/embeddings",
                                                              {"model": name, "input": texts})["data"]])
               for name in (PADDED, RAGGED)}
    assert np.abs(vectors[RAGGED] - vectors[PADDED]).max() < TOLERANCE
    minilm = np.array([d["embedding"] for d in post(ragged_server, "/v1/embeddings", {"input": texts})["data"]])
    assert minilm.shape[1] != vectors[RAGGED].shape[1]  # the default export still answers as itself
    scores = {name: [r["relevance_score"] for r in sorted(post(ragged_server, "/v1/rerank", {
        "model": name, "query": texts[0], "documents": texts[1:]})["results"], key=lambda r: r["index"])]
              for name in (PADDED, RAGGED)}
    assert np.abs(np.array(scores[RAGGED]) - np.array(scores[PADDED])).max() < TOLERANCE
    long_texts = [" ".join(VARIED_TEXTS[i:i + 6]) for i in range(0, 24, 6)]
    chunks = {name: post(ragged_server, "/v1/chunk_embeddings", {"model": name, "input": long_texts,
                                                                 "chunk_tokens": 24})["data"]
              for name in (PADDED, RAGGED)}
    assert len(numbers(chunks[RAGGED])) == len(numbers(chunks[PADDED])) > 4 * 32
    assert np.abs(np.array(numbers(chunks[RAGGED])) - np.array(numbers(chunks[PADDED]))).max() < TOLERANCE


def numbers(value):
    """Every number in a JSON value, in order."""
    if isinstance(value, dict):
        return [n for key in sorted(value) for n in numbers(value[key])]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []
