"""The proxy's app over a fake service, for the unit tests of the HTTP front (test_proxy_app.py, test_proxy_images.py,
test_proxy_dialects.py, test_proxy_errors.py, test_field_errors.py): the proxy's modules imported as its model.py
imports them inside Triton (model_library/in_process.py), a deterministic FakeService that follows
app.ServiceProtocol (fake models behind the real service's busy path), the client over both, and the error body read
back. No Triton here."""
import base64
import zlib
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from fastapi.testclient import TestClient

from model_library import (
    model_errors,
    request_rules,  # noqa: E402
)
from model_library.in_process import model_module

errors = model_module("proxy", "http_front.errors")
prechecks = model_module("proxy", "http_front.prechecks")
proxy_app = model_module("proxy", "http_front.app")
proxy_service = model_module("proxy", "http_front.service")
Metrics = model_module("proxy", "http_front.metrics").Metrics

DIM = 8


def model_error(kind, field, problem, card, rows):
    """What the real service raises for a model's error in the contract (model_errors.py): service.step_error of the
    tagged message, as the ensemble passes it on."""
    message = "in ensemble 'x', " + model_errors.tagged(kind, field, problem)
    return proxy_service.step_error(message, card, "x", rows)


def refuse_cut(card, cut, rows, field="text", single=False):
    """The tokenizer's truncate false (request_rules.cut_refused): the first row cut is too_long naming it, read as
    the real service reads it; `single`: the field is one text (a rerank query)."""
    for i, over in enumerate(cut):
        if over:
            raise request_rules.cut_refused(field if single else f"{field}[{i}]", card.max_length,
                                            lambda name, problem, kind: model_error(kind, name, problem, card, rows))


def keeps(parameters):
    """The request parameter `truncate` (false: the tokenizer refuses a text over the max length)."""
    return (parameters or {}).get("truncate", True)


@dataclass(frozen=True)
class Card:
    id: str
    name: str
    outputs: tuple
    embedding_size: int = DIM
    colbert_size: int = DIM
    max_length: int = 16
    source: str = "fake/source"
    created: int = 0
    kind: str = "embedding"
    chunks: str | None = "late_chunking"
    rerank: str | None = "rerank"
    image: str | None = None  # CLIP exports: the image ensemble
    architecture: str | None = None
    pretrained: str | None = None
    prompts: tuple = (("query", "query: "),)  # registry.Card's form: ((name, text), ...)
    default_prompt_name: str | None = None
    pooling: str | None = "mean"
    num_labels: int | None = None
    served_names: tuple = ()
    labels: tuple = ()
    unnormalized: bool = False  # the encoder's embedding_unnormalized (TEI's normalize: false)
    hidden_size: int | None = None  # the token vectors' width, when a Dense module makes it differ (registry.Card)
    dimensions: tuple = (DIM,)  # the widths `dimensions` may ask for (registry.Card)
    routes: tuple = ()  # an inference-free SPLADE export's Router tasks (registry.Card)
    # the export's reference check, JSON text (registry.Card: model_library/parity_report.py's report)
    parity_report: str = '{"checked": false, "why": "a fake export: no reference check"}'
    muvera_size: int | None = None  # MUVERA's width (registry.Card)


def stable_hash(text):
    """The same number for a text in every process (hash() of a str changes with PYTHONHASHSEED)."""
    return zlib.crc32(text.encode())


