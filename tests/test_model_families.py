"""The model families of docs/models.md (issue 56), served exactly: each a tiny random folder laid out as its real
checkpoint (tiny_checkpoints.FAMILIES: every row but those another module checks, so a family added there is checked
here with no edit), exported by name beside the default MiniLM export, all served by one tritonserver, and checked
through both doors (KServe gRPC to NAME_bls or NAME_rerank, the HTTP front) against sentence-transformers' own class
for the folder (SentenceTransformer, SparseEncoder, CrossEncoder) on texts in many scripts, one cut at the max
length: cosine >= 0.9999, sparse weights within 1e-3, scores within 1e-5, the same token ids. Prompts, Matryoshka
widths, a quantized type and `normalize: false` are checked where the families have them; a folder the graph would
serve wrongly is refused at export (tests/test_export.py's reference check tests the check itself). The tritonserver
is the suite's shared one."""
import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

import suite_stats
from conftest import PROJECT, serve_exports
from tiny_checkpoints import FAMILIES, HIDDEN
from triton_clients import PROTOCOLS, VARIED_TEXTS, bytes_input, client, outputs, rerank, text_input

MAX_LENGTH = 96
# {export name: family}: names as a user would give them (the rows another module serves and checks left out)
EXPORTS = {family.export_name: key for key, family in FAMILIES.items() if family.checked_in is None}
DENSE = [name for name, family in EXPORTS.items() if FAMILIES[family].reference == "SentenceTransformer"]
EMBEDDERS = [name for name, family in EXPORTS.items()
             if FAMILIES[family].reference in ("SentenceTransformer", "SparseEncoder")]
RERANKERS = [name for name, family in EXPORTS.items() if FAMILIES[family].reference == "CrossEncoder"]
# causal LMs published as yes/no rerankers (their score: P("yes") against "no" after the model card's prompt)
YES_NO = [name for name, family in EXPORTS.items() if "--yes-no-reranker" in FAMILIES[family].export_args]
# a prompt each family's folder names (sentence-transformers' prompt_name), where it has one that is not empty
PROMPTS = {name: FAMILIES[family].prompt for name, family in EXPORTS.items() if FAMILIES[family].prompt}
SCORE_TOLERANCE = 1e-5
QUERY = "What is the capital of France?"
# many scripts and lengths, and one text longer than MAX_LENGTH tokens (cut by both sides at the same token)
TEXTS = [VARIED_TEXTS[i] for i in (0, 2, 3, 7, 13, 14, 19, 21, 27, 30, 33, 49)] + [VARIED_TEXTS[-2]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: FAMILIES[family].build(str(tmp_path_factory.mktemp(name))) for name, family in EXPORTS.items()}


@pytest.fixture(scope="module")
def references(folders):
    import sentence_transformers

    loaded = {}
    for name, folder in folders.items():
        family = FAMILIES[EXPORTS[name]]
        trust = {"trust_remote_code": family.trust_remote_code}  # the folder's own code, as the export runs it
        if not hasattr(sentence_transformers, family.reference):  # scored by its own reference code: the yes/no test
            continue
        if family.reference == "CrossEncoder":  # cut at the export's --max-length
            loaded[name] = sentence_transformers.CrossEncoder(folder, max_length=family.max_length or MAX_LENGTH,
                                                              device="cpu", **trust)
            continue
        reference = getattr(sentence_transformers, family.reference)(folder, device="cpu", **trust)
        if not family.own_max_length:  # a StaticEmbedding's length is its tokenizer's
            reference.max_seq_length = MAX_LENGTH  # the export's --max-length
        loaded[name] = reference
    return loaded


@pytest.fixture(scope="module")
def served(folders, server):
    """The default MiniLM export with every family exported beside it by name: the shared server."""
    exports = {}
    for name, folder in folders.items():
        # a static embedding's max length is its tokenizer's own; Qwen3-Embedding is trained for Matryoshka widths
        family = FAMILIES[EXPORTS[name]]
        length = family.max_length or MAX_LENGTH
        extra = [*([] if family.own_max_length else ["--max-length", str(length)]), *family.export_args,
                 *(["--trust-remote-code"] if family.trust_remote_code else [])]
        exports[name] = ["--model", folder, *extra]
    with serve_exports(server, exports):
        yield server


def kserve(server, name, names, parameters=None, texts=TEXTS):
    connection = client("grpc", server.grpc_url)
    try:
        result = connection.infer(f"{name}_bls", [text_input("grpc", texts)], outputs=outputs("grpc", names),
                                  parameters=parameters)
        return {n: result.as_numpy(n) for n in names}
    finally:
        connection.close()


