"""Voyage's API: contextualized chunk embeddings (POST /v1/contextualizedembeddings, `voyageai.Client(base_url=...)`'s
`contextualized_embed`), served by the export's late chunking model: each document arrives as its chunks, and each
chunk's vector is pooled from one forward pass over the document (or, past the model's max length, over a window of
whole chunks around it: the model's windows). Errors in OpenAI's shape."""
import base64

import numpy as np
from fastapi import Request

from model_library import model_outputs
from model_library.model_errors import ErrorKind

from .. import dialects
from .. import route_helpers as shared
from ..errors import ApiError
from . import schemas

router = dialects.router("voyage", shape="voyage")
ERRORS = shared.error_responses("voyage", schemas.VoyageErrorResponse)
# output_dtype -> the late chunking model's output, and the bytes base64 carries (Voyage's client decodes them so)
OUTPUTS = {"float": model_outputs.TENSORS["dense"][0], **model_outputs.QUANTIZED}
BYTES = {"float": "<f4", "int8": "i1", "uint8": "u1", "binary": "i1", "ubinary": "u1"}


@router.post("/v1/contextualizedembeddings", dependencies=shared.USER,
             response_model=schemas.ContextualizedEmbeddingsResponse, responses=ERRORS)
async def contextualized_embeddings(request: Request, body: schemas.ContextualizedEmbeddingsRequest):
    """Voyage's contextualized chunk embeddings: per document (`inputs[i]`, its chunks in order) one vector per chunk,
    the mean of the chunk's token vectors from a forward pass over the whole document, L2-normalized; a document over
    the model's max length runs in overlapping windows of whole chunks (each chunk pooled from the window built
    around it). `output_dimension` a Matryoshka width, `output_dtype` the quantized types (int8 / uint8 with the
    export's calibrated ranges, binary packed), `encoding_format` base64 the vectors' bytes."""
    if body.enable_auto_chunking or body.chunk_size is not None or body.chunk_overlap is not None:
        raise ApiError("server-side chunking is not served: send each document as its chunks", ErrorKind.NOT_SERVED,
                       "enable_auto_chunking")
    shared.need_items(body.inputs, "inputs", what="a non-empty list of documents, each a list of its chunks")
    shared.check_count(request, sum(len(document) for document in body.inputs), "inputs")
    for i, document in enumerate(body.inputs):
        shared.need_items(document, "inputs", f"inputs[{i}]", what="a document's chunks (a non-empty list)")
        for k, chunk in enumerate(document):
            shared.check_text(request, chunk, f"inputs[{i}][{k}]", "inputs")
    card = shared.select(request, body.model)
    if card.chunks is None:
        raise ApiError(f"model '{card.id}' has no late chunking model, which serves contextualized chunks (its "
                       f"vectors are projected past the token vectors, or it was exported before late chunking)",
                       ErrorKind.NOT_SERVED, "model")
    dtype = body.output_dtype or "float"  # Voyage's client sends null for its default
    output = OUTPUTS[dtype]
    parameters = {"input_type": body.input_type, "dimensions": body.output_dimension}
    with shared.client_fields({"dimensions": "output_dimension"}):
        result = await request.app.state.service.document_chunks(card, body.inputs, [output], parameters)
    tokens = sum(document.tokens for document in result.documents)
    request.app.state.metrics.observe_embedding(card.id, sum(len(d) for d in body.inputs), tokens, 0)

    def encode(row):
        if body.encoding_format == "base64":
            return base64.b64encode(np.ascontiguousarray(row).astype(BYTES[dtype]).tobytes()).decode()
        return row.tolist()

    data = [{"object": "list", "index": i,
             "data": [{"object": "embedding", "index": k, "embedding": encode(row)}
                      for k, row in enumerate(document.vectors[output])]}
            for i, document in enumerate(result.documents)]
    return shared.json_response({"object": "list", "data": data, "model": card.id,
                                 "usage": {"total_tokens": tokens}}, shared.timing_headers(0, result.inference_ms))
