"""The Triton side of an export: the five models' names, their configs rendered from the templates in
model_source/ (the encoder's GPU variants included), the encoder's warm-up samples and batchstrategy.so
(token_budget.c compiled), the tokenizer's tokenizer.json, and the staged models installed into the repository."""
import filecmp
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import string
import subprocess
import tempfile

from local_triton.settings import model_source, serving_repository
from model_library.model_outputs import MUVERA

from . import fail, pbtxt, read_json
from .graph import ENCODER_ONLY, OUTPUT_TENSORS, RAGGED_LENGTHS, WITH_DENSE, public_families, token_guard_message

# The checkout this exporter is in: export may run from a copy of the checkout, and reads that copy's models' source
# and writes its serving repository by default (local_triton.settings names and joins both)
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_SOURCE = model_source(PROJECT)  # the models' code and config templates (tracked)

RESERVED_NAMES = {"tokenizer", "embedding", "ensemble", "ensemble_bls", "rerank", "late_chunking", "proxy",
                  "supervisor"}
STEP_SUFFIXES = ("_tokenizer", "_embedding", "_bls", "_rerank", "_chunks", "_image", "_image_preprocess")
VALID_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
WARMUP_LONG_TOKENS = 512  # the long warm-up sample: min(this, max length)
TEXT_INPUT = '  { name: "text", data_type: TYPE_STRING, dims: [ 1 ] }'
PAIR_INPUTS = TEXT_INPUT + ',\n  { name: "query", data_type: TYPE_STRING, dims: [ 1 ], optional: true }'
# The outputs whose dimension is the vector's width: the BLS model's are as wide as the request's `dimensions`
WIDTH_OUTPUTS = ("embedding", "embedding_unnormalized")
# The code of the graph the encoder runs (its outputs; each family's module: pooling, normalization, what it wraps;
# pipeline.py: which modules of a folder it builds; weights.py: which folders' weights it may be built from): part of
# the export digest
GRAPH_CODE = (os.path.join("exporter", "graph.py"), os.path.join("exporter", "pipeline.py"),
              os.path.join("exporter", "weights.py"),
              os.path.join("exporter", "families", "*.py"))
# The BLS model's quantized forms of `embedding` (sentence_transformers.quantization.quantize_embeddings' precisions)
QUANTIZED_OUTPUTS = [("embedding_int8", "TYPE_INT8"), ("embedding_uint8", "TYPE_UINT8"),
                     ("embedding_binary", "TYPE_INT8"), ("embedding_ubinary", "TYPE_UINT8")]
# The BLS model's compact ColBERT vectors (pooled with the request's colbert_pool_factor): [rows, vectors, width]
COLBERT_OUTPUTS = [("colbert_vectors_fp16", "TYPE_FP16"), ("colbert_vectors_int8", "TYPE_INT8"),
                   ("colbert_vectors_binary", "TYPE_UINT8")]
# What each kind of Python model's folder gets from the checkout: its tracked code and config, named one by one (a
# glob only where no generated file can match). Never a whole folder: the default export writes its generated files
# (prompts.json, text_cleaning.json, vectors.json, the library's copies...) into the checkout's folders, and a copy of
# those into another export served the default's prompts (issue 40).
# {kind: [(source under the project, destination in the model's folder)]}
# The models' library, installed whole as the package model_library/ in each Python model's version folder, which
# Triton's stub puts on sys.path: every model imports it as everything outside Triton does (`from model_library
# import model_errors`). in_process.py (running a model's code outside Triton) is never installed.
LIBRARY_MODULES = ("__init__", "colbert_side", "model_common", "model_errors", "model_outputs", "muvera",
                   "parity_report", "piece_pairs", "query_lookup", "request_rules", "tracing", "triton_server",
                   "vector_forms")
