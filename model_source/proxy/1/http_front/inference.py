"""The inference half of the service (service.Service): each export's models through BLS — its BLS model for
embeddings (it cuts many texts into length groups inside Triton), its ensemble for one text, its rerank, late
chunking, image and tokenizer models — with the request's deadline and admission, and the models' errors as the
error table's kinds (step_error: the error contract's kind and field, mapped once). Before a request's first call
(its admission), the models' refusals that need no tokens are given here (prechecks.py), so that busy or not a
request that can never succeed gets its 4xx; measure() asks the tokenizer alone, outside admission, what only it can
say (a text over the max length: busy.py asks it for a request the gate refused). pb_utils is handed in (tests
import this file)."""
import asyncio
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from model_library import model_errors, model_outputs, tracing
from model_library.model_errors import ErrorKind
from model_library.model_outputs import (
    CHUNK_SPANS,
    CHUNK_WINDOWS,
    DECODED,
    DENSE,
    LENGTH_GROUP,
    LOGITS,
    MODE_SCORES,
    NUM_TOKENS,
    QUERY_TRUNCATED,
    SCORES,
    TEXT_TOKENS,
    TRUNCATED,
)

from . import admission, prechecks
from .errors import FROM_MODEL, ApiError, ClientError, NotAdmitted, Timeout, Unavailable, rename_field

TENSORS = model_outputs.TENSORS
QUANTIZED = tuple(model_outputs.QUANTIZED)  # the BLS model's outputs (not the ensemble's)
COLBERT_KINDS = ("colbert", *model_outputs.COLBERT_COMPACT)  # one of them per request
BLS_ONLY = (*QUANTIZED, *COLBERT_KINDS[1:], "tokens", model_outputs.MUVERA)
PER_TOKEN = model_outputs.PER_TOKEN
SPARSE_INDICES, SPARSE_VALUES, SPARSE_COUNT = model_outputs.SPARSE
COLBERT_LENGTH = model_outputs.COLBERT[1]  # beside the ColBERT vectors of every form
TOKENIZE = list(model_outputs.TOKENIZE)  # the tokenizer's tokenize task's outputs
COUNTS = list(model_outputs.COUNTS)
# what the BLS and rerank models pass on to the tokenizer (truncate false: it refuses a text over the max length)
TOKENIZER_PARAMETERS = ("prompt_name", "input_type", "truncate")


class SparseWeights(NamedTuple):
    indices: np.ndarray  # the text's token ids with a weight
    values: np.ndarray  # their weights


@dataclass
class Embeddings:
    dense: np.ndarray | None
    sparse: list | None  # [SparseWeights] per text
    colbert: list | None
    tokens: np.ndarray
    truncated: np.ndarray
    inference_ms: float
    quantized: dict = field(default_factory=dict)  # embedding type -> [rows, width] array
    token_vectors: list | None = None  # per text [tokens, hidden]: the encoder's last hidden state
    unnormalized: np.ndarray | None = None  # [rows, dim]: the pooled vectors before the graph's L2 step
    muvera: np.ndarray | None = None  # [rows, size]: MUVERA's encoding of each text's ColBERT vectors


@dataclass
class Token:
    id: int
    text: str
    special: bool
    start: int | None  # bytes in the tokenized text (the prompt included); None for a special token
    stop: int | None


@dataclass
class RerankScores:
    scores: np.ndarray
    mode_scores: np.ndarray | None  # [n, 3]: dense, sparse, ColBERT (NaN: a mode not served); None: cross-encoder
    tokens: int
    query_truncated: bool
    truncated: np.ndarray
    inference_ms: float
    logits: np.ndarray | None = None  # a cross-encoder's scores before its sigmoid (TEI's raw_scores); else None


@dataclass
class Prediction:
    """A cross-encoder's classifier over inputs (Inference.predict), rows in the order given."""
    logits: np.ndarray  # [n, labels]: before the sigmoid or softmax (TEI's raw_scores)
    scores: np.ndarray  # [n, labels]
    tokens: int  # tokens of every input together
    truncated: np.ndarray  # [n]: an input cut at the max length
    inference_ms: float


