"""Request and response models of the HTTP API. FastAPI validates requests and writes the OpenAPI document from
these; the routes check only what depends on settings (limits) or on the model (outputs, dimensions)."""
from typing import Annotated, Literal

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


class Request(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send extras (e.g. the SDK's `extra_body`). Strict: "no" is not
    # a boolean and 5 is not a model name.
    model_config = ConfigDict(extra="ignore", strict=True)


# ---------------------------------------------------------------- requests
class Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ImageItem(Item):
    image: str = Field(description="base64 (standard or URL-safe), a data URI (data:image/png;base64,...) or an "
                                   "http(s) URL (fetched only from the hosts of the setting image_url_hosts)")


class TextItem(Item):
    text: Text


class EmbeddingsRequest(Request):
    """OpenAI `POST /v1/embeddings`."""
    input: Text | list[Text] | list[int] | list[list[int]] | list[Text | TextItem | ImageItem] = Field(
        description="a text or a list of texts (token arrays are refused: send text); CLIP models: a list mixing "
                    "texts and {\"image\": ...} / {\"text\": ...} objects (Jina's shape)")
    model: str | None = Field(None, description="served model id; default: the server's default model")
    encoding_format: Literal["float", "base64", "int8", "uint8", "binary", "ubinary"] = Field(
        "float", description="base64: little-endian float32; int8 / uint8: calibrated scalar quantization; binary / "
        "ubinary: sign bits packed 8 per value (sentence_transformers' quantize_embeddings)")
    dimensions: Count | None = Field(None, description="a Matryoshka width the model declares (or its own size)")
    input_type: str | None = Field(None, description="query, document, or one of the model's prompt names")
    prompt_name: str | None = Field(None, description="one of the model's prompts (config_sentence_transformers)")
    user: str | None = None
    truncate: bool = Field(True, description="false: an input over the model's max tokens is an error (422)")


class CohereEmbedRequest(Request):
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


class SeedItem(Request):
    query: Text


class InferRequest(Request):
    """Seed API `POST /infer` (CLIP): texts and images of one CLIP model; either list may be absent, not both."""
    text: list[Text] | None = None
    image: list[str] | None = Field(None, description="base64, data URIs or http(s) URLs (as /v1/embeddings)")
    model: str | None = Field(None, description="a CLIP export's id; default: the first loaded CLIP export")


class ClipModelRequest(Request):
    """Seed API `POST /load_clip_model`, `/unload_clip_model`, `/delete_clip_model`."""
    model_name: str = Field(description="open_clip's model name (ViT-B-32), the HF model_type, or an export id")
    pretrained: str | None = Field(None, description="open_clip's pretrained tag (laion2b_s34b_b79k); none: any")


class EncodeRequest(Request):
    """`POST /v1/encode`: any combination of a bge-m3 export's outputs, as FlagEmbedding's encode() returns them."""
    input: Text | list[Text]
    model: str | None = None
    return_dense: bool = True
    return_sparse: bool = False
    return_colbert: bool = False
    colbert_pool_factor: Count | None = Field(
        None, description="token pooling: about n / factor ColBERT vectors per input (Ward clustering of its "
        "token vectors, each cluster's mean L2-normalized; 1: none)")
    colbert_type: Literal["float", "fp16", "int8", "binary"] = Field(
        "float", description="ColBERT vectors as float32, fp16, int8 (round(v * 127)) or binary (sign bits packed 8 "
        "per byte, 0-255)")
    truncate: bool = True


class EmbedSparseRequest(Request):
    """TEI's `POST /embed_sparse`."""
    inputs: Text | list[Text]
    model: str | None = None
    truncate: bool | None = Field(None, description="as /embed's: true cuts an input over the max tokens; false or "
                                                    "none (TEI's default here): such an input is a 422")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: str | None = None


class RerankDocument(Request):
    text: Text


class RerankRequest(Request):
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


class TeiEmbedRequest(Request):
    """Hugging Face TEI's /embed (and / for an embedding model)."""
    inputs: Text | list[Text]
    normalize: bool = Field(True, description="false: the pooled vectors before the graph's L2 normalization (with "
                                              "`dimensions`: cut to that width, not normalized)")
    truncate: bool | None = Field(None, description="true: cut an input over the max tokens; false or none (TEI's "
                                                    "default): such an input is a 422")
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Right only: the tokenizer keeps a text's first tokens")
    prompt_name: str | None = None
    dimensions: Count | None = None
    model: str | None = Field(None, description="this server's: which export (TEI serves one); default: the default")


class TeiRerankRequest(Request):
    """TEI's /rerank (and / for a cross-encoder export)."""
    query: Text
    texts: list[Text] = Field(json_schema_extra=NOT_EMPTY)
    raw_scores: bool = Field(False, description="true: a cross-encoder's logits; bge-m3's combined score is raw")
    return_text: bool = False
    truncate: bool | None = Field(None, description="as /embed's")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    model: str | None = None


class TeiEmbedAllRequest(Request):
    """TEI's /embed_all: every token's vector (the encoder's last hidden state, before pooling)."""
    inputs: Text | list[Text]
    truncate: bool | None = Field(None, description="as /embed's")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: str | None = None
    model: str | None = None


class TeiPredictRequest(Request):
    """TEI's /predict for a cross-encoder: a text, a pair [text, text], or a list of [text] / [text, text]."""
    inputs: Text | list[Text] | list[list[Text]]
    truncate: bool | None = Field(None, description="as /embed's")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    raw_scores: bool = Field(False, description="true: the classifier's logits; false: sigmoid (one label) or "
                                                "softmax (several)")
    model: str | None = None


class SimilarityInput(Item):
    source_sentence: Text
    sentences: list[Text] = Field(json_schema_extra=NOT_EMPTY)


class SimilarityParameters(Item):
    truncate: bool | None = None
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: str | None = None


class TeiSimilarityRequest(Request):
    """TEI's /similarity: the cosine similarity of source_sentence with each sentence."""
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    model: str | None = None


class TeiTokenizeRequest(Request):
    """TEI's /tokenize: every token of each input (not truncated)."""
    inputs: Text | list[Text]
    add_special_tokens: bool = True
    prompt_name: str | None = None
    model: str | None = None


class TeiDecodeRequest(Request):
    """TEI's /decode: token ids (a list, or a list of lists) back to text; a row holds 1 to max_input_chars ids."""
    ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | list[list[Annotated[int, Field(ge=0, le=INT32_MAX)]]]
    skip_special_tokens: bool = True
    model: str | None = None


class CohereRerankRequest(Request):
    """Cohere's v2 rerank (also the v1 SDK's fields: `return_documents`, document objects)."""
    query: Text
    documents: list[Text | RerankDocument] = Field(json_schema_extra=NOT_EMPTY)
    model: str | None = None
    top_n: Count | None = None
    max_tokens_per_doc: Count | None = Field(None, description="at least the model's max tokens: documents are cut "
                                                               "there (a smaller value is a 422)")
    return_documents: bool = False


class CohereV1EmbedRequest(Request):
    """Cohere's v1 embed: `embeddings_floats` without `embedding_types`, `embeddings_by_type` with them."""
    texts: list[Text] = Field(json_schema_extra=NOT_EMPTY)
    model: str | None = None
    input_type: str | None = None
    embedding_types: list[Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]] | None = None
    truncate: Literal["NONE", "START", "END"] = Field("END", description="START is not served (422)")
    prompt_name: str | None = None


class ChunkEmbeddingsRequest(Request):
    """`POST /v1/chunk_embeddings`: late chunking, one vector per chunk of each text from one forward pass."""
    input: Text | list[Text] = Field(description="a text or a list of texts (each at most the model's max tokens)")
    model: str | None = None
    spans: list[list[Offset]] | list[list[list[Offset]]] | None = Field(
        None, description="the chunks as [start, end) character spans (Unicode code points): for one text "
        "[[start, end], ...], for a list of texts one such list per text; not overlapping, not empty")
    chunk_tokens: Count | None = Field(None, description="instead of spans: the text's sentences grouped into "
                                     "chunks of at most this many tokens")
    input_type: str | None = None
    prompt_name: str | None = None


# ---------------------------------------------------------------- responses
class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | list[int] | str
    truncated: bool


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage


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


class SeedResult(BaseModel):
    embedding: list[float]


class InferResponse(BaseModel):
    text_embeddings: list[list[float]]
    image_embeddings: list[list[float]]
    processingTimeMs: float  # noqa: N815 - the seed API's name


class ClipAdminResult(BaseModel):
    status: str
    model: str = Field(description="the export's id")
    model_name: str
    pretrained: str | None = None
    seconds: float
    files_kept: bool | None = None
    message: str | None = None


class SparseVector(BaseModel):
    indices: list[int]
    values: list[float]


class EncodeItem(BaseModel):
    index: int
    dense: list[float] | None = None
    sparse: SparseVector | None = None
    colbert: list[list[float]] | list[list[int]] | None = None
    truncated: bool


class EncodeResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EncodeItem]
    model: str
    usage: Usage


