"""Late chunking (issue 17, item 5) through the real tritonserver: the late chunking model over KServe (HTTP and
gRPC) and POST /v1/chunk_embeddings, against a reference computed here from the Hugging Face model's
last_hidden_state (the mean over each chunk's tokens, then L2 normalization), for a mean-pooling model
(all-MiniLM-L6-v2, the default export) and a CLS one (a tiny random XLM-R, exported beside it as `xcls`);
chunk_tokens' sentence groups; bad spans refused naming the span; a text over the max length refused."""
import json
import os
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import triton_clients
from conftest import TINY_XLMR_MAX_LENGTH, serve_exports
from triton_clients import PROTOCOLS, client, url_for

TEXT = ("Berlin is the capital of Germany. It has about four million inhabitants! The city lies on the Spree. "
        "Ünïcödé and 日本語 and emoji 🚀 shift character offsets from byte offsets.")
MULTI_SENTENCE = " ".join(f"Sentence number {i} talks about topic {i * 7} in a few words." for i in range(12))


@pytest.fixture(scope="module")
def served(server, tiny_xlmr_dir):
    """MiniLM (mean pooling) as the default export, the tiny XLM-R (CLS pooling) as `xcls`: the shared server."""
    with serve_exports(server, {"xcls": ["--model", tiny_xlmr_dir, "--pooling", "cls",
                                         "--max-length", TINY_XLMR_MAX_LENGTH]}):
        yield server