@dataclass
class ImageEmbeddings:
    """Images through a CLIP export's image models (Inference.embed_images)."""
    dense: np.ndarray  # [n, d] float32: one vector per image, as Embeddings.dense is per text
    inference_ms: float


@dataclass
class TextChunks:
    """One text's late chunking (Inference.chunk_embed): a vector per chunk."""
    vectors: np.ndarray  # [chunks, d]
    spans: np.ndarray  # [chunks, 2]: each chunk's [start, end] in the text
    chunk_tokens: np.ndarray  # [chunks]: each chunk's tokens
    tokens: int  # the text's tokens


@dataclass
class ChunkEmbeddings:
    texts: list  # [TextChunks], one per text in the order given
    inference_ms: float


@dataclass
class DocumentChunks:
    """One document's contextualized chunks (Inference.document_chunks): a vector per chunk, in each form asked."""
    vectors: dict  # output name (embedding, embedding_int8...) -> [chunks, d]
    spans: np.ndarray  # [chunks, 2]: each chunk's [start, end] in the document (its chunks joined)
    windows: np.ndarray  # [chunks, 2]: the [start, end] of the text each chunk's vector was pooled from
    chunk_tokens: np.ndarray  # [chunks]
    tokens: int  # the tokens the encoder ran on (every window's)


@dataclass
class ChunkedDocuments:
    documents: list  # [DocumentChunks], one per document in the order given
    inference_ms: float


@dataclass
class Measured:
    """What the tokenizer makes of texts (Inference.measure), as the embedding step would: per text (or pair)."""
    tokens: np.ndarray  # tokens embedded: cut at the max length, special tokens and the prompt included
    truncated: np.ndarray  # cut at the max length (a pair: cut at all)
    query_truncated: np.ndarray | None  # pairs: the pair's query was cut (None: single texts)


def encoded(texts):
    """UTF-8 bytes of each text. The routes have refused lone surrogates (route_helpers.check_text); one that got
    past them reaches the tokenizer as it is, whose rule (valid UTF-8) answers for it."""
    return [text.encode("utf-8", "surrogatepass") for text in texts]


