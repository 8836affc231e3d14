"""The ensemble's contract for requests of many texts: `text` in, the ensemble's outputs out, rows in the request's
order, computed without padding every text to the longest one.

One request: the tokenizer (BLS) tokenizes all its texts at once and, asked for `length_group`, says which rows
share a padded width (its grouping.py, the same cost model as for the ensemble); each group goes to the encoder as
its own request, all at once; the rows come back in the request's order. Outputs with a per-token dimension
(sparse, ColBERT, and `token_embeddings`: the encoder's last hidden state, sent only when asked for by name) are
padded to the request's longest row, as the ensemble returns them. Errors are the steps'
own (the tokenizer's `text[i] ...` carry the request's row numbers). Settings: config.pbtxt, read once here.

Inference-free SPLADE (a SparseEncoder with a Router): asked for the sparse outputs, this model asks the tokenizer for
them too; the tokenizer answers a query-side request (its Router task: prompt_name / input_type) from its weight
lookup, and that answer is returned as it is: no encoder run. A document-side request goes on as for SPLADE.

Vectors for a store (request parameters and outputs): `dimensions` (a width from vectors.json, which export writes:
the Matryoshka widths) truncates `embedding` and re-normalizes it, and truncates `embedding_unnormalized` (the pooled
vector before the encoder's L2 step, TEI's `normalize: false`; asked of the encoder only for a request that asks for
it, by name or by naming no outputs, which Triton turns into all) without normalizing it, as TEI does;
`embedding_int8`, `embedding_uint8`, `embedding_binary`, `embedding_ubinary` are that vector quantized exactly as
sentence_transformers' quantize_embeddings does, int8 / uint8 with the width's ranges calibrated at export.
`prompt_name` and `input_type` go to the tokenizer, which prepends the prompt; so does `truncate` (false: a text
over the max length is refused, before any encoder run).

Compact ColBERT (bge-m3 and PyLate ColBERT exports): `colbert_pool_factor` pools each text's token vectors into
n // factor clusters (a PyLate export's as PyLate 1.6 pools them: its first vector, [CLS]'s, left alone, Ward on
the cosine distances: pool_tokens)
(Clavie et al. 2024, as colbert-ai and PyLate do it: Ward clustering, here in numpy: pool_tokens), and
`colbert_vectors_fp16` / `_int8` / `_binary` are the (pooled) unit vectors as float16, round(v * 127) and packed sign
bits; `colbert_length` counts each row's vectors after pooling.

A cross-encoder export's BLS model takes (query, text) pairs: the input `query` per row, or the request parameter
`query` for every row (its rerank model sends one query so); both go to the tokenizer as they came.
"""
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library import (
    model_common,
    model_outputs,
    muvera,
    request_rules,
)
from model_library.model_errors import ErrorKind
from model_library.model_outputs import (
    ATTENTION_MASK,
    COLBERT_LENGTH,
    COLBERT_VECTORS,
    DENSE,
    INPUT_IDS,
    LENGTH_GROUP,
    NUM_TOKENS,
    QUERY_TRUNCATED,
    TOKEN_EMBEDDINGS,
    TRUNCATED,
)
from model_library.vector_forms import at_width, quantize, read_vectors_json

TOKENIZER_OUTPUTS = [INPUT_IDS, ATTENTION_MASK, NUM_TOKENS, TRUNCATED, LENGTH_GROUP]
FROM_TOKENIZER = {NUM_TOKENS, TRUNCATED, QUERY_TRUNCATED}
PAD_VALUES = {model_outputs.SPARSE[0]: -1}  # the encoder pads sparse ids with -1; every other output with 0
# Per token of a row, the encoder's outputs that follow its width have one entry, bge-m3's ColBERT one fewer (no
# vector for CLS; a PyLate ColBERT's, config colbert_width "tokens": one). A ragged encoder (export --ragged-batch)
# pads them to the widest row of its run: what is past the row's own width is padding, cut here.
PAST_WIDTH = {model_outputs.COLBERT[0]: -1}
QUANTIZED = {name: precision for precision, name in model_outputs.QUANTIZED.items()}  # output -> its precision
VECTORS = {DENSE, *QUANTIZED}  # their -1 dimension is the request's width, not a per-token one
UNNORMALIZED = model_outputs.UNNORMALIZED  # the encoder's own output, its -1 dimension the request's width too
PROMPT_PARAMETERS = ("prompt_name", "input_type")
COLBERT_TYPES = {name: kind.removeprefix("colbert_") for kind, name in model_outputs.COLBERT_COMPACT.items()}
COLBERT_SOURCES = list(model_outputs.COLBERT)  # what the compact forms are computed from
MUVERA = model_outputs.MUVERA  # computed here from the ColBERT vectors (model_library/muvera.py)
# sent only when asked for by name (a request naming none gets the rest)
ON_REQUEST = {TOKEN_EMBEDDINGS, UNNORMALIZED, MUVERA}


