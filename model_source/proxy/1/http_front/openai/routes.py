"""OpenAI's API and this server's own routes in its shape: POST /v1/embeddings (CLIP exports: images too, images.py
turns the items into bytes), GET /v1/models[/{id}] (each also without /v1, as Infinity's clients post), bge-m3's
POST /v1/encode, and late chunking's POST /v1/chunk_embeddings. Errors in OpenAI's shape."""
import json
import os

from fastapi import Request

from model_library import model_outputs
from model_library.model_errors import ErrorKind

from .. import dialects, images
from .. import route_helpers as shared
from ..errors import ApiError, client_indices
from . import schemas

router = dialects.router("openai")
ERRORS = shared.error_responses("openai")
# Which code serves the `backend: "onnxruntime"` models, as the launcher set it (local_triton/launch.py); None: not
# started by the launcher
ONNXRUNTIME_BACKEND = os.environ.get("TRITON_EMBED_ONNXRUNTIME_BACKEND")


# ---------------------------------------------------------------- embeddings
@router.post("/embeddings", dependencies=shared.USER, response_model=schemas.EmbeddingsResponse, responses=ERRORS)
@router.post("/v1/embeddings", dependencies=shared.USER, response_model=schemas.EmbeddingsResponse,
             responses=ERRORS)
async def embeddings(request: Request, body: schemas.EmbeddingsRequest):
    """OpenAI-compatible embeddings (`encoding_format` float, base64 little-endian float32, or int8 / uint8 / binary
    / ubinary as the BLS model quantizes them); `dimensions`, `input_type`, `prompt_name` go to the models (texts).
    CLIP exports: `input` may mix texts and `{"image": base64 | data URI | URL}` / `{"text": ...}` objects (Jina's
    shape); rows keep the input's order; images are float / base64 only and count 0 tokens."""
    items = shared.as_list(body.input)
    shared.need_items(items, "input")
    if any(isinstance(t, (int, list)) for t in items):
        raise ApiError("token arrays are not supported: send text", ErrorKind.INVALID_INPUT, "input")
    card = shared.select(request, body.model)
    shared.need(card, "dense", "/v1/embeddings")
    pictures = [(i, t.image) for i, t in enumerate(items) if isinstance(t, schemas.ImageItem)]
    texts = [(i, t if isinstance(t, str) else t.text) for i, t in enumerate(items)
             if not isinstance(t, schemas.ImageItem)]
    if pictures:
        shared.need_images(card)
        for name, value in (("encoding_format", body.encoding_format if body.encoding_format in shared.QUANTIZED
                             else None), ("dimensions", body.dimensions)):
            if value is not None:
                raise ApiError(f"{value}: images are embedded as float only (the image model has no quantized or "
                               f"Matryoshka outputs): use encoding_format float or base64 without dimensions",
                               ErrorKind.INVALID_VALUE, name, name)
    outputs = ("dense", body.encoding_format) if body.encoding_format in shared.QUANTIZED else ("dense",)
    parameters = {"dimensions": body.dimensions, "input_type": body.input_type, "prompt_name": body.prompt_name}
    rows, flags, tokens, truncated, inference_ms = [None] * len(items), [False] * len(items), 0, 0, 0.0
    with client_indices("input", [i for i, _ in texts]):
        checked = shared.check_texts(request, [t for _, t in texts], "input")
    encoded = await images.load([p for _, p in pictures], "input", request.app.state.settings,
                                [i for i, _ in pictures]) if pictures else []
    if texts:
        with client_indices("input", [i for i, _ in texts]):
            result = await shared.embed(request, card, checked, outputs, "input", body.truncate, parameters)
        for (i, _), vector, flag in zip(texts, shared.vector_rows(result, body.encoding_format), result.truncated):
            rows[i], flags[i] = vector, bool(flag)
        tokens, truncated, inference_ms = result.tokens.sum(), result.truncated.sum(), result.inference_ms
    if pictures:
        embedded = await shared.embed_images(request, card, encoded, "input", [i for i, _ in pictures])
        for (i, _), vector in zip(pictures, shared.vector_rows(embedded, body.encoding_format)):
            rows[i] = vector
        inference_ms += embedded.inference_ms
    data = [{"object": "embedding", "index": i, "embedding": rows[i], "truncated": flags[i]} for i in range(len(items))]
    return shared.json_response({"object": "list", "data": data, "model": card.id, "usage": shared.usage(tokens)},
                                shared.timing_headers(truncated, inference_ms))


