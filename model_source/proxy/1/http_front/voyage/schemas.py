"""Voyage's contextualized chunk embeddings: its request (`inputs` as each document's chunks, `input_type`,
`output_dimension`, `output_dtype`, `encoding_format`) and its answer (per document a list of its chunks' vectors)."""
from typing import Literal

from pydantic import BaseModel, Field

from ..schemas import NOT_EMPTY, Count, ErrorBody, RequestBody, Text


class ContextualizedEmbeddingsRequest(RequestBody):
    """`POST /v1/contextualizedembeddings`: each document as its chunks, in order; one vector per chunk that sees the
    whole document (late chunking; windows past the model's max length)."""
    inputs: list[list[Text]] = Field(json_schema_extra=NOT_EMPTY, description=(
        "the documents, each a non-empty list of its chunks in order (their text joined with one space is the "
        "document)"))
    model: str | None = None
    input_type: Literal["query", "document"] | None = Field(None, description=(
        "query or document: the export's query or document prompt (as every route's input_type)"))
    output_dimension: Count | None = Field(None, description="a Matryoshka width the export serves")
    output_dtype: Literal["float", "int8", "uint8", "binary", "ubinary"] | None = Field(None, description=(
        "the vectors' type (default float): int8 / uint8 with the export's calibrated ranges, binary packed"))
    encoding_format: Literal["base64"] | None = Field(None, description=(
        "base64: each vector as its little-endian bytes (float32, or the dtype's), as Voyage's client asks"))
    enable_auto_chunking: bool = Field(False, description="not served: send the chunks (server-side chunking is "
                                                          "Voyage's)")
    chunk_size: Count | None = None
    chunk_overlap: int | None = None


class ChunkEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | list[int] | str
    index: int


class DocumentEmbeddings(BaseModel):
    object: Literal["list"] = "list"
    data: list[ChunkEmbedding]
    index: int


class ContextualizedUsage(BaseModel):
    total_tokens: int


class ContextualizedEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentEmbeddings]
    model: str
    usage: ContextualizedUsage


class VoyageErrorResponse(BaseModel):
    """Voyage's `detail` (what its client reads), OpenAI's error object beside it."""
    detail: str
    error: ErrorBody
