"""Request and response models of the HTTP API. FastAPI validates requests and writes the OpenAPI document from
these; the routes check only what depends on settings (limits) or on the model (outputs, dimensions)."""
from typing import Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

Text = str  # one text to embed; the routes refuse blank ones (400 empty_input)


class Request(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send extras (e.g. the SDK's `extra_body`). Strict: "no" is not
    # a boolean and 5 is not a model name.
    model_config = ConfigDict(extra="ignore", strict=True)


# ---------------------------------------------------------------- requests
class EmbeddingsRequest(Request):
    """OpenAI `POST /v1/embeddings`."""
    input: Union[Text, List[Text], List[int], List[List[int]]] = Field(
        description="a text or a list of texts (token arrays are refused: send text)")
    model: Optional[str] = Field(None, description="served model id; default: the server's default model")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32")
    dimensions: Optional[int] = Field(None, description="only the model's own size is accepted")
    user: Optional[str] = None
    truncate: bool = Field(True, description="false: an input over the model's max tokens is an error (422)")


class SeedItem(Request):
    query: Text


class EncodeRequest(Request):
    """`POST /v1/encode`: any combination of a bge-m3 export's outputs, as FlagEmbedding's encode() returns them."""
    input: Union[Text, List[Text]]
    model: Optional[str] = None
    return_dense: bool = True
    return_sparse: bool = False
    return_colbert: bool = False
    truncate: bool = True


class EmbedSparseRequest(Request):
    """TEI's `POST /embed_sparse`."""
    inputs: Union[Text, List[Text]]
    model: Optional[str] = None
    truncate: bool = True


class RerankDocument(Request):
    text: Text


class RerankRequest(Request):
    """`POST /v1/rerank` in Cohere / Jina / TEI's shape, scored with bge-m3's combined (M3) score."""
    query: Text
    documents: List[Union[Text, RerankDocument]] = Field(min_length=1)
    model: Optional[str] = None
    top_n: Optional[int] = Field(None, ge=1, description="return the best n (default: all)")
    return_documents: bool = False
    weights: Optional[List[float]] = Field(
        None, min_length=3, max_length=3,
        description="[dense, sparse, colbert] weights of FlagEmbedding's compute_score (default [1, 1, 1]); "
                    "outputs the model does not serve are left out")
    truncate: bool = True


# ---------------------------------------------------------------- responses
class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[List[float], str]
    truncated: bool


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: List[EmbeddingItem]
    model: str
    usage: Usage


class SeedResult(BaseModel):
    embedding: List[float]


class SparseVector(BaseModel):
    indices: List[int]
    values: List[float]


class EncodeItem(BaseModel):
    index: int
    dense: Optional[List[float]] = None
    sparse: Optional[SparseVector] = None
    colbert: Optional[List[List[float]]] = None
    truncated: bool


class EncodeResponse(BaseModel):
    object: Literal["list"] = "list"
    data: List[EncodeItem]
    model: str
    usage: Usage


class SparseEntry(BaseModel):
    index: int
    value: float


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    scores: Dict[str, float] = Field(description="the dense, sparse and colbert scores that were combined")
    document: Optional[RerankDocument] = None


class RerankResponse(BaseModel):
    results: List[RerankResult]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "triton-embed"
    embedding_size: Optional[int] = None
    max_input_tokens: int
    outputs: List[str]
    source: str = Field(description="the Hugging Face model it was exported from")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: List[ModelCard]


class AdminResult(BaseModel):
    id: str
    status: str
    seconds: float


class ErrorBody(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorBody
