"""MUVERA (Dhulipala et al., "MUVERA: Multi-Vector Retrieval via Fixed Dimensional Encodings", 2024): one vector
for a set of ColBERT vectors, whose dot product approximates Chamfer similarity (MaxSim), so a plain vector index
serves late interaction's first stage. Computed by ensemble_bls from the ColBERT vectors it serves with it.

Per repetition r (of `r_reps`): `k_sim` SimHash hyperplanes (Gaussian) cut the space into 2^k_sim partitions; each
vector falls in the partition its signs name (bit i: hyperplane i); a partition's vector is the sum of its vectors
(a query's), or their mean (a document's, whose empty partitions take the first vector of the nearest non-empty
partition in Hamming distance); each is projected to `dim_proj` dimensions by a random +-1 matrix scaled by
1/sqrt(dim_proj) (none when dim_proj is the vectors' width); the r_reps x 2^k_sim x dim_proj values, in that order,
are the encoding. The parameters are fixed at export by a seed (`generate`, numpy's default_rng: for each repetition
its hyperplanes, then all projections), which is how fastembed's Muvera draws them from the same seed:
tests/test_muvera.py checks the encodings against fastembed's own."""
import os

import numpy as np

FILE = "muvera.npz"  # beside ensemble_bls's code: the hyperplanes and projections export drew
DEFAULTS = {"k_sim": 5, "dim_proj": 16, "r_reps": 20, "seed": 42}  # fastembed's defaults: 10,240 values


def generate(dim, k_sim, dim_proj, r_reps, seed):
    """The random parameters of an encoding of `dim`-wide vectors: (hyperplanes [r_reps, dim, k_sim], projections
    [r_reps, dim, dim_proj] of +-1)."""
    if not 1 <= dim_proj <= dim:
        raise ValueError(f"dim_proj must be from 1 to the vectors' width {dim}, not {dim_proj}")
    rng = np.random.default_rng(seed)
    hyperplanes = np.stack([rng.normal(size=(dim, k_sim)) for _ in range(r_reps)])
    projections = rng.choice([-1, 1], size=(r_reps, dim, dim_proj))
    return hyperplanes, projections


def size(k_sim, dim_proj, r_reps):
    return r_reps * 2 ** k_sim * dim_proj


def save(folder, hyperplanes, projections):
    np.savez(os.path.join(folder, FILE), hyperplanes=hyperplanes, projections=projections.astype(np.int8))


def load(folder):
    """(hyperplanes, projections) export saved in `folder`, or None (an export without ColBERT vectors)."""
    path = os.path.join(folder, FILE)
    if not os.path.exists(path):
        return None
    with np.load(path) as saved:  # the hyperplanes in float64 (the signs), the projections in float32
        return saved["hyperplanes"].astype(np.float64), saved["projections"].astype(np.float32)


def encode(vectors, hyperplanes, projections, document):
    """The encoding of one set of vectors [n, dim] (n >= 1): a document's (means, empty partitions filled) or a
    query's (sums) -> float32 [r_reps * 2^k_sim * dim_proj]. Every repetition at once, in float32 but the signs:
    the vectors are projected first (a partition's mean or sum of projections is the projection of its mean or
    sum), then a one-hot [2^k_sim, n] matrix per repetition sums the partitions in one product (a loop over
    repetitions in float64 cost 4x the served time of the vectors of a tiny model)."""
    r_reps, dim, k_sim = hyperplanes.shape
    partitions, n = 2 ** k_sim, len(vectors)
    # one product for every repetition's hyperplanes (and projections): [dim, r * k] as a plain matrix. The signs in
    # float64, as fastembed takes them: a product near 0 must fall on the same side
    signs = (np.asarray(vectors, dtype=np.float64) @ hyperplanes.transpose(1, 0, 2).reshape(dim, -1)).reshape(
        n, r_reps, k_sim) > 0
    vectors = np.asarray(vectors, dtype=np.float32)
    ids = (signs @ (1 << np.arange(k_sim))).T  # [r, n]: each vector's partition per repetition
    if projections.shape[2] < dim:
        scale = np.float32(1 / np.sqrt(projections.shape[2]))
        projected = (vectors @ projections.transpose(1, 0, 2).reshape(dim, -1)).reshape(n, r_reps, -1) * scale
        projected = projected.transpose(1, 0, 2)  # [r, n, p]
    else:
        projected = np.broadcast_to(vectors, (r_reps, *vectors.shape))
    onehot = ids[:, None, :] == np.arange(partitions)[None, :, None]  # [r, B, n]
    centers = onehot.astype(np.float32) @ projected  # [r, B, p]: sums
    if document:
        counts = onehot.sum(axis=2)  # [r, B]
        filled = counts > 0
        centers[filled] /= counts[filled][:, None]
        # an empty partition takes the first vector of the nearest filled one (Hamming distance of the ids; of
        # equals, the lowest id)
        popcount = np.array([bin(i).count("1") for i in range(partitions)])
        distance = popcount[np.arange(partitions)[:, None] ^ np.arange(partitions)[None, :]]  # [B, B]
        nearest = np.argmin(np.where(filled[:, None, :], distance[None], partitions + k_sim + 1), axis=2)  # [r, B]
        first = np.argmax(onehot, axis=2)  # [r, B]: the first vector of each partition
        reps, empty = np.nonzero(~filled)
        centers[reps, empty] = projected[reps, first[reps, nearest[reps, empty]]]
    return np.ascontiguousarray(centers, dtype=np.float32).reshape(-1)
