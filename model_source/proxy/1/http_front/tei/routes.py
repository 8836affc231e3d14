"""Hugging Face text-embeddings-inference's HTTP API, as TEI documents it, over the same models, limits and error
contract as the other routes: POST /embed, / (the served model's kind: /embed, or /similarity for a body with
`source_sentence`; /rerank for a one-label cross-encoder, /predict for a classifier: where huggingface_hub's
InferenceClient posts), /embed_all (the encoder's token vectors, from the BLS model), /embed_sparse, /rerank (TEI's
`texts`, or Cohere's `documents`: answered as /v1/rerank), /predict (the cross-encoder's BLS model), /similarity
(the rerank model, dense weights only), /tokenize and /decode (the tokenizer model's two tasks), GET /info. Errors
in TEI's shape and statuses on every one of these paths, whatever the body (dialects.shape; statuses from the error
table's TEI column, errors.KINDS): 422 for a validation error, 413 for too many inputs; the shared rules name TEI's
fields (`texts`, `inputs.sentences`). `truncate` is false unless asked on every route (TEI started with
--auto-truncate false, as /info says). TEI serves one model; here a body's `model` picks an export, else the default
one."""
import json

import numpy as np
from fastapi import Request
from pydantic import TypeAdapter

from model_library.model_errors import ErrorKind

from .. import bodies, dialects
from .. import route_helpers as shared
from ..errors import ApiError, client_indices
from ..schemas import RerankRequest
from . import schemas

router = dialects.router("tei", shape="tei")
ERRORS = shared.error_responses("tei", schemas.TeiErrorResponse)
EMBED, RERANK, COHERE_RERANK, PREDICT, SIMILARITY = (TypeAdapter(kind) for kind in (
    schemas.TeiEmbedRequest, schemas.TeiRerankRequest, RerankRequest, schemas.TeiPredictRequest,
    schemas.TeiSimilarityRequest))
VERSION = "triton-embed 2.0 (TEI API 1.9)"


def served_as_tei(body):
    """What TEI refuses or this server cannot do, named by field (422, TEI's Validation)."""
    direction = getattr(body, "truncation_direction", "Right")
    if direction.lower() == "left":
        raise ApiError("Left is not served: the tokenizer keeps a text's first tokens (Right)", ErrorKind.INVALID_VALUE,
                       "truncation_direction", "truncation_direction")


@router.post("/embed", dependencies=shared.USER, response_model=list[list[float]], responses=ERRORS)
async def tei_embed(request: Request, body: schemas.TeiEmbedRequest):
    """TEI's embed: `inputs` (a text or a list) -> one vector per input. `truncate` false or absent (TEI's
    default): an input over the model's max tokens is a 422."""
    return await embed_answer(request, body)


async def embed_answer(request, body):
    served_as_tei(body)
    texts = texts_of(request, body.inputs)
    card = shared.select(request, body.model)
    shared.need(card, "dense", "/embed")
    # normalize false (Haystack's TEI embedder sends it): the graph's pooled vector before its L2 step
    normalize = body.normalize is not False
    if not normalize and not card.unnormalized:
        raise ApiError(f"false needs the encoder's unnormalized output, which model '{card.id}' was exported "
                       f"without (an older export): export it again", ErrorKind.INVALID_VALUE, "normalize", "normalize")
    parameters = {"dimensions": body.dimensions, "prompt_name": body.prompt_name}
    result = await shared.embed(request, card, texts, ("dense",) if normalize else ("unnormalized",), "inputs",
                                bool(body.truncate), parameters)
    headers = shared.timing_headers(result.truncated.sum(), result.inference_ms)
    vectors = result.dense if normalize else result.unnormalized
    return shared.json_response(np.ascontiguousarray(vectors, dtype=np.float32), headers)


@router.post("/embed_sparse", dependencies=shared.USER, response_model=list[list[schemas.SparseEntry]],
             responses=ERRORS)