@router.post("/v1/encode", dependencies=shared.USER, response_model=schemas.EncodeResponse, responses=ERRORS)
async def encode(request: Request, body: schemas.EncodeRequest):
    """Any combination of dense, sparse ({indices, values}, as Milvus and Qdrant take it) and ColBERT vectors per
    input, from one forward pass (FlagEmbedding's encode(return_dense, return_sparse, return_colbert_vecs)).
    ColBERT: `colbert_pool_factor` pools them (token pooling), `colbert_type` gives them as float (default), fp16,
    int8 or binary (packed sign bits as 0-255 ints), as ensemble_bls computes them. `return_muvera`: MUVERA's one
    vector for the ColBERT vectors (a query's with input_type query, else a document's), to index in a plain vector
    store. `input_type` / `prompt_name`: the
    prompt, and an inference-free SPLADE model's side (query: the tokenizer model's weight lookup, no encoder run;
    document, the default, as SparseEncoder.encode: the encoder)."""
    texts = shared.check_texts(request, shared.as_list(body.input), "input")
    shared.need_items(texts, "input")
    card = shared.select(request, body.model)
    wanted = tuple(kind for kind, flag in (("dense", body.return_dense), ("sparse", body.return_sparse),
                                           ("colbert", body.return_colbert)) if flag)
    if not wanted and not body.return_muvera:
        raise ApiError("ask for at least one of return_dense, return_sparse, return_colbert, return_muvera",
                       ErrorKind.INVALID_VALUE)
    wanted, parameters = colbert_options(card, body, wanted)  # first: its 400 names the compact field
    for kind in wanted:  # the 400 names the client's return_<output> flag
        shared.need(card, kind.split("_")[0], "/v1/encode", f"return_{kind.split('_')[0]}")
    if body.return_muvera:
        if not card.muvera_size:
            raise ApiError(f"model '{card.id}' has no MUVERA encoding: it needs ColBERT vectors (it serves "
                           f"{', '.join(card.outputs)}), exported by this version", ErrorKind.NOT_SERVED,
                           "return_muvera")
        # MUVERA is computed from the ColBERT vectors: asked for with them (the float ones unless a type was asked)
        wanted = (*wanted, *(() if any(k.startswith("colbert") for k in wanted) else ("colbert",)),
                  model_outputs.MUVERA)
    parameters = {**(parameters or {}), "input_type": body.input_type, "prompt_name": body.prompt_name}
    result = await shared.embed(request, card, texts, wanted, "input", body.truncate, parameters)
    data = []
    for i in range(len(texts)):
        item = {"index": i, "truncated": bool(result.truncated[i])}
        if "dense" in wanted:
            item["dense"] = result.dense[i]
        if "sparse" in wanted:
            item["sparse"] = {"indices": result.sparse[i].indices, "values": result.sparse[i].values}
        if body.return_colbert:
            item["colbert"] = result.colbert[i]
        if body.return_muvera:
            item["muvera"] = result.muvera[i]
        data.append(item)
    return shared.json_response({"object": "list", "data": data, "model": card.id,
                                 "usage": shared.usage(result.tokens.sum())},
                                shared.timing_headers(result.truncated.sum(), result.inference_ms))


def colbert_options(card, body, wanted):
    """/v1/encode's compact ColBERT fields -> (outputs with the ColBERT type asked for, request parameters)."""
    options = [(name, value) for name, value, default in (("colbert_pool_factor", body.colbert_pool_factor, None),
                                                          ("colbert_type", body.colbert_type, "float"))
               if value != default]
    if not options:
        return wanted, None
    name, value = options[0]
    if "colbert" not in card.outputs:
        raise ApiError(f"{name}: model '{card.id}' has no ColBERT output (it serves {', '.join(card.outputs)})",
                       ErrorKind.NOT_SERVED, name)
    if "colbert" not in wanted:
        raise ApiError(f"{value!r} applies to ColBERT vectors: set return_colbert to true", ErrorKind.INVALID_VALUE,
                       name, name)
    kind = "colbert" if body.colbert_type == "float" else f"colbert_{body.colbert_type}"
    return tuple(kind if w == "colbert" else w for w in wanted), {"colbert_pool_factor": body.colbert_pool_factor}