class Inference:
    """Service's inference: the state it keeps is Service's (bls_rows, inflight, loop, executor, pb, settings)."""

    def abort_inflight(self, model, reason, code=ErrorKind.MODEL_NOT_READY):
        """From the readiness thread: fail (503) the calls waiting on `model` (None: every call); returns their BLS
        calls (futures)."""
        calls = [(waiting, call) for models, waiting, call in list(self.inflight) if model is None or model in models]

        def abort():
            for waiting, _ in calls:
                if not waiting.done():
                    waiting.set_exception(Unavailable(reason + "; retry", code, retry_after=2))
        if calls and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(abort)
        for _, call in calls:  # one still queued for a BLS thread never runs: only the running ones are stranded
            call.cancel()
        stranded = [call for _, call in calls if not call.cancelled()]
        for call in stranded:  # waiting on a dead stub, not running work: no reason for /health to say busy
            self.calls_started.pop(call, None)
        return stranded

    # ---------------------------------------------------------------- inference
    async def embed(self, card, texts, outputs, param, parameters=None):
        """Several texts through the export's BLS model, in pieces of its max_batch_size; one text through the
        ensemble (nothing to group, and the BLS hops cost ~1 ms) unless it needs the BLS model's quantized outputs
        or `dimensions`. parameters: the request parameters (dimensions, prompt_name, input_type,
        colbert_pool_factor), passed on. outputs: at most one ColBERT kind (colbert or colbert_fp16/int8/binary).
        -> Embeddings."""
        prechecks.embed(card, texts, param, parameters)
        started = time.perf_counter()
        names = [t for kind in outputs for t in TENSORS[kind]] + COUNTS
        parameters = {key: value for key, value in (parameters or {}).items() if value is not None}
        # (an inference-free SPLADE export's query side is the BLS model's answer: the ensemble runs the encoder)
        bls = len(texts) > 1 or "dimensions" in parameters or "colbert_pool_factor" in parameters or \
            any(kind in BLS_ONLY for kind in outputs) or bool(card.routes)
        rows, model = encoded(texts), card.bls if bls else card.name
        size = self.bls_rows.get(card.bls, 1) if bls else 1
        calls = [self.infer(card, model, {"text": np.array(rows[first:first + size], dtype=np.object_).reshape(-1, 1)},
                            names, (param, first), parameters) for first in range(0, len(rows), size)]
        # (gather runs each call in a task of its own: one call is awaited here, a task fewer per request)
        parts = await asyncio.gather(*calls) if len(calls) > 1 else [await calls[0]]
        # per-token outputs are padded per piece (widths differ): kept as rows; the others joined into one array
        joined = {name: [row for part in parts for row in part[name]] for name in names if name in PER_TOKEN}
        flat = {name: np.concatenate([part[name] for part in parts]) for name in names if name not in PER_TOKEN}
        colbert = next((TENSORS[kind][0] for kind in outputs if kind in COLBERT_KINDS), None)
        return Embeddings(
            dense=flat[DENSE] if "dense" in outputs else None,
            sparse=[SparseWeights(ids[:int(n)], weights[:int(n)]) for ids, weights, n in
                    zip(joined[SPARSE_INDICES], joined[SPARSE_VALUES], flat[SPARSE_COUNT].reshape(-1))]
            if "sparse" in outputs else None,
            colbert=[vectors[:int(n)] for vectors, n in zip(joined[colbert], flat[COLBERT_LENGTH].reshape(-1))]
            if colbert else None,
            tokens=flat[NUM_TOKENS].reshape(-1).astype(np.int64),
            truncated=flat[TRUNCATED].reshape(-1).astype(bool),
            inference_ms=(time.perf_counter() - started) * 1000,
            quantized={kind: flat[TENSORS[kind][0]] for kind in outputs if kind in QUANTIZED},
            token_vectors=[vectors[:int(n)] for vectors, n in zip(joined[model_outputs.TOKEN_EMBEDDINGS],
                                                                   flat[NUM_TOKENS].reshape(-1))]
            if "tokens" in outputs else None,
            unnormalized=flat[model_outputs.UNNORMALIZED] if "unnormalized" in outputs else None,
            muvera=flat[model_outputs.MUVERA] if model_outputs.MUVERA in outputs else None)

    async def tokenize(self, card, texts, param, parameters):
        """Every token of each text (the tokenizer model's tokenize task: not truncated) -> per text [Token]."""
        parameters = {key: value for key, value in parameters.items() if value is not None}
        prechecks.embed(card, texts, param, parameters)
        rows, size = encoded(texts), self.bls_rows.get(card.bls, 1)
        parts = await asyncio.gather(*(
            self.infer(card, card.tokenizer, {"text": np.array(rows[first:first + size], dtype=np.object_)
                                              .reshape(-1, 1)}, TOKENIZE, (param, first), parameters)
            for first in range(0, len(rows), size)))
        answer = []
        for part in parts:
            for ids, words, special, spans, count in zip(*(part[name] for name in TOKENIZE)):
                answer.append([Token(int(ids[k]), words[k].decode("utf-8", "replace"), bool(special[k]),
                                     None if special[k] else int(spans[k, 0]), None if special[k] else int(spans[k, 1]))
                               for k in range(int(count[0]))])
        return answer

    async def decode(self, card, ids, param, parameters):
        """Rows of token ids back to text (the tokenizer model's decode task) -> [str]; a bad row is param[i]."""
        size = self.bls_rows.get(card.bls, 1)

        async def piece(first):
            rows = ids[first:first + size]
            array = np.full((len(rows), max(1, max(len(row) for row in rows))), -1, dtype=np.int64)
            for i, row in enumerate(rows):
                array[i, :len(row)] = row
            try:
                return await self.infer(card, card.tokenizer, {"token_ids": array}, [DECODED], None, parameters)
            except ClientError as error:
                name, i = model_errors.split_field(error.field or "")
                if name == "token_ids":
                    rename_field(error, param if i is None else f"{param}[{first + i}]")
                    error.param = param
                raise
        parts = await asyncio.gather(*(piece(first) for first in range(0, len(ids), size)))
        return [item.decode("utf-8", "replace") for part in parts for item in part[DECODED].reshape(-1)]

    async def predict(self, card, inputs, param, parameters=None):
        """A cross-encoder's classifier over texts and (first, second) pairs, through its BLS model (single texts
        and pairs as separate calls) -> Prediction, rows in the order given. An input it refuses is param[i] (a
        pair's first text: its `query`)."""
        prechecks.predict(inputs, param)
        started, size = time.perf_counter(), self.bls_rows.get(card.bls, 1)
        names = [LOGITS, SCORES, *COUNTS]

        async def piece(indices, pairs):
            tensors = {"text": np.array(encoded([inputs[i][-1] for i in indices]), dtype=np.object_).reshape(-1, 1)}
            if pairs:
                tensors["query"] = np.array(encoded([inputs[i][0] for i in indices]), dtype=np.object_).reshape(-1, 1)
            try:
                return indices, await self.infer(card, card.bls, tensors, names, (param, 0, indices),
                                                 parameters)
            except ClientError as error:
                name, i = model_errors.split_field(error.field or "")
                if name == "query" and i is not None:
                    rename_field(error, f"{param}[{indices[i]}]")
                    error.param = param
                raise
        calls = []
        for pairs in (False, True):
            chosen = [i for i, item in enumerate(inputs) if (len(item) == 2) == pairs]
            calls += [piece(chosen[first:first + size], pairs) for first in range(0, len(chosen), size)]
        parts = await asyncio.gather(*calls)
        out = dict.fromkeys(names)
        for indices, part in parts:
            for name in names:
                if out[name] is None:
                    out[name] = np.zeros((len(inputs), *part[name].shape[1:]), dtype=part[name].dtype)
                out[name][indices] = part[name]
        return Prediction(out[LOGITS], out[SCORES], int(out[NUM_TOKENS].sum()), out[TRUNCATED].reshape(-1).astype(bool),
                          (time.perf_counter() - started) * 1000)

    async def embed_images(self, card, images, param, indices=None):
        """Encoded images (bytes) through a CLIP export's image ensemble, in pieces of its max_batch_size, all at
        once -> ImageEmbeddings. The image model decodes them; an image it refuses is named
        `param[indices[i]]` (the client's item; indices default to 0..n-1)."""
        started = time.perf_counter()
        indices = list(range(len(images))) if indices is None else list(indices)
        size = self.bls_rows.get(card.image, 1)
        parts = await asyncio.gather(*(
            self.infer(card, card.image, {"image": np.array(images[first:first + size], dtype=np.object_)
                                          .reshape(-1, 1)}, [DENSE], (param, first, indices))
            for first in range(0, len(images), size)))
        vectors = np.concatenate([part[DENSE] for part in parts]).astype(np.float32, copy=False)
        return ImageEmbeddings(vectors, (time.perf_counter() - started) * 1000)

    async def rerank(self, card, query, documents, weights, parameters=None):
        """-> RerankScores. A cross-encoder's rerank model: the classifier's scores (mode_scores None); else bge-m3's
        combined one.
        parameters: the request parameters (prompt_name: one prompt for all the texts; embedding exports)."""
        prechecks.rerank(card, query, documents, weights, parameters, self.max_documents.get(card.rerank))
        started = time.perf_counter()
        inputs = {"query": np.array(encoded([query]), dtype=np.object_),
                  "documents": np.array(encoded(documents), dtype=np.object_)}
        cross = card.kind == "cross-encoder"
        if not cross:
            inputs["weights"] = np.array(weights, dtype=np.float32)
        names = [SCORES, LOGITS if cross else MODE_SCORES, NUM_TOKENS, QUERY_TRUNCATED, TRUNCATED]
        result = await self.infer(card, card.rerank, inputs, names, None,
                                  {key: value for key, value in (parameters or {}).items() if value is not None})
        return RerankScores(result[SCORES], None if cross else result[MODE_SCORES], int(result[NUM_TOKENS][0]),
                            bool(result[QUERY_TRUNCATED][0]), result[TRUNCATED].astype(bool),
                            (time.perf_counter() - started) * 1000, result[LOGITS] if cross else None)

    async def chunk_embed(self, card, texts, spans, parameters):
        """Late chunking, one call to the export's late chunking model per text (all at once). spans: per text,
        [[start, end], ...] or None (then parameters holds chunk_tokens) -> ChunkEmbeddings. A bad text or span is
        named input[i]."""
        started = time.perf_counter()
        parameters = {key: value for key, value in parameters.items() if value is not None}
        names = [DENSE, CHUNK_SPANS, NUM_TOKENS, TEXT_TOKENS]

        async def one(i):
            inputs = {"text": np.array(encoded([texts[i]]), dtype=np.object_)}
            if spans is not None:
                inputs["spans"] = np.array(spans[i], dtype=np.int64).reshape(-1, 2)
            try:
                result = await self.infer(card, card.chunks, inputs, names, None, parameters)
            except ClientError as error:
                if len(texts) > 1:  # the model names its one text `input`, and its spans: say which text
                    if error.field == "input":
                        rename_field(error, f"input[{i}]")
                    else:  # said in the text's own terms, after the text; the field: the client's item
                        error.problem, error.leads = f"input[{i}]: {error.message}", False
                        name, k = model_errors.split_field(error.field or "")
                        if name == "spans" and spans is not None:
                            error.field = f"spans[{i}]" + ("" if k is None else f"[{k}]")
                raise
            return TextChunks(result[DENSE], result[CHUNK_SPANS], result[NUM_TOKENS], int(result[TEXT_TOKENS][0]))
        results = await asyncio.gather(*(one(i) for i in range(len(texts))))
        return ChunkEmbeddings(list(results), (time.perf_counter() - started) * 1000)

    async def document_chunks(self, card, documents, outputs, parameters):
        """Contextualized chunk embeddings: one call to the export's late chunking model per document (its chunks,
        in order; a document over the max length runs in the model's windows), all at once. outputs: the vector
        outputs wanted (embedding, embedding_int8...). A bad chunk is named inputs[i][j], a document inputs[i]."""
        started = time.perf_counter()
        parameters = {key: value for key, value in parameters.items() if value is not None}
        names = [*outputs, CHUNK_SPANS, CHUNK_WINDOWS, NUM_TOKENS, TEXT_TOKENS]

        async def one(i):
            inputs = {"chunks": np.array(encoded(documents[i]), dtype=np.object_)}
            try:
                result = await self.infer(card, card.chunks, inputs, names, None, parameters)
            except ClientError as error:
                name, k = model_errors.split_field(error.field or "")
                if name == "chunks":
                    rename_field(error, f"inputs[{i}]" + ("" if k is None else f"[{k}]"))
                    error.param = "inputs"
                raise
            return DocumentChunks({name: result[name] for name in outputs}, result[CHUNK_SPANS],
                                  result[CHUNK_WINDOWS], result[NUM_TOKENS], int(result[TEXT_TOKENS][0]))
        results = await asyncio.gather(*(one(i) for i in range(len(documents))))
        return ChunkedDocuments(list(results), (time.perf_counter() - started) * 1000)

    async def measure(self, card, texts, param, parameters=None, queries=None):
        """What the export's tokenizer makes of `texts` (each alone with the request's prompt; or paired with
        `queries`: one text for all, as a cross-encoder's rerank model sends its query, or one per text), as the
        embedding step would: asked of the tokenizer alone, outside admission, for a request the gate refused whose
        answer depends on its tokens (truncate false, passed on: the tokenizer's too_long names a text over the max
        length; busy.py). -> Measured, or None when the tokenizer cannot say in time: a full
        queue, the request's deadline, or more than a quarter of the BLS threads (bls_concurrency) already waiting on
        such questions (under the rate limiter the tokenizer runs only when the encoder has nothing queued: these
        wait for the busy encoder)."""
        size = self.bls_rows.get(card.bls, 1)
        starts = range(0, len(texts), size)
        if self.measuring + len(starts) > max(1, self.settings.bls_concurrency // 4):
            return None
        prompt = {key: value for key, value in (parameters or {}).items()
                  if key in TOKENIZER_PARAMETERS and value is not None}
        if isinstance(queries, str):
            prompt["query"] = queries
        names = [*COUNTS, LENGTH_GROUP] + ([QUERY_TRUNCATED] if queries is not None else [])
        rows = encoded(texts)

        async def piece(first):
            inputs = {"text": np.array(rows[first:first + size], dtype=np.object_).reshape(-1, 1)}
            if queries is not None and not isinstance(queries, str):
                inputs["query"] = np.array(encoded(queries[first:first + size]), dtype=np.object_).reshape(-1, 1)
            return await self.infer(card, card.tokenizer, inputs, names, (param, first), prompt, admit=False)
        self.measuring += len(starts)
        try:
            parts = await asyncio.gather(*(piece(first) for first in starts))
        except ApiError as error:
            if error.kind in (ErrorKind.OVERLOADED, ErrorKind.INFERENCE_TIMEOUT):
                return None
            raise
        finally:
            self.measuring -= len(starts)
        joined = {name: np.concatenate([part[name].reshape(-1) for part in parts]) for name in names}
        return Measured(joined[NUM_TOKENS].astype(np.int64), joined[TRUNCATED].astype(bool),
                        joined[QUERY_TRUNCATED].astype(bool) if queries is not None else None)

    async def infer(self, card, model, inputs, names, rows, parameters=None, admit=True):
        """One BLS request to `model` -> {output: array}. rows: (param, first row) to name a bad `text` row in the
        client's terms, (param, first row, client index of each row) a bad `image` row; None: the model's messages
        already do (rerank: `query`, `documents[i]`). admit false: a call outside admission (measure), under the
        request's deadline all the same."""
        pb = self.pb
        admitted = admit_request(card, inputs) if admit else admission.current()
        # What is left of the request's deadline (request_timeout_s from its arrival), for each call in turn.
        left_s = admitted.left_s() if admitted is not None else self.settings.request_timeout_s
        if left_s <= 0:
            raise Timeout(f"inference did not finish within {self.settings.request_timeout_s:g} s (setting "
                          f"request_timeout_s)", ErrorKind.INFERENCE_TIMEOUT)
        request = pb.InferenceRequest(
            model_name=model, requested_output_names=names, parameters=parameters or {},
            inputs=[pb.Tensor(name, array) for name, array in inputs.items()],
            timeout=max(1, int(left_s * 1e6)),  # queued past it in Triton: refused, not run
            # Outputs come back in host memory even when the encoder runs on a GPU (as_numpy needs that).
            preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))
        self.loop = loop = asyncio.get_running_loop()
        # One future for whatever comes first: the call's answer, the deadline, or abort_inflight's error (its stub
        # died). The call itself runs on: the request's admitted work is released when it returns, or at once when
        # the request is abandoned (deadline passed, client gone).
        waiting = loop.create_future()
        release = admitted.hold() if admitted is not None else (lambda *_: None)

        def settle(call):
            release()
            if waiting.done():
                return
            if call.cancelled():  # abort_inflight cancelled it before a BLS thread took it (and failed `waiting`)
                waiting.cancel()
            elif call.exception() is not None:
                waiting.set_exception(call.exception())
            else:
                waiting.set_result(call.result())

        def returned(call):  # on the BLS thread (or on the readiness thread, which cancels a queued call)
            self.calls_started.pop(call, None)
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, call)

        def expire():
            if not waiting.done():
                waiting.set_exception(Timeout(f"inference did not finish within {self.settings.request_timeout_s:g} "
                                              f"s (setting request_timeout_s)", ErrorKind.INFERENCE_TIMEOUT))
        call = self.executor.submit(request.exec)  # (its own future: cancellable while it waits for a thread)
        self.calls_started[call] = time.monotonic()  # (/health: a call running past the deadline is a busy server)
        call.add_done_callback(returned)
        timer, entry = loop.call_later(left_s, expire), (card.models, waiting, call)
        self.inflight.add(entry)
        try:
            response = await waiting
        except ApiError as error:  # the timeout, or abort_inflight's (that call will never return)
            if isinstance(error, Timeout):
                if admitted is not None:
                    admitted.abandon()  # nobody waits for it now; Triton stops feeding it at the same deadline
            else:
                release()
            raise
        except asyncio.CancelledError:  # the client left (HttpGuard): a call still waiting for a thread is not sent
            call.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - BLS refused: the model is stopping or not there
            raise Unavailable(f"model '{card.id}' is not available: {error}", ErrorKind.MODEL_NOT_READY) from None
        finally:
            timer.cancel()
            self.inflight.discard(entry)
        if response.has_error():
            raise step_error(response.error().message(), card, model, rows)
        return {name: pb.get_output_tensor_by_name(response, name).as_numpy() for name in names}



