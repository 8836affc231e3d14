"""Cross-encoder rerankers (issue 18): export recognizes a sequence-classification model and refuses what it cannot
serve; the tokenizer model pairs (query, passage) with the references' truncation, token for token; the export's
rerank model (`query` + `documents`, KServe) and pair ensemble give sentence-transformers' CrossEncoder.predict and
FlagEmbedding's FlagReranker.compute_score (normalize off and on) within 1e-5, over gRPC and HTTP; bad input is
INVALID_ARGUMENT naming the field; the proxy's /v1/rerank scores by model kind.

FlagEmbedding 1.4 on transformers 5 tokenizes a pair by decoding the cut token ids and tokenizing the text again
(tokenizer_compat.prepare_for_model_compat): a passage with an <unk> token ('🍣') comes back with other ids. Its
rule on ids (transformers 4's prepare_for_model) is what the tokenizer model follows; such passages are left out of
the comparison with FlagReranker (and counted), not with CrossEncoder.

Models: a tiny random XLM-R cross-encoder (one logit, the 250k tokenizer) and a tiny random BERT one (two labels,
MiniLM's tokenizer: token types), exported beside a tiny XLM-R embedder into one repository served once.
"""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import CE_BERT_MAX_LENGTH as BERT_MAX_LENGTH
from conftest import CE_MAX_LENGTH as MAX_LENGTH
from conftest import PROJECT, pbtxt
from triton_clients import PROTOCOLS, VARIED_TEXTS, bytes_input, client, post, raw_bytes_grpc, rerank

TOLERANCE = 1e-5
QUERY = "What is the capital of France?"
# 100 documents of mixed lengths: VARIED_TEXTS (53, two far over the max length) and 47 more of 1 to ~200 tokens.
WORDS = ["paris", "france", "capital", "city", "river", "seine", "museum", "louvre", "tower", "eiffel", "history",
         "people", "food", "wine", "art"]
DOCUMENTS = VARIED_TEXTS + [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + (i * 37) % 160))
                            for i in range(47)]
LONG_QUERY = "Where is the capital of France and what is its history? " * 12  # over 3/4 of MAX_LENGTH tokens


@pytest.fixture(scope="module")
def references(xlmr_ce):
    """CrossEncoder.predict (sigmoid) and FlagReranker.compute_score (logits, and normalized) on (QUERY, DOCUMENTS)."""
    import torch
    from FlagEmbedding import FlagReranker
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    torch.set_num_threads(1)  # a shared 2-core machine: the server runs beside it
    pairs = [(QUERY, d) for d in DOCUMENTS]
    hf = AutoTokenizer.from_pretrained(xlmr_ce)
    round_trip = [i for i, d in enumerate(DOCUMENTS) if flag_rule(hf, QUERY, d) != pair_rule(hf, QUERY, d)]
    flag = FlagReranker(xlmr_ce, use_fp16=False, devices="cpu", max_length=MAX_LENGTH)
    return {"cross_encoder": CrossEncoder(xlmr_ce, max_length=MAX_LENGTH, device="cpu").predict(pairs),
            "logits": np.asarray(flag.compute_score(pairs, max_length=MAX_LENGTH)),
            "normalized": np.asarray(flag.compute_score(pairs, max_length=MAX_LENGTH, normalize=True)),
            "flag_rows": [i for i in range(len(DOCUMENTS)) if i not in round_trip]}


