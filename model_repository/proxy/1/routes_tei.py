"""Hugging Face text-embeddings-inference's HTTP API, as TEI documents it, over the same models, limits and error
contract as the other routes: POST /embed, / (the served model's kind: /embed, or /rerank for a cross-encoder, where
huggingface_hub's InferenceClient posts), /embed_sparse, /rerank (TEI's `texts`, or Cohere's `documents`: answered as
/v1/rerank), GET /info. Errors in TEI's shape and statuses (http_errors.TEI_PATHS). TEI serves one model; here a
body's `model` picks an export, else the default one."""
import numpy as np
import route_helpers as shared
import routes_cohere
from direct import DirectRoutes
from fastapi import APIRouter, Request
from http_errors import ApiError
from pydantic import TypeAdapter

import schemas

router = APIRouter(route_class=shared.OrjsonRoute)
EMBED, RERANK, COHERE_RERANK = (TypeAdapter(kind) for kind in (schemas.TeiEmbedRequest, schemas.TeiRerankRequest,
                                                                  schemas.RerankRequest))
VERSION = "triton-embed 2.0 (TEI API 1.9)"



def served_as_tei(body):
    """What TEI refuses or this server cannot do, named by field (422, TEI's Validation)."""
    direction = getattr(body, "truncation_direction", "Right")
    if direction.lower() == "left":
        raise ApiError(422, "truncation_direction Left is not served: the tokenizer keeps a text's first tokens "
                            "(Right)", "invalid_value", "truncation_direction")
    if getattr(body, "normalize", True) is False:
        raise ApiError(422, "normalize false is not served: the vectors are L2-normalized in the model's graph",
                       "invalid_value", "normalize")


@router.post("/embed", dependencies=shared.USER, response_model=list[list[float]], responses=shared.ERRORS)
async def tei_embed(request: Request, body: schemas.TeiEmbedRequest):
    """TEI's embed: `inputs` (a text or a list) -> one vector per input. `truncate` false or absent (TEI's
    default): an input over the model's max tokens is a 422."""
    return await embed_answer(request, body)


async def embed_answer(request, body):
    served_as_tei(body)
    texts = shared.check_texts(request, shared.as_list(body.inputs), "inputs")
    if not texts:
        raise ApiError(422, "`inputs` cannot be empty", "invalid_input", "inputs")
    card = shared.select(request, body.model)
    shared.need(card, "dense", "/embed")
    parameters = {"dimensions": body.dimensions, "prompt_name": body.prompt_name}
    result = await shared.embed(request, card, texts, ("dense",), "inputs", bool(body.truncate), parameters)
    headers = shared.timing_headers(result.truncated.sum(), result.inference_ms)
    return shared.json_response(np.ascontiguousarray(result.dense, dtype=np.float32), headers)


@router.post("/embed_sparse", dependencies=shared.USER, response_model=list[list[schemas.SparseEntry]],
             responses=shared.ERRORS)
async def embed_sparse(request: Request, body: schemas.EmbedSparseRequest):
    """TEI's sparse route: `[[{"index": token id, "value": weight}, ...], ...]` per input."""
    texts = shared.check_texts(request, shared.as_list(body.inputs), "inputs")
    if not texts:
        raise ApiError(422, "`inputs` cannot be empty", "invalid_input", "inputs")
    card = shared.select(request, body.model)
    shared.need(card, "sparse", "/embed_sparse")
    result = await shared.embed(request, card, texts, ("sparse",), "inputs", body.truncate)
    rows = [[{"index": int(t), "value": float(w)} for t, w in zip(*pair)] for pair in result.sparse]
    return shared.json_response(rows, shared.timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/rerank", dependencies=shared.USER, response_model=list[dict], responses=shared.ERRORS)
async def tei_rerank(request: Request):
    """TEI's rerank: `query`, `texts`, `raw_scores`, `return_text`, `truncate` -> `[{index, score, text?}]`, best
    first. A body with Cohere's `documents` instead is answered as POST /v1/rerank (Infinity's and Cohere's clients
    post there without a version)."""
    body = await DirectRoutes.json_body(request)
    if isinstance(body, dict) and "documents" in body and "texts" not in body:
        request.scope["state"]["dialect"] = "openai"
        return await routes_cohere.rerank_v1_answer(request, DirectRoutes.validated(body, COHERE_RERANK))
    return await rerank_answer(request, DirectRoutes.validated(body, RERANK))


async def rerank_answer(request, body):
    served_as_tei(body)
    with shared.client_fields({"documents": "texts"}):
        _, result, _, truncated = await shared.score_documents(request, body.model, body.query, body.texts, None,
                                                               bool(body.truncate))
    scores = result.logits if body.raw_scores and result.logits is not None else result.scores
    scores = [float(s) for s in scores]
    order = shared.best_first(scores)
    ranked = [{"index": i, "score": scores[i], **({"text": body.texts[i]} if body.return_text else {})} for i in order]
    return shared.json_response(ranked, shared.timing_headers(truncated, result.inference_ms))


@router.post("/", dependencies=shared.USER, responses=shared.ERRORS)
async def tei_root(request: Request):
    """As TEI answers at its root, by the served model's kind: an embedding model's /embed, a cross-encoder's
    /rerank (huggingface_hub's InferenceClient(base_url).feature_extraction posts here)."""
    body = await DirectRoutes.json_body(request)
    model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else None
    card = shared.select(request, model)
    if card.kind == "cross-encoder":
        return await rerank_answer(request, DirectRoutes.validated(body, RERANK))
    return await embed_answer(request, DirectRoutes.validated(body, EMBED))


@router.get("/info", dependencies=shared.USER, response_model=dict, responses=shared.ERRORS)
async def info(request: Request, model: str | None = None):
    """TEI's info for the default export (or `?model=`): its id, type (pooling, or a cross-encoder's labels), max
    input length, this server's limits, prompts and version."""
    card = shared.select(request, model)
    settings = request.app.state.settings
    if card.kind == "cross-encoder":
        labels = {str(i): f"LABEL_{i}" for i in range(card.num_labels or 1)}
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
        "served_model_id": card.id})