def post(server, path, body):
    request = urllib.request.Request(server.proxy_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def cosines(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_each_dense_family_embeds_as_sentence_transformers_through_both_doors(served, references):
    """KServe (NAME_bls, `embedding`) and the HTTP front (/v1/embeddings by export name) against
    SentenceTransformer.encode of the folder, with no prompt and with a named prompt where the family has one."""
    for name in DENSE:
        reference = references[name]
        for prompt_name in [None, PROMPTS.get(name)] if name in PROMPTS else [None]:
            want = reference.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True)
            got = kserve(served, name, ("embedding",), {"prompt_name": prompt_name} if prompt_name else None)
            assert got["embedding"].shape == want.shape, name
            assert cosines(got["embedding"], want).min() >= 0.9999, (name, prompt_name, cosines(got["embedding"],
                                                                                                  want))
            body = {"model": name, "input": TEXTS, **({"input_type": prompt_name} if prompt_name else {})}
            http = np.asarray([row["embedding"] for row in post(served, "/v1/embeddings", body)["data"]])
            assert cosines(http, want).min() >= 0.9999, (name, prompt_name, "http")


def test_token_ids_are_the_references(served, references):
    """TEI's /tokenize (the tokenizer model's ids, special tokens and the prompt's included) against the ids the
    reference feeds its model: a decoder's appended EOS, Gemma's BOS, a static embedding's none."""
    for name in EMBEDDERS:
        texts = TEXTS[:-1]  # /tokenize does not truncate
        answer = post(served, "/tokenize", {"model": name, "inputs": texts, "add_special_tokens": True})
        served_ids = [[token["id"] for token in row] for row in answer]
        features = references[name].preprocess(texts)
        if "offsets" in features:  # StaticEmbedding: one flat list and where each text starts
            flat, starts = features["input_ids"].tolist(), features["offsets"].tolist()
            want = [flat[a:b] for a, b in zip(starts, [*starts[1:], len(flat)])]
        else:
            want = [[t for t, m in zip(row, mask) if m] for row, mask in
                    zip(features["input_ids"].tolist(), features["attention_mask"].tolist())]
        assert served_ids == want, name


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_cross_encoder_family_scores_as_cross_encoder_through_both_doors(served, references, protocol):
    """KServe (NAME_rerank: a query and its documents) and the HTTP front (/v1/rerank by export name) against
    CrossEncoder.predict of the folder, in the same order: pairs in many scripts, one document cut at the max
    length."""
    for name in RERANKERS:
        want = references[name].predict([(QUERY, text) for text in TEXTS])
        got = rerank(protocol, served, QUERY, TEXTS, model=f"{name}_rerank")
        assert np.abs(got["scores"] - want).max() <= SCORE_TOLERANCE and np.ptp(want) > 1e-3, (name, got, want)
        assert got["truncated"].any(), name  # the long text, cut as CrossEncoder cuts it
        answer = post(served, "/v1/rerank", {"model": name, "query": QUERY, "documents": TEXTS})
        order = list(np.argsort(-want))
        assert [result["index"] for result in answer["results"]] == order, name
        scores = np.array([result["relevance_score"] for result in answer["results"]])
        assert np.abs(scores - want[order]).max() <= SCORE_TOLERANCE, name


# The model cards' own scoring code, as published (Qwen/Qwen3-Reranker-0.6B's "Transformers Usage"): its prompt's
# fixed text, the default instruction, the pair's format
MODEL_CARDS = {"Qwen/Qwen3-Reranker-0.6B": {
    "prefix": "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
              "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n",
    "suffix": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "task": "Given a web search query, retrieve relevant passages that answer the query"}}


def reference_scores(family, folder, query, documents):
    """(scores, raw scores) per document from the yes/no reranker's own reference: Qwen3-Reranker's model card with
    transformers (P(yes), logit(yes) - logit(no)); FlagEmbedding's FlagLLMReranker itself (compute_score with
    normalize on and off: sigmoid(logit Yes), logit Yes); mxbai-rerank's MxbaiRerankV2 as its code computes it
    (mxbai_v2_scores: the package needs transformers 4's prepare_for_model; sigmoid(logit 1 - logit 0), the
    difference)."""
    max_length = family.max_length or MAX_LENGTH
    if family.reference == "FlagLLMReranker":
        from FlagEmbedding import FlagLLMReranker

        reranker = FlagLLMReranker(folder, use_fp16=False, devices="cpu", max_length=max_length)
        pairs = [(query, document) for document in documents]
        return (np.asarray(reranker.compute_score(pairs, max_length=max_length, normalize=True)),
                np.asarray(reranker.compute_score(pairs, max_length=max_length)))
    if family.reference == "MxbaiRerankV2":
        raw = mxbai_v2_scores(folder, query, documents, max_length)
        return 1 / (1 + np.exp(-raw)), raw
    return model_card_scores(folder, family.checkpoint, query, documents, max_length)


def mxbai_v2_scores(folder, query, documents, max_length):
    """MxbaiRerankV2.predict (mxbai-rerank 0.1.6, mxbai_rerank_v2.py) as its code computes it, with transformers 4's
    prepare_for_model(..., truncation="only_second") on ids written out (transformers 5 has none)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model_max_length = AutoConfig.from_pretrained(folder).max_position_embeddings

    def get_input_ids(x):
        return tokenizer(x, return_tensors=None, add_special_tokens=False)["input_ids"]

    yes_loc, no_loc = get_input_ids("1")[0], get_input_ids("0")[0]
    task = get_input_ids("You are a search relevance expert who evaluates how well documents match search queries. "
                         "For each query-document pair, carefully analyze the semantic relationship between them, "
                         "then provide your binary relevance judgment (0 for not relevant, 1 for relevant).\n"
                         "Relevance:")
    sep = get_input_ids("\n")
    prefix = get_input_ids("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                           "assistant.<|im_end|>\n<|im_start|>user\n")
    suffix = get_input_ids("<|im_end|>\n<|im_start|>assistant\n")
    predefined = len(prefix) + len(task) + len(suffix) + len(sep)
    max_length = min(max_length, model_max_length - predefined)
    rows = []
    for document in documents:
        q = tokenizer(f"query: {query}", add_special_tokens=False, max_length=max_length * 3 // 4,
                      truncation=True)["input_ids"]
        d = sep + tokenizer(f"document: {document}", add_special_tokens=False, truncation=True,
                            max_length=min(model_max_length - len(q) - predefined, max_length))["input_ids"]
        over = len(q) + len(d) - max_length
        rows.append(prefix + q + (d[:-over] if 0 < over < len(d) else d) + sep + task + suffix)
    batch = tokenizer.pad({"input_ids": rows}, padding="longest", pad_to_multiple_of=8, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[:, -1, :]
    return (logits[:, yes_loc] - logits[:, no_loc]).numpy()


def model_card_scores(folder, checkpoint, query, documents, max_length):
    """(P(yes), logit(yes) - logit(no)) per document, computed as the model card does with transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    card = MODEL_CARDS[checkpoint]
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    token_false_id, token_true_id = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    prefix_tokens = tokenizer.encode(card["prefix"], add_special_tokens=False)
    suffix_tokens = tokenizer.encode(card["suffix"], add_special_tokens=False)
    pairs = [f"<Instruct>: {card['task']}\n<Query>: {query}\n<Document>: {doc}" for doc in documents]
    inputs = tokenizer(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                       max_length=max_length - len(prefix_tokens) - len(suffix_tokens))
    for i, ele in enumerate(inputs["input_ids"]):
        inputs["input_ids"][i] = prefix_tokens + ele + suffix_tokens
    inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
    with torch.no_grad():
        batch_scores = model(**inputs).logits[:, -1, :]
    batch_scores = torch.stack([batch_scores[:, token_false_id], batch_scores[:, token_true_id]], dim=1)
    batch_scores = torch.nn.functional.log_softmax(batch_scores, dim=1)
    return batch_scores[:, 1].exp().numpy(), (batch_scores[:, 1] - batch_scores[:, 0]).numpy()


# the label each yes/no reranker's score is served under (TEI's /predict): its "yes" token, by reference
YES_LABELS = {"CrossEncoder": "yes", "FlagLLMReranker": "Yes", "MxbaiRerankV2": "1"}


def test_yes_no_rerankers_score_as_their_model_card_through_every_route(served, folders):
    """A causal LM published as a yes/no reranker against its own reference (reference_scores: Qwen3-Reranker's
    model card with transformers, FlagLLMReranker for bge-reranker-v2-gemma, MxbaiRerankV2's code for
    mxbai-rerank-v2): `scores` (P(yes), or the sigmoid of the raw score) and `logits` (the raw score: the log-odds,
    logit(1) - logit(0), logit(Yes)) through KServe's rerank model and pair ensemble, and the HTTP front's
    /v1/rerank, Cohere's /v2/rerank, TEI's /rerank and /predict, one document cut at the max length; the graph holds
    two rows of the LM head (one for FlagLLMReranker's "Yes"), not the vocabulary."""
    import onnx
    import tritonclient.grpc as grpcclient
    from transformers import AutoTokenizer

    assert YES_NO, "a yes/no reranker row in tiny_checkpoints.FAMILIES"
    for name in YES_NO:
        family = FAMILIES[EXPORTS[name]]
        want, log_odds = reference_scores(family, folders[name], QUERY, TEXTS)
        assert np.ptp(want) > 1e-3, want
        manifest = json.load(open(os.path.join(served.repository, name, "1", "export.json"), encoding="utf-8"))
        label = YES_LABELS[family.reference]
        assert manifest["parity"]["model_card_max_abs_diff"] <= 1e-4 and manifest["labels"] == [label], manifest
        graph = onnx.load(os.path.join(served.repository, f"{name}_embedding", "1", "model.onnx"),
                          load_external_data=False)
        shapes = [list(t.dims) for t in graph.graph.initializer]
        vocabulary = len(AutoTokenizer.from_pretrained(folders[name]))
        rows = 1 if family.reference == "FlagLLMReranker" else 2  # the "yes" (and "no") rows of the LM head
        assert [rows, HIDDEN] in shapes or [HIDDEN, rows] in shapes, shapes
        assert sum(shape[:1] == [vocabulary] for shape in shapes) == 1, shapes  # the input embedding alone
        for protocol in PROTOCOLS:
            got = rerank(protocol, served, QUERY, TEXTS, model=f"{name}_rerank")
            assert np.abs(got["scores"] - want).max() <= SCORE_TOLERANCE, (name, protocol, got["scores"], want)
            assert np.abs(got["logits"].reshape(-1) - log_odds).max() <= 1e-4, (name, protocol)
            assert got["truncated"].any(), name
        connection = client("grpc", served.grpc_url)
        try:
            result = connection.infer(name, [bytes_input(grpcclient, "query", [QUERY] * 4, [4, 1]),
                                             bytes_input(grpcclient, "text", TEXTS[:4], [4, 1])])
        finally:
            connection.close()
        assert np.abs(result.as_numpy("scores")[:, 0] - want[:4]).max() <= SCORE_TOLERANCE, name
        order = list(np.argsort(-want))
        answer = post(served, "/v1/rerank", {"model": name, "query": QUERY, "documents": TEXTS})
        assert [r["index"] for r in answer["results"]] == order, name
        assert np.abs(np.array([r["relevance_score"] for r in answer["results"]]) - want[order]).max() <= \
            SCORE_TOLERANCE, name
        cohere = post(served, "/v2/rerank", {"model": name, "query": QUERY, "documents": TEXTS})
        assert [r["index"] for r in cohere["results"]] == order, name
        assert np.abs(np.array([r["relevance_score"] for r in cohere["results"]]) - want[order]).max() <= \
            SCORE_TOLERANCE, name
        tei = post(served, "/rerank", {"model": name, "query": QUERY, "texts": TEXTS, "truncate": True})
        assert [r["index"] for r in tei] == order, name
        assert np.abs(np.array([r["score"] for r in tei]) - want[order]).max() <= SCORE_TOLERANCE, name
        predicted = post(served, "/predict", {"model": name, "truncate": True,
                                              "inputs": [[QUERY, text] for text in TEXTS[:4]]})
        assert [row[0]["label"] for row in predicted] == [label] * 4, predicted
        assert np.abs(np.array([row[0]["score"] for row in predicted]) - want[:4]).max() <= SCORE_TOLERANCE, name


def test_splade_serves_the_sparse_encoders_weights_through_both_doors(served, references):
    """A SparseEncoder folder: /embed_sparse (TEI) and KServe's sparse outputs give SparseEncoder.encode's non-zero
    token ids and weights (within 1e-3), over the vocabulary however short the text; /v1/rerank scores with them
    (the dot product, SparseEncoder's similarity); no dense vector is served."""
    want = references["splade"].encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
    got = kserve(served, "splade", ("sparse_indices", "sparse_values", "sparse_count"))
    assert got["sparse_indices"].shape[1] > max(len(t.split()) for t in TEXTS[:-1])  # expansion past the tokens
    for row in range(len(TEXTS)):
        count = int(got["sparse_count"][row, 0])
        ids = got["sparse_indices"][row, :count]
        assert sorted(ids.tolist()) == np.flatnonzero(want[row]).tolist(), row
        assert np.abs(got["sparse_values"][row, :count] - want[row][ids]).max() <= 1e-3, row
        assert (got["sparse_indices"][row, count:] == -1).all()
    answer = post(served, "/embed_sparse", {"model": "splade", "inputs": TEXTS, "truncate": True})
    for row, entries in enumerate(answer):
        weights = {entry["index"]: entry["value"] for entry in entries}
        assert sorted(weights) == np.flatnonzero(want[row]).tolist(), row
        assert max(abs(value - want[row][index]) for index, value in weights.items()) <= 1e-3, row
    # rerank on a SPLADE export scores with its sparse output alone: SparseEncoder's similarity, the dot product
    answer = post(served, "/v1/rerank", {"model": "splade", "query": TEXTS[0], "documents": TEXTS[1:6]})
    scores = {result["index"]: result["relevance_score"] for result in answer["results"]}
    for index in range(5):
        assert abs(scores[index] - float(want[0] @ want[index + 1])) <= 1e-3 * max(1.0, abs(scores[index])), index
    request = urllib.request.Request(served.proxy_url + "/v1/embeddings", data=json.dumps(
        {"model": "splade", "input": ["dense?"]}).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400 and json.load(refused.value)["error"]["code"] == "not_served"


def sparse_rows(got):
    """KServe's sparse outputs -> per row {token id: weight}."""
    return [dict(zip(got["sparse_indices"][row, :int(n)].tolist(), got["sparse_values"][row, :int(n)].tolist()))
            for row, n in enumerate(got["sparse_count"][:, 0])]


SPARSE_FIGURES = {}  # {(side, door): the largest weight difference}: printed at the end (suite_stats.report)


def assert_sparse_equal(rows, want, label):
    worst = 0.0
    for row, weights in enumerate(rows):
        assert sorted(weights) == np.flatnonzero(want[row]).tolist(), (label, row)
        worst = max([worst, *(abs(value - want[row][index]) for index, value in weights.items())])
        assert worst <= 1e-3, (label, row)
    SPARSE_FIGURES[str(label)] = worst


def test_inference_free_splade_serves_both_sides_and_queries_never_run_the_encoder(served, references):
    """A SparseEncoder with a Router (opensearch-neural-sparse-encoding-doc-v3-distill): the document side (no
    input type, input_type document, TEI's /embed_sparse as it is) is SparseEncoder.encode_document's, from the
    encoder; the query side (input_type / prompt_name query, through KServe's sparse outputs, /embed_sparse and
    /v1/encode) is encode_query's, from the tokenizer model's weight lookup: the encoder's execution count does not
    move. The ensemble's encoder step refuses a query by name."""
    name, reference = "neural-sparse", references["neural-sparse"]
    kwargs = {"convert_to_tensor": True, "convert_to_sparse_tensor": False}
    queries = reference.encode_query(TEXTS, **kwargs).numpy()
    documents = reference.encode_document(TEXTS, **kwargs).numpy()
    assert not np.allclose(queries, documents)
    names = ("sparse_indices", "sparse_values", "sparse_count", "num_tokens")
    before = served.stats(f"{name}_embedding")["execution_count"]
    for parameters in ({"input_type": "query"}, {"prompt_name": "query"}, {"input_type": "search_query"}):
        got = kserve(served, name, names, parameters)
        assert_sparse_equal(sparse_rows(got), queries, f"KServe {json.dumps(parameters)}")
        # the query's own tokens (no special ones), as SparseStaticEmbedding counts them
        assert got["num_tokens"][:, 0].tolist() == [len(reference.preprocess([t], task="query")["input_ids"][0])
                                                    for t in TEXTS]
    answer = post(served, "/embed_sparse", {"model": name, "inputs": TEXTS, "prompt_name": "query",
                                             "truncate": True})
    assert_sparse_equal([{e["index"]: e["value"] for e in row} for row in answer], queries,
                        "/embed_sparse prompt_name query")
    for body in ({"input_type": "query"}, {"prompt_name": "query"}):
        for texts in (TEXTS, TEXTS[:1]):  # one text too: the BLS model answers it (the ensemble would run the encoder)
            data = post(served, "/v1/encode", {"model": name, "input": texts, "return_dense": False,
                                               "return_sparse": True, **body})["data"]
            assert_sparse_equal([dict(zip(d["sparse"]["indices"], d["sparse"]["values"])) for d in data],
                                queries[:len(texts)], f"/v1/encode {json.dumps(body)} ({len(texts)} texts)")
    assert served.stats(f"{name}_embedding")["execution_count"] == before  # no query ran the encoder
    # TEI's /tokenize under the query side: the query's own ids, as SparseStaticEmbedding tokenizes it
    answer = post(served, "/tokenize", {"model": name, "inputs": TEXTS[:-1], "prompt_name": "query"})
    features = reference.preprocess(TEXTS[:-1], task="query")
    assert [[token["id"] for token in row] for row in answer] == [
        [t for t, m in zip(row, mask) if m] for row, mask in zip(features["input_ids"].tolist(),
                                                                 features["attention_mask"].tolist())]

    for parameters in (None, {"input_type": "document"}, {"prompt_name": "document"}):
        assert_sparse_equal(sparse_rows(kserve(served, name, names, parameters)), documents,
                            f"KServe {json.dumps(parameters) if parameters else 'no input type'}")
    assert served.stats(f"{name}_embedding")["execution_count"] > before
    answer = post(served, "/embed_sparse", {"model": name, "inputs": TEXTS, "truncate": True})  # TEI: documents
    assert_sparse_equal([{e["index"]: e["value"] for e in row} for row in answer], documents,
                        "/embed_sparse (TEI: no input type)")
    data = post(served, "/v1/encode", {"model": name, "input": TEXTS[:1], "return_dense": False,
                                       "return_sparse": True})["data"]
    assert_sparse_equal([dict(zip(d["sparse"]["indices"], d["sparse"]["values"])) for d in data], documents[:1],
                        "/v1/encode no input type (1 text)")

    # rerank: the query as a query (its lookup), the documents as documents: SparseEncoder's similarity, the dot
    answer = post(served, "/v1/rerank", {"model": name, "query": TEXTS[0], "documents": TEXTS[1:6]})
    scores = {result["index"]: result["relevance_score"] for result in answer["results"]}
    for index in range(5):
        want = float(queries[0] @ documents[index + 1])
        assert abs(scores[index] - want) <= 1e-3 * max(1.0, abs(want)), index

    connection = client("grpc", served.grpc_url)
    try:
        with pytest.raises(Exception) as refused:
            connection.infer(name, [text_input("grpc", TEXTS[:1])], outputs=outputs("grpc", ("sparse_count",)),
                             parameters={"input_type": "query"})
    finally:
        connection.close()
    assert "[not_served input_type]" in str(refused.value)
    suite_stats.report(["", f"inference-free SPLADE vs SparseEncoder ({len(TEXTS)} texts; query side vs encode_query, "
                            "document side vs encode_document): largest weight difference",
                        *(f"  {label:45s} {worst:.3g}" for label, worst in SPARSE_FIGURES.items())])


def test_vectors_for_stores_keep_working_on_the_new_families(served, references):
    """On a decoder export: a Matryoshka width (`dimensions`: the vector cut, then normalized, as
    sentence-transformers' truncate_dim) and a quantized type (ubinary: the sign bits); on the static export (no
    Normalize module): `normalize: false` is sentence-transformers' own unnormalized vector, length included."""
    reference = references["qwen3"]
    want = reference.encode(TEXTS, truncate_dim=16, normalize_embeddings=True)
    got = kserve(served, "qwen3", ("embedding", "embedding_ubinary"), {"dimensions": 16})
    assert got["embedding"].shape == (len(TEXTS), 16)
    assert cosines(got["embedding"], want).min() >= 0.9999
    agree = np.unpackbits(got["embedding_ubinary"], axis=1) == np.unpackbits(np.packbits(want > 0, axis=1), axis=1)
    assert agree.mean() >= 0.99  # a sign may flip only where a component is ~0
    static = references["static"].encode(TEXTS[:-1], normalize_embeddings=False)
    answer = np.asarray(post(served, "/embed", {"model": "static", "inputs": TEXTS[:-1], "normalize": False}))
    assert np.abs(np.linalg.norm(answer, axis=1) / np.linalg.norm(static, axis=1) - 1).max() <= 1e-4
    assert cosines(answer, static).min() >= 0.9999


def test_every_export_reports_its_reference_check_through_both_doors(served):
    """Issue 70 item 4: the export's reference check, kept in export.json, is what /v1/models, TEI's /info and the
    ensemble's config (KServe: GET /v2/models/NAME/config) show, the same report through each; for every family
    and for the default export beside them: the reference class the row names and its installed version, the texts
    (or pairs) and prompts checked, and a worst figure within the family's tolerance."""
    from importlib.metadata import version

    def get(url):
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)

    cards = {card["id"]: card for card in get(served.proxy_url + "/v1/models")["data"]}
    default = [id for id, card in cards.items() if id not in EXPORTS and "root" not in card]  # MiniLM's
    assert default
    for name in [*EXPORTS, *default]:
        family = FAMILIES[EXPORTS[name]] if name in EXPORTS else None
        report = cards[name]["parity"]
        assert report["checked"] is True and "why" not in report, (name, report)
        if cards[name]["kind"] != "cross-encoder":
            assert report["reference"] == (family.reference if family else "SentenceTransformer"), (name, report)
            assert report["reference_version"] == version("sentence-transformers"), (name, report)
            assert report["texts"] >= 6 and "none" in report["prompts"], (name, report)
            if family and family.prompt:
                assert family.prompt in report["prompts"], (name, report)
            if report["reference"] == "SparseEncoder":
                assert report["worst_abs_diff"] <= 1e-3, (name, report)
            else:
                assert report["worst_cosine"] >= 0.9999, (name, report)
            assert report["graph_vs_pytorch_worst_cosine"] >= 0.9999, (name, report)
        else:  # CrossEncoder's pairs, or where it cannot render a yes/no folder's pairs, the model card's scoring
            assert report["reference"] in ("CrossEncoder", "transformers"), (name, report)
            library = "sentence-transformers" if report["reference"] == "CrossEncoder" else "transformers"
            assert report["reference_version"] == version(library), (name, report)
            assert (report["pairs"] or 0) >= 16 or report["model_card"], (name, report)
            assert report["worst_abs_diff"] <= 1e-4, (name, report)
        assert get(f"{served.proxy_url}/info?model={name}")["parity"] == report, name
        ensemble = name if family else "ensemble"  # a named export's ensemble is its name; the default's, ensemble
        config = get(f"http://{served.http_url}/v2/models/{ensemble}/config")
        assert json.loads(config["parameters"]["parity_report"]["string_value"]) == report, name


def test_what_a_family_does_not_have_is_refused_by_name(served):
    """Late chunking needs token vectors in the embedding's space: an export whose Dense modules project the pooled
    vector (LaBSE, EmbeddingGemma) has no chunks model and says so; the default export is unchanged beside them."""
    for name in ("labse", "gemma"):
        with open(os.path.join(served.repository, name, "1", "export.json"), encoding="utf-8") as handle:
            manifest = json.load(handle)
        assert manifest["chunks_model"] is None and not os.path.exists(os.path.join(served.repository,
                                                                                    f"{name}_chunks"))
        request = urllib.request.Request(served.proxy_url + "/v1/chunk_embeddings", data=json.dumps(
            {"model": name, "input": "One. Two.", "chunk_tokens": 8}).encode(),
            headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code in (400, 404) and json.load(refused.value)["error"]["code"] == "not_served"
    default = post(served, "/v1/embeddings", {"input": ["hello"]})["data"][0]["embedding"]
    assert len(default) == 384  # MiniLM, the default export, as before


def refused(tmp_path, folder, *args):
    result = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--model", str(folder),
                             "--repository", str(tmp_path / "repository"), "--name", "x", *args],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert not (tmp_path / "repository" / "x").exists()
    return result.stderr.strip().splitlines()[-1]


def test_modules_the_graph_does_not_build_are_refused_in_one_line(tmp_path):
    """A module after pooling that the export does not build (here sentence-transformers' LayerNorm), pooling that
    leaves the prompt out, and --pooling against the folder's own are refused, naming the module or setting: none is
    exported to serve other vectors than sentence-transformers gives."""
    folder = FAMILIES["labse"].build(str(tmp_path / "labse"))
    with open(os.path.join(folder, "modules.json"), encoding="utf-8") as handle:
        modules = json.load(handle)
    layer_norm = dict(modules[-1], type="sentence_transformers.models.LayerNorm", path="4_LayerNorm")
    with open(os.path.join(folder, "modules.json"), "w", encoding="utf-8") as handle:
        json.dump([*modules[:-1], layer_norm, modules[-1]], handle)
    assert "module LayerNorm (4_LayerNorm)" in refused(tmp_path / "a", folder)

    qwen = FAMILIES["qwen3_embedding"].build(str(tmp_path / "qwen"))
    assert "--pooling mean" in refused(tmp_path / "b", qwen, "--pooling", "mean")
    pooling = os.path.join(qwen, "1_Pooling", "config.json")
    with open(pooling, encoding="utf-8") as handle:
        config = json.load(handle)
    with open(pooling, "w", encoding="utf-8") as handle:
        json.dump({**config, "include_prompt": False}, handle)
    assert "include_prompt" in refused(tmp_path / "c", qwen)


def test_a_folder_whose_served_tokens_would_differ_is_refused_by_the_reference_check(tmp_path):
    """A folder that passes every rule read from its files, but whose tokenizer_config.json cuts long texts from the
    left (truncation_side), which transformers applies and the served tokenizer.json does not: the reference check
    finds the long text's ids differ and the export exits non-zero naming it, before anything is installed."""
    folder = FAMILIES["labse"].build(str(tmp_path / "labse"))
    config_path = os.path.join(folder, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump({**config, "truncation_side": "left"}, handle)
    line = refused(tmp_path / "a", folder, "--max-length", "32")
    assert line.startswith("export: reference check failed: text ") and "the served tokenizer gives ids" in line


def test_a_folder_with_its_own_code_is_refused_in_one_line_unless_told_to_run_it(tmp_path):
    """A folder whose config.json maps its classes to its own code (auto_map, model_type "bert": transformers'
    native BertModel would load it in silence and compute other vectors) is refused in one line naming that code,
    exit code 1, no traceback and no question, even with a terminal on stdin; with --trust-remote-code it is served
    (test_each_dense_family_embeds_as_sentence_transformers_through_both_doors: `remote-bert`, against
    sentence-transformers running the same code)."""
    import pty

    import sentence_transformers

    folder = FAMILIES["remote_bert"].build(str(tmp_path / "remote"))
    terminal, stdin = pty.openpty()
    try:
        result = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--model", folder,
                                 "--repository", str(tmp_path / "repository"), "--name", "x"], stdin=stdin,
                                capture_output=True, text=True, timeout=300)
    finally:
        os.close(stdin)
        os.close(terminal)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "[y/N]" not in result.stdout + result.stderr
    for named in ("config.json auto_map AutoModel → modeling_remote_bert.RemoteBertModel", "modeling_remote_bert.py",
                  "configuration_remote_bert.py", "--trust-remote-code"):
        assert named in lines[0], lines[0]
    assert not (tmp_path / "repository" / "x").exists()
    # what the flag changes: the checkpoint's code computes other vectors than transformers' native class
    texts = TEXTS[:4]
    own = sentence_transformers.SentenceTransformer(folder, device="cpu", trust_remote_code=True).encode(texts)
    native = sentence_transformers.SentenceTransformer(folder, device="cpu").encode(texts)
    assert cosines(own, native).max() < 0.99


