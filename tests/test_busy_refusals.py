"""A request that can never succeed gets its 4xx, busy or idle (issue 59, item 3): admission refuses a request with
429 at its first Triton call, before any model could refuse it, and a client told to retry a request that cannot
succeed retries for ever. The models' refusals that need no tokens are given before admission (proxy/1/prechecks.py:
empty and invisible texts, prompt_name, input_type, dimensions, documents per request, weights), by the models' own
rules (model_library/request_rules.py), with the model's kind, field and words; a text over the max length with
truncate false, which only its tokens tell, is asked of the tokenizer alone when the gate refuses the request
(Service.measure, the service's busy path: busy.py).

Three layers: the prechecks against the models' code (the answer the proxy gives from the model's error, through
inference.step_error, equals the precheck's: the same rule, called with the same data and named alike); the routes
over the fake service with a gate that refuses everything (every dialect); the real server, made busy, each hopeless
case against its idle answer."""
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from conftest import import_python_model, proxy_settings
from model_library.in_process import model_module
from proxy_fakes import DIM, Card, error_of, make_client, prechecks, proxy_service

pytestmark = pytest.mark.serial  # `make test` runs it alone: the gate's refusals under load

busy = model_module("proxy", "http_front.busy")


# ---------------------------------------------------------------- the prechecks against the models' own code
class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = 3, 14, 13, 1

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class Tensor:
    def __init__(self, array):
        self.array = np.asarray(array)

    def as_numpy(self):
        return self.array


class ModelRequest:
    """What the models' code reads of a request: its parameters (JSON) and its inputs."""

    def __init__(self, parameters=None, **inputs):
        self.json, self.inputs = json.dumps(parameters or {}), {k: Tensor(v) for k, v in inputs.items()}

    def parameters(self):
        return self.json


FAKE_PB = {"TRITONSERVER_RESPONSE_COMPLETE_FINAL": 1, "TritonError": TritonError, "TritonModelException": RuntimeError,
           "get_input_tensor_by_name": lambda request, name: request.inputs.get(name)}


@pytest.fixture(scope="module")
def models():
    return SimpleNamespace(tokenizer=import_python_model("tokenizer", **FAKE_PB),
                           bls=import_python_model("ensemble_bls", **FAKE_PB),
                           rerank=import_python_model("rerank", **FAKE_PB))


def model_answer(work, rows):
    """The proxy's answer to what the model's code does (None: it passes): its error through step_error, as the
    service reads a model's error (rows: the service's naming of `text[i]`)."""
    try:
        work()
    except ValueError as error:  # model_common.InvalidInput
        return answer(proxy_service.step_error(f"in ensemble 'x', {error}", None, "x", rows))
    return None


def precheck_answer(work):
    try:
        work()
    except proxy_service.ClientError as error:
        return answer(error)
    return None


def answer(error):
    return error.kind, error.param, error.field, error.message


TEXTS = ["", " ", " \t\n ", "\u00a0", "\u200b", "\u200c\u200d", "\u2060", "\ufeff", "\x00", "\x00\x00\x00",
         "\u200b\ufeff\x00\u2060", " \ufeff \ufeff ", "\x01\x02\x1f\x7f", "\n\x00\r\n\x00", "\x1c",
         "ok", " ok ", "a\u200b", "\u064d", "\u0301", "\ue000", "\u3164", "🙂"]


@pytest.mark.parametrize("text", TEXTS, ids=[ascii(t) for t in TEXTS])
def test_a_texts_content_is_refused_as_the_tokenizer_refuses_it(models, text):
    tokenizer = object.__new__(models.tokenizer.TritonPythonModel)
    tokenizer.max_text_bytes, tokenizer.clean = 1 << 20, None
    expected = model_answer(lambda: tokenizer.decode_row(text.encode(), "text[3]"), ("input", 0))
    assert precheck_answer(lambda: prechecks.texts(["ok", "a", "b", text], "input")) == expected
    assert (expected is None) == (text in ("ok", " ok ", "a\u200b", "\u064d", "\u0301", "\ue000", "\u3164", "🙂"))


