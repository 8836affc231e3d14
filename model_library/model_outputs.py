"""The output vocabulary: which tensors each kind of output is made of, and the models' other outputs (counts, the
tokenizer's tasks, the rerank and late chunking models'), named once for every model and tool: the proxy and the bulk
client write no output name of their own (tests/test_proxy_errors.py checks).

A kind is what a client asks for (export.json's `outputs`, the HTTP front's embedding types, the bulk client's
--outputs); its tensors are what the ensembles, the BLS model and the encoder return. build/export.py installs this
file beside every Python model that names outputs (ensemble_bls, rerank, the proxy); the tools outside Triton import
it from model_library/. The encoder graph's own table (names with Triton types and dims) is
exporter/graph.py's OUTPUT_TENSORS, which export checks against this one."""
DENSE = "embedding"
UNNORMALIZED = "embedding_unnormalized"  # the pooled vector before its L2 step (TEI's normalize: false)
TOKEN_EMBEDDINGS = "token_embeddings"  # the encoder's last hidden state (late chunking, TEI's /embed_all)
SPARSE_INDICES, SPARSE_VALUES, SPARSE_COUNT = "sparse_indices", "sparse_values", "sparse_count"
SPARSE = (SPARSE_INDICES, SPARSE_VALUES, SPARSE_COUNT)
COLBERT_VECTORS, COLBERT_LENGTH = "colbert_vectors", "colbert_length"
COLBERT = (COLBERT_VECTORS, COLBERT_LENGTH)
# sentence_transformers.quantization's precisions of `embedding`, computed by the BLS model
QUANTIZED = {"int8": "embedding_int8", "uint8": "embedding_uint8", "binary": "embedding_binary",
             "ubinary": "embedding_ubinary"}
# the BLS model's compact forms of `colbert_vectors` (each with `colbert_length`)
COLBERT_COMPACT = {"colbert_fp16": "colbert_vectors_fp16", "colbert_int8": "colbert_vectors_int8",
                   "colbert_binary": "colbert_vectors_binary"}
# MUVERA's fixed-dimensional encoding of a text's ColBERT vectors (model_library/muvera.py), computed by the BLS model
MUVERA = "muvera"
# kind -> its tensors, in the order the models return them
TENSORS = {
    "dense": (DENSE,), "sparse": SPARSE, "colbert": COLBERT,
    **{kind: (name,) for kind, name in QUANTIZED.items()},
    **{kind: (name, COLBERT[1]) for kind, name in COLBERT_COMPACT.items()},
    "tokens": (TOKEN_EMBEDDINGS,), "unnormalized": (UNNORMALIZED,), "muvera": (MUVERA,),
}
MODES = ("dense", "sparse", "colbert")  # bge-m3's retrieval modes: the rerank model's mode_scores columns, in order
# Beside the vectors, what the text models' answers say: how many tokens (each text's; a late chunking model's each
# chunk's; a rerank model's the request's) and whether a text was cut to the max length (a rerank model's: each
# document). Some of these words are also fields of the HTTP front's answers (tests/test_proxy_errors.py knows which).
NUM_TOKENS = "num_tokens"
TRUNCATED = "truncated"
COUNTS = (NUM_TOKENS, TRUNCATED)  # beside every text model's vectors, in every answer
# the tokenizer's outputs (the encoder's inputs: ENCODER_INPUTS), a text's length group (the BLS model's groups),
# each token's [start, end) characters (late chunking), its tokenize task's (each token's id, text, whether it is
# special and byte span; and NUM_TOKENS) and its decode task's (the text of token ids)
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
ENCODER_INPUTS = (INPUT_IDS, ATTENTION_MASK)
LENGTH_GROUP = "length_group"
OFFSETS = "offsets"
TOKEN_TEXT = "token_text"
TOKEN_SPECIAL = "token_special"
BYTE_OFFSETS = "byte_offsets"
TOKENIZE = (INPUT_IDS, TOKEN_TEXT, TOKEN_SPECIAL, BYTE_OFFSETS, NUM_TOKENS)
DECODED = "decoded"
# the image preprocessing model's (CLIP): each image as the image tower's input
PIXEL_VALUES = "pixel_values"
# the rerank models' (and a cross-encoder's BLS model's: SCORES and LOGITS): each document's score, bge-m3's score
# per mode (MODES' columns), a cross-encoder's classifier logits, whether the query was cut
SCORES = "scores"
MODE_SCORES = "mode_scores"
LOGITS = "logits"
QUERY_TRUNCATED = "query_truncated"
# the late chunking model's, beside each chunk's vector (DENSE) and tokens (NUM_TOKENS): its [start, end) characters
# and the whole text's tokens
CHUNK_SPANS = "chunk_spans"
CHUNK_WINDOWS = "chunk_windows"  # per chunk: the [start, end) of the window its vector was pooled from
TEXT_TOKENS = "text_tokens"
# the tensors with a per-token dimension (padded to the widest row of their request or run)
PER_TOKEN = (SPARSE[0], SPARSE[1], COLBERT[0], *COLBERT_COMPACT.values(), TOKEN_EMBEDDINGS)