def rename_weights(folder, old, new, drop=()):
    """The folder's model.safetensors with `old` replaced by `new` in every key (`drop`: keys left out): a state
    dict named for other code than the class transformers loads for the folder."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    state = load_file(path)
    save_file({key.replace(old, new): value for key, value in state.items() if key not in drop}, path,
              metadata={"format": "pt"})
    return folder


def test_a_folder_whose_weights_its_class_does_not_hold_is_refused_in_one_line(tmp_path, monkeypatch):
    """A folder whose weights do not fit the class transformers loads for it (its state dict named for the
    checkpoint's own code: here every `layer` renamed) would load with those weights randomly initialized, and the
    reference, loading the same class, would agree: the export stops in one line naming the missing weights and the
    checkpoint's unplaced ones, with counts, exit code 1, nothing installed. Weights the served graph never reads may
    be missing (a BERT pooler, when the checkpoint is the MLM: its MLM head unexpected too); a weight the graph holds
    a copy of (the yes/no reranker's LM head rows, when the head is not tied) may not."""
    import shutil

    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForCausalLM, BertForMaskedLM, BertModel, Qwen3Config, Qwen3ForCausalLM

    from exporter import weights
    from exporter.families.encoder import build_encoder
    from exporter.families.yes_no_reranker import build_yes_no

    labse = FAMILIES["labse"].build(str(tmp_path / "labse"))
    mlm_folder = shutil.copytree(labse, tmp_path / "mlm")
    renamed = rename_weights(labse, "layer", "block")
    line = refused(tmp_path / "a", renamed, "--max-length", "32")
    assert line.startswith("export: BertModel loads ") and "without 32 weight(s) the served graph reads (" in line
    assert "encoder.layer.0.attention" in line and "and 29 more" in line and "32 weight(s) BertModel has no place " \
        "for (encoder.block.0.attention" in line, line

    from transformers import modeling_utils

    monkeypatch.setattr(modeling_utils, "log_state_dict_report", modeling_utils.log_state_dict_report)  # undone after
    weights.record()
    base = BertModel.from_pretrained(mlm_folder)
    mlm = BertForMaskedLM(base.config)
    mlm.bert.load_state_dict(base.state_dict(), strict=False)
    mlm.save_pretrained(mlm_folder)  # the MLM's checkpoint: no pooler, an MLM head
    reference = SentenceTransformer(str(mlm_folder), device="cpu")
    report = weights._LOADS[-1][2]
    assert sorted(report.missing_keys) == ["pooler.dense.bias", "pooler.dense.weight"] and report.unexpected_keys
    weights.check((build_encoder(reference[0].auto_model, ("mean",), ["dense"], {}, []),
                   weights.sample(reference.tokenizer)))  # the pooler is never read: not refused

    folder = str(tmp_path / "qwen3")  # Qwen3-Reranker's class with its own LM head, absent from the checkpoint
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                 tie_word_embeddings=False)).save_pretrained(folder)
    rename_weights(folder, "layer", "layer", drop=("lm_head.weight",))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert sorted(weights._LOADS[-1][2].missing_keys) == ["lm_head.weight"]
    with pytest.raises(SystemExit, match=r"without 1 weight\(s\) the served graph reads \(lm_head\.weight\)"):
        weights.check((build_yes_no(model, 5, 6), lambda: (torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1, 1]]))))