@pytest.fixture(scope="module")
def references(minilm_model_dir, tiny_xlmr_dir):
    """model -> (HF tokenizer, HF model) for the reference."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    found = {}
    for name, folder in (("late_chunking", minilm_model_dir), ("xcls_chunks", tiny_xlmr_dir)):
        found[name] = (AutoTokenizer.from_pretrained(folder),
                       AutoModel.from_pretrained(folder, dtype=torch.float32).eval())
    return found


def reference(references, model, text, spans):
    """Per span: the mean of last_hidden_state over the text's tokens overlapping [start, end) (special tokens
    excluded), L2-normalized; and how many tokens that is."""
    import torch

    tokenizer, hf_model = references[model]
    batch = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    offsets = batch.pop("offset_mapping")[0].numpy()
    special = batch.pop("special_tokens_mask")[0].numpy().astype(bool)
    with torch.no_grad():
        hidden = hf_model(**batch).last_hidden_state[0].numpy().astype(np.float64)
    vectors, counts = [], []
    for start, end in spans:
        mask = ~special & (offsets[:, 1] > offsets[:, 0]) & (offsets[:, 0] < end) & (offsets[:, 1] > start)
        mean = hidden[mask].mean(0)
        vectors.append(mean / np.linalg.norm(mean))
        counts.append(int(mask.sum()))
    return np.array(vectors), np.array(counts), len(offsets)


def chunk(server, protocol, text, spans=None, model="late_chunking", parameters=None):
    module = httpclient if protocol == "http" else grpcclient
    connection = client(protocol, url_for(server, protocol))
    try:
        inputs = [module.InferInput("text", [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        if spans is not None:
            array = np.array(spans, dtype=np.int64).reshape(-1, 2)
            inputs.append(module.InferInput("spans", list(array.shape), "INT64"))
            inputs[1].set_data_from_numpy(array)
        names = ("embedding", "chunk_spans", "num_tokens", "text_tokens")
        result = connection.infer(model, inputs, outputs=[module.InferRequestedOutput(n) for n in names],
                                  parameters=parameters)
        return {name: result.as_numpy(name) for name in names}
    finally:
        connection.close()


def chunk_error(server, protocol, text, spans=None, model="late_chunking", parameters=None):
    with pytest.raises(InferenceServerException) as caught:
        chunk(server, protocol, text, spans, model, parameters)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), caught.value
    return caught.value.message()


def post(server, body):
    return triton_clients.post(server, "/v1/chunk_embeddings", body)


def sentence_spans(text):
    """[start, end) of each sentence of TEXT (". " / "! " separated), by hand."""
    return [(m.start(), m.end()) for m in re.finditer(r"[^.!?\s][^.!?]*[.!?]", text)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["late_chunking", "xcls_chunks"])
def test_spans_match_the_reference(served, references, protocol, model):
    """Client spans (out of order, one cutting a word, one over non-ASCII text): each chunk's vector equals the mean
    of the model's token vectors over its tokens from the whole text's pass, normalized, within 1e-5; the spans
    come back as sent."""
    spans = sentence_spans(TEXT)
    spans = [spans[2], spans[0], (spans[1][0], spans[1][0] + 5), spans[3]]
    got = chunk(served, protocol, TEXT, spans, model)
    expected, counts, total = reference(references, model, TEXT, spans)
    assert got["embedding"].shape == expected.shape
    np.testing.assert_allclose(got["embedding"], expected, atol=1e-5, rtol=0)
    assert got["chunk_spans"].tolist() == [list(s) for s in spans]
    assert got["num_tokens"].tolist() == counts.tolist() and got["text_tokens"].tolist() == [total]


def test_context_changes_the_vector(served, references):
    """Guard against testing nothing (MiniLM: the tiny random model's token vectors are nearly equal): a chunk's
    late vector differs from the chunk embedded alone and from the whole text's mean."""
    spans = sentence_spans(TEXT)
    late = chunk(served, "grpc", TEXT, spans[:1])["embedding"][0]
    alone, _, _ = reference(references, "late_chunking", TEXT[slice(*spans[0])], [(0, spans[0][1] - spans[0][0])])
    whole, _, _ = reference(references, "late_chunking", TEXT, [(0, len(TEXT))])
    print(f"\nlate vs alone: cos {float(late @ alone[0]):.4f}; late vs whole text: cos {float(late @ whole[0]):.4f}")
    assert float(late @ alone[0]) < 0.999 and float(late @ whole[0]) < 0.999


@pytest.mark.parametrize("budget", [12, 40])
def test_chunk_tokens_groups_sentences(served, references, budget):
    """chunk_tokens: the text's sentences in order, grouped while a group holds at most `budget` tokens; vectors
    equal the reference over the returned spans."""
    got = chunk(served, "http", MULTI_SENTENCE, parameters={"chunk_tokens": budget})
    spans = got["chunk_spans"].tolist()
    sentences = sentence_spans(MULTI_SENTENCE)
    starts, ends = {s for s, _ in sentences}, {e for _, e in sentences}
    assert all(a in starts and b in ends for a, b in spans), spans  # whole sentences
    assert [a for a, _ in spans] == sorted(a for a, _ in spans) and spans[0][0] == 0
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # in order, not overlapping
    assert sum(1 for a in starts if any(s <= a < e for s, e in spans)) == len(sentences)  # every sentence
    assert (got["num_tokens"] <= budget).all()
    expected, counts, _ = reference(references, "late_chunking", MULTI_SENTENCE, spans)
    np.testing.assert_allclose(got["embedding"], expected, atol=1e-5, rtol=0)
    assert got["num_tokens"].tolist() == counts.tolist()
    # a larger budget merges more sentences: fewer chunks
    assert len(spans) > len(chunk(served, "http", MULTI_SENTENCE, parameters={"chunk_tokens": budget * 3})[
        "chunk_spans"])


def test_a_sentence_over_the_budget_is_cut_between_tokens(served):
    got = chunk(served, "grpc", MULTI_SENTENCE[:60], parameters={"chunk_tokens": 4})
    assert len(got["chunk_spans"]) >= 3 and (got["num_tokens"] <= 4).all()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("spans, words", [
    ([(0, 10), (5, 20)], "spans[1] [5, 20] overlaps spans[0] [0, 10]"),
    ([(0, 10), (10, 100000)], "spans[1] [10, 100000] is out of range: the text has"),
    ([(-1, 4)], "spans[0] [-1, 4] is out of range"),
    ([(0, 10), (12, 12)], "spans[1] [12, 12] is empty"),
    ([(20, 10)], "spans[0] [20, 10] ends before it starts"),
    (np.zeros((0, 2)), "spans is empty"),
    ([(33, 34)], "spans[0] [33, 34] covers no token"),  # the space after the first sentence
])
def test_bad_spans_are_refused_naming_the_span(served, protocol, spans, words):
    assert TEXT[33] == " "
    message = chunk_error(served, protocol, TEXT, spans)
    assert words in message, message


@pytest.mark.parametrize("spans, parameters, words", [  # (the error contract's tag: model_errors.py)
    (None, None, "spans or the request parameter chunk_tokens gives the chunks: neither was given "
                 "[invalid_input spans]"),
    ([(0, 5)], {"chunk_tokens": 8}, ": one of them, not both [invalid_input spans]"),
    (None, {"chunk_tokens": 0}, "chunk_tokens must be a whole number from 1 to 2147483647, not 0 "
                                "[invalid_value chunk_tokens]"),
])
def test_bad_combinations_are_refused(served, spans, parameters, words):
    assert words in chunk_error(served, "grpc", TEXT, spans, parameters=parameters)


def test_over_the_max_length_is_refused_naming_the_limit(served):
    """MiniLM takes 256 tokens: late chunking does not truncate (chunks past the cut would have no tokens)."""
    message = chunk_error(served, "http", MULTI_SENTENCE * 3, [(0, 10)])
    assert "text is longer than the model's maximum of 256 tokens" in message, message
    message = chunk_error(served, "grpc", "   ", [(0, 1)])
    assert message.startswith("text is empty"), message


def test_http_route_matches_kserve(served, references):
    """POST /v1/chunk_embeddings: one text with spans, a list of texts with spans per text, chunk_tokens; the same
    vectors as the KServe model; the server keeps serving after bad requests."""
    spans = sentence_spans(TEXT)
    status, body = post(served, {"input": TEXT, "spans": spans})
    assert status == 200, body
    kserve = chunk(served, "grpc", TEXT, spans)
    chunks = body["data"][0]["chunks"]
    np.testing.assert_allclose([c["embedding"] for c in chunks], kserve["embedding"], atol=1e-6, rtol=0)
    assert [c["span"] for c in chunks] == [list(s) for s in spans]
    assert [c["num_tokens"] for c in chunks] == kserve["num_tokens"].tolist()
    assert body["usage"]["total_tokens"] == body["data"][0]["num_tokens"] == int(kserve["text_tokens"][0])

    short = MULTI_SENTENCE[:200]  # within the tiny XLM-R's 128 tokens
    status, body = post(served, {"input": [TEXT, short], "spans": [spans[:2], [[0, 30]]], "model": "xcls"})
    assert status == 200, body
    expected, _, _ = reference(references, "xcls_chunks", short, [(0, 30)])
    np.testing.assert_allclose(body["data"][1]["chunks"][0]["embedding"], expected[0], atol=1e-5, rtol=0)
    assert len(body["data"][0]["chunks"]) == 2

    status, body = post(served, {"input": [MULTI_SENTENCE], "chunk_tokens": 20})
    assert status == 200 and len(body["data"][0]["chunks"]) > 1, body


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": TEXT, "spans": [[0, 10], [5, 20]]}, 400, "spans", "spans[1] [5, 20] overlaps spans[0] [0, 10]"),
    ({"input": [TEXT, TEXT], "spans": [[[0, 10]], [[0, 999]]]}, 400, "spans", "input[1]: spans[0] [0, 999] is out"),
    ({"input": TEXT, "spans": [[3, 3]]}, 400, "spans", "spans[0] [3, 3] is empty"),
    ({"input": TEXT, "spans": [[0, 1, 2]]}, 400, "spans", "spans[0] must be [start, end]"),
    ({"input": TEXT}, 400, "spans", "spans or the request parameter chunk_tokens gives the chunks: neither"),
    ({"input": MULTI_SENTENCE * 3, "chunk_tokens": 50}, 422, "input", "input is longer than the model's maximum "
                                                                      "of 256 tokens"),  # too_long: over a limit
    # the tokenizer's parameter errors, behind the late chunking model (was a 500: found by schemathesis)
    ({"input": TEXT, "chunk_tokens": 30, "input_type": "poem"}, 400, "input_type", 'input_type "poem" is not one'),
])
def test_http_errors_name_the_cause(served, body, status, param, words):
    got, answer = post(served, body)
    assert got == status and answer["error"]["param"] == param and words in answer["error"]["message"], answer
    assert post(served, {"input": TEXT, "chunk_tokens": 30})[0] == 200  # still serving