PROMPTS = (("query", "query: "), ("passage", "passage: "), ("classification", ""))
PARAMETERS = [{"prompt_name": "poem"}, {"input_type": "poem"}, {"prompt_name": "query"}, {"input_type": "query"},
              {"input_type": "search_document"}, {"input_type": "clustering"}, {"prompt_name": "query",
                                                                                 "input_type": "query"},
              {"prompt_name": "passage"}, {"input_type": "image"}, {"prompt_name": ""}, {}]


@pytest.mark.parametrize("routes", [(), ("query", "document")], ids=["no router", "router"])
@pytest.mark.parametrize("prompts", [PROMPTS, ()], ids=["prompts", "none"])
@pytest.mark.parametrize("parameters", PARAMETERS + [{"prompt_name": "document"}], ids=json.dumps)
def test_prompt_name_and_input_type_are_refused_as_the_tokenizer_refuses_them(models, prompts, parameters, routes):
    """(An inference-free SPLADE export's Router tasks, query and document, are prompt names too.)"""
    tokenizer = object.__new__(models.tokenizer.TritonPythonModel)
    tokenizer.prompts, tokenizer.default_prompt, tokenizer.routes = dict(prompts), None, routes
    card = Card("m", "m", ("dense",), prompts=prompts, routes=routes)
    expected = model_answer(lambda: tokenizer.prompt(parameters), ("input", 0))
    assert precheck_answer(lambda: prechecks.prompt(card, parameters)) == expected


def test_each_rule_is_one_copy_the_models_and_the_proxy_import(models):
    """The rules are model_library/request_rules.py's, imported by the models and the proxy alike (export installs
    that file beside each of them): nothing to keep in step."""
    for module in (models.tokenizer, models.bls, models.rerank, prechecks):
        assert module.request_rules.__file__ == models.tokenizer.request_rules.__file__
        assert module.request_rules.__file__.endswith(os.path.join("model_library", "request_rules.py"))


@pytest.mark.parametrize("served", [(384,), (768, 512, 256, 128)], ids=["one width", "matryoshka"])
@pytest.mark.parametrize("width", [None, 100, 384, 512, 128, 1, 2**31 - 1])
def test_dimensions_are_refused_as_the_bls_model_refuses_them(models, served, width):
    bls = object.__new__(models.bls.TritonPythonModel)
    bls.dimensions = list(served)
    expected = model_answer(lambda: bls.options(ModelRequest({} if width is None else {"dimensions": width})), None)
    card = Card("m", "m", ("dense",), dimensions=served)
    assert precheck_answer(lambda: prechecks.width(card, width)) == expected


@pytest.mark.parametrize("count", [0, 1, 2048, 2049, 3000])
def test_documents_per_request_are_refused_as_the_rerank_models_refuse_them(models, count):
    request = ModelRequest(query=np.array([b"q"], dtype=np.object_),
                           documents=np.array([b"d"] * count, dtype=np.object_))
    rerank_inputs = models.rerank.model_common.rerank_inputs
    expected = model_answer(lambda: rerank_inputs(request, 2048), None)
    assert precheck_answer(lambda: prechecks.documents(count, 2048)) == expected
    assert precheck_answer(lambda: prechecks.documents(count, None)) == (expected if count == 0 else None)