TEXT_INPUTS = ("text", "query", "documents")  # the BLS inputs that carry texts (not images: bytes of another kind)


def admit_request(card=None, inputs=None):
    """The current HTTP request's admission.RequestAdmission, admitted by its first Triton call (again: a no-op); None
    outside a request (tests, bench). Refused (NotAdmitted, the same for every call of the request): overloaded
    (429), or too_much_work (413: its work cannot finish within its deadline at the measured rate). card, inputs: the
    call's model and inputs, whose texts add their attention term to the request's cost (admission.attention_cost)."""
    admitted = admission.current()
    if admitted is None:
        return None
    extra = 0
    if inputs is not None and card is not None and admitted.ticket is None and admitted.refused is None:
        extra = admission.attention_cost([inputs[name] for name in TEXT_INPUTS if name in inputs],
                                         getattr(card, "hidden_size", None), getattr(card, "max_length", None))
    if (refused := admitted.enter(extra)) is not None:
        if not refused.retry:
            raise NotAdmitted(refused.reason, ErrorKind.TOO_MUCH_WORK)
        raise NotAdmitted(f"the server is busy: {refused.reason}; retry", ErrorKind.OVERLOADED,
                          retry_after=refused.retry_after_s)
    return admitted


# Traced (model_library/tracing.py): a span per call, its context passed on, the admission's span. Off: as it is.
Inference.infer = tracing.bls_call(Inference.infer, admit_request)


