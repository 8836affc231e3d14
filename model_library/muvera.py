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
    with np.load(path) as saved:
        return saved["hyperplanes"], saved["projections"].astype(np.float64)


def encode(vectors, hyperplanes, projections, document):
    """The encoding of one set of vectors [n, dim] (n >= 1): a document's (means, empty partitions filled) or a
    query's (sums) -> float32 [r_reps * 2^k_sim * dim_proj]."""
    vectors = np.asarray(vectors, dtype=np.float64)
    r_reps, dim, k_sim = hyperplanes.shape
    partitions = 2 ** k_sim
    ids_of_all = np.arange(partitions)
    popcount = np.array([bin(i).count("1") for i in range(partitions)])
    parts = []
    for rep in range(r_reps):
        ids = (vectors @ hyperplanes[rep] > 0) @ (1 << np.arange(k_sim))
        centers = np.zeros((partitions, dim))
        np.add.at(centers, ids, vectors)
        if document:
            counts = np.bincount(ids, minlength=partitions)
            filled = counts > 0
            centers[filled] /= counts[filled][:, None]
            occupied, empty = ids_of_all[filled], ids_of_all[~filled]
            if len(empty):
                nearest = occupied[np.argmin(popcount[empty[:, None] ^ occupied[None, :]], axis=1)]
                first = {int(p): int(np.flatnonzero(ids == p)[0]) for p in np.unique(nearest)}
                centers[empty] = vectors[[first[int(p)] for p in nearest]]
        if projections.shape[2] < dim:
            centers = centers @ projections[rep] / np.sqrt(projections.shape[2])
        parts.append(centers.reshape(-1))
    return np.concatenate(parts).astype(np.float32)