LIBRARY = [(os.path.join("model_library", f"{module}.py"), "1/model_library/") for module in LIBRARY_MODULES]
MODEL_CODE = {
    "tokenizer": [("model_source/tokenizer/config.pbtxt", "config.pbtxt"),
                  ("model_source/tokenizer/1/model.py", "1/"), ("model_source/tokenizer/1/grouping.py", "1/"),
                  ("model_source/tokenizer/warmup/text", "warmup/text"), *LIBRARY],
    "ensemble_bls": [("model_source/ensemble_bls/1/model.py", "1/"), *LIBRARY],
    "rerank": [("model_source/rerank/1/model.py", "1/"), *LIBRARY],
    "cross_encoder_rerank": [("model_source/rerank/cross_encoder.py", "1/model.py"), *LIBRARY],
    "late_chunking": [("model_source/late_chunking/1/model.py", "1/"), *LIBRARY],
    "image_preprocess": [("model_source/tokenizer/image_preprocess.py", "1/model.py"), *LIBRARY],
    "proxy": [("model_source/proxy/config.pbtxt", "config.pbtxt"), ("model_source/proxy/1/model.py", "1/"),
              ("model_source/proxy/1/http_front/**/*.py", "1/http_front/"),
              *LIBRARY],
    "supervisor": [("model_source/supervisor/config.pbtxt", "config.pbtxt"),
                   ("model_source/supervisor/1/model.py", "1/"), *LIBRARY],
}


