"""Cohere's API, over the same models, limits and error contract as the other routes: embed v2 (POST /v2/embed) and
v1 (POST /v1/embed), rerank v2 (POST /v2/rerank) and v1 (POST /v1/rerank, this server's own rerank route: Cohere's
v1 shape with bge-m3's per-mode scores and weights), tokenize (POST /v1/tokenize, the tokenizer model's tokenize
task). Cohere's SDK (ClientV2 / Client with base_url) posts to these.
Errors in Cohere's shape (its `message`, OpenAI's error object beside it); its fields by Cohere's names
(`output_dimension`, `texts`)."""
import uuid

from fastapi import Request

from model_library.model_errors import ErrorKind

from .. import dialects
from .. import route_helpers as shared
from ..errors import ApiError, rename_field
from ..schemas import RerankRequest
from . import schemas

router = dialects.router("cohere", shape="cohere")
ERRORS = shared.error_responses("cohere", schemas.CohereErrorResponse)


async def embed_by_type(request, body, route, kinds, dimensions=None):
    """The texts' vectors of each embedding type -> (rows by type, tokens, the answer's timing headers)."""
    if body.truncate == "START":
        raise ApiError("START is not served: the tokenizer keeps a text's first tokens (use END or NONE)",
                       ErrorKind.INVALID_VALUE, "truncate", "truncate")
    card = shared.select(request, body.model)
    shared.need(card, "dense", route)
    parameters = {"dimensions": dimensions, "input_type": body.input_type, "prompt_name": body.prompt_name}
    with shared.client_fields({"dimensions": "output_dimension"}):
        shared.need_items(body.texts, "texts", what="a non-empty list of texts")
        texts = shared.check_texts(request, body.texts, "texts")
        outputs = ("dense", *(k for k in kinds if k in shared.QUANTIZED))
        result = await shared.embed(request, card, texts, outputs, "texts", body.truncate == "END", parameters)
    return ({kind: shared.vector_rows(result, kind) for kind in kinds}, int(result.tokens.sum()),
            shared.timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/v2/embed", dependencies=shared.USER, response_model=schemas.CohereEmbedResponse, responses=ERRORS)
async def cohere_embed(request: Request, body: schemas.CohereEmbedRequest):
    """Cohere's embed v2: `texts`, `input_type`, `embedding_types` (several at once), `output_dimension`."""
    embeddings, tokens, headers = await embed_by_type(request, body, "/v2/embed",
                                                      list(dict.fromkeys(body.embedding_types)),
                                                      body.output_dimension)
    return shared.json_response({"id": str(uuid.uuid4()), "embeddings": embeddings, "texts": body.texts,
                                 "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
                                 "response_type": "embeddings_by_type"}, headers)


@router.post("/v1/embed", dependencies=shared.USER, response_model=dict, responses=ERRORS)
async def cohere_embed_v1(request: Request, body: schemas.CohereV1EmbedRequest):
    """Cohere's embed v1: without `embedding_types`, `embeddings` is the float vectors (`embeddings_floats`); with
    them, one list per type (`embeddings_by_type`), as v2's."""
    kinds = list(dict.fromkeys(body.embedding_types or ["float"]))
    embeddings, tokens, headers = await embed_by_type(request, body, "/v1/embed", kinds)
    by_type = body.embedding_types is not None
    return shared.json_response({"id": str(uuid.uuid4()), "embeddings": embeddings if by_type else embeddings["float"],
                                 "texts": body.texts, "meta": {"api_version": {"version": "1"},
                                                               "billed_units": {"input_tokens": tokens}},
                                 "response_type": "embeddings_by_type" if by_type else "embeddings_floats"}, headers)


@router.post("/v1/rerank", dependencies=shared.USER, response_model=schemas.RerankResponse, responses=ERRORS)
async def rerank(request: Request, body: RerankRequest):
    """Scores each document against the query with the export's rerank model, by the model's kind: a cross-encoder's
    relevance (CrossEncoder.predict, FlagReranker.compute_score normalized); for an embedding model bge-m3's
    combined score, as FlagEmbedding's compute_score ('colbert+sparse+dense' with `weights`; models without
    sparse/ColBERT outputs use what they serve). Cohere's v1 shape, with `scores` per mode and `usage`."""
    return await shared.rerank_v1_answer(request, body)


@router.post("/v2/rerank", dependencies=shared.USER, response_model=dict, responses=ERRORS)
async def cohere_rerank_v2(request: Request, body: schemas.CohereRerankRequest):
    """Cohere's rerank v2: `query`, `documents`, `top_n`, `max_tokens_per_doc` -> `results` [{index,
    relevance_score}] best first, and `meta`. Documents are cut at the model's max tokens (max_tokens_per_doc may not
    ask for fewer)."""
    card = shared.select(request, body.model)
    if body.max_tokens_per_doc is not None and body.max_tokens_per_doc < card.max_length:
        raise ApiError(f"{body.max_tokens_per_doc} is not served: documents are cut at the model's max of "
                       f"{card.max_length} tokens (send at least that, or leave it out)", ErrorKind.INVALID_VALUE,
                       "max_tokens_per_doc", "max_tokens_per_doc")
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    scored = await shared.score_documents(request, body.model, body.query, documents)
    answer = {"id": str(uuid.uuid4()),
              "results": shared.ranked(scored.result, documents, body.top_n, body.return_documents),
              "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}}
    return shared.json_response(answer, shared.timing_headers(scored.truncated, scored.result.inference_ms))


@router.post("/v1/tokenize", dependencies=shared.USER, response_model=schemas.CohereTokenizeResponse,
             responses=ERRORS)
async def cohere_tokenize(request: Request, body: schemas.CohereTokenizeRequest):
    """Cohere's tokenize (`Client.tokenize`: its offline default asks GET /v1/models/{model} for a tokenizer file,
    which an export does not publish, then posts here): `text` -> `tokens` and each token's text (`token_strings`),
    from the export's tokenizer model, without special tokens as Cohere tokenizes (an export's default prompt is
    the model's: its tokens first); not truncated."""
    shared.check_text(request, body.text, "text", "text")
    card = shared.select(request, body.model)
    try:
        [tokens] = await request.app.state.service.tokenize(card, [body.text], "text", {"add_special_tokens": False})
    except ApiError as error:
        if error.field == "text[0]":  # the one text, named as the client sent it
            rename_field(error, "text")
        raise
    return shared.json_response({"tokens": [token.id for token in tokens],
                                 "token_strings": [token.text for token in tokens],
                                 "meta": {"api_version": {"version": "1"}}})
