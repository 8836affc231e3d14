"""Rerank: `query` and `documents` in, one relevance score per document out, with bge-m3's scores as FlagEmbedding's
BGEM3FlagModel.compute_score gives them ('colbert+sparse+dense' with `weights`):

dense   = q . p                                     (unit vectors)
sparse  = sum over token ids in both of q_w * p_w   (lexical matching)
colbert = mean over query vectors of the best dot product with a passage vector
combined = (w_dense * dense + w_sparse * sparse + w_colbert * colbert) / (w_dense + w_sparse + w_colbert)

One detail is FlagEmbedding's own: compute_score pads the passages of a batch (256 pairs) into one tensor, so the
padded positions of a passage shorter than the batch's longest are zero vectors, and a query vector's best match
with it is never below 0. It is reproduced here, so the scores equal FlagEmbedding's.

The texts are embedded by the export's BLS model (length groups); its errors name `text[i]`, reported here as the
query (row 0) or `documents[i - 1]`. An inference-free SPLADE export's (config: `routes`): with no prompt_name or
input_type in the request, the query is embedded as a query (the tokenizer model's weight lookup) and the documents
as documents (the encoder), so the sparse score is SparseEncoder's similarity(encode_query, encode_document).
Settings: config.pbtxt, read once here.
"""
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library import (
    model_common,
    model_errors,
    model_outputs,
    request_rules,
)
from model_library.model_outputs import (
    COLBERT_LENGTH,
    COLBERT_VECTORS,
    DENSE,
    MODE_SCORES,
    NUM_TOKENS,
    QUERY_TRUNCATED,
    SCORES,
    SPARSE_COUNT,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TRUNCATED,
)

MODES = model_outputs.MODES
TENSORS = {mode: model_outputs.TENSORS[mode] for mode in MODES}
PROMPT_PARAMETERS = ("prompt_name", "input_type", "truncate")  # request parameters passed on to the BLS model
FLAG_EMBEDDING_BATCH = 256  # compute_score's default batch_size: the padding above is per batch of this many


def sparse_score(query, passage):
    """query, passage: (token ids, weights) arrays, each id once."""
    shared, q_at, p_at = np.intersect1d(query[0], passage[0], assume_unique=True, return_indices=True)
    return float(np.dot(query[1][q_at].astype(np.float64), passage[1][p_at])) if len(shared) else 0.0


def colbert_score(query, passage, padded_length, rule="mean"):
    """query [n, d], passage [m, d] unit vectors; padded_length: the longest passage of its batch (vectors).
    rule "sum": PyLate's colbert_scores (the sum of the best dot products; a passage's padding masked out)."""
    best = (query @ passage.T).max(axis=1)
    if rule == "sum":
        return float(best.astype(np.float64).sum())
    if len(passage) < padded_length:
        best = np.maximum(best, 0.0)
    return float(best.sum() / len(query))


def scores(query, passages, weights, colbert_rule="mean"):
    """query / passages: {mode: vectors} ("dense" vector, "sparse" (ids, weights), "colbert" vectors); weights:
    {mode: w} of the modes to combine. Returns (combined [n], per mode [n, 3] with NaN where not combined)."""
    combined, per_mode = np.zeros(len(passages), np.float32), np.full((len(passages), 3), np.nan, np.float32)
    total = sum(weights.values())
    for start in range(0, len(passages), FLAG_EMBEDDING_BATCH):
        batch = passages[start:start + FLAG_EMBEDDING_BATCH]
        padded = max((len(p["colbert"]) for p in batch), default=0) if "colbert" in weights else 0
        for k, passage in enumerate(batch, start):
            found = {}
            if "dense" in weights:
                found["dense"] = float(np.dot(query["dense"], passage["dense"]))
            if "sparse" in weights:
                found["sparse"] = sparse_score(query["sparse"], passage["sparse"])
            if "colbert" in weights:
                found["colbert"] = colbert_score(query["colbert"], passage["colbert"], padded, colbert_rule)
            for mode, value in found.items():
                per_mode[k, MODES.index(mode)] = value
            combined[k] = sum(weights[mode] * found[mode] for mode in weights) / total if total else 0.0
    return combined, per_mode


InvalidInput = model_common.InvalidInput  # a request's error about one field (model_errors.py's contract)