def pair_rule(hf, query, passage):
    """FlagReranker's rule on token ids: the query cut to 3/4 of max length, then the pair cut 'only_second'."""
    q = hf(query, add_special_tokens=False, truncation=True, max_length=MAX_LENGTH * 3 // 4)["input_ids"]
    q_text = hf.decode(q) if len(q) == MAX_LENGTH * 3 // 4 else query
    return hf(q_text, passage, truncation="only_second", max_length=MAX_LENGTH)["input_ids"]


def flag_rule(hf, query, passage):
    """What FlagReranker.compute_score feeds its model with transformers 5 (the decode / tokenize round trip)."""
    from FlagEmbedding.utils.tokenizer_compat import prepare_for_model_compat

    q = hf(query, add_special_tokens=False, truncation=True, max_length=MAX_LENGTH * 3 // 4)["input_ids"]
    p = hf(passage, add_special_tokens=False, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    return prepare_for_model_compat(hf, q, p, truncation="only_second", max_length=MAX_LENGTH)["input_ids"]


# ---------------------------------------------------------------- export
def test_export_recognizes_cross_encoders_and_checks_parity(ce_repository):
    repository = ce_repository
    import onnx

    for name, labels in (("xr", 1), ("bert2", 2)):
        manifest = json.load(open(repository / name / "1" / "export.json"))
        assert manifest["kind"] == "cross-encoder" and manifest["num_labels"] == labels
        assert manifest["rerank_model"] == f"{name}_rerank" and manifest["embedding_size"] is None
        graph = onnx.load(str(repository / f"{name}_embedding" / "1" / "model.onnx"))
        assert [o.name for o in graph.graph.output] == ["logits", "scores"]
        assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
        parity = manifest["parity"]
        assert parity["truncated_pairs"] > 0 and parity["cross_encoder_max_abs_diff"] <= TOLERANCE, parity
        if labels == 1:  # FlagReranker takes one logit per pair
            assert parity["flag_reranker_max_abs_diff"] <= TOLERANCE, parity
            assert parity["flag_reranker_normalized_max_abs_diff"] <= TOLERANCE, parity
    assert json.load(open(repository / "emb" / "1" / "export.json"))["kind"] == "embedding"
    assert "label" in pbtxt.parameters(pbtxt.read(repository / "bert2_rerank" / "config.pbtxt"))


def _config_only(folder, architecture, model_type):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": model_type}))
    return str(folder)


def test_export_refuses_what_it_cannot_serve_faithfully(tmp_path, xlmr_ce):
    def refused(*args):
        result = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--repository",
                                 str(tmp_path / "repository"), *args], capture_output=True, text=True, timeout=300)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        return result.stderr.strip().splitlines()[-1]

    assert "--name" in refused("--model", xlmr_ce)
    assert "--pooling" in refused("--model", xlmr_ce, "--name", "x", "--pooling", "mean")
    assert "distilbert" in refused("--model", _config_only(tmp_path / "d", "DistilBertForSequenceClassification",
                                                           "distilbert"), "--name", "d")
    assert "would drop" in refused("--model", _config_only(tmp_path / "t", "BertForTokenClassification", "bert"))
    assert not (tmp_path / "repository").exists()


# ---------------------------------------------------------------- the tokenizer model's pairs
def test_pairs_are_tokenized_as_the_references_token_for_token(ce_server, xlmr_ce):
    """The tokenizer model's (query, text) rows against CrossEncoder's tokenization (short queries: longest_first
    cuts the passage) and FlagReranker's (the query cut to 3/4 of max length first, then only_second)."""
    import tritonclient.grpc as grpcclient
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(xlmr_ce)
    queries = [QUERY] * 20 + [LONG_QUERY] * 5
    passages = DOCUMENTS[20:32] + DOCUMENTS[51:53] + DOCUMENTS[60:66] + DOCUMENTS[-5:]  # [28]: an <unk>; [51:53] long
    connection = client("grpc", ce_server.grpc_url)
    try:
        result = connection.infer("xr_tokenizer", [bytes_input(grpcclient, "text", passages, [25, 1]),
                                                   bytes_input(grpcclient, "query", queries, [25, 1])],
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in
                                           ("input_ids", "num_tokens", "truncated", "query_truncated")])
    finally:
        connection.close()
    ids, counts = result.as_numpy("input_ids"), result.as_numpy("num_tokens").reshape(-1)
    same_as_flag = 0
    for row, (query, passage) in enumerate(zip(queries, passages)):
        got = ids[row, :counts[row]].tolist()
        assert got == pair_rule(hf, query, passage), row
        if query == QUERY:  # CrossEncoder's longest_first: the passage, the longer part, is cut first
            assert got == hf(query, passage, truncation=True, max_length=MAX_LENGTH)["input_ids"], row
        same_as_flag += got == flag_rule(hf, query, passage)
        full = len(hf(query, passage)["input_ids"])
        assert bool(result.as_numpy("truncated")[row, 0]) == (full > MAX_LENGTH), row
        assert bool(result.as_numpy("query_truncated")[row, 0]) == (query == LONG_QUERY), row
    assert same_as_flag == len(queries) - 1  # all but the <unk> passage's round trip
    assert result.as_numpy("truncated").sum() >= 7  # long passages and the long queries


