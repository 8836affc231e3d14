"""The seed API (the service this one replaced): POST /v1/embedding (`[{"query": ...}]`, `truncate` and `model` as
query parameters) and, for CLIP exports, POST /infer (texts and images of one CLIP model). Its admin routes
(/load_clip_model...) are the admin router's (admin/routes.py). Errors in OpenAI's shape."""
import time

import numpy as np
from fastapi import Query, Request

from model_library.model_errors import ErrorKind

from .. import dialects, images
from .. import route_helpers as shared
from ..errors import ApiError
from . import schemas

router = dialects.router("seed")
ERRORS = shared.error_responses("openai")
EXPORT_CLIP = "python build/export.py --open-clip ViT-B-32 --pretrained laion2b_s34b_b79k --name <name>"


@router.post("/v1/embedding", dependencies=shared.USER, response_model=list[schemas.SeedResult], responses=ERRORS)
async def seed_embedding(request: Request, body: list[schemas.SeedItem],
                         truncate: bool = Query(True, description="false: over-long = 422"),
                         model: str | None = Query(None, description="served model id (default model)")):
    """Seed API: `[{"query": "..."}]` -> `[{"embedding": [...]}]`."""
    shared.need_items(body, None, "body", 'a non-empty list of {"query": "..."} objects')
    card = shared.select(request, model)
    shared.need(card, "dense", "/v1/embedding")
    texts = shared.check_texts(request, [item.query for item in body], "query")
    result = await shared.embed(request, card, texts, ("dense",), "query", truncate)
    vectors = np.ascontiguousarray(result.dense, dtype=np.float32)
    return shared.json_response([{"embedding": row} for row in vectors],
                                shared.timing_headers(result.truncated.sum(), result.inference_ms))


@router.post("/infer", dependencies=shared.USER, response_model=schemas.InferResponse, responses=ERRORS)
async def infer(request: Request, body: schemas.InferRequest):
    """Seed API (CLIP): `{"text": [...], "image": [...]}` (base64, data URIs or URLs) -> `text_embeddings`,
    `image_embeddings` (in order) and `processingTimeMs`. Default model: the first loaded CLIP export by id."""
    started = time.perf_counter()
    if not body.text and not body.image:
        raise ApiError("give 'text' or 'image': a non-empty list (or both)", ErrorKind.INVALID_INPUT, "text")
    card = clip_card(request, body.model)
    texts = shared.check_texts(request, body.text or [], "text")
    encoded = await images.load(body.image or [], "image", request.app.state.settings)
    text_rows = (await shared.embed(request, card, texts, ("dense",), "text", True)).dense if texts else []
    image_rows = (await shared.embed_images(request, card, encoded, "image")).dense if encoded else []
    return shared.json_response({"text_embeddings": np.ascontiguousarray(text_rows, dtype=np.float32) if texts else [],
                                 "image_embeddings": image_rows,
                                 "processingTimeMs": round((time.perf_counter() - started) * 1000, 3)})


def clip_card(request, model):
    if not model:
        model = next((c.id for c in request.app.state.service.cards() if c.image), None)
        if model is None:
            raise ApiError(f"no CLIP model is loaded: export one ({EXPORT_CLIP}) and load it (POST /load_clip_model)",
                           ErrorKind.MODEL_NOT_FOUND, "model")
    card = shared.select(request, model)
    shared.need_images(card)
    return card