@router.post("/v1/chunk_embeddings", dependencies=shared.USER, response_model=schemas.ChunkEmbeddingsResponse,
             responses=ERRORS)
async def chunk_embeddings(request: Request, body: schemas.ChunkEmbeddingsRequest):
    """Late chunking through the export's late chunking model: per text, one vector per chunk (the client's `spans`,
    or sentences grouped to `chunk_tokens`), each the mean of the chunk's token vectors from the whole text's one
    forward pass, L2-normalized. A text over the model's max tokens is refused (400), not truncated."""
    single = isinstance(body.input, str)
    texts = shared.check_texts(request, shared.as_list(body.input), "input")
    shared.need_items(texts, "input")
    spans = body.spans  # (spans or chunk_tokens, one of them: the late chunking model's rule)
    if spans is not None:
        spans = [spans] if single else spans
        if len(spans) != len(texts) or not all(isinstance(s, list) and all(isinstance(p, list) for p in s)
                                               for s in spans):
            raise ApiError("spans: one list of [start, end] per input text" if not single else
                           "spans: a list of [start, end] for the text", ErrorKind.INVALID_VALUE, "spans")
        for i, text_spans in enumerate(spans):
            for k, pair in enumerate(text_spans):
                if len(pair) != 2:
                    where = f"spans[{k}]" if single else f"input[{i}]: spans[{k}]"
                    raise ApiError(f"{where} must be [start, end], not {pair}", ErrorKind.INVALID_VALUE, "spans",
                                   f"spans[{k}]" if single else f"spans[{i}][{k}]", leads=False)
    card = shared.select(request, body.model)
    if card.chunks is None:
        raise ApiError(f"model '{card.id}' has no late chunking model (export it again)", ErrorKind.NOT_SERVED, "model")
    parameters = {"chunk_tokens": body.chunk_tokens, "input_type": body.input_type, "prompt_name": body.prompt_name}
    chunked = await request.app.state.service.chunk_embed(card, texts, spans, parameters)
    tokens = sum(text.tokens for text in chunked.texts)
    request.app.state.metrics.observe_embedding(card.id, len(texts), tokens, 0)
    data = [{"index": i, "num_tokens": text.tokens,
             "chunks": [{"embedding": vector, "span": span, "num_tokens": int(n)}
                        for vector, span, n in zip(text.vectors, text.spans.tolist(), text.chunk_tokens)]}
            for i, text in enumerate(chunked.texts)]
    return shared.json_response({"object": "list", "data": data, "model": card.id, "usage": shared.usage(tokens)},
                                shared.timing_headers(0, chunked.inference_ms))


# ---------------------------------------------------------------- models
def card_json(card, name=None):
    """An export's model card; under one of its served names (`name`), that name with `root` the export's id."""
    return {"id": name or card.id, "object": "model", "created": card.created, "owned_by": "triton-embed",
            "embedding_size": card.embedding_size, "max_input_tokens": card.max_length,
            "outputs": list(card.outputs), "source": card.source, "kind": card.kind,
            "prompts": dict(card.prompts), "default_prompt_name": card.default_prompt_name,
            "parity": json.loads(card.parity_report), **({"root": card.id} if name and name != card.id else {})}


@router.get("/models", dependencies=shared.USER, response_model=schemas.ModelList, responses=ERRORS)
@router.get("/v1/models", dependencies=shared.USER, response_model=schemas.ModelList, responses=ERRORS)
async def models(request: Request):
    """The models loaded now (a model exported or loaded after start-up appears here), each also under its served
    names (export --served-name, setting served_model_names)."""
    return shared.json_response({"object": "list",
                                 "data": [card_json(c, name) for c in request.app.state.service.cards()
                                          for name in (c.id, *c.served_names)],
                                 "onnxruntime_backend": ONNXRUNTIME_BACKEND})


@router.get("/models/{model_id:path}", dependencies=shared.USER, response_model=schemas.ModelCard, responses=ERRORS)
@router.get("/v1/models/{model_id:path}", dependencies=shared.USER, response_model=schemas.ModelCard,
            responses=ERRORS)
async def model(request: Request, model_id: str):
    card = shared.select(request, model_id)
    return shared.json_response(card_json(card, model_id if model_id in card.served_names else None))