async def embed_sparse(request: Request, body: schemas.EmbedSparseRequest):
    """TEI's sparse route: `[[{"index": token id, "value": weight}, ...], ...]` per input. `truncate` as /embed's
    (false or absent: an input over the model's max tokens is a 422). TEI's body has no input type: an
    inference-free SPLADE model embeds documents (SparseEncoder.encode's default route, its encoder) unless
    `prompt_name` is `query` (its query side: the tokenizer model's weight lookup, no encoder run)."""
    served_as_tei(body)
    texts = texts_of(request, body.inputs)
    card = shared.select(request, body.model)
    shared.need(card, "sparse", "/embed_sparse")
    result = await shared.embed(request, card, texts, ("sparse",), "inputs", bool(body.truncate),
                                {"prompt_name": body.prompt_name})
    rows = [[{"index": int(t), "value": float(w)} for t, w in zip(vector.indices, vector.values)]
            for vector in result.sparse]
    return shared.json_response(rows, shared.timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/rerank", dependencies=shared.USER, response_model=list[dict], responses=ERRORS)
async def tei_rerank(request: Request):
    """TEI's rerank: `query`, `texts`, `raw_scores`, `return_text`, `truncate` -> `[{index, score, text?}]`, best
    first. A body with Cohere's `documents` instead is answered as POST /v1/rerank (Infinity's and Cohere's clients
    post there without a version); its errors, as every error on this path, in TEI's shape and statuses."""
    body = await bodies.json(request)
    if isinstance(body, dict) and "documents" in body and "texts" not in body:
        return await shared.rerank_v1_answer(request, bodies.validated(body, COHERE_RERANK))
    return await rerank_answer(request, bodies.validated(body, RERANK))


async def rerank_answer(request, body):
    served_as_tei(body)
    with shared.client_fields({"documents": "texts"}):
        scored = await shared.score_documents(request, body.model, body.query, body.texts, None, bool(body.truncate))
    result = scored.result
    scores = result.logits if body.raw_scores and result.logits is not None else result.scores
    scores = [float(s) for s in scores]
    order = shared.best_first(scores)
    ranked = [{"index": i, "score": scores[i], **({"text": body.texts[i]} if body.return_text else {})} for i in order]
    return shared.json_response(ranked, shared.timing_headers(scored.truncated, result.inference_ms))


@router.post("/", dependencies=shared.USER, responses=ERRORS)
async def tei_root(request: Request):
    """As TEI answers at its root, by the served model's kind: an embedding model's /embed (or /similarity for
    `inputs` with `source_sentence`, which TEI serves there with TASK=sentence-similarity), a one-label
    cross-encoder's /rerank, a classifier's /predict. huggingface_hub's InferenceClient(base_url) posts here
    (feature_extraction, sentence_similarity, text_classification)."""
    body = await bodies.json(request)
    model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else None
    card = shared.select(request, model)
    if card.kind == "cross-encoder":
        if len(label_names(card)) > 1 or (isinstance(body, dict) and "texts" not in body):
            return await predict_answer(request, bodies.validated(body, PREDICT))
        return await rerank_answer(request, bodies.validated(body, RERANK))
    if isinstance(body, dict) and isinstance(body.get("inputs"), dict):
        return await similarity_answer(request, bodies.validated(body, SIMILARITY))
    return await embed_answer(request, bodies.validated(body, EMBED))


def label_names(card):
    """A cross-encoder's label names, in its classifier's order (LABEL_i where the export recorded none)."""
    return card.labels or tuple(f"LABEL_{i}" for i in range(card.num_labels or 1))


def texts_of(request, inputs):
    texts = shared.check_texts(request, shared.as_list(inputs), "inputs")
    shared.need_items(texts, "inputs")
    return texts


def embedding_export(card, route):
    """A model that is not a text embedding export (TEI: "model is not an embedding model")."""
    if card.kind != "embedding":
        raise ApiError(f"model '{card.id}' is a {card.kind} export; {route} serves text embedding exports",
                       ErrorKind.NOT_SERVED, "model")


@router.post("/embed_all", dependencies=shared.USER, response_model=list[list[list[float]]],
             responses=ERRORS)
async def embed_all(request: Request, body: schemas.TeiEmbedAllRequest):
    """TEI's embed_all: per input, every token's vector (special tokens included): the encoder's last hidden state,
    before pooling and normalization. `truncate` as /embed's. The answer holds at most max_embed_all_numbers
    numbers (tokens x hidden size): over it, a 413 before the encoder runs."""
    served_as_tei(body)
    texts = texts_of(request, body.inputs)
    card = shared.select(request, body.model)
    embedding_export(card, "/embed_all")
    parameters = {"prompt_name": body.prompt_name}
    await bound_token_vectors(request, card, texts, parameters)
    result = await shared.embed(request, card, texts, ("tokens",), "inputs", bool(body.truncate), parameters)
    rows = [np.ascontiguousarray(vectors, dtype=np.float32) for vectors in result.token_vectors]
    # the encoder's own widths: exact, where the check before the work read the export's embedding size
    answer_size(request, sum(int(row.shape[0]) for row in rows), rows[0].shape[1] if rows else 0)
    return shared.json_response(rows, shared.timing_headers(result.truncated.sum(), result.inference_ms))


async def bound_token_vectors(request, card, texts, parameters):
    """The 413 of an /embed_all answer over max_embed_all_numbers, before the encoder runs: nothing to do when
    every input at the model's max length fits; else the tokenizer model counts the tokens (Service.count_tokens:
    the prompt included, each text counted at most at the max length: over it, cut, or the embed call's 422; busy
    too, so an answer too large gets its 413 before the embed call's 422 or 429)."""
    hidden = card.hidden_size or card.embedding_size or 0
    if len(texts) * card.max_length * hidden <= request.app.state.settings.max_embed_all_numbers:
        return
    answer_size(request, await request.app.state.service.count_tokens(card, texts, "inputs", parameters), hidden)


def answer_size(request, tokens, hidden):
    limit = request.app.state.settings.max_embed_all_numbers
    if tokens * hidden > limit:
        raise ApiError(f"inputs: the answer would hold {tokens * hidden} numbers ({tokens} tokens x {hidden} per "
                       f"token), over the limit of {limit} (setting max_embed_all_numbers): send fewer or shorter "
                       f"inputs", ErrorKind.ANSWER_TOO_LARGE, "inputs")


def predict_items(inputs):
    """TEI's predict inputs -> (one input or a batch, [(text,) or (first, second)]): a string is one text, a list
    of strings one input of 1 or 2 texts, a list of lists a batch of such."""
    if isinstance(inputs, str):
        return True, [(inputs,)]
    shared.need_items(inputs, "inputs")
    single = isinstance(inputs[0], str)
    items = [inputs] if single else inputs
    for i, item in enumerate(items):
        if len(item) not in (1, 2):
            where = "inputs" if single else f"inputs[{i}]"
            raise ApiError(f"holds {len(item)} texts: an input is a text or a pair [text, text]",
                           ErrorKind.INVALID_VALUE, "inputs", where)
    return single, [tuple(item) for item in items]


@router.post("/predict", dependencies=shared.USER, response_model=list[dict] | list[list[dict]],
             responses=ERRORS)
async def predict(request: Request, body: schemas.TeiPredictRequest):
    """TEI's predict: a cross-encoder's classifier over a text or a pair of texts (or a batch of them) -> per
    input, every label with its score, best first. A pair is (first, second) as the model reads a (query,
    passage) pair: cut by the tokenizer's pair rule (the first to its query_max_length, then the second)."""
    return await predict_answer(request, body)


async def predict_answer(request, body):
    served_as_tei(body)
    single, items = predict_items(body.inputs)
    shared.check_texts(request, [item[-1] for item in items], "inputs")  # the count, and each input's last text
    pairs = [i for i, item in enumerate(items) if len(item) == 2]
    with client_indices("inputs", pairs):
        shared.check_texts(request, [items[i][0] for i in pairs], "inputs", count=False)
    card = shared.select(request, body.model)
    if card.kind != "cross-encoder":
        raise ApiError(f"model '{card.id}' is not a classifier: /predict serves cross-encoder exports",
                       ErrorKind.NOT_SERVED, "model")
    # truncate false: the tokenizer refuses an input over the max length (too_long, 422, naming it)
    prediction = await request.app.state.service.predict(card, items, "inputs",
                                                         shared.refusing_cut(None, bool(body.truncate)))
    request.app.state.metrics.observe_embedding(card.id, sum(len(item) for item in items), prediction.tokens,
                                                int(prediction.truncated.sum()))
    labels, values = label_names(card), prediction.logits if body.raw_scores else prediction.scores
    answer = [[{"score": float(row[k]), "label": labels[k]} for k in shared.best_first([float(v) for v in row])]
              for row in values]
    return shared.json_response(answer[0] if single else answer,
                                shared.timing_headers(int(prediction.truncated.sum()), prediction.inference_ms))


@router.post("/similarity", dependencies=shared.USER, response_model=list[float], responses=ERRORS)
async def similarity(request: Request, body: schemas.TeiSimilarityRequest):
    """TEI's similarity: the cosine similarity of `inputs.source_sentence` with each of `inputs.sentences`, from
    the export's rerank model with only its dense score (its vectors are unit length: cosine = dot product).
    `parameters`: truncate, truncation_direction, prompt_name (one prompt for every sentence)."""
    return await similarity_answer(request, body)


async def similarity_answer(request, body):
    parameters = body.parameters or schemas.SimilarityParameters()
    served_as_tei(parameters)
    card = shared.select(request, body.model)
    embedding_export(card, "/similarity")
    shared.need(card, "dense", "/similarity")
    with shared.client_fields({"query": "inputs.source_sentence", "documents": "inputs.sentences"}):
        scored = await shared.score_documents(
            request, body.model, body.inputs.source_sentence, body.inputs.sentences, (1.0, 0.0, 0.0),
            bool(parameters.truncate), {"prompt_name": parameters.prompt_name})
    return shared.json_response([float(score) for score in scored.result.scores],
                                shared.timing_headers(scored.truncated, scored.result.inference_ms))


@router.post("/tokenize", dependencies=shared.USER, response_model=list[list[dict]], responses=ERRORS)
async def tokenize(request: Request, body: schemas.TeiTokenizeRequest):
    """TEI's tokenize, from the export's tokenizer model: per input, every token (not truncated; the prompt's
    included) as {id, text, special, start, stop}; start and stop are bytes of the tokenized text, null for a
    special token."""
    texts = texts_of(request, body.inputs)
    card = shared.select(request, body.model)
    tokens = await request.app.state.service.tokenize(
        card, texts, "inputs", {"add_special_tokens": body.add_special_tokens, "prompt_name": body.prompt_name})
    return shared.json_response([[{"id": t.id, "text": t.text, "special": t.special, "start": t.start,
                                   "stop": t.stop} for t in row] for row in tokens])


@router.post("/decode", dependencies=shared.USER, response_model=list[str], responses=ERRORS)
async def decode(request: Request, body: schemas.TeiDecodeRequest):
    """TEI's decode, from the export's tokenizer model: token ids (a list, or a list of lists) -> one text per
    list; skip_special_tokens (default true) leaves the special tokens out. Rows: at most max_inputs_per_request
    (413), each of 1 to max_input_chars ids (as a text's characters: 422)."""
    single = not body.ids or isinstance(body.ids[0], int)
    rows = [body.ids] if single else body.ids
    shared.check_count(request, len(rows), "ids")
    for i, row in enumerate(rows):
        where = "ids" if single else f"ids[{i}]"
        shared.need_items(row, "ids", where, "at least one token id")
        shared.check_length(request, len(row), where, "ids", "ids")
    card = shared.select(request, body.model)
    texts = await request.app.state.service.decode(card, rows, "ids",
                                                   {"skip_special_tokens": body.skip_special_tokens})
    return shared.json_response(texts)


@router.get("/info", dependencies=shared.USER, response_model=dict, responses=ERRORS)
async def info(request: Request, model: str | None = None):
    """TEI's info for the default export (or `?model=`): its id, type (pooling, or a cross-encoder's labels), max
    input length, this server's limits, prompts and version."""
    card = shared.select(request, model)
    settings = request.app.state.settings
    if card.kind == "cross-encoder":
        labels = {str(i): label for i, label in enumerate(label_names(card))}
        kind = {"reranker" if len(labels) == 1 else "classifier": {
            "id2label": labels, "label2id": {label: int(i) for i, label in labels.items()}}}
    else:
        kind = {"embedding": {"pooling": card.pooling or "cls"}}
    return shared.json_response({
        "model_id": card.source, "model_sha": None, "model_dtype": "float32", "model_type": kind,
        "prompts": dict(card.prompts) or None, "default_prompt_name": card.default_prompt_name,
        "max_concurrent_requests": settings.max_concurrent_requests, "max_input_length": card.max_length,
        "max_batch_tokens": card.max_length * settings.max_inputs_per_request, "max_batch_requests": None,
        "max_client_batch_size": settings.max_inputs_per_request, "auto_truncate": False,
        "tokenization_workers": 1, "version": VERSION, "sha": None, "docker_label": None,
        "served_model_id": card.id, "parity": json.loads(card.parity_report)})