# ---------------------------------------------------------------- contextualized chunks (issue 70 item 2)
def test_windows_hold_their_chunks_whole_with_context_on_both_sides():
    """plan_windows: a document that fits is one window; past the room, every chunk is the target of one window
    that holds it whole, targets take at most half a window, whole context chunks fill the rest, nearest first on
    both sides (so windows overlap), nothing is over the room; a chunk over the room alone is refused (IndexError
    names it)."""
    from conftest import import_python_model

    late_chunking = import_python_model("late_chunking")
    assert late_chunking.plan_windows([10, 20, 30], 60) == [(0, 0, 3, 3)]
    tokens = [14, 9, 17, 12, 30, 8, 11, 15, 13, 16, 10, 12]
    windows = late_chunking.plan_windows(tokens, 60)
    targets = [i for _, start, end, _ in windows for i in range(start, end)]
    assert targets == list(range(len(tokens)))  # each chunk pooled once, in order
    for first, start, end, last in windows:
        assert first <= start < end <= last and sum(tokens[first:last]) <= 60
        assert sum(tokens[start:end]) <= 30 or end - start == 1
    inner = [w for w in windows if w[1] > 0 and w[2] < len(tokens)]
    assert inner and all(w[0] < w[1] or w[2] < w[3] for w in inner)  # context (whole chunks: one side may not fit)
    even = late_chunking.plan_windows([10] * 12, 60)  # chunks of one size: context on both sides of every window
    assert all(w[0] < w[1] and w[2] < w[3] for w in even if w[1] > 0 and w[2] < 12), even
    with pytest.raises(IndexError) as refused:
        late_chunking.plan_windows([10, 70, 5], 60)
    assert refused.value.args[0] == 1


