"""Decoder rerankers (issue 56 item 6): a sequence-classification decoder (Qwen3ForSequenceClassification, laid out as
tomaarsen/Qwen3-Reranker-0.6B-seq-cls, with its chat template) exported by name beside the default MiniLM export and
served as every cross-encoder is: the tokenizer model renders each (query, document) pair as CrossEncoder does (the
template's fixed text around the two texts, cut at max length with the template's tail written back), token for
token, and the scores over KServe (the rerank model and the pair ensemble) and the HTTP front (/v1/rerank, TEI's
/rerank and /predict, Cohere's /v2/rerank) are sentence-transformers' CrossEncoder.predict within 1e-4, in the same
order. A template that is not fixed text around the texts is refused at export in one line.

The tiny model's template alone is ~130 tokens (its 2,000-token vocabulary), so the export's max length is 256: short
pairs fit, long documents are cut.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import PROJECT, serve_exports
from tiny_checkpoints import build_qwen3_reranker
from triton_clients import PROTOCOLS, bytes_input, client, post, rerank

TOLERANCE = 1e-4
MAX_LENGTH = 256
NAME = "qr"
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "short",
    "Berlin is the capital of Germany.",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "The Seine flows through Paris. " * 40,  # longer than max length: cut, the template's tail written back
    "An EOS in the middle <|endoftext|> of the text.",
    "A document ending with the pad token<|endoftext|>",  # pad == eos: transformers reads the token before it
    "  spaces around, and a new\nline  ",
    "def capital(country):\n    return {'France': 'Paris'}[country]",
    "The Louvre is the world's most-visited museum.",
]
LONG_QUERY = "Where is the capital of France and what is its history? " * 12  # cut: the documents go with it


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return build_qwen3_reranker(tmp_path_factory.mktemp("qwen3_reranker"))


@pytest.fixture(scope="module")
def decoder_server(server, reranker):
    """The reranker exported by name beside MiniLM: the shared server."""
    with serve_exports(server, {NAME: ["--model", reranker, "--max-length", MAX_LENGTH]}):
        yield server


@pytest.fixture(scope="module")
def repository(decoder_server):
    return Path(decoder_server.repository)


@pytest.fixture(scope="module")
def cross_encoder(reranker):
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(1)  # the server runs beside it
    return CrossEncoder(reranker, max_length=MAX_LENGTH, device="cpu")


def expected_ids(cross_encoder, pairs):
    features = cross_encoder.preprocess(pairs)
    return [ids[mask.bool()].tolist() for ids, mask in zip(features["input_ids"], features["attention_mask"])]


def test_export_renders_the_template_and_checks_parity(repository):
    manifest = json.load(open(repository / NAME / "1" / "export.json"))
    assert manifest["kind"] == "cross-encoder" and manifest["model_type"] == "qwen3" and manifest["pair_template"]
    parity = manifest["parity"]
    assert parity["same_token_ids"] == parity["pairs"] and parity["truncated_pairs"] > 0, parity
    assert parity["cross_encoder_max_abs_diff"] <= TOLERANCE, parity
    template = json.load(open(repository / f"{NAME}_tokenizer" / "1" / "pair_template.json"))
    assert template["prefix"].startswith("<|im_start|>system") and template["prefix"].endswith("<Query>: ")
    assert template["between"] == "\n<Document>: " and template["suffix_ids"]
    assert json.load(open(repository / "ensemble" / "1" / "export.json"))["kind"] == "embedding"


def test_tokenizer_model_gives_cross_encoders_token_ids(decoder_server, cross_encoder):
    """Each (query, document) row, the long query's included, is CrossEncoder's preprocessing token for token;
    truncated says a row was cut, query_truncated that the cut reached its query."""
    import tritonclient.grpc as grpcclient

    queries = [QUERY] * len(DOCUMENTS) + [LONG_QUERY] * 2
    texts = DOCUMENTS + DOCUMENTS[:2]
    connection = client("grpc", decoder_server.grpc_url)
    try:
        result = connection.infer(f"{NAME}_tokenizer", [bytes_input(grpcclient, "text", texts, [len(texts), 1]),
                                                        bytes_input(grpcclient, "query", queries, [len(texts), 1])],
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in
                                           ("input_ids", "num_tokens", "truncated", "query_truncated")])
    finally:
        connection.close()
    ids, counts = result.as_numpy("input_ids"), result.as_numpy("num_tokens").reshape(-1)
    expected = expected_ids(cross_encoder, list(zip(queries, texts)))
    for row, want in enumerate(expected):
        assert ids[row, :counts[row]].tolist() == want, row
    cut = result.as_numpy("truncated").reshape(-1).tolist()
    assert cut == [i in (4, 10, 11) for i in range(len(texts))], cut
    assert result.as_numpy("query_truncated").reshape(-1).tolist() == [i >= 10 for i in range(len(texts))]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_model_matches_cross_encoder(decoder_server, cross_encoder, protocol):
    expected = cross_encoder.predict([(QUERY, d) for d in DOCUMENTS])
    result = rerank(protocol, decoder_server, QUERY, DOCUMENTS, model=f"{NAME}_rerank")
    worst = float(np.abs(result["scores"] - expected).max())
    print(f"\ndecoder reranker over {protocol}: max abs difference {worst:.3g}")
    assert worst <= TOLERANCE and np.ptp(expected) > 1e-3, (worst, expected)
    assert list(np.argsort(-result["scores"])) == list(np.argsort(-expected))
    assert result["truncated"].tolist() == [i == 4 for i in range(len(DOCUMENTS))]


def test_pair_ensemble_matches_cross_encoder(decoder_server, cross_encoder):
    """The public pair model NAME (a query per row), the long query's rows included."""
    import torch
    import tritonclient.grpc as grpcclient

    queries = [QUERY, LONG_QUERY, "q", "日本の首都は?"] * 2
    texts = DOCUMENTS[:8]
    connection = client("grpc", decoder_server.grpc_url)
    try:
        result = connection.infer(NAME, [bytes_input(grpcclient, "query", queries, [8, 1]),
                                         bytes_input(grpcclient, "text", texts, [8, 1])])
    finally:
        connection.close()
    pairs = list(zip(queries, texts))
    assert np.abs(result.as_numpy("scores")[:, 0] - cross_encoder.predict(pairs)).max() <= TOLERANCE
    raw = cross_encoder.predict(pairs, activation_fn=torch.nn.Identity())
    assert np.abs(result.as_numpy("logits")[:, 0] - raw).max() <= TOLERANCE