class TritonPythonModel(model_common.RequestModel):
    def setup(self, args):
        config, parameters = self.config, self.parameters
        self.tokenizer_model = parameters["tokenizer_model"]
        self.encoder_model = parameters["encoder_model"]
        # per output: which dimensions (after the row) follow the padded width: those grow to the request's width
        self.outputs = [o["name"] for o in config["output"] if o["name"] not in ON_REQUEST]
        self.variable_dims = {o["name"]: [i for i, d in enumerate(o["dims"]) if int(d) == -1] for o in config["output"]
                              if o["name"] not in VECTORS | {UNNORMALIZED} and o["name"] not in COLBERT_TYPES}
        # SPLADE's sparse outputs hold weights over the vocabulary: their width follows no text's (config.pbtxt)
        self.vocabulary_outputs = set(model_outputs.SPARSE[:2]) if parameters.get("sparse_width") == "vocabulary" \
            else set()
        pylate = parameters.get("colbert_width") == "tokens"  # a PyLate ColBERT's vectors: [CLS]'s first
        self.past_width = {**PAST_WIDTH, **({model_outputs.COLBERT[0]: 0} if pylate else {})}
        # token pooling leaves a row's first vectors alone: PyLate's pool_embeddings_hierarchical protects [CLS]'s
        self.protected = 1 if pylate else 0
        self.tokenizer_outputs = TOKENIZER_OUTPUTS + [n for n in self.outputs if n == QUERY_TRUNCATED]
        self.dimensions, self.ranges = read_vectors_json(os.path.join(args["model_repository"],
                                                                      args["model_version"]))
        self.muvera = muvera.load(os.path.join(args["model_repository"], args["model_version"]))
        threads = int(parameters.get("bls_threads") or 32)
        self.requests_pool = ThreadPoolExecutor(threads, thread_name_prefix="bls-request")
        self.runs_pool = ThreadPoolExecutor(threads, thread_name_prefix="bls-run")

    def execute(self, requests):  # side by side: each request's steps are BLS calls that wait
        return list(self.requests_pool.map(lambda request: model_common.answer(request, self.work), requests))

    def work(self, request):
        return self.embed(request, Deadline(request))

    def options(self, request):
        """(dimensions or None, the tokenizer's parameters: prompt, pairs' shared query, truncate) from the request's
        parameters; InvalidInput names a bad one."""
        parameters = json.loads(request.parameters() or "{}")
        prompt = {key: parameters[key] for key in PROMPT_PARAMETERS if key in parameters}
        for key, value in prompt.items():
            if not isinstance(value, str):
                raise InvalidInput(key, f"must be a string, not {json.dumps(value)}", ErrorKind.INVALID_VALUE)
        if "query" in parameters:
            prompt["query"] = parameters["query"]
        if "truncate" in parameters:  # the tokenizer's to apply: false refuses a text over the max length
            prompt["truncate"] = request_rules.truncate(parameters, InvalidInput)
        width = parameters.get("dimensions")
        if width is None:
            return None, prompt
        width = request_rules.width(self.dimensions, width, InvalidInput)
        return (None if width == max(self.dimensions) else width), prompt

    def vectors(self, results, wanted, width):
        """`embedding` at the request's width (truncated, re-normalized) and its quantized forms;
        `embedding_unnormalized` truncated to the width, not normalized (TEI: truncate, then normalize if asked)."""
        if width is not None and UNNORMALIZED in results:
            results[UNNORMALIZED] = np.ascontiguousarray(results[UNNORMALIZED][:, :width])
        dense = results.get(DENSE)
        if dense is None:
            return
        if width is not None:
            dense = results[DENSE] = at_width(dense, width)
        for name in wanted:
            if name in QUANTIZED:
                ranges = self.ranges.get(dense.shape[1])
                if ranges is None and QUANTIZED[name].endswith("int8"):
                    raise model_common.ModelError(ErrorKind.INTERNAL, None, f"{name}: no calibrated ranges for width "
                                                                    f"{dense.shape[1]}: re-run build/export.py")
                results[name] = quantize(dense, QUANTIZED[name], ranges)

    def embed(self, request, deadline):
        wanted = request.requested_output_names() or self.outputs
        dimensions, parameters = self.options(request)
        pool_factor = self.colbert_options(request)
        # InvalidInput for a malformed element or shape, before any step (a `query` whose rows wrap past 2^32 beside
        # a well-formed `text` arrives well-formed, one row: Triton core's, nothing here can tell: read_bytes)
        model_common.read_bytes(request, "text", rank=2)
        model_common.read_bytes(request, "query", rank=2, optional=True)
        inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("text", "query")]
        inputs = [tensor for tensor in inputs if tensor is not None]
        # SPLADE-kind exports: the tokenizer answers an inference-free export's query side itself (its lookup)
        lookup = bool(self.vocabulary_outputs) and any(name in model_outputs.SPARSE for name in wanted)
        asked = self.tokenizer_outputs + list(model_outputs.SPARSE) if lookup else self.tokenizer_outputs
        tokens = call(self.tokenizer_model, inputs, asked, deadline, parameters,
                      optional=model_outputs.SPARSE if lookup else ())
        if lookup and model_outputs.SPARSE_COUNT in tokens:
            return self.looked_up(tokens, wanted)
        encoder_outputs = [name for name in wanted if name not in FROM_TOKENIZER and name not in VECTORS
                           and name not in COLBERT_TYPES and name != MUVERA]
        if VECTORS & set(wanted):
            encoder_outputs.append(DENSE)  # the quantized forms are computed here from it
        if (COLBERT_TYPES.keys() | {MUVERA}) & set(wanted):
            encoder_outputs += [name for name in COLBERT_SOURCES if name not in encoder_outputs]
        results = {name: tokens[name] for name in wanted if name in FROM_TOKENIZER}
        if not encoder_outputs:
            return [pb_utils.Tensor(name, array) for name, array in results.items()]
        ids, mask, groups = tokens[INPUT_IDS], tokens[ATTENTION_MASK], tokens[LENGTH_GROUP]
        width = ids.shape[1]
        runs = []
        for group in np.unique(groups[:, 0]):
            rows = np.flatnonzero(groups[:, 0] == group)
            cut = int(groups[rows[0], 1])
            inputs = [pb_utils.Tensor(INPUT_IDS, np.ascontiguousarray(ids[rows, :cut])),
                      pb_utils.Tensor(ATTENTION_MASK, np.ascontiguousarray(mask[rows, :cut]))]
            runs.append((rows, cut, self.runs_pool.submit(call, self.encoder_model, inputs, encoder_outputs, deadline)))
        finished = [(rows, cut, run.result()) for rows, cut, run in runs]
        for rows, cut, parts in finished:
            for name, part in parts.items():
                dims = () if name in self.vocabulary_outputs else self.variable_dims.get(name, ())
                if dims:
                    past = self.past_width.get(name, 0)
                    part = part[(slice(None), *(slice(0, cut + past) if i in dims else slice(None)
                                                for i in range(part.ndim - 1)))]
                if name not in results:
                    shape = list(part.shape)
                    for dim in dims:
                        shape[dim + 1] += width - cut  # sparse: `width` ids; ColBERT: `width (- 1)` vectors
                    if name in self.vocabulary_outputs:  # as many weights as the fullest run found
                        shape[1] = max(other[name].shape[1] for _, _, other in finished)
                    shape[0] = len(ids)
                    results[name] = np.full(shape, PAD_VALUES.get(name, 0), dtype=part.dtype)
                target = results[name]
                target[(rows, *(slice(0, n) for n in part.shape[1:]))] = part
        deadline.check_answer()
        self.vectors(results, wanted, dimensions)
        self.compact_colbert(results, wanted, pool_factor)
        if MUVERA in wanted:
            self.encode_muvera(results, request)
        return [pb_utils.Tensor(name, results[name]) for name in wanted]

    def encode_muvera(self, results, request):
        """MUVERA's encoding of each text's ColBERT vectors as served with it (pooled, where asked): a query's (the
        request's input_type or prompt_name a query task: request_rules.TASKS) or a document's (the default)."""
        if self.muvera is None:
            raise InvalidInput(MUVERA, "is not served: this export has no MUVERA parameters (export it again)",
                               ErrorKind.NOT_SERVED)
        parameters = json.loads(request.parameters() or "{}")
        side = next((request_rules.TASKS.get(parameters.get(key)) for key in ("prompt_name", "input_type")
                     if request_rules.TASKS.get(parameters.get(key))), "document")
        vectors, lengths = results[COLBERT_VECTORS], results[COLBERT_LENGTH].reshape(-1)
        results[MUVERA] = np.stack([muvera.encode(vectors[i, :max(1, int(n))], *self.muvera, side == "document")
                                    for i, n in enumerate(lengths)])

    @staticmethod
    def looked_up(tokens, wanted):
        """A query of an inference-free SPLADE export: the tokenizer's lookup is the answer (no encoder run); what
        only the encoder gives is not served for queries."""
        missing = next((name for name in wanted if name not in tokens), None)
        if missing is not None:
            raise model_common.ModelError(ErrorKind.NOT_SERVED, missing, "is not served for queries: this model's "
                                          "query side is a token-weight lookup (the sparse outputs and counts only)")
        return [pb_utils.Tensor(name, tokens[name]) for name in wanted]

    # ---------------------------------------------------------------- compact ColBERT
    def colbert_options(self, request):
        """The request's `colbert_pool_factor` (1: no pooling); InvalidInput names a bad one."""
        parameters = json.loads(request.parameters() or "{}")
        if parameters.get("colbert_pool_factor") is None:
            return 1
        if COLBERT_VECTORS not in self.outputs:
            raise InvalidInput("colbert_pool_factor", f"is not served: this model has no ColBERT output (it serves "
                                                      f"{', '.join(self.outputs)})", ErrorKind.NOT_SERVED)
        factor = model_common.whole_number(parameters, "colbert_pool_factor", meaning=" (1: no pooling)")
        if factor > 1 and self.protected and request_rules.task(("query", "document"), parameters.get("prompt_name"),
                                                                parameters.get("input_type")) == "query":
            raise InvalidInput("colbert_pool_factor", "pools documents only: a PyLate ColBERT's query keeps every "
                                                      "vector (PyLate pools no query)", ErrorKind.INVALID_VALUE)
        return factor

    def compact_colbert(self, results, wanted, pool_factor):
        """Pools `colbert_vectors` (pool_factor > 1; `colbert_length` follows) and adds the compact types asked for,
        computed from the vectors served with them, so a client can check them against `colbert_vectors`."""
        names = [name for name in wanted if name in COLBERT_TYPES]
        if COLBERT_VECTORS not in results or (pool_factor == 1 and not names):
            return
        vectors, lengths = results[COLBERT_VECTORS], results[COLBERT_LENGTH]
        if pool_factor > 1:
            first = self.protected
            rows = [np.concatenate([vectors[i, :first], pool_tokens(vectors[i, first:int(n)], pool_factor,
                                                                    pylate=bool(first))])
                    if int(n) > first else vectors[i, :int(n)] for i, n in enumerate(lengths.reshape(-1))]
            pooled = np.zeros((len(rows), max(len(r) for r in rows), vectors.shape[2]), dtype=np.float32)
            for i, row in enumerate(rows):
                pooled[i, :len(row)] = row
            vectors = results[COLBERT_VECTORS] = pooled
            results[COLBERT_LENGTH] = np.array([len(r) for r in rows], dtype=lengths.dtype).reshape(lengths.shape)
        for name in names:
            results[name] = compact(vectors, COLBERT_TYPES[name])

    def finalize(self):
        self.requests_pool.shutdown(wait=False, cancel_futures=True)
        self.runs_pool.shutdown(wait=False, cancel_futures=True)