def step_error(message, card, model, rows):
    """A model's error (model_errors.py's contract: its kind and field) as the error table's kind (FROM_MODEL), its
    field in the client's terms: rows (param, first row) names the model's `text[i]` / `text` as param[first + i] /
    param, (param, first row, client index of each row) its `image[i]` / `image` so; None: the model's fields are
    the client's (rerank: `query`, `documents[i]`; late chunking: `spans[i]`, `chunk_tokens`, its `text` is
    `input`)."""
    info = model_errors.parse(message)
    kind = FROM_MODEL[info.kind]
    if info.kind in model_errors.CLIENT_KINDS:
        field = info.field
        name, i = model_errors.split_field(field or "")
        param = name or None
        if rows and name in ("text", "image"):
            param, first = rows[0], rows[1]
            row = None if i is None else first + i
            if len(rows) == 3 and row is not None:
                row = rows[2][row] if row < len(rows[2]) else row
            field = param if row is None else f"{param}[{row}]"
        elif not rows and name == "text":  # the late chunking model's one text
            param = field = "input"
        return ClientError(model_errors.problem(info) if field else info.message, kind, param, field)
    if info.kind == ErrorKind.TIMEOUT:  # its deadline (request_timeout_s) passed while it was queued or ran
        return Timeout(f"inference did not finish within request_timeout_s: {info.message}", kind)
    if info.kind == ErrorKind.OVERLOADED:  # a queue policy's max_queue_size refused it: overload, not a fault
        return ApiError(f"the server is busy: model '{model}' has a full queue (its max_queue_size); retry", kind)
    if info.kind in (ErrorKind.UNAVAILABLE, ErrorKind.CANCELLED):
        return Unavailable(f"model '{card.id}' is not available: {info.message}", kind)
    return ApiError(f"inference failed: {info.message}", kind)