@pytest.mark.parametrize("values", [(1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (1.0, -1.0, 0.0), (0.0, 0.0, -0.5)])
def test_weights_are_refused_as_the_rerank_model_refuses_them(models, values):
    rerank = object.__new__(models.rerank.TritonPythonModel)
    rerank.served = ["dense"]
    expected = model_answer(lambda: rerank.weights(ModelRequest(weights=np.array(values, dtype=np.float32))), None)
    assert precheck_answer(lambda: prechecks.rerank(Card("m", "m", ("dense",)), "q", ["d"], values, {}, 2048)) == \
        expected


def test_the_first_refusal_is_the_models_first():
    """Several faults at once: the one the models meet first (the BLS model's width, then the tokenizer's prompt,
    then the texts in order; bge-m3's rerank model its weights and documents first)."""
    card = Card("m", "m", ("dense",), prompts=PROMPTS, dimensions=(384,))
    with pytest.raises(proxy_service.ClientError) as caught:
        prechecks.embed(card, ["ok", "", "\u200b"], "input", {"dimensions": 7, "prompt_name": "poem"})
    assert caught.value.field == "dimensions"
    with pytest.raises(proxy_service.ClientError) as caught:
        prechecks.embed(card, ["ok", "", "\u200b"], "input", {"prompt_name": "poem"})
    assert caught.value.field == "prompt_name"
    with pytest.raises(proxy_service.ClientError) as caught:
        prechecks.embed(card, ["ok", "", "\u200b"], "input", {})
    assert caught.value.field == "input[1]"
    with pytest.raises(proxy_service.ClientError) as caught:
        prechecks.rerank(card, "", [""] * 3, (1.0, -1.0, 1.0), {"prompt_name": "poem"}, 2)
    assert caught.value.field == "weights"
    with pytest.raises(proxy_service.ClientError) as caught:
        prechecks.rerank(card, "", [""] * 3, (1.0, 1.0, 1.0), {"prompt_name": "poem"}, 2)
    assert caught.value.field == "documents" and caught.value.kind == "too_many"
    with pytest.raises(proxy_service.ClientError) as caught:
        prechecks.rerank(card, "", ["a", ""], (1.0, 1.0, 1.0), {}, 2)
    assert caught.value.field == "query"


def test_a_text_is_asked_of_the_tokenizer_only_when_its_characters_cannot_tell():
    """busy.surely_within: ASCII texts within the max length less the longest prompt and ASCII_SLACK need
    no question; anything else is asked (the answer is the tokenizer's, never the estimate's)."""
    card = Card("m", "m", ("dense",), max_length=32, prompts=(("query", "query: "),))
    room = 32 - len("query: ") - busy.ASCII_SLACK
    assert busy.surely_within(card, ["a" * room, "ok"])
    assert not busy.surely_within(card, ["a" * (room + 1)])
    assert not busy.surely_within(card, ["é"])  # not ASCII: a character may be several tokens
    assert not busy.surely_within(Card("m", "m", ("dense",), prompts=(("q", "質問: "),)), ["ok"])


# ---------------------------------------------------------------- the routes, with a gate that refuses everything
LONG_FAKE = "w " * 20  # 22 fake tokens: over the fake card's 16
CROSS = Card("fake-ce", "fake-ce", ("logits", "scores"), kind="cross-encoder", num_labels=1, chunks=None, prompts=())
# (route, body, the 4xx: status, code, field); the fake card serves width 8 and the prompt "query"
HOPELESS = [
    ("/v1/embeddings", {"input": ["ok", ""]}, 400, "invalid_input", "input[1]"),
    ("/v1/embeddings", {"input": ["ok", "\u200b\ufeff"]}, 400, "invalid_input", "input[1]"),
    ("/v1/embeddings", {"input": "x", "dimensions": 100}, 400, "not_served", "dimensions"),
    ("/v1/embeddings", {"input": "x", "prompt_name": "poem"}, 400, "not_served", "prompt_name"),
    ("/v1/embeddings", {"input": "x", "prompt_name": "query", "input_type": "query"}, 400, "invalid_value",
     "prompt_name"),
    ("/v1/embeddings", {"input": ["ok", LONG_FAKE], "truncate": False}, 422, "too_long", "input[1]"),
    ("/v1/encode", {"input": ["ok", " "]}, 400, "invalid_input", "input[1]"),
    ("/v1/embedding?truncate=false", [{"query": "ok"}, {"query": LONG_FAKE}], 422, "too_long", "query[1]"),
    ("/v1/embedding", [{"query": " "}], 400, "invalid_input", "query[0]"),
    ("/embed", {"inputs": ["ok", ""]}, 422, "invalid_input", "inputs[1]"),
    ("/embed", {"inputs": ["ok", LONG_FAKE]}, 422, "too_long", "inputs[1]"),  # TEI: truncate false unless asked
    ("/embed", {"inputs": "x", "prompt_name": "poem"}, 422, "not_served", "prompt_name"),
    ("/", {"inputs": ["ok", ""]}, 422, "invalid_input", "inputs[1]"),
    ("/embed_all", {"inputs": ["ok", LONG_FAKE]}, 422, "too_long", "inputs[1]"),
    ("/tokenize", {"inputs": ["ok", " "]}, 422, "invalid_input", "inputs[1]"),
    ("/v1/embed", {"texts": ["a"], "input_type": "poem"}, 400, "not_served", "input_type"),
    ("/v2/embed", {"texts": ["a"], "input_type": "search_query", "output_dimension": 100}, 400, "not_served",
     "output_dimension"),
    ("/v2/embed", {"texts": ["a", LONG_FAKE], "input_type": "search_query", "truncate": "NONE"}, 422, "too_long",
     "texts[1]"),
    ("/v1/rerank", {"query": "q", "documents": ["a", ""]}, 400, "invalid_input", "documents[1]"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "weights": [1, -1, 0]}, 400, "invalid_value", "weights"),
    ("/v1/rerank", {"query": "q", "documents": ["a", LONG_FAKE], "truncate": False}, 422, "too_long",
     "documents[1]"),
    ("/v1/rerank", {"query": LONG_FAKE, "documents": ["a"], "truncate": False}, 422, "too_long", "query"),
    ("/v2/rerank", {"query": " ", "documents": ["a"]}, 400, "invalid_input", "query"),
    ("/rerank", {"query": "q", "texts": ["a", LONG_FAKE]}, 422, "too_long", "texts[1]"),
    ("/similarity", {"inputs": {"source_sentence": "", "sentences": ["a"]}}, 422, "invalid_input",
     "inputs.source_sentence"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b", LONG_FAKE]}}, 422, "too_long",
     "inputs.sentences[1]"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": "x"}},
     422, "not_served", "prompt_name"),
    ("/v1/rerank", {"model": "fake-ce", "query": "q", "documents": ["a", LONG_FAKE], "truncate": False}, 422,
     "too_long", "documents[1]"),
    ("/v1/rerank", {"model": "fake-ce", "query": "q", "documents": ["a", "\x00"]}, 400, "invalid_input",
     "documents[1]"),
    ("/predict", {"model": "fake-ce", "inputs": [["ok"], ["q", LONG_FAKE]]}, 422, "too_long", "inputs[1]"),
    ("/predict", {"model": "fake-ce", "inputs": [["ok"], ["", "a"]]}, 422, "invalid_input", "inputs[1]"),
]
# valid requests of the same shapes: refused 429 while busy (a text within the max length is not asked about)
VALID = [("/v1/embeddings", {"input": ["ok", "fine"], "truncate": False}), ("/embed", {"inputs": ["ok"]}),
         ("/v1/rerank", {"query": "q", "documents": ["a", "b"], "truncate": False}),
         ("/predict", {"model": "fake-ce", "inputs": [["ok"], ["fine"]]}),
         ("/v2/embed", {"texts": ["a"], "input_type": "search_query", "output_dimension": DIM})]


