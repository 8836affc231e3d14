"""Cohere's request and response models (routes.py beside them): embed v1 and v2, rerank v2, /v1/rerank's answer,
Cohere's error shape."""
from typing import Literal

from pydantic import BaseModel, Field

from ..schemas import NOT_EMPTY, Count, ErrorBody, RequestBody, RerankDocument, Text, Usage


class CohereEmbedRequest(RequestBody):
    """Cohere's `POST /v2/embed`."""
    texts: list[Text] = Field(json_schema_extra=NOT_EMPTY)
    model: str | None = None
    input_type: str | None = Field(None, description="search_query, search_document, query, document, or one of "
                                   "the model's prompt names (none: the model's default prompt)")
    embedding_types: list[Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]] = Field(
        ["float"], min_length=1)
    output_dimension: Count | None = Field(None, description="a Matryoshka width the model declares")
    prompt_name: str | None = None
    truncate: Literal["NONE", "END"] = Field("END", description="NONE: an input over the max tokens is a 422")


class CohereV1EmbedRequest(RequestBody):
    """Cohere's v1 embed: `embeddings_floats` without `embedding_types`, `embeddings_by_type` with them."""
    texts: list[Text] = Field(json_schema_extra=NOT_EMPTY)
    model: str | None = None
    input_type: str | None = None
    embedding_types: list[Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]] | None = None
    truncate: Literal["NONE", "START", "END"] = Field("END", description="START is not served (422)")
    prompt_name: str | None = None


class CohereRerankRequest(RequestBody):
    """Cohere's v2 rerank (also the v1 SDK's fields: `return_documents`, document objects)."""
    query: Text
    documents: list[Text | RerankDocument] = Field(json_schema_extra=NOT_EMPTY)
    model: str | None = None
    top_n: Count | None = None
    max_tokens_per_doc: Count | None = Field(None, description="at least the model's max tokens: documents are cut "
                                                               "there (a smaller value is a 422)")
    return_documents: bool = False


class CohereEmbeddings(BaseModel):
    float: list[list[float]] | None = None
    base64: list[str] | None = None
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None


class CohereEmbedResponse(BaseModel):
    id: str
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: dict
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    scores: dict[str, float] | None = Field(
        None, description="embedding models: the dense, sparse and colbert scores that were combined (not for a "
                          "cross-encoder, whose relevance_score is its classifier's)")
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    results: list[RerankResult]
    model: str
    usage: Usage


class CohereErrorResponse(BaseModel):
    """Cohere's routes: Cohere's `message`, and OpenAI's error object beside it."""
    message: str
    error: ErrorBody


class CohereTokenizeRequest(RequestBody):
    """Cohere's `POST /v1/tokenize`."""
    text: Text = Field(description="the text to tokenize (not truncated)")
    model: str | None = Field(None, description="served model id; default: the server's default model")


class CohereTokenizeResponse(BaseModel):
    tokens: list[int] = Field(description="the tokenizer's ids, without special tokens")
    token_strings: list[str] = Field(description="each token's text")
    meta: dict