# ---------------------------------------------------------------- KServe: the rerank model and the pair ensemble
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_model_matches_cross_encoder_and_flag_reranker(ce_server, references, protocol):
    """One query, 100 documents of mixed lengths (some cut), over gRPC and HTTP: scores = CrossEncoder.predict =
    compute_score(normalize=True), logits = compute_score() within 1e-5."""
    result, rows = rerank(protocol, ce_server, QUERY, DOCUMENTS), references["flag_rows"]
    assert len(rows) >= 98  # FlagReranker's round trip changes the <unk> passage only
    assert result["scores"].shape == (100,) and result["truncated"].sum() >= 2 and not result["query_truncated"][0]
    worst = {"cross_encoder": float(np.abs(result["scores"] - references["cross_encoder"]).max()),
             "normalized": float(np.abs(result["scores"] - references["normalized"])[rows].max()),
             "logits": float(np.abs(result["logits"] - references["logits"])[rows].max())}
    print(f"\ncross-encoder rerank over {protocol}, 100 documents: max abs differences {worst}")
    assert max(worst.values()) <= TOLERANCE, worst
    assert np.ptp(result["scores"]) > 0.05  # the scores spread: ranking them means something


def test_pair_ensembles_match_cross_encoder(ce_server, xlmr_ce, bert_ce):
    """The public pair models (rows of query + text), one logit (sigmoid) and two labels (softmax, token types)."""
    import tritonclient.grpc as grpcclient
    from sentence_transformers import CrossEncoder

    queries = [QUERY, "q", "日本の首都は?", LONG_QUERY] * 4
    texts = DOCUMENTS[::6][:16]
    connection = client("grpc", ce_server.grpc_url)
    try:
        for name, folder, length in (("xr", xlmr_ce, MAX_LENGTH), ("bert2", bert_ce, BERT_MAX_LENGTH)):
            result = connection.infer(name, [bytes_input(grpcclient, "query", queries, [16, 1]),
                                             bytes_input(grpcclient, "text", texts, [16, 1])])
            reference = CrossEncoder(folder, max_length=length, device="cpu")
            short = [i for i, q in enumerate(queries) if q != LONG_QUERY]  # CrossEncoder cuts long queries its way
            pairs = [(queries[i], texts[i]) for i in short]
            expected = reference.predict(pairs, apply_softmax=name == "bert2").reshape(len(short), -1)
            assert np.abs(result.as_numpy("scores")[short] - expected).max() <= TOLERANCE, name
            raw = reference.predict(pairs, activation_fn=_identity()).reshape(len(short), -1)
            assert np.abs(result.as_numpy("logits")[short] - raw).max() <= TOLERANCE, name
            assert result.as_numpy("query_truncated")[3, 0] and not result.as_numpy("query_truncated")[0, 0]
    finally:
        connection.close()


def _identity():
    import torch

    return torch.nn.Identity()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input_is_invalid_argument_naming_the_field(ce_server, protocol):
    from tritonclient.utils import InferenceServerException

    for query, documents, named in (("  ", ["fine"], "query is empty"), (QUERY, [], "documents is empty"),
                                    (QUERY, ["fine", ""], "documents[1] is empty"),
                                    (QUERY, ["fine", "ok", b"\xff\xfe"], "documents[2] is not valid UTF-8"),
                                    (b"\xc3", ["fine"], "query is not valid UTF-8")):
        with pytest.raises(InferenceServerException) as error:
            rerank(protocol, ce_server, query, documents)
        assert error.value.message().startswith(named), error.value.message()
        assert str(error.value.status()) in ("StatusCode.INVALID_ARGUMENT", "400"), error.value.status()
    assert rerank(protocol, ce_server, QUERY, ["still serving"])["scores"].shape == (1,)