def client_with(busy):
    client = make_client(max_concurrent_requests=0 if busy else 64)  # 0: the gate refuses every request
    client.service.models["fake-ce"] = CROSS
    client.service.max_documents = 2
    return client


def body_of(error):
    return error["code"], error["param"], error["field"], error["message"]


@pytest.mark.parametrize("route, body, status, code, field", HOPELESS, ids=[f"{c[0]} {c[4]}" for c in HOPELESS])
def test_a_hopeless_request_gets_its_4xx_from_every_route_busy_or_idle(route, body, status, code, field):
    idle, busy = client_with(False), client_with(True)
    answers = [error_of(c.post(route, json=body), status) for c in (idle, busy)]
    assert (answers[0]["code"], answers[0]["field"]) == (code, field), answers[0]
    assert body_of(answers[1]) == body_of(answers[0])
    if code == "too_long":  # busy: the tokenizer alone was asked (the fake's measure), and nothing else
        assert [call[2] for call in busy.service.calls] == ["measure"] * len(busy.service.calls) and \
            busy.service.calls
    else:  # refused before admission: no call at all
        assert busy.service.calls == []


@pytest.mark.parametrize("route, body", VALID, ids=[c[0] for c in VALID])
def test_a_valid_request_is_refused_while_busy_without_a_question(route, body):
    busy = client_with(True)
    error = error_of(busy.post(route, json=body), 429, "busy", "max_concurrent_requests")
    assert error["code"] == "overloaded" and busy.service.calls == []
    assert client_with(False).post(route, json=body).status_code == 200


