"""Small helpers for the ensemble tests: the same calls through tritonclient.http and tritonclient.grpc."""
import json
import time
import urllib.error
import urllib.request
import weakref

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROTOCOLS = ("http", "grpc")
ENSEMBLE_OUTPUTS = ("embedding", "num_tokens", "truncated")
TOKENIZER_OUTPUTS = ("input_ids", "attention_mask", "num_tokens", "truncated")

# ≥ 50 varied texts: several scripts and languages, emoji, punctuation, numbers, code, one far longer than any
# max length (truncation), and a range of lengths so the tokenizer's length groups differ.
VARIED_TEXTS = [
    "Hello world",
    "short",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Triton Inference Server serves text embeddings from an ensemble of a tokenizer and an ONNX encoder.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "¿Dónde está la biblioteca? Está al lado de la estación.",
    "Português: não há mal que sempre dure, nem bem que nunca acabe.",
    "Русский язык — один из восточнославянских языков.",
    "Українська мова має багату історію.",
    "Ελληνικά: η γλώσσα των φιλοσόφων.",
    "日本語のテキストも埋め込みできます。",
    "東京は日本の首都です。",
    "中文文本嵌入测试，包含标点符号。",
    "我们今天去公园散步吧",
    "한국어 문장도 처리할 수 있어야 합니다.",
    "العربية تكتب من اليمين إلى اليسار.",
    "עברית היא שפה שמית.",
    "हिन्दी भारत की आधिकारिक भाषाओं में से एक है।",
    "বাংলা ভাষা বিশ্বের অন্যতম প্রধান ভাষা।",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "Tiếng Việt có nhiều dấu thanh điệu.",
    "Türkçe: Çalışkan öğrenciler başarılı olur.",
    "Polski: Zażółć gęślą jaźń.",
    "Emoji only: 🚀🔥🎉",
    "I love pizza 🍕 and sushi 🍣!",
    "Family emoji with joiners: 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Mixed: Ünïcödé, 日本語, العربية and emoji 🙂 in one line.",
    "Numbers 3.14159, 2.71828 and 1,000,000 dollars.",
    "Email me at someone@example.com or visit https://example.com/path?q=1.",
    "def add(a, b):\n    return a + b",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    "   leading and trailing spaces   ",
    "Tabs\tand\nnew\nlines",
    "ALL CAPS SENTENCE SHOUTING LOUDLY",
    "punctuation!!! ??? ... --- ;;;",
    "Zero-width space:\u200bhere and non-breaking\u00a0space.",
    "Accents composed é vs decomposed e\u0301.",
    "Machine learning models map sentences to dense vectors for semantic search.",
    "Embeddings let us compare the meaning of two pieces of text with a cosine similarity.",
    "A man is playing a guitar on the street corner while people walk by.",
    "The weather today is sunny with a light breeze from the west.",
    "Stock markets rallied after the central bank held interest rates steady.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The mitochondria is the powerhouse of the cell.",
    "To be, or not to be, that is the question.",
    ("A medium-length paragraph about distributed systems: consensus protocols such as Raft and Paxos let a "
     "cluster of machines agree on a sequence of values even when some of them fail or messages are delayed."),
    ("Another paragraph, in a different register: the recipe asks for two cups of flour, one teaspoon of salt, "
     "a spoonful of sugar, warm water and yeast; knead for ten minutes and let the dough rise for an hour."),
    "Paris is the capital of France. " * 60,  # far longer than the max length: truncated
    "词" * 700,  # long CJK run: truncated too
]


def url_for(server, protocol):
    return server.http_url if protocol == "http" else server.grpc_url


OPEN_CLIENTS = weakref.WeakSet()  # closed before a test server stops (close_clients)


def client(protocol, url, **kwargs):
    module = httpclient if protocol == "http" else grpcclient
    connection = module.InferenceServerClient(url, **kwargs)
    OPEN_CLIENTS.add(connection)
    return connection


def close_clients():
    """Close every client a test left open: at SIGTERM Triton waits (up to its exit timeout, 30 s) for the HTTP
    connections open to it, an idle keep-alive one included, before it unloads the models."""
    for connection in list(OPEN_CLIENTS):
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - already closed, or its loop gone: nothing left to close
            pass
    OPEN_CLIENTS.clear()


