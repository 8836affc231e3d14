"""The seed API's request and response models (routes.py beside them): /v1/embedding and CLIP's /infer."""
from pydantic import BaseModel, Field

from ..schemas import RequestBody, Text


class SeedItem(RequestBody):
    query: Text


class InferRequest(RequestBody):
    """Seed API `POST /infer` (CLIP): texts and images of one CLIP model; either list may be absent, not both."""
    text: list[Text] | None = None
    image: list[str] | None = Field(None, description="base64, data URIs or http(s) URLs (as /v1/embeddings)")
    model: str | None = Field(None, description="a CLIP export's id; default: the first loaded CLIP export")


class SeedResult(BaseModel):
    embedding: list[float]


class InferResponse(BaseModel):
    text_embeddings: list[list[float]]
    image_embeddings: list[list[float]]
    processingTimeMs: float  # noqa: N815 - the seed API's name