class Chunk(BaseModel):
    embedding: list[float]
    span: list[int] = Field(description="[start, end) in characters of the text")
    num_tokens: int = Field(description="the tokens the chunk's vector is the mean of")


class ChunkedText(BaseModel):
    index: int
    chunks: list[Chunk]
    num_tokens: int = Field(description="the whole text's tokens (special tokens included)")


class ChunkEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ChunkedText]
    model: str
    usage: Usage


class SparseEntry(BaseModel):
    index: int
    value: float


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


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "triton-embed"
    embedding_size: int | None = None
    max_input_tokens: int
    outputs: list[str]
    source: str = Field(description="the Hugging Face model it was exported from")
    kind: Literal["embedding", "cross-encoder", "clip"] = Field(
        "embedding", description="embedding: embeds texts (and reranks with bge-m3's score); cross-encoder: reranks "
                                 "only, scoring each (query, document) pair; clip: embeds texts and images")
    prompts: dict[str, str] = Field(
        default_factory=dict, description="the prompts the model prepends, by name: `prompt_name` picks one, and "
                                          "`input_type` query / document picks its query or document prompt")
    default_prompt_name: str | None = Field(None, description="the prompt prepended when the request names none")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    onnxruntime_backend: str | None = Field(None, description="which code serves the encoders (the launcher's "
                                            "word): Triton's C++ backend, or the stand-in outside the container")


class AdminResult(BaseModel):
    id: str
    status: str
    seconds: float


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = Field(None, description="the request parameter at fault")
    code: str = Field(description="the error's kind: one name per error, in every dialect")
    field: str | None = Field(None, description="the item at fault as the client wrote it (`input[3]`); else param")


class ErrorResponse(BaseModel):
    """OpenAI's error shape (OpenAI's routes, the seed API's, the admin routes)."""
    error: ErrorBody


class CohereErrorResponse(BaseModel):
    """Cohere's routes: Cohere's `message`, and OpenAI's error object beside it."""
    message: str
    error: ErrorBody


class TeiErrorResponse(BaseModel):
    """TEI's error shape (every TEI route): TEI's `error` and `error_type`, then this server's code, param, field."""
    error: str
    error_type: str
    code: str = Field(description="the error's kind, as OpenAI's `code` on the other routes")
    param: str | None = None
    field: str | None = None
