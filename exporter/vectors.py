"""What an export serves beyond float vectors: the model's prompts (config_sentence_transformers.json), the widths
it can be truncated to (Matryoshka: its config's `matryoshka_dimensions`, or --matryoshka-dims), and the int8 /
uint8 ranges calibrated on a corpus (exporter/calibration/README.md) for each width. The tokenizer model reads
prompts.json, the BLS model vectors.json."""
import hashlib
import json
import os

from model_library import muvera

from . import fail, read_json
from .progress import staged

CALIBRATION_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration", "corpus.txt")
CALIBRATION_BATCH = 32


def detect_prompts(folder):
    """(prompts {name: text}, default prompt name or None) from a sentence-transformers folder."""
    config = read_json(folder, "config_sentence_transformers.json") or {}
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in prompts.items()):
        fail(f"config_sentence_transformers.json: prompts must map names to strings, not {prompts!r}")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        fail(f"config_sentence_transformers.json: default_prompt_name {default!r} is not one of its prompts")
    for module in read_json(folder, "modules.json") or []:
        if prompts and module.get("type", "").endswith("Pooling"):
            pooling = read_json(folder, module.get("path", ""), "config.json") or {}
            if pooling.get("include_prompt") is False:
                fail("the model's pooling leaves prompt tokens out (include_prompt: false); the graph pools them")
    return prompts, default


def detect_dimensions(folder, config, requested, hidden_size):
    """The widths served: --matryoshka-dims (comma-separated), else the model config's `matryoshka_dimensions`
    (config.json or config_sentence_transformers.json), always with the full width; [hidden_size] if neither."""
    if requested:
        try:
            dims = [int(d) for d in requested.split(",") if d.strip()]
        except ValueError:
            fail(f"--matryoshka-dims takes comma-separated integers, not {requested!r}")
    else:
        st_config = read_json(folder, "config_sentence_transformers.json") or {}
        dims = getattr(config, "matryoshka_dimensions", None) or st_config.get("matryoshka_dimensions") or []
    bad = [d for d in dims if not isinstance(d, int) or not 0 < d <= hidden_size]
    if bad:
        fail(f"Matryoshka dimensions must be integers in 1..{hidden_size} (the model's size), not {bad}")
    return sorted(set(dims) | {hidden_size})


@staged("calibrate")
def calibrate(encoder, tokenizer, max_length, dimensions, prefix="", corpus=CALIBRATION_CORPUS):
    """Per width: the [2, width] float32 min / max of the corpus's embeddings (truncated to the width, then
    re-normalized), as sentence_transformers.quantization.quantize_embeddings takes them as `ranges`."""
    import numpy as np
    import torch

    with open(corpus, encoding="utf-8") as handle:
        texts = [prefix + line.strip() for line in handle if line.strip()]
    if len(texts) < 2:
        fail(f"calibration corpus {corpus} needs at least 2 lines")
    parts = []
    with torch.no_grad():
        for start in range(0, len(texts), CALIBRATION_BATCH):
            batch = tokenizer(texts[start:start + CALIBRATION_BATCH], padding=True, truncation=True,
                              max_length=max_length, return_tensors="pt")
            parts.append(encoder(batch["input_ids"], batch["attention_mask"])[0].numpy())
    full = np.concatenate(parts).astype(np.float32)
    ranges = {}
    for width in dimensions:
        vectors = renormalize(full[:, :width])
        ranges[str(width)] = np.stack([vectors.min(0), vectors.max(0)]).astype(np.float32).tolist()
    with open(corpus, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    return {"corpus": os.path.basename(corpus), "corpus_sha256": digest, "texts": len(texts), "prompt": prefix,
            "ranges": ranges}


def renormalize(vectors):
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def write_vectors(bls_dir, dimensions, calibration):
    """<bls>/1/vectors.json: the widths served and the calibrated int8 / uint8 ranges per width."""
    os.makedirs(bls_dir, exist_ok=True)
    with open(os.path.join(bls_dir, "vectors.json"), "w", encoding="utf-8") as handle:
        json.dump({"dimensions": dimensions, "calibration": calibration}, handle)


def write_muvera(bls_dir, setting, dim):
    """<bls>/1/muvera.npz: MUVERA's hyperplanes and projections for `dim`-wide ColBERT vectors, drawn from the
    setting's seed (--muvera "k_sim=5,dim_proj=16,r_reps=20,seed=42"); returns export.json's record of them."""
    values = dict(muvera.DEFAULTS)
    for part in filter(None, (p.strip() for p in (setting or "").split(","))):
        key, _, value = part.partition("=")
        if key.strip() not in values or not value.strip().isdigit():
            fail(f"--muvera {setting!r}: give k_sim=N,dim_proj=N,r_reps=N,seed=N (whole numbers), not {part!r}")
        values[key.strip()] = int(value)
    if not 1 <= values["k_sim"] <= 10 or not 1 <= values["r_reps"] <= 64 or not 1 <= values["dim_proj"] <= dim:
        fail(f"--muvera {setting!r}: k_sim from 1 to 10, r_reps from 1 to 64, dim_proj from 1 to the ColBERT "
             f"width {dim}")
    hyperplanes, projections = muvera.generate(dim, values["k_sim"], values["dim_proj"], values["r_reps"],
                                               values["seed"])
    os.makedirs(bls_dir, exist_ok=True)
    muvera.save(bls_dir, hyperplanes, projections)
    return {**values, "size": muvera.size(values["k_sim"], values["dim_proj"], values["r_reps"])}


def write_prompts(tokenizer_dir, prompts, default):
    """<tokenizer>/1/prompts.json: the prompts the tokenizer prepends (prompt_name / input_type)."""
    os.makedirs(tokenizer_dir, exist_ok=True)
    with open(os.path.join(tokenizer_dir, "prompts.json"), "w", encoding="utf-8") as handle:
        json.dump({"prompts": prompts, "default_prompt_name": default}, handle, indent=2)