def test_the_served_max_length_is_the_references_or_refused_naming_both(tmp_path):
    """Where transformers' config and sentence-transformers disagree on the max length (nomic-embed's case: 2048
    positions in config.json, max_seq_length 8192), the export serves the reference's length when the graph can take
    it (rotary positions: ModernBERT here), and refuses in one line naming both when a learned position table is
    shorter than the reference's length (a BERT whose sentence_bert_config.json says 1024)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig, AutoTokenizer

    from exporter.source import detect_max_length

    folder = FAMILIES["modernbert"].build(str(tmp_path / "modernbert"))
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as handle:
        json.dump({**config, "max_position_embeddings": 2048}, handle)
    reference = SentenceTransformer(folder, device="cpu")
    assert reference.max_seq_length == 8192
    length = detect_max_length(folder, AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder),
                               reference.max_seq_length, reference[0].auto_model)
    assert length == 8192

    labse = FAMILIES["labse"].build(str(tmp_path / "labse"))
    with open(os.path.join(labse, "sentence_bert_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"max_seq_length": 1024, "do_lower_case": False}, handle)
    line = refused(tmp_path / "a", labse)
    assert "cuts texts at 1024 tokens" in line and "position table holds 512" in line, line


def test_a_causal_lm_is_a_yes_no_reranker_only_when_said(tmp_path):
    """Qwen3-Reranker's config is a Qwen3 chat model's: without --yes-no-reranker the causal LM is refused in one
    line naming the flag (never served as an embedder or a reranker by guess). With it, the folder as Qwen's main
    branch ships it (Qwen3's chat-model template, which CrossEncoder cannot render pairs with) is exported with the
    model card's messages through that template: the same fixed text as the sentence-transformers layout's, checked
    against the model card's scoring; a template that renders neither is refused in one line."""
    folder = FAMILIES["qwen3_yes_no_reranker"].build(str(tmp_path / "qwen3_reranker"), chat_model_template=True)
    assert "--yes-no-reranker" in refused(tmp_path / "a", folder)
    repository = tmp_path / "b" / "repository"
    result = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--model", folder,
                             "--repository", str(repository), "--name", "x", "--yes-no-reranker", "--max-length",
                             "256"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(repository / "x" / "1" / "export.json", encoding="utf-8") as handle:
        parity = json.load(handle)["parity"]
    assert parity["model_card_same_token_ids"] == 20 and parity["model_card_max_abs_diff"] <= 1e-4, parity
    with open(repository / "x_tokenizer" / "1" / "pair_template.json", encoding="utf-8") as handle:
        template = json.load(handle)
    card = MODEL_CARDS["Qwen/Qwen3-Reranker-0.6B"]
    assert template["prefix"] == f"{card['prefix']}<Instruct>: {card['task']}\n<Query>: ", template
    assert (template["between"], template["suffix"]) == ("\n<Document>: ", card["suffix"]), template
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump({**config, "chat_template": config["chat_template"].replace("enable_thinking is false", "false")},
                  handle)  # no empty think block: not the model card's prompt
    assert "chat template renders neither" in refused(tmp_path / "c", folder, "--yes-no-reranker")


def test_a_router_the_export_does_not_build_is_refused_in_one_line(tmp_path):
    """An inference-free SPLADE folder whose Router the export does not build: a route of other modules (here the
    document side without its SpladePooling) or routes by modality are refused naming them, nothing exported."""
    folder = FAMILIES["inference_free_splade"].build(str(tmp_path / "router"))
    path = os.path.join(folder, "router_config.json")
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({**config, "structure": {**config["structure"], "document": ["document_0_MLMTransformer"]}}, handle)
    assert "route 'document' is MLMTransformer;" in refused(tmp_path / "a", folder)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({**config, "parameters": {**config["parameters"], "route_mappings": {"(None, 'text')": "query"}}},
                  handle)
    assert "route_mappings" in refused(tmp_path / "b", folder)