def test_an_answer_too_large_gets_its_413_while_busy():
    """/embed_all's bound needs the tokens when the worst case is over max_embed_all_numbers: while busy, the
    tokenizer alone counts them (8 tokens per text, 8 numbers per token: 256 over 100)."""
    answers = []
    for busy in (False, True):
        client = make_client(max_concurrent_requests=0 if busy else 64, max_embed_all_numbers=100)
        answers.append(body_of(error_of(client.post("/embed_all", json={"inputs": ["a a a a a a"] * 4}), 413,
                                        "256 numbers")))
    assert answers[0] == answers[1] and answers[0][0] == "answer_too_large"


def test_no_answer_in_time_leaves_the_429():
    """The tokenizer cannot say (a full queue, the deadline, too many questions in flight): Service.measure gives
    None, and the request gets the gate's 429 as before."""
    busy = client_with(True)

    async def no_answer(card, texts, param, parameters=None, queries=None):
        return None
    busy.service.measure = no_answer
    error = error_of(busy.post("/embed", json={"inputs": ["ok", LONG_FAKE]}), 429, "busy")
    assert error["code"] == "overloaded"


# ---------------------------------------------------------------- the real server, made busy
LONG = "word " * 400  # 400 words: over MiniLM's 256 tokens
PASSAGE = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)  # 108 words: under 256, over 251 chars
HEAVY_S = 4.0  # each heavy /similarity alone, from the rate measured idle (~40 sentences of 100 words on 2 cores)
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a", "panda", "eats",
         "bamboo", "in", "the", "quiet", "forest"]
SERVED = [  # (route, body, status, code, field): MiniLM (width 384, no prompts, 256 tokens, max_documents 2048)
    ("/embed", {"inputs": ["ok", ""]}, 422, "invalid_input", "inputs[1]"),
    ("/embed", {"inputs": ["ok", LONG]}, 422, "too_long", "inputs[1]"),  # TEI's truncate: false unless asked
    ("/v1/embeddings", {"input": ["ok", LONG], "truncate": False}, 422, "too_long", "input[1]"),
    ("/v1/embeddings", {"input": "x", "dimensions": 100}, 400, "not_served", "dimensions"),
    ("/v1/embeddings", {"input": "x", "prompt_name": "poem"}, 400, "not_served", "prompt_name"),
    ("/v1/embeddings", {"input": ["fine", "\u200b\u200b"]}, 400, "invalid_input", "input[1]"),
    ("/v1/embed", {"texts": ["a"], "input_type": "poem"}, 400, "not_served", "input_type"),
    ("/v2/embed", {"texts": ["a"], "input_type": "search_query", "output_dimension": 100}, 400, "not_served",
     "output_dimension"),
    ("/v1/rerank", {"query": "q", "documents": ["a"] * 3000}, 422, "too_many", "documents"),
    ("/rerank", {"query": "q", "texts": ["a"] * 3000}, 413, "too_many", "texts"),
    ("/rerank", {"query": "q", "texts": ["a", LONG]}, 422, "too_long", "texts[1]"),
    ("/v1/embedding", [{"query": "\ufeff"}], 400, "invalid_input", "query[0]"),
]
TWINS = [("/v1/embeddings", {"input": ["ok", "fine"]}), ("/embed", {"inputs": ["ok", "fine"]}),
         ("/v1/rerank", {"query": "q", "documents": ["a"] * 30}), ("/v1/embed", {"texts": ["a"],
                                                                                "input_type": "search_query"})]


@pytest.fixture(scope="module")
def busy_server(server):
    """Two requests admitted at most (the setting max_concurrent_requests): two heavy requests in flight make the
    gate refuse every other one at its first Triton call, whatever the measured rate and whatever a request's size
    (why the gate refuses does not matter here; by work alone, which small requests it refuses depends on timing).
    The shared server, its proxy reloaded with these settings for the module."""
    with proxy_settings(server, max_concurrent_requests=2, request_timeout_s=60):
        yield server


