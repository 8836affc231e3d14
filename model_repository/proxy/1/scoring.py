"""bge-m3's relevance scores (FlagEmbedding's BGEM3FlagModel.compute_score), from the vectors the ensemble returns.

dense   = q . p                                     (unit vectors)
sparse  = sum over token ids in both of q_w * p_w   (lexical matching)
colbert = mean over query vectors of the best dot product with a passage vector
combined = (w_dense * dense + w_sparse * sparse + w_colbert * colbert) / (w_dense + w_sparse + w_colbert)

One detail is FlagEmbedding's own: compute_score pads the passages of a batch (256 pairs) into one tensor, so the
padded positions of a passage shorter than the batch's longest are zero vectors, and a query vector's best match
with it is never below 0. It is reproduced here, so the scores equal FlagEmbedding's.
"""
import numpy as np

FLAG_EMBEDDING_BATCH = 256  # compute_score's default batch_size: the padding above is per batch of this many


def sparse_score(query, passage):
    """query, passage: (token ids, weights) arrays, each id once."""
    shared, q_at, p_at = np.intersect1d(query[0], passage[0], assume_unique=True, return_indices=True)
    return float(np.dot(query[1][q_at].astype(np.float64), passage[1][p_at])) if len(shared) else 0.0


def colbert_score(query, passage, padded_length):
    """query [n, d], passage [m, d] unit vectors; padded_length: the longest passage of its batch (vectors)."""
    best = (query @ passage.T).max(axis=1)
    if len(passage) < padded_length:
        best = np.maximum(best, 0.0)
    return float(best.sum() / len(query))


def rerank_scores(query, passages, weights):
    """query / passages: dicts with any of "dense" (vector), "sparse" ((ids, weights)), "colbert" (vectors).
    weights: {"dense": w, "sparse": w, "colbert": w} for the modes to combine.
    Returns [(combined, {mode: score})] per passage, in order."""
    results = []
    for start in range(0, len(passages), FLAG_EMBEDDING_BATCH):
        batch = passages[start:start + FLAG_EMBEDDING_BATCH]
        padded = max((len(p["colbert"]) for p in batch), default=0) if "colbert" in weights else 0
        for passage in batch:
            scores = {}
            if "dense" in weights:
                scores["dense"] = float(np.dot(query["dense"], passage["dense"]))
            if "sparse" in weights:
                scores["sparse"] = sparse_score(query["sparse"], passage["sparse"])
            if "colbert" in weights:
                scores["colbert"] = colbert_score(query["colbert"], passage["colbert"], padded)
            total = sum(weights.values())
            combined = sum(weights[mode] * scores[mode] for mode in weights) / total if total else 0.0
            results.append((combined, scores))
    return results