# Named exports' Python models (a cross-encoder's NAME_rerank, an embedder's NAME_bls, NAME_rerank, NAME_chunks)
# read BYTES with the models' library as the default export's do (issue 36): {model: (forged input, other inputs,
# parameters)}
NAMED_MODELS = {"xr_rerank": ("documents", [("query", [1], b"q")], {}), "xr_bls": ("text", [], {"query": "q"}),
                "emb_bls": ("text", [], {}), "emb_rerank": ("documents", [("query", [1], b"q")], {}),
                "emb_chunks": ("text", [], {"chunk_tokens": 8})}


@pytest.mark.parametrize("model", list(NAMED_MODELS))
def test_named_exports_answer_forged_bytes_with_a_400_and_keep_their_stubs(ce_server, model):
    import grpc

    from local_triton import launch

    def prefixed(text):
        return len(text).to_bytes(4, "little") + text

    field, others, parameters = NAMED_MODELS[model]
    shape = [1, 1] if model.endswith("_bls") else [1]
    others = [(name, sh, prefixed(raw)) for name, sh, raw in others]
    forged = [(field, shape, b"\xe8\x03\x00\x00abc")] + others
    code, details = raw_bytes_grpc(ce_server.grpc_url, model, forged, parameters)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}[0] is malformed"), details
    dead = [pid for pid, (state, _) in launch.children(ce_server.process.pid).items() if state == "Z"]
    assert ce_server.process.poll() is None and not dead, ce_server.log()[-3000:]
    good = [(field, shape, prefixed(b"a good text"))] + others
    code, details = raw_bytes_grpc(ce_server.grpc_url, model, good, parameters)
    assert code == grpc.StatusCode.OK, details


def test_cross_encoder_rerank_refuses_more_than_max_documents(ce_server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as error:
        rerank("grpc", ce_server, QUERY, [f"doc {i}" for i in range(2049)])
    assert error.value.message().startswith("documents holds 2049 documents, over the limit of 2048"), error.value


# ---------------------------------------------------------------- the proxy: /v1/rerank by model kind, /v1/models
def test_proxy_reranks_by_model_kind(ce_server, references):
    """/v1/rerank on the cross-encoder: the classifier's scores (= CrossEncoder's within 1e-5), best first, top_n,
    return_documents; on the embedder beside it, bge-m3's score (its per-mode scores); /v1/models says the kinds."""
    status, body = post(ce_server, "/v1/rerank", {"model": "xr", "query": QUERY, "documents": DOCUMENTS})
    assert status == 200, body
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(100)) and "scores" not in results[0]
    got = np.array([r["relevance_score"] for r in results])
    assert np.all(np.diff(got) <= 0)
    assert np.abs(got - references["cross_encoder"][[r["index"] for r in results]]).max() <= TOLERANCE
    status, top = post(ce_server, "/v1/rerank", {"model": "xr", "query": QUERY, "documents": DOCUMENTS,
                                                 "top_n": 3, "return_documents": True})
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:3]]
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in top["results"])

    status, embedder = post(ce_server, "/v1/rerank", {"model": "emb", "query": QUERY, "documents": DOCUMENTS[:5]})
    assert status == 200 and set(embedder["results"][0]["scores"]) == {"dense"}, embedder
    with urllib.request.urlopen(ce_server.proxy_url + "/v1/models", timeout=30) as response:
        kinds = {m["id"]: m["kind"] for m in json.load(response)["data"] if "root" not in m}  # not served names
    assert kinds == {"xr": "cross-encoder", "bert2": "cross-encoder", "emb": "embedding"}


def test_proxy_bad_rerank_input_names_it(ce_server):
    cases = [({"query": " ", "documents": ["a"]}, 400, "query"), ({"query": QUERY, "documents": []}, 400, "documents"),
             ({"query": QUERY, "documents": ["a", ""]}, 400, "documents"),
             ({"query": QUERY, "documents": ["a"], "weights": [1, 0, 0]}, 400, "weights"),
             ({"query": QUERY, "documents": ["a", DOCUMENTS[51]], "truncate": False}, 422, "documents")]
    for body, code, param in cases:
        status, answer = post(ce_server, "/v1/rerank", {"model": "xr", **body})
        assert status == code and answer["error"]["param"] == param, (body, answer)
    assert "documents[1]" in answer["error"]["message"]
    status, answer = post(ce_server, "/v1/embeddings", {"model": "xr", "input": ["a"]})
    assert status == 400 and "dense" in answer["error"]["message"]
