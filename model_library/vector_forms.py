"""A text vector's served forms, for every model that answers vectors (ensemble_bls, late_chunking): a Matryoshka
width (truncated, L2-normalized again) and the quantized types, computed exactly as sentence-transformers does, int8
and uint8 with the ranges export calibrated for each width (vectors.json beside the model's code)."""
import json
import os

import numpy as np


def read_vectors_json(version_folder):
    """(the widths served, {width: ranges [2, width]}) from the export's vectors.json in `version_folder`; ([], {})
    when there is none (an export made before it)."""
    path = os.path.join(version_folder, "vectors.json")
    if not os.path.exists(path):
        return [], {}
    with open(path, encoding="utf-8") as handle:
        vectors = json.load(handle)
    ranges = (vectors.get("calibration") or {}).get("ranges", {})
    return vectors.get("dimensions") or [], {int(w): np.asarray(r, dtype=np.float32) for w, r in ranges.items()}


def at_width(vectors, width):
    """`vectors` cut to their first `width` dimensions and L2-normalized again (Matryoshka)."""
    cut = vectors[:, :width]
    return (cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def quantize(vectors, precision, ranges):
    """sentence_transformers.quantization.quantize_embeddings(vectors, precision, ranges), line for line."""
    if precision == "binary":
        return (np.packbits(vectors > 0, axis=-1) - 128).astype(np.int8)
    if precision == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    q_vals = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return q_vals.astype(np.uint8) if precision == "uint8" else (q_vals - 128).astype(np.int8)