# the library's: a request's error about one field, the BLS call, the request's deadline
InvalidInput, call, Deadline = model_common.InvalidInput, model_common.call, model_common.Deadline


# ---------------------------------------------------------------- compact ColBERT: token pooling and types
def compact(vectors, kind):
    """Unit vectors as fp16 (a cast), int8 (round(v * 127), half to even, clipped to +-127: symmetric, no
    calibration, the same for every vector) or binary (sign bits, v > 0, packed 8 per byte as np.packbits:
    sentence_transformers' 'ubinary'). Zero padding stays zero in every type."""
    if kind == "fp16":
        return vectors.astype(np.float16)
    if kind == "int8":
        return np.clip(np.rint(vectors * np.float32(127)), -127, 127).astype(np.int8)
    return np.packbits(vectors > 0, axis=-1)


def pool_tokens(vectors, pool_factor, pylate=False):
    """Token pooling (Clavie et al. 2024) as colbert-ai's and PyLate's pool_embeddings_hierarchical do it:
    scipy's linkage(1 - V V^T, method="ward") - the rows of the cosine-distance matrix taken as points in
    Euclidean space - cut with fcluster(t=max(n // pool_factor, 1), criterion="maxclust"), and the mean of each
    cluster. Then each mean is L2-normalized (PyLate keeps the norms; unit vectors keep dot product = cosine and the
    int8 scale exact). No token is protected: bge-m3's vectors already leave out <s>. Clusters come in the order of
    their first token (PyLate's order is fcluster's label order; MaxSim does not depend on it). The container has no
    scipy, hence ward_merges. Cost for n tokens of width d: O(n^2 min(n, d)) flops, ~n^2 float64s of memory.
    pylate: PyLate 1.6's rule instead (a PyLate ColBERT export's): it hands linkage the condensed 1 - V V^T, so Ward
    merges on those cosine distances themselves, not on rows taken as points."""
    n = len(vectors)
    clusters = max(n // pool_factor, 1)
    if pool_factor == 1 or n <= clusters:
        return vectors
    if pylate:
        cosine = 1.0 - vectors.astype(np.float64) @ vectors.astype(np.float64).T
        merges = ward_merges(cosine * cosine)  # ward_merges takes squared distances
    else:
        merges = ward_merges(row_distances(vectors))
    order = np.argsort(merges[:, 0], kind="stable")[:n - clusters]  # the n - t lowest merges leave t clusters
    parent = np.arange(n)

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for _, a, b in merges[order]:
        ra, rb = root(int(a)), root(int(b))
        parent[max(ra, rb)] = min(ra, rb)  # a cluster's root is its first token
    roots = np.array([root(i) for i in range(n)])
    firsts, labels = np.unique(roots, return_inverse=True)  # sorted roots = clusters in first-token order
    sums = np.zeros((len(firsts), vectors.shape[1]))
    np.add.at(sums, labels, vectors.astype(np.float64))
    means = sums / np.bincount(labels)[:, None]
    return (means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def row_distances(vectors):
    """Squared Euclidean distances (float64, n x n) between the rows of 1 - V V^T, the points Ward clusters.
    Rows i, k differ by V (v_i - v_k), so for n > d the d x d Gram matrix G = V^T V gives them in O(n^2 d):
    (v_i - v_k)^T G (v_i - v_k); else the n x n rows directly in O(n^3)."""
    vectors = vectors.astype(np.float32)
    if len(vectors) > vectors.shape[1]:
        v = vectors.astype(np.float64)
        inner = (v @ (v.T @ v)) @ v.T
    else:
        rows = (np.float32(1) - vectors @ vectors.T).astype(np.float64)  # float32, as the reference computes it
        inner = rows @ rows.T
    norms = np.diag(inner).copy()
    inner *= -2  # in place: a long text's n x n matrix is the memory this costs
    inner += norms[:, None]
    inner += norms[None, :]
    return np.maximum(inner, 0, out=inner)


def ward_merges(distances):
    """Ward's hierarchical clustering of n points from their squared Euclidean distances (n x n, overwritten), by
    the nearest-neighbour chain (scipy's algorithm for ward): n - 1 rows (height, a, b), a merge of the clusters
    holding points a and b, in the order found. A height is the largest squared Ward distance of the merge and of
    those under it (fcluster's criterion: rounding cannot put a merge below its parts)."""
    n = len(distances)
    size = np.ones(n)
    height = np.zeros(n)  # of the merge that made each slot's cluster (slot i holds point i)
    np.fill_diagonal(distances, np.inf)
    merges, chain = np.zeros((n - 1, 3)), []
    for step in range(n - 1):
        if not chain:
            chain.append(int(np.flatnonzero(size)[0]))
        while True:
            x = chain[-1]
            row = distances[x]
            y = int(np.argmin(row))
            if len(chain) > 1 and row[chain[-2]] <= row[y]:  # a tie goes to the previous link, as in scipy
                y = chain[-2]
            if len(chain) > 1 and y == chain[-2]:
                break
            chain.append(y)
        chain.pop(), chain.pop()
        keep, drop = min(x, y), max(x, y)
        d_xy, s_x, s_y = distances[x, y], size[x], size[y]
        # Lance-Williams for Ward on squared distances (scipy's _ward, squared); inactive slots stay at inf
        updated = ((size + s_x) * distances[x] + (size + s_y) * distances[y] - size * d_xy) / (size + s_x + s_y)
        updated[keep] = updated[drop] = np.inf
        distances[keep, :] = distances[:, keep] = updated
        distances[drop, :] = distances[:, drop] = np.inf
        height[keep] = max(d_xy, height[x], height[y])
        size[keep], size[drop] = s_x + s_y, 0
        merges[step] = height[keep], x, y
    return merges