def fake_vectors(text, dim=DIM):
    rng = np.random.default_rng(stable_hash(text))
    vector = rng.normal(size=dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


class FakeModels:
    """The models' side of app.ServiceProtocol: deterministic vectors per text, token count = words + 2, truncated
    over 14. Before admission, as the real service: the models' refusals that need no tokens (the proxy's
    prechecks.py)."""

    max_documents = None  # the rerank model's max_documents (None: not known; the real one learns Triton's)

    def __init__(self):
        self.models = {"fake-dense": Card("fake-dense", "ensemble", ("dense",), unnormalized=True),
                       "fake-m3": Card("fake-m3", "fake-m3", ("dense", "sparse", "colbert"), muvera_size=64)}
        self.default, self.draining, self.calls, self.admin = "fake-dense", False, [], []
        self.failed = ""  # the registry's "not live" reason

    def cards(self):
        return list(self.models.values())

    def exports(self):
        return sorted(self.models.values(), key=lambda c: c.id)

    def resolve(self, model):
        card = self.models.get(model or self.default) or next(
            (c for c in self.models.values() if c.name == model), None)
        if card is None:
            raise errors.NotFound(f"model '{model}' is not served here", "model_not_found", "model")
        return card

    def health(self):
        return proxy_service.Health(False, "shutting down") if self.draining else proxy_service.Health(True, "ok")

    def live(self):
        return proxy_service.Health(False, self.failed) if self.failed else proxy_service.Health(True, "ok")

    async def embed(self, card, texts, outputs, param, parameters=None):
        prechecks.embed(card, texts, param, parameters)
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, list(texts), outputs))
        width = (parameters or {}).get("dimensions")
        if width not in (None, DIM):  # the BLS model's error, read as the real service reads it
            raise model_error("not_served", "dimensions", f"{width} is not served; dimensions must be {DIM}: this "
                                                          f"model is not Matryoshka", card, (param, 0))
        for i, text in enumerate(texts):  # the tokenizer's per-text errors
            if not text.strip():
                raise model_error("invalid_input", f"text[{i}]", "is empty", card, (param, 0))
            if text == "BAD":
                raise model_error("invalid_input", f"text[{i}]", "is not valid UTF-8 (byte 0)", card, (param, 0))
        words = [len(t.split()) + 2 for t in texts]
        if not keeps(parameters):
            refuse_cut(card, np.array(words) > card.max_length, (param, 0))
        tokens = np.minimum(words, card.max_length)
        # a token id per distinct word: hash() of a str differs per process, and "a" and "b" once met mod 1000
        ids = [np.array(sorted({stable_hash(w) % 1000 for w in t.split()}), dtype=np.int64) for t in texts]
        sparse = [proxy_service.SparseWeights(row, np.full(len(row), 0.5, dtype=np.float32)) for row in ids]
        colbert = [np.stack([fake_vectors(w) for w in t.split()] + [fake_vectors("</s>")]) for t in texts]
        return proxy_service.Embeddings(
            dense=np.stack([fake_vectors(t) for t in texts]), sparse=sparse, colbert=colbert, tokens=tokens,
            truncated=np.array(words) > card.max_length, inference_ms=1.0,
            unnormalized=np.stack([fake_vectors(t) * (2.0 + len(t)) for t in texts]),
            muvera=np.stack([fake_vectors(t, 64) for t in texts]) if "muvera" in outputs else None)

    async def embed_images(self, card, images, param, indices=None):
        """Vectors per image's bytes; an image starting with b"BAD" is refused as the image model refuses it."""
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, list(images), "images"))
        indices = list(range(len(images))) if indices is None else indices
        for i, image in enumerate(images):
            if image.startswith(b"BAD"):  # the image model's error
                raise model_error("invalid_input", f"image[{i}]", "is not an image (cannot identify image file)", card,
                                  (param, 0, indices))
        return proxy_service.ImageEmbeddings(np.stack([fake_vectors(image.hex()) for image in images]), 2.0)

    async def rerank(self, card, query, documents, weights, parameters=None):
        """Scores: the dense dot product; per mode: dense, and weight-scaled stand-ins for the others the card
        serves (the scoring itself is the rerank model's: tests/test_rerank.py, tests/test_m3.py)."""
        prechecks.rerank(card, query, documents, weights, parameters, self.max_documents)
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, [query, *documents], tuple(weights)))
        if not query.strip():
            raise model_error("invalid_input", "query", "is empty", card, None)
        for i, text in enumerate(documents):
            if not text.strip():
                raise model_error("invalid_input", f"documents[{i}]", "is empty", card, None)
            if text == "BAD":
                raise model_error("invalid_input", f"documents[{i}]", "is not valid UTF-8 (byte 0)", card, None)
        words = [len(t.split()) + 2 for t in documents]
        if not keeps(parameters):  # the rerank model's fields: query, documents[i]
            refuse_cut(card, [len(query.split()) + 2 > card.max_length], None, "query", single=True)
            refuse_cut(card, np.array(words) > card.max_length, None, "documents")
        dense = np.array([float(fake_vectors(query) @ fake_vectors(d)) for d in documents], dtype=np.float32)
        modes = np.full((len(documents), 3), np.nan, dtype=np.float32)
        for column, mode in enumerate(("dense", "sparse", "colbert")):
            if mode in card.outputs:
                modes[:, column] = dense * (column + 1)
        cross = card.kind == "cross-encoder"  # its classifier's logits, and their sigmoid as the scores
        logits = dense * 4 if cross else None
        return proxy_service.RerankScores(
            scores=1 / (1 + np.exp(-logits)) if cross else dense, mode_scores=None if cross else modes,
            tokens=sum(words) + len(query.split()) + 2, query_truncated=len(query.split()) + 2 > card.max_length,
            truncated=np.array(words) > card.max_length, inference_ms=1.0, logits=logits)

    async def tokenize(self, card, texts, param, parameters):
        """A token per word (bytes counted), between two special tokens; the tokenizer's empty-text error."""
        prechecks.embed(card, texts, param, {key: value for key, value in parameters.items() if value is not None})
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, list(texts), "tokenize", parameters))
        rows = []
        for i, text in enumerate(texts):
            if not text.strip():
                raise model_error("invalid_input", f"text[{i}]", "is empty", card, (param, 0))
            tokens, at = [proxy_service.Token(id=0, text="<s>", special=True, start=None, stop=None)], 0
            for word in text.split(" "):
                start = len(text[:text.index(word, at)].encode()) if word else at
                tokens.append(proxy_service.Token(id=stable_hash(word) % 1000, text=word, special=False, start=start,
                                                  stop=start + len(word.encode())))
                at = text.index(word, at) + len(word) if word else at
            rows.append(tokens + [proxy_service.Token(id=2, text="</s>", special=True, start=None, stop=None)])
        return rows

    async def decode(self, card, ids, param, parameters):
        """Each row's ids joined by spaces; an id over 999 is the tokenizer's error for its row."""
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, ids, "decode", parameters))
        for i, row in enumerate(ids):
            if any(token > 999 for token in row):
                raise model_error("invalid_value", f"{param}[{i}]", "holds an id outside the vocabulary", card, None)
        return [" ".join(map(str, row)) for row in ids]

    async def predict(self, card, inputs, param, parameters=None):
        """Per input one logit per label from its texts' vectors; scores their softmax (sigmoid for one)."""
        prechecks.predict(inputs, param)
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, list(inputs), "predict"))
        labels = card.num_labels or 1
        logits = np.array([[float(fake_vectors(" | ".join(item))[k]) * 4 for k in range(labels)] for item in inputs],
                          dtype=np.float32)
        scores = 1 / (1 + np.exp(-logits)) if labels == 1 else np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        words = np.array([sum(len(t.split()) for t in item) + 3 for item in inputs])
        if not keeps(parameters):
            refuse_cut(card, words > card.max_length, (param, 0))
        return proxy_service.Prediction(logits, scores, int(words.sum()), words > card.max_length, 1.0)

    async def measure(self, card, texts, param, parameters=None, queries=None):
        """The tokenizer's count without admission (the real one: the tokenizer model alone): words + 2 per text (a
        pair: both texts' words + 3), cut over the card's max length; a pair's query is cut over half of it."""
        self.calls.append((card.id, list(texts), "measure", queries))
        queries_given = queries
        if queries is None:
            words = np.array([len(t.split()) + 2 for t in texts])
            cut_queries = None
        else:
            queries = [queries] * len(texts) if isinstance(queries, str) else list(queries)
            words = np.array([len(q.split()) + len(t.split()) + 3 for q, t in zip(queries, texts)])
            cut_queries = np.array([len(q.split()) > card.max_length // 2 for q in queries])
        if not keeps(parameters):  # the tokenizer's order: a pair's query, then the row
            if cut_queries is not None:
                refuse_cut(card, cut_queries, (param, 0), "query", single=isinstance(queries_given, str))
            refuse_cut(card, words > card.max_length, (param, 0))
        return proxy_service.Measured(np.minimum(words, card.max_length), words > card.max_length, cut_queries)

    async def chunk_embed(self, card, texts, spans, parameters):
        """One chunk per span (or one for the text with chunk_tokens); vectors per chunk text."""
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, list(texts), spans, parameters))
        if (spans is None) == (parameters.get("chunk_tokens") is None):  # the late chunking model's rules
            raise model_error("invalid_input", "spans", "or the request parameter chunk_tokens gives the chunks: one "
                                                        "of them", card, None)
        results = []
        for i, text in enumerate(texts):
            if not text.strip():
                raise model_error("invalid_input", "text", "is empty", card, None)
            found = np.array(spans[i] if spans is not None else [[0, len(text)]], dtype=np.int64).reshape(-1, 2)
            vectors = np.stack([fake_vectors(text[a:b]) for a, b in found.tolist()])
            results.append(proxy_service.TextChunks(vectors, found, np.full(len(found), 2, dtype=np.int32),
                                                     len(text.split()) + 2))
        return proxy_service.ChunkEmbeddings(results, 1.0)

    async def document_chunks(self, card, documents, outputs, parameters):
        """Each document's chunks joined with one space, one window; a vector per chunk text in each output."""
        proxy_service.admit_request()  # as the real service's first Triton call
        self.calls.append((card.id, [list(d) for d in documents], outputs, parameters))
        results = []
        for chunks in documents:
            for k, chunk in enumerate(chunks):
                if not chunk.strip():
                    raise model_error("invalid_input", f"chunks[{k}]", "is empty or only whitespace", card, None)
            starts = np.cumsum([0] + [len(c) + 1 for c in chunks[:-1]])
            spans = np.array([[a, a + len(c)] for a, c in zip(starts, chunks)], dtype=np.int64).reshape(-1, 2)
            dense = np.stack([fake_vectors(c) for c in chunks])
            vectors = {name: dense if name == "embedding" else (dense > 0).astype(np.uint8) for name in outputs}
            windows = np.array([[0, int(spans[-1, 1])]] * len(chunks), dtype=np.int64).reshape(-1, 2)
            results.append(proxy_service.DocumentChunks(vectors, spans, windows, np.full(len(chunks), 2, np.int32),
                                                        sum(len(c.split()) for c in chunks) + 2))
        return proxy_service.ChunkedDocuments(results, 1.0)

    async def load(self, model_id):
        self.admin.append(("load", model_id))
        return 0.5

    async def unload(self, model_id):
        self.admin.append(("unload", model_id))
        return 0.25