def chunks_call(server, chunks, model="xcls_chunks", outputs=("embedding", "chunk_spans", "chunk_windows"),
                parameters=None):
    connection = client("grpc", url_for(server, "grpc"))
    try:
        document = grpcclient.InferInput("chunks", [len(chunks)], "BYTES")
        document.set_data_from_numpy(np.array([c.encode() for c in chunks], dtype=np.object_))
        result = connection.infer(model, [document], outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                                  parameters=parameters)
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        connection.close()


def test_contextualized_chunks_through_voyages_client_and_kserve(served, references):
    """Voyage's own client (voyageai, base_url the front) on POST /v1/contextualizedembeddings, and KServe's
    `chunks` input of the late chunking model: a document that fits is its chunks joined with one space, each chunk
    the reference's mean over its tokens in one forward pass; a document over the max length (the tiny XLM-R's 128
    tokens) runs in windows, each chunk equal to the reference run on its window's text (`chunk_windows`), windows
    overlapping (the seam: a chunk near a window's edge has context on both sides); ubinary and int8 are the float
    vectors quantized; bad chunks refused naming inputs[i][j]."""
    import voyageai
    from sentence_transformers.util.quantization import quantize_embeddings

    voyage = voyageai.Client(api_key="unused", base_url=served.proxy_url + "/v1", max_retries=0)
    short = ["Berlin is the capital of Germany.", "It has about four million inhabitants!",
             "The city lies on the Spree."]
    long = [f"Sentence number {i} talks about topic {i * 7} in a few words." for i in range(30)]
    answer = voyage.contextualized_embed(inputs=[short, long], model="xcls", input_type="document")
    assert [len(r.embeddings) for r in answer.results] == [3, 30] and answer.total_tokens > 0

    joined = " ".join(short)
    spans = [(joined.index(c), joined.index(c) + len(c)) for c in short]
    want, _, _ = reference(references, "xcls_chunks", joined, spans)
    assert (np.asarray(answer.results[0].embeddings) * want).sum(1).min() >= 0.9999

    kserve = chunks_call(served, long)
    np.testing.assert_allclose(kserve["embedding"], answer.results[1].embeddings, atol=1e-6, rtol=0)
    document = " ".join(long)
    windows = [tuple(w) for w in kserve["chunk_windows"].tolist()]
    assert len(set(windows)) > 2 and windows[0][0] == 0 and windows[-1][1] == len(document)
    for i, ((a, b), (start, end)) in enumerate(zip(windows, kserve["chunk_spans"].tolist())):
        assert (start, end) == (document.index(long[i]), document.index(long[i]) + len(long[i]))
        assert a <= start and end <= b  # whole in its window
        got, _, _ = reference(references, "xcls_chunks", document[a:b], [(start - a, end - a)])
        assert float(got[0] @ kserve["embedding"][i]) >= 0.9999, i
    seams = [i for i in range(1, len(long)) if windows[i] != windows[i - 1]]
    assert seams and all(windows[i][0] < kserve["chunk_spans"][i - 1][1] for i in seams)  # the windows overlap
    assert any(windows[i][0] < kserve["chunk_spans"][i][0] and kserve["chunk_spans"][i][1] < windows[i][1]
               for i in seams)  # a chunk at a seam sees text on both sides

    floats = np.asarray(answer.results[1].embeddings, dtype=np.float32)
    packed = voyage.contextualized_embed(inputs=[long], model="xcls", input_type="document", output_dtype="ubinary")
    assert np.array_equal(np.asarray(packed.results[0].embeddings, dtype=np.uint8), np.packbits(floats > 0, axis=-1))
    with open(os.path.join(served.repository, "xcls_chunks", "1", "vectors.json"), encoding="utf-8") as handle:
        ranges = np.asarray(json.load(handle)["calibration"]["ranges"][str(floats.shape[1])], dtype=np.float32)
    int8 = voyage.contextualized_embed(inputs=[long], model="xcls", input_type="document", output_dtype="int8")
    assert np.array_equal(np.asarray(int8.results[0].embeddings, dtype=np.int8),
                          quantize_embeddings(floats, "int8", ranges=ranges))

    for body, field in (({"inputs": [short, ["fine", "  "]], "model": "xcls"}, "inputs[1][1]"),
                        ({"inputs": [["x " * 200]], "model": "xcls"}, "inputs[0][0]"),
                        ({"inputs": [[]], "model": "xcls"}, "inputs[0]"),
                        ({"inputs": [short], "model": "xcls", "output_dimension": 7}, "output_dimension")):
        status, error = triton_clients.post(served, "/v1/contextualizedembeddings", body)
        assert status in (400, 422) and error["error"]["param"] in ("inputs", "output_dimension") and \
            field in error["error"]["message"], (body, error)
    assert triton_clients.post(served, "/v1/contextualizedembeddings", {"inputs": [short]})[0] == 200  # serving