def templates_digest():
    """sha256 of every config template export renders (model_source/*/*.template), of the encoder's batching
    strategy it compiles (token_budget.c), of the models' library it installs (model_library/), of the GPU table
    (GPU, the tokenizer's grouping GPU_TOKENIZER in it) and of the graph it exports (GRAPH_CODE: graph.py, the
    encoder's outputs, e.g. `embedding_unnormalized`, which an older export lacks; the family modules, what each
    family's graph computes; pipeline.py: which of a folder's modules it builds, e.g. a Dense module an older export
    dropped): an export made from other ones is stale, and
    --skip-if-exported redoes it (else a changed config, strategy, library or graph never reaches it)."""
    digest = hashlib.sha256(json.dumps(GPU, sort_keys=True).encode() + b"\0")
    sources = glob.glob(os.path.join(MODEL_SOURCE, "*", "*.template")) + [
        os.path.join(MODEL_SOURCE, "embedding", "token_budget.c"), *(os.path.join(PROJECT, source)
                                                                     for source, _ in LIBRARY),
        *(path for pattern in GRAPH_CODE for path in glob.glob(os.path.join(PROJECT, pattern)))]
    for path in sorted(sources):
        digest.update(os.path.relpath(path, MODEL_SOURCE).encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(handle.read() + b"\0")
    return digest.hexdigest()


def model_names(name):
    """(ensemble, tokenizer, encoder, BLS, rerank) Triton model names of one export."""
    if name is None:
        return "ensemble", "tokenizer", "embedding", "ensemble_bls", "rerank"
    return name, f"{name}_tokenizer", f"{name}_embedding", f"{name}_bls", f"{name}_rerank"


def chunks_name(name):
    """The late chunking model of an embedding export (cross-encoders have none)."""
    return "late_chunking" if name is None else f"{name}_chunks"


def remove_chunks(repository, name):
    """An export without a late chunking model (its pipeline projects the pooled vector) leaves no earlier one
    behind: Triton would load it against the new encoder."""
    remove(os.path.join(repository, chunks_name(name)))


def copy_model_code(kind, model_dir, project=PROJECT, keep_config=False):
    """The files MODEL_CODE lists for `kind`, copied from model_source/ and model_library/ into `model_dir` (a
    folder of the serving repository, or of an export's staging); returns their paths there. Python files there
    that the list no longer names (a module since moved or removed) go. keep_config: an existing config.pbtxt
    stays (the proxy's and supervisor's of a repository outside the project: their settings are the user's)."""
    copied = []
    for pattern, destination in MODEL_CODE[kind]:
        sources = sorted(glob.glob(os.path.join(project, pattern), recursive=True))
        if not sources:
            fail(f"{pattern} is missing from the checkout")
        # a package's files (`**`) keep their place under its folder; others go into `destination` by name
        base = os.path.join(project, pattern.split("**")[0]) if "**" in pattern else None
        for source in sources:
            target = os.path.join(model_dir, destination)
            if destination.endswith("/"):
                target = os.path.join(target, os.path.relpath(source, base) if base else os.path.basename(source))
            if keep_config and destination == "config.pbtxt" and os.path.exists(target):
                continue
            # an unchanged file keeps its mtime: Triton's polling reloads none
            if not (os.path.isfile(target) and filecmp.cmp(source, target, shallow=False)):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(source, target)
            copied.append(target)
    for folder in {os.path.dirname(path) for path in copied}:
        for stale in set(glob.glob(os.path.join(folder, "*.py"))) - set(copied):
            os.remove(stale)
    return copied


def export_code(repository, manifest):
    """{model folder: MODEL_CODE kind} of the Python models of the export `manifest` describes (its export.json)."""
    name = None if manifest["name"] == "ensemble" else manifest["name"]
    _, tokenizer, _, bls, rerank = model_names(name)
    kinds = {tokenizer: "tokenizer", bls: "ensemble_bls",
             rerank: "cross_encoder_rerank" if manifest.get("kind") == "cross-encoder" else "rerank",
             chunks_name(name): "late_chunking"}
    if manifest.get("kind") == "clip":
        kinds[clip_image_names(name)[1]] = "image_preprocess"
    return {model: kind for model, kind in kinds.items() if os.path.isdir(os.path.join(repository, model, "1"))}


def refresh_code(repository):
    """Every export's Python models, the proxy and the supervisor get model_source/'s code and the library as they
    are now (--skip-if-exported: an edit of a model's code reaches the served repository without a new export)."""
    for path in sorted(glob.glob(os.path.join(repository, "*", "1", "export.json"))):
        for model, kind in export_code(repository, read_json(path)).items():
            if kind == "tokenizer":
                copy_tokenizer(repository, model)
            else:
                copy_model_code(kind, os.path.join(repository, model))
    ensure_proxy(repository)


def write_chunks_config(staging, names, chunks, hidden_size, max_length):
    """The late chunking model: its config rendered from model_source/late_chunking/config.pbtxt.template, its
    code copied (for the default export too: the folder holds the template and the code, like the others)."""
    _, tokenizer, encoder, _, _ = names
    os.makedirs(os.path.join(staging, chunks, "1"), exist_ok=True)
    with open(os.path.join(staging, chunks, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(MODEL_SOURCE, "late_chunking", "config.pbtxt.template"),
                            tokenizer=tokenizer, encoder=encoder, dim=hidden_size, max_length=max_length))
    copy_model_code("late_chunking", os.path.join(staging, chunks))


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
    for model in (*model_names(name), chunks_name(name), *clip_image_names(name)):
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


LONG_CONTEXT = 512  # above this max length (tokens), the encoder gives its CPU arena back after each run


def arena_shrinkage(max_length):
    """The encoder config's arena line: onnxruntime gives its CPU arena's unused memory back after each run for a model
    of over LONG_CONTEXT tokens, whose one run can take gigabytes (issue 71: bge-m3's 8,192-token text, 11 GiB, kept
    for good); below, the arena is kept: what a run takes is small, and giving it back cost 8 % on MiniLM's batches."""
    if max_length > LONG_CONTEXT:
        return 'parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }'
    return f"# (the arena is kept: max length {max_length}, at most {LONG_CONTEXT} tokens)"


def triton_dims(dims, sizes):
    """Config dims from OUTPUT_TENSORS' ("D" the embedding's size, "H" the hidden size, "C" ColBERT's: `sizes`)."""
    return ", ".join(str(sizes.get(d, d)) for d in dims)


def encoder_inputs(ragged=False):
    """The encoder config's inputs. Ragged (export --ragged-batch): one batch may hold requests of any widths; the
    backend hands the graph every request's tokens flat, with each row's width in the batch input `row_lengths`
    (graph.add_ragged_inputs rebuilds the padded batch)."""
    flag = ", allow_ragged_batch: true" if ragged else ""
    lines = [f'  {{ name: "{name}", data_type: TYPE_INT64, dims: [ -1 ]{flag} }}'
             for name in ("input_ids", "attention_mask")]
    text = ",\n".join(lines)
    if ragged:
        text += (f'\n]\nbatch_input [\n  {{ kind: BATCH_ITEM_SHAPE, target_name: "{RAGGED_LENGTHS}", '
                 'data_type: TYPE_INT32, source_input: "input_ids" }')
    return text


def write_configs(staging, names, outputs, sizes, warmup, max_length, encoder_only=ENCODER_ONLY,
                  with_dense=WITH_DENSE, ragged=False, sparse_width="tokens", routes=(), colbert_score="mean",
                  colbert_width="tokens-1"):
    """Render the encoder's (CPU and GPU), the ensemble's, the BLS model's and the rerank model's (when `names` has
    one) configs; copy the code of the Python models for a named export. `outputs`: export.json's; the graph also
    has `with_dense` (graph.WITH_DENSE: embedding_unnormalized) and `encoder_only` (token_embeddings) families, which
    CLIP's text tower has not. `sizes`: {"D": the embedding's size, "H": the hidden size, "C": ColBERT's}. `routes`:
    a Router's tasks (inference-free SPLADE, a PyLate ColBERT), which the rerank model embeds the query and documents
    by; colbert_score: the rerank model's ColBERT score (mean: FlagEmbedding's, sum: PyLate's); colbert_width: the
    encoder's colbert_vectors per row (tokens-1: bge-m3's, tokens: PyLate's)."""
    ensemble, tokenizer, encoder, bls, rerank = names
    colbert_dim = sizes.get("C")
    declarations = [(name, kind, triton_dims(dims, sizes))
                    for family in public_families(outputs, with_dense) for name, kind, dims in OUTPUT_TENSORS[family]]
    lines = [f'  {{ name: "{n}", data_type: {t}, dims: [ {d} ] }}' for n, t, d in declarations]
    encoder_lines = lines + [f'  {{ name: "{n}", data_type: {t}, dims: [ {triton_dims(d, sizes)} ] }}'
                             for family in encoder_only for n, t, d in OUTPUT_TENSORS[family]]
    encoder_dir = os.path.join(staging, encoder)
    os.makedirs(encoder_dir, exist_ok=True)
    budget = tokenizer_parameter("max_batch_tokens")
    values = {"outputs": ",\n".join(encoder_lines), "short_tokens": warmup[0], "long_tokens": warmup[1],
              "max_batch_tokens": budget, "encoder_inputs": encoder_inputs(ragged),
              "arena_shrinkage": arena_shrinkage(max_length)}
    with open(os.path.join(encoder_dir, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(MODEL_SOURCE, "embedding", "config.pbtxt.template"), **values))
    write_gpu_configs(encoder_dir, values, max_length, int(budget), ragged)
    public = lines + ['  { name: "num_tokens", data_type: TYPE_INT32, dims: [ 1 ] }',
                      '  { name: "truncated", data_type: TYPE_BOOL, dims: [ 1 ] }']
    maps = [f'      output_map {{ key: "{n}", value: "{n}" }}' for n, _, _ in declarations]
    os.makedirs(os.path.join(staging, ensemble, "1"), exist_ok=True)
    with open(os.path.join(staging, ensemble, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(MODEL_SOURCE, "ensemble", "config.pbtxt.template"),
                            tokenizer=tokenizer, encoder=encoder, outputs=",\n".join(public),
                            output_maps="\n".join(maps)))
    os.makedirs(os.path.join(staging, bls, "1"), exist_ok=True)
    # The BLS model's vectors are as wide as the request's `dimensions` (Matryoshka), in the types it asks for.
    bls_outputs = [f'  {{ name: "{n}", data_type: {t}, dims: [ -1 ] }}' if n in WIDTH_OUTPUTS else line
                   for (n, t, _), line in zip(declarations, lines)] + public[len(lines):]
    if "dense" in outputs:
        bls_outputs += [f'  {{ name: "{n}", data_type: {t}, dims: [ -1 ] }}' for n, t in QUANTIZED_OUTPUTS]
    if "colbert" in outputs:  # binary: the sign bits packed 8 per byte
        bls_outputs += [f'  {{ name: "{n}", data_type: {t}, dims: [ -1, '
                        f'{-(-colbert_dim // 8) if n.endswith("binary") else colbert_dim} ] }}'
                        for n, t in COLBERT_OUTPUTS]
    if sizes.get("M"):  # MUVERA's encoding of the ColBERT vectors (model_library/muvera.py), sent when asked for
        bls_outputs.append(f'  {{ name: "{MUVERA}", data_type: TYPE_FP32, dims: [ {sizes["M"]} ] }}')
    # The encoder's token vectors (TEI's /embed_all), padded like ColBERT's; sent only when asked for by name.
    bls_outputs += [f'  {{ name: "{n}", data_type: {t}, dims: [ {triton_dims(d, sizes)} ] }}'
                    for family in encoder_only for n, t, d in OUTPUT_TENSORS[family]]
    with open(os.path.join(staging, bls, "config.pbtxt"), "w", encoding="utf-8") as handle:
        handle.write(render(os.path.join(MODEL_SOURCE, "ensemble_bls", "config.pbtxt.template"),
                            tokenizer=tokenizer, encoder=encoder, outputs=",\n".join(bls_outputs),
                            inputs=TEXT_INPUT, sparse_width=sparse_width, colbert_width=colbert_width))
    if rerank is not None:
        os.makedirs(os.path.join(staging, rerank, "1"), exist_ok=True)
        with open(os.path.join(staging, rerank, "config.pbtxt"), "w", encoding="utf-8") as handle:
            handle.write(render(os.path.join(MODEL_SOURCE, "rerank", "config.pbtxt.template"), bls=bls,
                                served=",".join(outputs), routes=",".join(routes), colbert_score=colbert_score))
        write_rerank_gpu_configs(os.path.join(staging, rerank))
    # The tokenizer's config names no model and no per-model value: a named export uses it as it is.
    copy_tokenizer(staging, tokenizer)
    for model, kind in ((bls, "ensemble_bls"), (rerank, "rerank")):
        if model is not None:
            copy_model_code(kind, os.path.join(staging, model))


def copy_tokenizer(staging, tokenizer):
    """The tokenizer model's tracked config and code (MODEL_CODE: not the files an export wrote beside them), and
    its configs for GPUs."""
    copy_model_code("tokenizer", os.path.join(staging, tokenizer))
    write_tokenizer_gpu_configs(os.path.join(staging, tokenizer))


# On a GPU an encoder run costs about the same for 3 rows as for 200 (kernel launches, not arithmetic), and Triton's
# dynamic batcher joins equal shapes only: the CPU's fine length groups (widths in steps of 8, a run worth 256
# tokens) left bge-m3 runs of 1-3 rows. Coarser groups, measured on an H100 (docs/benchmarks-gpu.md): single queries
# at 256 in flight 194 -> 1,694 texts/s (runs of 3.4 -> 222 rows), passages 70-78 -> 114-169. The BLS model's split
# of one request (split_overhead_tokens; the CPU's 32 cut 32 mixed texts into ~6 runs of 5.6 rows) and the padding
# floor too: ensemble_bls on 32 mixed texts per request 310-323 -> 1,425-1,875 texts/s, 1.28x `ensemble` (same run).
# Widths in powers of two: single passages (100-500 tokens) at 64 in flight 101-131 -> 784 texts/s (runs of ~2 ->
# 27 rows): one tokenizer execute's texts pad to one width, and consecutive executes now mostly share it.
GPU_TOKENIZER = {"pad_to_multiple_of": "32", "pad_to_power_of_two": "true", "batch_overhead_tokens": "4096",
                 "split_overhead_tokens": "8192", "min_padding_efficiency": "0"}
# The GPU configs' own values, whatever the CPU configs say (issue 51: the CPU's second tokenizer instance, the fix
# of a CPU stall, reached the GPU config through it and halved passages there: 524 -> 275 texts/s at 64 in flight on
# an H200, mixed single texts 658 -> 164, as each execute then took 2 requests instead of 7-14, of other widths).
GPU = {
    "tokenizer": {"instances": 1, "max_queue_size": 512, "parameters": GPU_TOKENIZER},
    "encoder": {"instances": 1},  # one instance on each GPU the pod sees
    # the rerank models' calls: the CPU's 32 texts (a 1-text request waits behind one call's encoder runs, issue 59)
    # would cut a GPU's runs to 32 rows, where 256 cost about the same
    "rerank": {"parameters": {"texts_per_call": "256"}},
}


def gpu_tokenizer_config(config, table=None):
    """The tokenizer's config for GPUs from its CPU config (pbtxt: a ModelConfig or its text, returned in that form):
    GPU's instance count, queue bound and length grouping (table: GPU["tokenizer"]'s keys, for the GPU bench's
    matrix). KeyError names what `config` lacks."""
    table = {**GPU["tokenizer"], **(table or {})}
    config = pbtxt.with_instance_count(config, table["instances"])
    config = pbtxt.with_max_queue_size(config, table["max_queue_size"])
    return pbtxt.with_parameters(config, table["parameters"])


def write_tokenizer_gpu_configs(tokenizer_dir):
    """<tokenizer>/configs/{gpu,gpu-trt}.pbtxt: the tokenizer's config.pbtxt with the GPU table's instances, queue
    bound and length grouping."""
    write_gpu_variants(tokenizer_dir, gpu_tokenizer_config, "instances, queue bound and length grouping")


def write_rerank_gpu_configs(rerank_dir):
    """<rerank>/configs/{gpu,gpu-trt}.pbtxt: the rerank model's config.pbtxt with the GPU table's parameters."""
    write_gpu_variants(rerank_dir, lambda config: pbtxt.with_parameters(config, GPU["rerank"]["parameters"]),
                       "parameters")


def write_gpu_variants(model_dir, edit, edited):
    """<model>/configs/{gpu,gpu-trt}.pbtxt: its config.pbtxt through `edit`, written through Triton's ModelConfig
    (exporter/pbtxt.py: no comments; config.pbtxt has them). Triton loads them under --model-config-name
    (launcher MODEL_CONFIG_NAME), as the encoder's configs/. edited: what the header says was changed."""
    name = os.path.basename(os.path.normpath(model_dir))
    try:
        config = edit(pbtxt.read(os.path.join(model_dir, "config.pbtxt")))
    except pbtxt.ConfigError as error:
        fail(str(error))
    except KeyError as missing:
        fail(f"{name}/config.pbtxt has no {missing.args[0]!r}")
    header = (f"# Written by build/export.py: config.pbtxt with the GPU table's {edited} (GPU in\n"
              "# exporter/repository.py), through Triton's ModelConfig: what each value means is in\n"
              "# ../config.pbtxt's comments.\n")
    os.makedirs(os.path.join(model_dir, "configs"), exist_ok=True)
    for variant in ("gpu", "gpu-trt"):
        pbtxt.write(os.path.join(model_dir, "configs", f"{variant}.pbtxt"), config, header)


def clip_image_names(name):
    """(image ensemble, image preprocessing model, image encoder) of a CLIP export."""
    return f"{name}_image", f"{name}_image_preprocess", f"{name}_image_embedding"


def write_clip_image_configs(staging, name, height, width, dim):
    """A CLIP export's image side: the preprocessing model (code and config: model_source/tokenizer/
    image_preprocess.py and image.pbtxt.template), the image encoder's config and the image ensemble's."""
    ensemble, preprocess, encoder = clip_image_names(name)
    renders = [(preprocess, "tokenizer/image.pbtxt.template", {"height": height, "width": width}),
               (encoder, "embedding/image.pbtxt.template", {"height": height, "width": width, "dim": dim}),
               (ensemble, "ensemble/image.pbtxt.template", {"preprocess": preprocess, "encoder": encoder, "dim": dim})]
    for model, template, fill in renders:
        os.makedirs(os.path.join(staging, model, "1"), exist_ok=True)
        with open(os.path.join(staging, model, "config.pbtxt"), "w", encoding="utf-8") as handle:
            handle.write(render(os.path.join(MODEL_SOURCE, template), **fill))
    copy_model_code("image_preprocess", os.path.join(staging, preprocess))



def write_cross_encoder_configs(staging, names, labels, warmup, max_length):
    """A cross-encoder's models: the encoder (logits and scores out), the pair ensemble, the BLS model over pairs,
    the rerank model (query + documents) and the tokenizer; code copied as for a named embedding export."""
    ensemble, tokenizer, encoder, bls, rerank = names
    declared = [f'  {{ name: "{n}", data_type: TYPE_FP32, dims: [ {labels} ] }}' for n in ("logits", "scores")]
    public = declared + ['  { name: "num_tokens", data_type: TYPE_INT32, dims: [ 1 ] }',
                         '  { name: "truncated", data_type: TYPE_BOOL, dims: [ 1 ] }',
                         '  { name: "query_truncated", data_type: TYPE_BOOL, dims: [ 1 ] }']
    budget = tokenizer_parameter("max_batch_tokens")
    values = {"outputs": ",\n".join(declared), "short_tokens": warmup[0], "long_tokens": warmup[1],
              "max_batch_tokens": budget, "encoder_inputs": encoder_inputs(),
              "arena_shrinkage": arena_shrinkage(max_length)}
    renders = [(encoder, "embedding/config.pbtxt.template", values),
               (ensemble, "ensemble/pairs.pbtxt.template", {"tokenizer": tokenizer, "encoder": encoder,
                                                            "outputs": ",\n".join(public)}),
               (bls, "ensemble_bls/config.pbtxt.template", {"tokenizer": tokenizer, "encoder": encoder,
                                                            "outputs": ",\n".join(public), "inputs": PAIR_INPUTS,
                                                            "sparse_width": "tokens", "colbert_width": "tokens-1"}),
               (rerank, "rerank/cross_encoder.pbtxt.template", {"bls": bls, "label": 0 if labels == 1 else labels - 1})]
    for model, template, fill in renders:
        os.makedirs(os.path.join(staging, model, "1"), exist_ok=True)
        with open(os.path.join(staging, model, "config.pbtxt"), "w", encoding="utf-8") as handle:
            handle.write(render(os.path.join(MODEL_SOURCE, template), **fill))
    write_gpu_configs(os.path.join(staging, encoder), values, max_length, int(budget))
    write_rerank_gpu_configs(os.path.join(staging, rerank))
    copy_tokenizer(staging, tokenizer)
    copy_model_code("ensemble_bls", os.path.join(staging, bls))
    copy_model_code("cross_encoder_rerank", os.path.join(staging, rerank))


def write_gpu_configs(encoder_dir, values, max_length, max_batch_tokens, ragged=False):
    """The encoder's configs for GPUs, <encoder>/configs/{gpu,gpu-trt}.pbtxt (Triton --model-config-name, launcher
    MODEL_CONFIG_NAME), rendered from model_source/embedding/{gpu,gpu-trt}.pbtxt.template with the CPU config's
    values. TensorRT gets one optimization profile covering every batch the token budget allows (onnxruntime 1.18.1
    uses the first profile only), so rows x length = max_batch_tokens. Options: docs/deploying.md. Unmeasured.
    A ragged encoder gets no gpu-trt.pbtxt: its profiles would be over flat token counts, untried."""
    rows = max(1, min(256, max_batch_tokens // max_length))
    shapes = {f"{kind}_shapes": ",".join(f"{name}:{r}x{length}" for name in ("input_ids", "attention_mask"))
              for kind, r, length in (("min", 1, 1), ("opt", rows, max(1, max_length // 2)), ("max", rows, max_length))}
    os.makedirs(os.path.join(encoder_dir, "configs"), exist_ok=True)
    for variant, extra in (("gpu", {}), ("gpu-trt", {"rows": rows, **shapes}))[:1 if ragged else 2]:
        with open(os.path.join(encoder_dir, "configs", f"{variant}.pbtxt"), "w", encoding="utf-8") as handle:
            handle.write(render(os.path.join(MODEL_SOURCE, "embedding", f"{variant}.pbtxt.template"),
                                **{**values, "encoder_inputs": encoder_inputs(ragged)}, **extra,
                                gpu_instances=GPU["encoder"]["instances"]))


def tokenizer_parameter(key):
    """A parameter of the tracked tokenizer config (the home of settings the encoder shares)."""
    try:
        value = pbtxt.parameter(os.path.join(MODEL_SOURCE, "tokenizer", "config.pbtxt"), key)
    except pbtxt.ConfigError as error:
        fail(str(error))
    if value is None:
        fail(f"tokenizer/config.pbtxt has no parameter {key!r}")
    return value


def build_batch_strategy(encoder_dir):
    """Compile the encoder's token-budget batching strategy (token_budget.c) into batchstrategy.so. Returns whether
    it was built: without a C compiler the export still works, with batches bounded by rows only."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    source = os.path.join(MODEL_SOURCE, "embedding", "token_budget.c")
    if compiler is None:
        print("export: warning: no C compiler (cc/gcc), so no batchstrategy.so: encoder batches are bounded by "
              "max_batch_size rows, not by max_batch_tokens, and a direct call to the encoder is not refused")
        return False
    os.makedirs(encoder_dir, exist_ok=True)
    result = subprocess.run([compiler, "-O2", "-Wall", "-shared", "-fPIC", "-o",
                             os.path.join(encoder_dir, "batchstrategy.so"), source], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"compiling {source} failed:\n{result.stderr}")
    return True


def token_guard(token_budget, names, max_length):
    """finalize_onnx's token_guard for an encoder batched by token_budget.c (None without it: batches bounded by
    rows alone may pass max_batch_tokens legitimately). A lone row of max_length tokens always passes."""
    if not token_budget:
        return None
    budget = max(int(tokenizer_parameter("max_batch_tokens")), max_length)
    return budget, token_guard_message(budget, names[2], names[3])


def warmup_lengths(max_length):
    """Tokens of the short and the long warm-up sample."""
    return min(16, max_length), min(WARMUP_LONG_TOKENS, max_length)


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


def fast_tokenizer(hf_tokenizer):
    """A transformers tokenizer as a `tokenizers` Tokenizer (its tokenizer.json form, which the tokenizer model
    reads), or the export stops naming what is missing."""
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as scratch:
        hf_tokenizer.save_pretrained(scratch)
        path = os.path.join(scratch, "tokenizer.json")
        if not os.path.exists(path):
            fail("the tokenizer has no fast (tokenizer.json) form, which the tokenizer model needs")
        return Tokenizer.from_file(path)


def write_tokenizer(hf_tokenizer, max_length, tokenizer_dir):
    """tokenizer.json with the pad token and the model's max length as its truncation (the tokenizer model reads
    both from it)."""
    fast = fast_tokenizer(hf_tokenizer)
    fast.enable_truncation(max_length)
    fast.enable_padding(pad_id=hf_tokenizer.pad_token_id, pad_token=hf_tokenizer.pad_token)
    os.makedirs(tokenizer_dir, exist_ok=True)
    fast.save(os.path.join(tokenizer_dir, "tokenizer.json"))


def ensure_proxy(repository):
    """The proxy and supervisor models (config + code) in the repository, their code as model_source/'s now; a
    repository outside the project keeps a config.pbtxt it has (its settings are the user's)."""
    ours = os.path.abspath(repository) == serving_repository(PROJECT)
    for model in ("proxy", "supervisor"):
        copy_model_code(model, os.path.join(repository, model), keep_config=not ours)


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def install(staging, repository, names):
    """Move the staged models into the repository. A previous export of the same names loses its generated files
    first (ONNX in either layout, warm-up samples, tokenizer files); tracked files (model code) stay."""
    tokenizer, encoder = names[1], names[2]  # names: model_names(), and the late chunking model's
    remove(os.path.join(repository, encoder, "1", "model.onnx"))
    remove(os.path.join(repository, encoder, "warmup"))
    remove(os.path.join(repository, encoder, "batchstrategy.so"))
    remove(os.path.join(repository, encoder, "configs"))
    remove(os.path.join(repository, tokenizer, "configs"))
    version = os.path.join(repository, tokenizer, "1")
    for entry in os.listdir(version) if os.path.isdir(version) else []:
        if not entry.endswith(".py") and entry != "__pycache__":
            remove(os.path.join(version, entry))
    for model in names:
        shutil.copytree(os.path.join(staging, model), os.path.join(repository, model), dirs_exist_ok=True)
        readable_by_all(os.path.join(repository, model))


def readable_by_all(folder):
    """Folders 0755 and files 0644 (0755 where the owner may run them), whatever wrote them: onnx writes external
    data 0600, and tritonserver often runs as another user than the exporter (the image's triton-server, uid 1000;
    a repository synced to object storage or mounted into KServe)."""
    for root, _, files in os.walk(folder):  # root: the folder itself, then each folder under it
        os.chmod(root, os.stat(root).st_mode | 0o755)
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode):
                os.chmod(path, mode | (0o755 if mode & stat.S_IXUSR else 0o644))