def test_http_front_reranks_as_cross_encoder(decoder_server, cross_encoder):
    expected = cross_encoder.predict([(QUERY, d) for d in DOCUMENTS])
    order = list(np.argsort(-expected))
    status, body = post(decoder_server, "/v1/rerank", {"model": NAME, "query": QUERY, "documents": DOCUMENTS})
    assert status == 200, body
    assert [r["index"] for r in body["results"]] == order
    got = np.array([r["relevance_score"] for r in body["results"]])
    assert np.abs(got - expected[order]).max() <= TOLERANCE
    status, tei = post(decoder_server, "/rerank", {"model": NAME, "query": QUERY, "texts": DOCUMENTS,
                                                   "truncate": True})
    assert status == 200, tei
    assert [r["index"] for r in tei] == order
    assert np.abs(np.array([r["score"] for r in tei]) - expected[order]).max() <= TOLERANCE
    status, cohere = post(decoder_server, "/v2/rerank", {"model": NAME, "query": QUERY, "documents": DOCUMENTS})
    assert status == 200 and [r["index"] for r in cohere["results"]] == order, cohere
    status, predicted = post(decoder_server, "/predict", {"model": NAME, "truncate": True,
                                                          "inputs": [[QUERY, d] for d in DOCUMENTS[:4]]})
    assert status == 200, predicted
    assert np.abs(np.array([row[0]["score"] for row in predicted]) - expected[:4]).max() <= TOLERANCE


def test_export_refuses_a_template_that_is_not_fixed_text(reranker, tmp_path):
    """A template that changes the texts (here: trims the query) cannot be served as prefix + query + between +
    document + suffix: refused in one line before anything is written."""
    folder = tmp_path / "trimming"
    shutil.copytree(reranker, folder)
    template = (folder / "chat_template.jinja").read_text()
    assert "{{ ns.query }}" in template
    (folder / "chat_template.jinja").write_text(template.replace("{{ ns.query }}", "{{ ns.query | trim }}"))
    result = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--repository",
                             str(tmp_path / "repository"), "--model", str(folder), "--name", "bad"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "chat template does not render" in result.stderr.strip().splitlines()[-1], result.stderr
    assert not (tmp_path / "repository").exists()
