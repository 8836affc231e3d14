"""TEI's request and response models (routes.py beside them), and TEI's error shape."""
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from ..schemas import INT32_MAX, NOT_EMPTY, Count, Item, RequestBody, Text


class EmbedSparseRequest(RequestBody):
    """TEI's `POST /embed_sparse`."""
    inputs: Text | list[Text]
    model: str | None = None
    truncate: bool | None = Field(None, description="as /embed's: true cuts an input over the max tokens; false or "
                                                    "none (TEI's default here): such an input is a 422")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: str | None = None


class TeiEmbedRequest(RequestBody):
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


class TeiRerankRequest(RequestBody):
    """TEI's /rerank (and / for a cross-encoder export)."""
    query: Text
    texts: list[Text] = Field(json_schema_extra=NOT_EMPTY)
    raw_scores: bool = Field(False, description="true: a cross-encoder's logits; bge-m3's combined score is raw")
    return_text: bool = False
    truncate: bool | None = Field(None, description="as /embed's")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    model: str | None = None


class TeiEmbedAllRequest(RequestBody):
    """TEI's /embed_all: every token's vector (the encoder's last hidden state, before pooling)."""
    inputs: Text | list[Text]
    truncate: bool | None = Field(None, description="as /embed's")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: str | None = None
    model: str | None = None


class TeiPredictRequest(RequestBody):
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


class TeiSimilarityRequest(RequestBody):
    """TEI's /similarity: the cosine similarity of source_sentence with each sentence."""
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    model: str | None = None


class TeiTokenizeRequest(RequestBody):
    """TEI's /tokenize: every token of each input (not truncated)."""
    inputs: Text | list[Text]
    add_special_tokens: bool = True
    prompt_name: str | None = None
    model: str | None = None


class TeiDecodeRequest(RequestBody):
    """TEI's /decode: token ids (a list, or a list of lists) back to text; a row holds 1 to max_input_chars ids."""
    ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | list[list[Annotated[int, Field(ge=0, le=INT32_MAX)]]]
    skip_special_tokens: bool = True
    model: str | None = None


class SparseEntry(BaseModel):
    index: int
    value: float


class TeiErrorResponse(BaseModel):
    """TEI's error shape (every TEI route): TEI's `error` and `error_type`, then this server's code, param, field."""
    error: str
    error_type: str
    code: str = Field(description="the error's kind, as OpenAI's `code` on the other routes")
    param: str | None = None
    field: str | None = None