class TritonPythonModel(model_common.RerankModel):
    def setup(self, args):
        super().setup(args)
        self.embedding_model = self.parameters["embedding_model"]
        self.served = [mode for mode in self.parameters["served_outputs"].split(",") if mode in MODES]
        # an inference-free SPLADE export's Router tasks: the query embedded as a query, the documents as documents
        self.routes = [task for task in (self.parameters.get("routes") or "").split(",") if task]
        self.colbert_rule = self.parameters.get("colbert_score") or "mean"  # "sum": a PyLate ColBERT export's
        if self.colbert_rule not in ("mean", "sum"):
            raise pb_utils.TritonModelException(f"colbert_score {self.colbert_rule!r} must be mean or sum")

    def weights(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "weights")
        values = [1.0, 1.0, 1.0] if tensor is None else [float(w) for w in tensor.as_numpy().reshape(-1)]
        request_rules.weights(values, InvalidInput)
        return {mode: w for mode, w in zip(MODES, values) if mode in self.served}

    def work(self, request):
        """One rerank request: the query and documents embedded (the BLS model, texts_per_call per call), scored."""
        weights = self.weights(request)
        query, documents = model_common.rerank_inputs(request, self.max_documents)
        deadline = model_common.Deadline(request)
        # a prompt for every text, query and documents alike (TEI's /similarity); the BLS model checks it
        parameters = json.loads(request.parameters() or "{}")
        prompt = {key: parameters[key] for key in PROMPT_PARAMETERS if key in parameters}
        if "truncate" in prompt:  # false: a text over the max length is refused (by the tokenizer, before the encoder)
            prompt["truncate"] = request_rules.truncate(parameters, InvalidInput)
        texts = np.concatenate([query, documents]).astype(np.object_)
        names = [name for mode in weights for name in TENSORS[mode]] + [NUM_TOKENS, TRUNCATED]
        step = self.texts_per_call
        if {"query", "document"} <= set(self.routes) and not {"prompt_name", "input_type"} & set(prompt):
            # a Router: the query's side (its lookup) and the documents' (the encoder), as encode_query/_document
            first = [self.embed(texts[:1], 0, names, deadline, {**prompt, "input_type": "query"})]
            parts = first + self.pieces(lambda i: self.embed(texts[1 + i * step:1 + (i + 1) * step], 1 + i * step,
                                                             names, deadline, {**prompt, "input_type": "document"}),
                                        -(-len(documents) // step), deadline)
        else:
            parts = self.pieces(lambda i: self.embed(texts[i * step:(i + 1) * step], i * step, names, deadline,
                                                     prompt), -(-len(texts) // step), deadline)
        deadline.check_answer()
        outputs = {name: np.concatenate([part[name] for part in parts]) if name not in (SPARSE_INDICES,
                   SPARSE_VALUES, COLBERT_VECTORS) else [row for part in parts for row in part[name]]
                   for name in names}
        vectors = []
        for i in range(len(texts)):
            row = {}
            if "dense" in weights:
                row["dense"] = outputs[DENSE][i]
            if "sparse" in weights:
                count = int(outputs[SPARSE_COUNT][i, 0])
                row["sparse"] = (outputs[SPARSE_INDICES][i][:count], outputs[SPARSE_VALUES][i][:count])
            if "colbert" in weights:
                row["colbert"] = outputs[COLBERT_VECTORS][i][:int(outputs[COLBERT_LENGTH][i, 0])]
            vectors.append(row)
        combined, per_mode = scores(vectors[0], vectors[1:], weights, self.colbert_rule)
        truncated = outputs[TRUNCATED].reshape(-1)
        return [pb_utils.Tensor(SCORES, combined), pb_utils.Tensor(MODE_SCORES, per_mode),
                pb_utils.Tensor(NUM_TOKENS, np.array([outputs[NUM_TOKENS].sum()], dtype=np.int32)),
                pb_utils.Tensor(QUERY_TRUNCATED, truncated[:1].copy()),
                pb_utils.Tensor(TRUNCATED, truncated[1:].copy())]

    def embed(self, texts, first, names, deadline, prompt):
        """texts[first:...] of [query, *documents] -> {output: rows}, with what is left of the request's timeout;
        errors name the query or documents[i]."""
        def rename(field):  # the BLS model's text[i] is row first + i of [query, *documents]
            name, i = model_errors.split_field(field)
            if name != "text":
                return field
            if i is None:
                return "documents"
            return "query" if first + i == 0 else f"documents[{first + i - 1}]"
        return model_common.call(self.embedding_model, [pb_utils.Tensor("text", texts.reshape(-1, 1))], names,
                                 deadline, prompt, rename=rename)
