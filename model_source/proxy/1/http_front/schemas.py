"""The types every dialect's request and response models share (each dialect's own are in its folder's schemas.py,
beside its routes): the request base, texts and counts as the models read them, the Cohere v1 rerank body that
Cohere's /v1/rerank and TEI's /rerank both take, usage, and the error body in OpenAI's shape (the default dialect's:
OpenAI's, the seed API's and the admin routes'). FastAPI validates requests and writes the OpenAPI document from
these; the routes check only what depends on settings (limits) or on the model (outputs, dimensions)."""
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Text = str  # one text to embed; the tokenizer refuses a blank one (400 naming it)
# Integers are checked against what the models read (int32) at the door, so that one too large is a 400 naming the
# field: a value from 2^63 up does not fit Triton's int64 request parameters and failed inside Triton (a 500).
INT32_MAX = 2**31 - 1
Count = Annotated[int, Field(ge=1, le=INT32_MAX)]  # widths, factors, token counts, top_n
Offset = Annotated[int, Field(ge=0, le=INT32_MAX)]  # character positions
# A list of inputs (texts, documents, sentences): at least one, as the document says, but checked by the routes
# (route_helpers.need_items), not pydantic: an empty list is then invalid_input in every dialect, as OpenAI's `input`
# and the rerank models' `documents` are (pydantic's too_short is invalid_value, a request parameter's kind).
NOT_EMPTY = {"minItems": 1}


class RequestBody(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send extras (e.g. the SDK's `extra_body`). Strict: "no" is not
    # a boolean and 5 is not a model name.
    model_config = ConfigDict(extra="ignore", strict=True)


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RerankDocument(RequestBody):
    text: Text


class RerankRequest(RequestBody):
    """`POST /v1/rerank` in Cohere / Jina / TEI's shape, scored with bge-m3's combined (M3) score."""
    query: Text
    documents: list[Text | RerankDocument] = Field(json_schema_extra=NOT_EMPTY)
    model: str | None = None
    top_n: Count | None = Field(None, description="return the best n (default: all)")
    return_documents: bool = False
    weights: list[float] | None = Field(
        None, min_length=3, max_length=3,
        description="[dense, sparse, colbert] weights of FlagEmbedding's compute_score (default [1, 1, 1]); "
                    "outputs the model does not serve are left out")
    truncate: bool = True


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = Field(None, description="the request parameter at fault")
    code: str = Field(description="the error's kind: one name per error, in every dialect")
    field: str | None = Field(None, description="the item at fault as the client wrote it (`input[3]`); else param")


class ErrorResponse(BaseModel):
    """OpenAI's error shape (OpenAI's routes, the seed API's, the admin routes)."""
    error: ErrorBody
