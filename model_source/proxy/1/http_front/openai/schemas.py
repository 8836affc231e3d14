"""OpenAI's request and response models (routes.py beside them): embeddings (CLIP exports: texts and images),
bge-m3's encode, late chunking, the model list."""
from typing import Literal

from pydantic import BaseModel, Field

from ..schemas import Count, Item, Offset, RequestBody, Text, Usage


class ImageItem(Item):
    image: str = Field(description="base64 (standard or URL-safe), a data URI (data:image/png;base64,...) or an "
                                   "http(s) URL (fetched only from the hosts of the setting image_url_hosts)")


class TextItem(Item):
    text: Text


class EmbeddingsRequest(RequestBody):
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


class EncodeRequest(RequestBody):
    """`POST /v1/encode`: any combination of a bge-m3 export's outputs, as FlagEmbedding's encode() returns them."""
    input: Text | list[Text]
    model: str | None = None
    return_dense: bool = True
    return_sparse: bool = False
    return_colbert: bool = False
    return_muvera: bool = Field(False, description=(
        "MUVERA's fixed-dimensional encoding of the ColBERT vectors (one vector whose dot product approximates "
        "MaxSim): a query's with input_type query, else a document's; parameters fixed at export"))
    colbert_pool_factor: Count | None = Field(
        None, description="token pooling: about n / factor ColBERT vectors per input (Ward clustering of its "
        "token vectors, each cluster's mean L2-normalized; 1: none)")
    colbert_type: Literal["float", "fp16", "int8", "binary"] = Field(
        "float", description="ColBERT vectors as float32, fp16, int8 (round(v * 127)) or binary (sign bits packed 8 "
        "per byte, 0-255)")
    truncate: bool = True
    input_type: str | None = Field(None, description="query or document (Cohere's names too), or a prompt name: "
                                   "the prompt, and an inference-free SPLADE model's side (query: its weight "
                                   "lookup, no encoder run; document, the default: the encoder)")
    prompt_name: str | None = Field(None, description="one of the model's prompts, or an inference-free SPLADE "
                                    "model's side (sentence-transformers' Router task: query or document)")


class ChunkEmbeddingsRequest(RequestBody):
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


class SparseVector(BaseModel):
    indices: list[int]
    values: list[float]


class EncodeItem(BaseModel):
    index: int
    dense: list[float] | None = None
    sparse: SparseVector | None = None
    colbert: list[list[float]] | list[list[int]] | None = None
    muvera: list[float] | None = None
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
    parity: dict = Field(default_factory=dict, description=(
        "the export's reference check: `checked`, the `reference` class and `reference_version`, the `texts` (or "
        "`pairs`) and `prompts` checked, `worst_cosine` / `worst_abs_diff`; `why` when it was not checked"))


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    onnxruntime_backend: str | None = Field(None, description="which code serves the encoders (the launcher's "
                                            "word): Triton's C++ backend, or the stand-in outside the container")
