"""The output vocabulary: which tensors each kind of output is made of, named once for every model and tool.

A kind is what a client asks for (export.json's `outputs`, the HTTP front's embedding types, the bulk client's
--outputs); its tensors are what the ensembles, the BLS model and the encoder return. build/export.py installs this
file beside every Python model that names outputs (ensemble_bls, rerank, the proxy); the tools outside Triton import
it from model_library/. The encoder graph's own table (names with Triton types and dims) is
build/exporting/graph.py's OUTPUT_TENSORS, which export checks against this one."""
DENSE = "embedding"
UNNORMALIZED = "embedding_unnormalized"  # the pooled vector before its L2 step (TEI's normalize: false)
TOKEN_EMBEDDINGS = "token_embeddings"  # the encoder's last hidden state (late chunking, TEI's /embed_all)
SPARSE = ("sparse_indices", "sparse_values", "sparse_count")
COLBERT = ("colbert_vectors", "colbert_length")
# sentence_transformers.quantization's precisions of `embedding`, computed by the BLS model
QUANTIZED = {"int8": "embedding_int8", "uint8": "embedding_uint8", "binary": "embedding_binary",
             "ubinary": "embedding_ubinary"}
# the BLS model's compact forms of `colbert_vectors` (each with `colbert_length`)
COLBERT_COMPACT = {"colbert_fp16": "colbert_vectors_fp16", "colbert_int8": "colbert_vectors_int8",
                   "colbert_binary": "colbert_vectors_binary"}
# kind -> its tensors, in the order the models return them
TENSORS = {
    "dense": (DENSE,), "sparse": SPARSE, "colbert": COLBERT,
    **{kind: (name,) for kind, name in QUANTIZED.items()},
    **{kind: (name, COLBERT[1]) for kind, name in COLBERT_COMPACT.items()},
    "tokens": (TOKEN_EMBEDDINGS,), "unnormalized": (UNNORMALIZED,),
}
MODES = ("dense", "sparse", "colbert")  # bge-m3's retrieval modes: the rerank model's mode_scores columns, in order
# the tensors with a per-token dimension (padded to the widest row of their request or run)
PER_TOKEN = (SPARSE[0], SPARSE[1], COLBERT[0], *COLBERT_COMPACT.values(), TOKEN_EMBEDDINGS)