def post(client, case):
    started = time.monotonic()
    response = client.post(case[0], json=case[1])
    return response, time.monotonic() - started


def answered(response):
    body = response.json()
    error = body["error"]
    if isinstance(error, str):  # TEI's shape
        return response.status_code, body["code"], body["field"], error
    return response.status_code, error["code"], error["field"], error["message"]


def test_hopeless_requests_get_their_4xx_while_the_server_is_busy(busy_server):
    """Idle, each hopeless case's answer; then two heavy /similarity requests hold the gate, a valid request gets
    429 at once, and every hopeless case gets its idle answer (status, kind, field, words), never 429: the
    refusals that need no tokens at once, a text over the max length with truncate false once the tokenizer, which
    waits for the busy encoder (Triton's rate limiter), has counted it."""
    sentences = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(100)) for i in range(600)]
    with httpx.Client(base_url=busy_server.proxy_url, timeout=120) as client, ThreadPoolExecutor(32) as pool:
        idle = {i: answered(post(client, case)[0]) for i, case in enumerate(SERVED)}
        for i, case in enumerate(SERVED):
            assert idle[i][:3] == case[2:], (case[0], idle[i])
        assert [client.post(route, json=body).status_code for route, body in TWINS] == [200] * len(TWINS)
        sample = post(client, ("/similarity", {"inputs": {"source_sentence": "a panda", "sentences": sentences[:10]}}))
        assert sample[0].status_code == 200, sample[0].text
        count = min(600, max(20, round(10 * HEAVY_S / sample[1])))  # heavy enough on this machine, not more
        heavy = {"inputs": {"source_sentence": "a panda", "sentences": sentences[:count]}}

        heavies = [pool.submit(post, client, ("/similarity", heavy)) for _ in range(2)]
        time.sleep(1.0)  # both admitted at their first Triton call (a probe sent sooner could take a place first)
        deadline = time.monotonic() + 30
        while client.post("/v1/embeddings", json={"input": ["ok"]}).status_code != 429:
            finished = [future.result() for future in heavies if future.done()]
            assert time.monotonic() < deadline and not finished, \
                ("the gate never filled", [(r.status_code, r.text[:200], s) for r, s in finished])
            time.sleep(0.05)
        hopeless = [pool.submit(post, client, case) for case in SERVED]
        twins = [pool.submit(post, client, case) for case in TWINS]
        passage = pool.submit(post, client, ("/embed", {"inputs": ["ok", PASSAGE]}))  # valid, asked: 429 later
        twin_answers = [future.result() for future in twins]
        busy = [future.result() for future in hopeless]
        passage_answer = passage.result()
        heavy_answers = [future.result() for future in heavies]

    report = [f"{case[0]} {case[4]}: {response.status_code} in {seconds * 1000:.0f} ms"
              for case, (response, seconds) in zip(SERVED, busy)]
    print("\nwhile busy: " + "; ".join(report))
    print(f"heavy: {count} sentences (10 took {sample[1]:.2f} s idle); "
          f"valid twins: {[(r.status_code, round(s * 1000)) for r, s in twin_answers]}; a valid 108-word passage "
          f"with truncate false: {passage_answer[0].status_code} after {passage_answer[1]:.2f} s; heavy requests: "
          f"{[(r.status_code, round(s, 1)) for r, s in heavy_answers]}")
    assert [r.status_code for r, _ in twin_answers] == [429] * len(TWINS), [r.text for r, _ in twin_answers]
    for i, (case, (response, _)) in enumerate(zip(SERVED, busy)):
        assert answered(response) == idle[i], (case[0], case[4], response.status_code, response.text[:300])
    assert passage_answer[0].status_code == 429, passage_answer[0].text
    assert [r.status_code for r, _ in heavy_answers] == [200, 200]
    with httpx.Client(base_url=busy_server.proxy_url, timeout=60) as client:  # and it serves on
        assert client.post("/embed", json={"inputs": ["ok", PASSAGE]}).status_code == 200