class FakeService(proxy_service.BusyPath, FakeModels):
    """The fake models behind the real service's busy path (busy.py), as service.Service has it before its
    Inference."""


def settings(**overrides):
    values = {"api_key": "", "admin_api_key": "", "max_inputs_per_request": 16, "max_input_chars": 200,
              "max_concurrent_requests": 64, "admission_target_s": 2.0, "max_image_bytes": 1000,
              "max_images_per_request": 4,
              "image_url_hosts": "", "image_url_max_bytes": 1000, "image_url_timeout_s": 2.0,
              "image_url_allow_private": False,
              "max_body_bytes": 4096, "body_timeout_s": 5.0, "swagger_path": None, "request_timeout_s": 60.0,
              "max_embed_all_numbers": 4_000_000}
    values.update(overrides)
    return SimpleNamespace(**values)


def make_client(**overrides):
    service, metrics, config = FakeService(), Metrics(), settings(**overrides)
    client = TestClient(proxy_app.create_server_app(config, service, metrics))
    client.service, client.metrics = service, metrics
    return client


def error_of(response, status, *words):
    """The error body's fields, in OpenAI's shape or (TEI's routes) TEI's, ours beside: {error, error_type, code,
    param, field}."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if isinstance(error, str):
        body = response.json()
        assert set(body) == {"error", "error_type", "code", "param", "field"} and body["error_type"], body
        error = {"message": error, "type": body["error_type"], "param": body["param"], "code": body["code"],
                 "field": body["field"]}
    assert set(error) == {"message", "type", "param", "code", "field"} and error["message"] and error["type"]
    for word in words:
        assert word in error["message"], error["message"]
    return error


# ---------------------------------------------------------------- images (CLIP exports)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # not a real image: the fake service embeds any bytes
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(255, -1, -1))
CLIP = Card("fake-clip", "fake-clip", ("dense",), kind="clip", chunks=None, rerank=None, image="fake-clip_image",
            architecture="ViT-B-32", pretrained="laion2b_s34b_b79k")


def b64(data, urlsafe=False, padded=True):
    text = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()
    return text if padded else text.rstrip("=")