def text_input(protocol, texts):
    """A [rows, 1] BYTES tensor; `texts` may hold str or raw bytes (invalid UTF-8, NUL bytes pass unchanged)."""
    module = httpclient if protocol == "http" else grpcclient
    rows = [t if isinstance(t, bytes) else t.encode("utf-8") for t in texts]
    data = np.empty((len(rows), 1), dtype=object)
    for i, raw in enumerate(rows):
        data[i, 0] = raw
    tensor = module.InferInput("text", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def outputs(protocol, names):
    module = httpclient if protocol == "http" else grpcclient
    return [module.InferRequestedOutput(name) for name in names]


def infer(protocol, url, texts, model="ensemble", names=ENSEMBLE_OUTPUTS, connection=None):
    """One request holding every text as a row; returns {output name: numpy array}."""
    own = connection is None
    connection = connection or client(protocol, url)
    try:
        result = connection.infer(model, [text_input(protocol, texts)], outputs=outputs(protocol, names))
        return {name: result.as_numpy(name) for name in names}
    finally:
        if own:
            connection.close()


def bytes_input(module, name, texts, shape):
    """A BYTES tensor of `shape` (tritonclient.http or .grpc: `module`) holding `texts`, str or raw bytes."""
    tensor = module.InferInput(name, shape, "BYTES")
    tensor.set_data_from_numpy(np.array([t if isinstance(t, bytes) else t.encode() for t in texts],
                                        dtype=np.object_).reshape(shape))
    return tensor


def rerank(protocol, server, query, documents, model="xr_rerank"):
    """A cross-encoder's rerank model (`query` + `documents`) over KServe: {output name: numpy array}."""
    module = httpclient if protocol == "http" else grpcclient
    connection = client(protocol, url_for(server, protocol))
    try:
        result = connection.infer(model, [bytes_input(module, "query", [query], [1]),
                                          bytes_input(module, "documents", documents, [len(documents)])])
        return {name: result.as_numpy(name) for name in ("scores", "logits", "num_tokens", "query_truncated",
                                                         "truncated")}
    finally:
        connection.close()


def embed_one_by_one(protocol, url, texts):
    """Each text in its own request, sequentially: (embeddings [n, dim], num_tokens [n], truncated [n])."""
    connection = client(protocol, url)
    try:
        results = [infer(protocol, url, [text], connection=connection) for text in texts]
    finally:
        connection.close()
    return (np.concatenate([r["embedding"] for r in results]),
            np.concatenate([r["num_tokens"].reshape(-1) for r in results]),
            np.concatenate([r["truncated"].reshape(-1) for r in results]))


def error_of(protocol, url, texts, model="ensemble", names=ENSEMBLE_OUTPUTS):
    """The InferenceServerException a request raises (fails the test if it succeeds)."""
    try:
        infer(protocol, url, texts, model=model, names=names)
    except InferenceServerException as error:
        return error
    raise AssertionError(f"{protocol}: request with {len(texts)} row(s) succeeded, an error was expected")


def cosine(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def settled_stats(server, model, quiet_s=0.3, timeout_s=10.0):
    """Triton's statistics for `model` once they stop changing: a backend records an execution's statistics
    after its responses went out, so a client can see its answer before the counts include it."""
    deadline = time.monotonic() + timeout_s
    last = server.stats(model)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        current = server.stats(model)
        if (current["inference_count"], current["execution_count"]) == \
                (last["inference_count"], last["execution_count"]):
            return current
        last = current
    return last


def raw_bytes_grpc(grpc_url, model, inputs, parameters=None):
    """gRPC ModelInfer with raw BYTES contents as sent, malformed or not: inputs [(name, shape, serialized bytes)],
    parameters {name: int or str}. Returns (grpc status code, details)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, shape, _ in inputs:
        request.inputs.add(name=name, datatype="BYTES", shape=shape)
    request.raw_input_contents.extend(raw for _, _, raw in inputs)
    for key, value in (parameters or {}).items():
        if isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value
    with grpc.insecure_channel(grpc_url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            return error.code(), error.details()


def post(server, path, body):
    """(status, JSON answer) of a POST to the server's HTTP front, an error's included."""
    request = urllib.request.Request(server.proxy_url + path, json.dumps(body).encode(),
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
