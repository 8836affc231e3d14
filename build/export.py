"""Export a Hugging Face encoder into the Triton model repository.

    python build/export.py --model BAAI/bge-m3                       # dense + sparse + ColBERT (bge-m3's heads)
    python build/export.py --model sentence-transformers/all-MiniLM-L6-v2   # offline: pip package copy
    python build/export.py --model ./my-model --pooling mean --max-length 512 --repository /tmp/repo
    python build/export.py --model ./e5-small --name e5-small       # a second model beside the first
    python build/export.py --model BAAI/bge-reranker-v2-m3 --name reranker   # a cross-encoder (kind from config)

One export is five Triton models: a tokenizer (Python), an encoder (ONNX), the ensemble that clients call, its BLS
twin for many-text requests (length groups as concurrent encoder runs) and the rerank model; an embedding export
also has a late chunking model (`late_chunking`, or NAME_chunks: one vector per chunk of a text, pooled from the
encoder's `token_embeddings`). Without --name they are
the design card's `tokenizer`, `embedding`, `ensemble`, plus `ensemble_bls` and `rerank`; with --name NAME they are
`NAME_tokenizer`, `NAME_embedding`, `NAME`, `NAME_bls` and `NAME_rerank`. Export writes a serving repository
(default model_repository/, ignored by git as one folder; model_source/ holds the code and templates and is never
written):
  <encoder>/1/model.onnx          input_ids + attention_mask in; `embedding` (pooled, L2-normalized) out, plus
                                  bge-m3's sparse and ColBERT outputs when the folder has its heads, and
                                  `embedding_unnormalized` (the pooled vector before its L2 step)
  <encoder>/config.pbtxt          rendered from model_source/embedding/config.pbtxt.template
  <encoder>/warmup/*              model_warmup samples (a short and a long text)
  <encoder>/batchstrategy.so      token_budget.c compiled: encoder batches bounded by max_batch_tokens
  <encoder>/configs/gpu.pbtxt     the encoder on a GPU with the CUDA execution provider; configs/gpu-trt.pbtxt with
                                  TensorRT (Triton --model-config-name, launcher MODEL_CONFIG_NAME; docs/deploying.md),
                                  rendered from model_source/embedding/{gpu,gpu-trt}.pbtxt.template
  <tokenizer>/1/tokenizer.json    with the model's max length as its truncation
  <tokenizer>/1/prompts.json      the model's prompts (config_sentence_transformers.json), prepended on request
  <bls>/1/vectors.json            the widths served (Matryoshka) and the int8/uint8 ranges calibrated per width
                                  on build/calibration/corpus.txt (its README.md: provenance)
  <ensemble>/config.pbtxt         rendered from model_source/ensemble/config.pbtxt.template
  <ensemble>/1/export.json        what was exported (the proxy discovers models by this file)
  <bls>/config.pbtxt, <rerank>/config.pbtxt   rendered from model_source/{ensemble_bls,rerank}/config.pbtxt.template
Every export also copies its Python models' code from model_source/ (MODEL_CODE), with the library beside it, and
the proxy's and supervisor's. Everything is
built in a temporary folder and checked against PyTorch (every output) before it replaces anything in the
repository.

The kind comes from the model's config: a sequence-classification model (XLM-R, RoBERTa or BERT family) is a
cross-encoder, exported with --name as the same five models over (query, passage) pairs: NAME (pairs in, `logits`
and `scores` out), NAME_tokenizer (pair tokenization), NAME_embedding (the classifier), NAME_bls (pairs in length
groups) and NAME_rerank (query + documents), checked against sentence-transformers' CrossEncoder and
FlagEmbedding's FlagReranker (build/exporting/cross_encoder.py). Other heads are refused, not exported without them.

The work is done by build/exporting/ (source, graph, parity, repository); this file is the command: its flags and
the order of the steps.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import types

# `import exporting` (found in build/, this script's folder, without any install: the image's export stage), never
# `import build.exporting`: `build` is pypa's package name on PyPI.
from exporting import cache, clip, cross_encoder, fail, read_json
from exporting.graph import (
    OPSET,
    build_encoder,
    build_splade,
    build_static,
    declared_dims,
    export_onnx,
    finalize_onnx,
    load_head,
    traceable,
)
from exporting.parity import parity_check
from exporting.pipeline import POOLING_MODES, module_list, read_pipeline
from exporting.reference import check_dense, check_sparse, load_reference
from exporting.repository import (
    SERVING_REPOSITORY,
    SOURCE_REPOSITORY,
    build_batch_strategy,
    check_name,
    chunks_name,
    clip_image_names,
    ensure_proxy,
    install,
    model_names,
    refresh_code,
    remove_chunks,
    templates_digest,
    token_guard,
    warmup_lengths,
    write_chunks_config,
    write_clip_image_configs,
    write_configs,
    write_cross_encoder_configs,
    write_tokenizer,
    write_warmup,
)
from exporting.source import M3_HEADS, choose_outputs, detect_max_length, resolve_model
from exporting.vectors import (
    CALIBRATION_CORPUS,
    calibrate,
    detect_dimensions,
    detect_prompts,
    write_prompts,
    write_vectors,
)
from local_triton.run_stats import record

DEFAULT_MODEL = "BAAI/bge-m3"
# a static embedding's tokens per text when its tokenizer.json sets no truncation (sentence-transformers sets none;
# the tokenizer model needs one, and says when it cuts): --max-length changes it
STATIC_MAX_LENGTH = 2048


def parse_args(argv):
    return build_parser().parse_args(argv)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"hub id or local folder (default {DEFAULT_MODEL})")
    parser.add_argument("--name", help="serve it as its own models NAME, NAME_tokenizer, NAME_embedding, NAME_bls, "
                        "NAME_rerank beside the others (default: the design card's ensemble/tokenizer/embedding)")
    parser.add_argument("--outputs", help="comma-separated subset of dense,sparse,colbert (default: all the model "
                        "has: sparse and colbert need bge-m3's sparse_linear.pt / colbert_linear.pt)")
    parser.add_argument("--pooling", choices=POOLING_MODES, help="a folder without sentence-transformers files: "
                        "how its token vectors become one (default cls); a sentence-transformers folder's own "
                        "Pooling module decides for it")
    parser.add_argument("--max-length", type=int, help="tokens per text; longer texts are truncated "
                        "(default: the model's own limit)")
    parser.add_argument("--matryoshka-dims", help="comma-separated widths the model was trained to be truncated to "
                        "(default: its config's matryoshka_dimensions; none: only its full size)")
    parser.add_argument("--calibration-corpus", default=CALIBRATION_CORPUS, help="texts, one per line, whose "
                        "embeddings give the int8/uint8 ranges (default: build/calibration/corpus.txt)")
    parser.add_argument("--served-name", action="append", default=[], dest="served_names", metavar="NAME",
                        help="another name clients may call this export by (repeatable; e.g. text-embedding-3-small "
                             "for OpenAI tools with a fixed model name); another export's id always wins")
    parser.add_argument("--repository", default=SERVING_REPOSITORY,
                        help="the serving repository to write (default %(default)s)")
    parser.add_argument("--fp16", action="store_true", help="store weights in fp16 (GPU serving)")
    parser.add_argument("--external-data", action="store_true",
                        help="weights in one external data file (automatic above 2 GB)")
    parser.add_argument("--open-clip", metavar="ARCHITECTURE", help="export an open_clip CLIP model (e.g. ViT-B-32): "
                        "text and image towers; needs --name")
    parser.add_argument("--pretrained", help="with --open-clip: a pretrained tag (downloaded from the hub) or a "
                        "checkpoint file, as open_clip takes it; 'none' = random weights (tests)")
    parser.add_argument("--ragged-batch", action="store_true",
                        help="an encoder that takes ragged batches (Triton's allow_ragged_batch): one encoder run "
                             "holds texts of any widths, padded in the graph to the widest (text embeddings only; "
                             "measured against width groups in bench/TUNING.md)")
    parser.add_argument("--skip-if-exported", action="store_true",
                        help="do nothing when the repository holds an export of --model under this name "
                             "(or any, if no --model)")
    return parser


def already_exported(repository, name, model):
    """Whether --skip-if-exported skips: an export of `model` (any when None) rendered from today's templates."""
    manifest = read_json(repository, model_names(name)[0], "1", "export.json")
    if manifest is None or model not in (None, manifest.get("model")):
        return False
    if manifest.get("templates") != templates_digest():  # other templates, token_budget.c, library or graph: redone
        print("export: the config templates, the batching strategy, the models' library or the graph "
              "(build/exporting/graph.py) changed since this export: exporting again")
        return False
    return True


# The export cache's entry the export being made goes into (cache.py; None: off, or not cacheable), and its printout
CACHING = types.SimpleNamespace(key=None, printout=None, lock=None)


def main(argv=None):
    """The export, counted for the test suite's closing lines (local_triton/run_stats.py) by how it ended."""
    started, outcome = time.monotonic(), "refused"
    try:
        outcome = export(parse_args(argv))
        return 0
    finally:
        record("export", outcome=outcome, seconds=time.monotonic() - started)


def export(args):
    """The export `args` asks for; returns how it was made: "full", "cached" or "skipped"."""
    repository = os.path.abspath(args.repository)
    if repository == SOURCE_REPOSITORY:
        fail(f"--repository {args.repository}: that is the models' source (tracked); export writes a serving "
             f"repository (default {os.path.relpath(SERVING_REPOSITORY)})")
    if args.skip_if_exported and already_exported(repository, args.name, args.model):
        print(f"export: {repository} already holds an export{f' of {args.model}' if args.model else ''}; skipped")
        refresh_code(repository)  # the served code follows model_source/ and model_library/ (file copies)
        return "skipped"
    check_name(repository, args.name)
    started = time.monotonic()
    if args.ragged_batch and args.open_clip:
        fail("--ragged-batch: text embedding exports only (not --open-clip)")
    if not args.open_clip:
        args.model = args.model or DEFAULT_MODEL
    if cache.folder():
        CACHING.key = cache.key(args, args.pretrained if args.open_clip else resolve_model(args.model))
        CACHING.lock = CACHING.key and cache.hold(CACHING.key)
        hit = cache.lookup(CACHING.key)
        if hit:
            install_cached(*hit, args, repository, started)
            return "cached"
        if CACHING.key:
            CACHING.printout = sys.stdout = cache.Printout(sys.stdout)
    try:
        make_export(args, repository, started)
    finally:
        if CACHING.printout:
            sys.stdout = CACHING.printout.stream
    return "full"


def make_export(args, repository, started):
    """The export made by the exporter: the kind of model decides how."""
    if args.open_clip:
        return export_clip(args, repository, started)
    from transformers import AutoConfig, AutoTokenizer

    folder = resolve_model(args.model)
    modules = module_list(folder) or []
    # a static embedding folder has no transformers config (model2vec's config.json names no model_type)
    config = None if modules[:1] and modules[0][0] == "StaticEmbedding" else AutoConfig.from_pretrained(folder)
    if config is not None and config.model_type == "clip":
        if args.ragged_batch:
            fail("--ragged-batch: text embedding exports only (not CLIP)")
        return export_clip(args, repository, started, folder)
    kind = cross_encoder.detect_kind(config, sentence_transformers_folder=bool(modules)) if config else "embedding"
    if args.ragged_batch and kind == "cross-encoder":
        fail("--ragged-batch: text embedding exports only (not a cross-encoder)")
    if kind == "cross-encoder":
        cross_encoder.check_arguments(args)
        return export_cross_encoder(args, folder, config, AutoTokenizer.from_pretrained(folder), repository, started)
    pipeline = read_pipeline(folder, args.pooling)
    prompts, default_prompt = detect_prompts(folder)
    if not pipeline.include_prompt and prompts:
        fail("Pooling's include_prompt is false: pooling without the prompt's tokens needs the prompt's length in "
             "the graph, which this export does not build")
    made = {"dense": transformer_encoder, "splade": splade_encoder, "static": static_encoder}[pipeline.kind](
        args, folder, config, pipeline)
    encoder, tokenizer, outputs, max_length, reference = (made.encoder, made.tokenizer, made.outputs,
                                                          made.max_length, made.reference)
    names = model_names(args.name)
    dim = made.sizes.get("D")
    # Late chunking pools token vectors: they are the embedding's space only when nothing projects the pooled one.
    chunks = chunks_name(args.name) if "dense" in outputs and dim == made.sizes["H"] and not pipeline.projects \
        else None
    dimensions = detect_dimensions(folder, config, args.matryoshka_dims, dim)
    calibration = None
    if "dense" in outputs:
        calibration = calibrate(encoder, tokenizer, max_length, dimensions, prompts.get(default_prompt, ""),
                                args.calibration_corpus)
    print(f"export: {args.model} ({made.model_type}, {' → '.join(pipeline.modules or ['transformers'])}, "
          f"{'+'.join(pipeline.pooling) or pipeline.kind} pooling, max length {max_length}, dim {dim}, outputs "
          f"{','.join(outputs)}) → {repository} as {names[0]}")

    static_dims = declared_dims(outputs, made.sizes)
    warmup = warmup_lengths(max_length)
    with tempfile.TemporaryDirectory() as workdir:
        staging = os.path.join(workdir, "repository")
        token_budget = build_batch_strategy(os.path.join(staging, names[2]))
        onnx_path = finalize_onnx(export_onnx(encoder, tokenizer, outputs, workdir),
                                  os.path.join(staging, names[2], "1"), args.fp16, args.external_data, static_dims,
                                  token_guard(token_budget, names, max_length),
                                  tokenizer.pad_token_id if args.ragged_batch else None)
        min_cosine = 0.999 if args.fp16 else 0.9999
        figures = parity_check(encoder, tokenizer, onnx_path, outputs, max_length, min_cosine,
                               ragged=args.ragged_batch)
        write_tokenizer(tokenizer, max_length, os.path.join(staging, names[1], "1"))
        write_prompts(os.path.join(staging, names[1], "1"), prompts, default_prompt)
        served_tokenizer = os.path.join(staging, names[1], "1", "tokenizer.json")
        if pipeline.kind == "splade":
            figures["reference"] = check_sparse(reference, onnx_path, served_tokenizer, prompts,
                                                ragged=args.ragged_batch)
        else:
            figures["reference"] = check_dense(reference, pipeline, onnx_path, served_tokenizer, prompts,
                                               min_cosine, ragged=args.ragged_batch)
        write_vectors(os.path.join(staging, names[3], "1"), dimensions, calibration)
        write_configs(staging, names, outputs, made.sizes, warmup, max_length, ragged=args.ragged_batch,
                      sparse_width="vocabulary" if pipeline.kind == "splade" else "tokens")
        if chunks:
            write_chunks_config(staging, names, chunks, dim)
        else:
            remove_chunks(repository, args.name)
        write_warmup(staging, names[2], tokenizer, warmup)
        manifest = {
            "id": args.name or args.model, "kind": "embedding", "name": names[0], "tokenizer_model": names[1],
            "encoder_model": names[2],
            "bls_model": names[3], "rerank_model": names[4], "chunks_model": chunks,
            "model": args.model, "model_type": made.model_type, "pipeline": pipeline.kind,
            "pooling": "+".join(pipeline.pooling) or pipeline.kind, "modules": pipeline.modules, "outputs": outputs,
            "embedding_size": dim if "dense" in outputs else None, "hidden_size": made.sizes["H"],
            "colbert_size": made.sizes.get("C"), "max_length": max_length,
            "special_token_ids": made.special_ids, "dimensions": dimensions, "prompts": prompts,
            "default_prompt_name": default_prompt,
            "calibration": calibration and {k: v for k, v in calibration.items() if k != "ranges"},
            "fp16": args.fp16, "token_budget_batching": token_budget, "ragged_batch": args.ragged_batch,
            "opset": OPSET,
            "onnx": os.path.relpath(onnx_path, staging), "parity": figures,
            # the encoder's embedding_unnormalized (TEI's normalize: false), with a dense output only
            "unnormalized_output": "dense" in outputs,
            "served_names": args.served_names, "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        install_export(staging, repository, tuple(m for m in (*names, chunks) if m), manifest, started)
    return 0


def transformer_encoder(args, folder, config, pipeline):
    """A transformer (encoder or decoder) with its pooling and the modules after it, bge-m3's heads where the folder
    has them; the reference (sentence-transformers' class for the folder) holds the one model the graph wraps."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    outputs = choose_outputs(folder, args.outputs)
    if pipeline.projects and outputs != ["dense"]:
        fail(f"--outputs {','.join(outputs)}: bge-m3's heads read the hidden states of a model whose pipeline "
             f"({' → '.join(pipeline.modules)}) projects its pooled vector; export dense only")
    heads = {kind: load_head(folder, kind, config.hidden_size) for kind in outputs if kind in M3_HEADS}
    # FlagEmbedding's rule: these never carry lexical weight.
    special_ids = sorted({t for t in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                      tokenizer.unk_token_id) if t is not None})
    reference = load_reference(folder, pipeline, max_length)
    encoder = build_encoder(traceable(reference[0].auto_model.eval()), pipeline.pooling, outputs, heads, special_ids,
                            [reference[i] for i in pipeline.dense_modules])
    dim = embedding_size(encoder, tokenizer) if "dense" in outputs else config.hidden_size
    sizes = {"D": dim, "H": config.hidden_size, "C": heads["colbert"].out_features if "colbert" in heads else None}
    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=outputs, max_length=max_length,
                                 reference=reference, sizes=sizes, special_ids=special_ids,
                                 model_type=config.model_type)


def splade_encoder(args, folder, config, pipeline):
    """A SparseEncoder (MLMTransformer + SpladePooling): its vocabulary-wide weights as the sparse outputs bge-m3's
    serve (/embed_sparse, KServe's sparse_*), never a dense vector of the masked-LM's backbone."""
    from transformers import AutoTokenizer

    if args.outputs not in (None, "sparse"):
        fail(f"--outputs {args.outputs}: a SPLADE model (SparseEncoder) has the sparse output only")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    reference = load_reference(folder, pipeline, max_length)
    if getattr(reference, "max_active_dims", None):
        fail(f"config_sentence_transformers.json: max_active_dims {reference.max_active_dims} (the top weights "
             "only) is not built into the graph")
    splade = reference[1]
    encoder = build_splade(reference[0].auto_model.eval(), splade.pooling_strategy, splade.activation_function)
    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=["sparse"], max_length=max_length,
                                 reference=reference, sizes={"H": config.hidden_size}, special_ids=[],
                                 model_type=config.model_type)


def static_encoder(args, folder, config, pipeline):
    """A StaticEmbedding (sentence-transformers' or model2vec's layout): token rows averaged, behind the same
    tokenizer model; its own tokenizer, without the special tokens it never adds."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if args.outputs not in (None, "dense"):
        fail(f"--outputs {args.outputs}: a static embedding model has the dense output only")
    reference = load_reference(folder, pipeline, None)
    static = reference[0]
    spec = json.loads(static.tokenizer.to_str())  # a copy: the reference keeps its own
    spec["post_processor"] = None  # StaticEmbedding tokenizes with add_special_tokens=False
    fast = Tokenizer.from_str(json.dumps(spec))
    max_length = args.max_length or (fast.truncation or {}).get("max_length") or STATIC_MAX_LENGTH
    static.tokenizer.enable_truncation(max_length)  # the reference at the export's max length, as for transformers
    fast.no_padding()
    pad = next((t for t in ("[PAD]", "<pad>", "<unk>", "[UNK]") if fast.token_to_id(t) is not None), None)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=fast, pad_token=pad or fast.id_to_token(0))
    table = static.embedding.weight
    encoder = build_static(table)
    dim = int(table.shape[1])
    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=["dense"], max_length=max_length,
                                 reference=reference, sizes={"D": dim, "H": dim}, special_ids=[],
                                 model_type="static")


def embedding_size(encoder, tokenizer):
    """The width of the graph's `embedding`: the last module's output (a Dense module's, or the pooled modes')."""
    import torch

    sample = tokenizer(["size"], return_tensors="pt")
    with torch.no_grad():
        return int(encoder(sample["input_ids"], sample["attention_mask"])[0].shape[-1])


def install_export(staging, repository, names, manifest, started):
    """The staged export, its manifest beside the ensemble, moved into the repository (with the proxy), and kept in
    the export cache when it is on."""
    with open(os.path.join(staging, names[0], "1", "export.json"), "w", encoding="utf-8") as handle:
        json.dump({**manifest, "templates": templates_digest()}, handle, indent=2)
    if CACHING.key:
        cache.store(CACHING.key, staging, names, repository, manifest, CACHING.printout.copy.getvalue())
    os.makedirs(repository, exist_ok=True)
    install(staging, repository, names)
    ensure_proxy(repository)
    print(f"export: done in {time.monotonic() - started:.1f} s")


def install_cached(staging, meta, args, repository, started):
    """An export from the cache: installed as install_export installs the one it copies (an embedding export
    without a late chunking model removes an earlier one, as export() does)."""
    names = tuple(meta["names"])
    with tempfile.TemporaryDirectory() as workdir:
        copy = cache.restore(staging, meta, workdir, repository, args)
        manifest = read_json(copy, names[0], "1", "export.json")
        if manifest["kind"] == "embedding" and not manifest.get("chunks_model"):
            remove_chunks(repository, args.name)
        os.makedirs(repository, exist_ok=True)
        install(copy, repository, names)
        ensure_proxy(repository)
    print(f"export: done in {time.monotonic() - started:.1f} s, a copy from the export cache "
          f"({cache.ENVIRONMENT}: {os.path.join(cache.folder(), CACHING.key)})")


def export_cross_encoder(args, folder, config, tokenizer, repository, started):
    """A sequence-classification model: (query, passage) pairs in, logits and scores out; the five models over pairs."""
    import torch
    from transformers import AutoModelForSequenceClassification

    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    decoder = cross_encoder.is_decoder(config)
    if decoder and tokenizer.pad_token_id is None:
        fail(f"{args.model}: the tokenizer has no pad token, which CrossEncoder (and the tokenizer model) pad with")
    reference = cross_encoder.load_reference(folder, max_length)
    template = cross_encoder.pair_template(reference, tokenizer)  # refused here, before the graph is traced
    graph = cross_encoder.build_cross_encoder(model, tokenizer)
    names = model_names(args.name)
    labels = config.num_labels
    layout = ", pairs through its chat template" if template else ""
    print(f"export: {args.model} (cross-encoder, {config.model_type}, {labels} label(s), max length {max_length}"
          f"{layout}) → {repository} as {names[0]}")
    warmup = warmup_lengths(max_length)
    with tempfile.TemporaryDirectory() as workdir:
        staging = os.path.join(workdir, "repository")
        exported = cross_encoder.export_onnx(graph, tokenizer, os.path.join(workdir, "model.onnx"), OPSET)
        token_budget = build_batch_strategy(os.path.join(staging, names[2]))
        onnx_path = finalize_onnx(exported, os.path.join(staging, names[2], "1"), args.fp16, args.external_data,
                                  {"logits": [labels], "scores": [labels]},
                                  token_guard(token_budget, names, max_length))
        figures = cross_encoder.parity_check(folder, tokenizer, onnx_path, max_length, 1e-2 if args.fp16 else 1e-4,
                                             reference, template, decoder)
        write_tokenizer(tokenizer, max_length, os.path.join(staging, names[1], "1"))
        cross_encoder.write_pair_template(os.path.join(staging, names[1], "1"), template)
        write_cross_encoder_configs(staging, names, labels, warmup, max_length)
        write_warmup(staging, names[2], tokenizer, warmup)
        manifest = {
            "id": args.name, "kind": "cross-encoder", "name": names[0], "tokenizer_model": names[1],
            "encoder_model": names[2], "bls_model": names[3], "rerank_model": names[4], "model": args.model,
            "model_type": config.model_type, "num_labels": labels, "outputs": ["logits", "scores"],
            # the classifier's label names (TEI's /predict and /info answer with them)
            "labels": [str((config.id2label or {}).get(i, f"LABEL_{i}")) for i in range(labels)],
            "embedding_size": None, "colbert_size": None, "max_length": max_length, "fp16": args.fp16,
            "token_budget_batching": token_budget, "opset": OPSET, "onnx": os.path.relpath(onnx_path, staging),
            "parity": figures, "served_names": args.served_names, "pair_template": template is not None,
            "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        install_export(staging, repository, names, manifest, started)
    return 0


def export_clip(args, repository, started, folder=None):
    """A CLIP model (open_clip, or a Hugging Face CLIP folder): the text side as a text export (ensemble NAME,
    NAME_tokenizer, the text tower NAME_embedding, NAME_bls) and the image side (ensemble NAME_image, the
    preprocessing model NAME_image_preprocess, the image tower NAME_image_embedding). No rerank, no late chunking."""
    import types

    import torch

    from exporting import image_config

    if args.name is None:
        fail("a CLIP export needs --name (its models are NAME, NAME_image, ...)")
    if args.outputs or args.pooling or args.max_length or args.matryoshka_dims or args.fp16:
        fail("--outputs, --pooling, --max-length, --matryoshka-dims and --fp16 do not apply to CLIP exports")
    if args.open_clip:
        if not args.pretrained:
            fail("--open-clip needs --pretrained: a tag (e.g. laion2b_s34b_b79k), a checkpoint file, or none "
                 "(random weights, for tests)")
        pretrained = None if args.pretrained.lower() == "none" else args.pretrained
        model, preprocess, simple = clip.load_open_clip(args.open_clip, pretrained)
        tokenizer = clip.fast_tokenizer_of(simple)
        reference = types.SimpleNamespace(source="open_clip", model=model, tokenize=simple,
                                          end_id=simple.eot_token_id)
        pixels = image_config.from_open_clip(model, preprocess)
        args.model, architecture, cleaning = f"open_clip:{args.open_clip}", args.open_clip, "open_clip"
        if pretrained is None:
            print("export: warning: --pretrained none: random weights (for tests and benchmarks, not for search)")
    else:
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

        if args.pretrained:
            fail("--pretrained goes with --open-clip; a Hugging Face folder carries its weights")
        model = CLIPModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        reference = types.SimpleNamespace(source="transformers", model=model, tokenizer=tokenizer)
        pixels = image_config.from_hf_processor(CLIPImageProcessor.from_pretrained(folder))
        architecture, pretrained, cleaning = "clip", None, None
    text_tower, image_tower = clip.build_towers(model, reference.source)
    image_size = (pixels["height"], pixels["width"])
    with torch.no_grad():
        dim = int(image_tower(torch.zeros(1, 3, *image_size)).shape[-1])
    names = model_names(args.name)[:4] + (None,)  # no rerank model
    image_names = clip_image_names(args.name)
    print(f"export: {args.model} (CLIP from {reference.source}, pretrained {pretrained}, {dim}-d, image "
          f"{image_size[0]}x{image_size[1]}, text {clip.CONTEXT_LENGTH} tokens) → {repository} as {args.name}, "
          f"{image_names[0]}")
    calibration = calibrate(lambda ids, mask: (text_tower(ids, mask),), tokenizer, clip.CONTEXT_LENGTH, [dim], "",
                            args.calibration_corpus)
    warmup = warmup_lengths(clip.CONTEXT_LENGTH)
    with tempfile.TemporaryDirectory() as workdir:
        staging = os.path.join(workdir, "repository")
        text_path, image_path = clip.export_towers(text_tower, image_tower, tokenizer, image_size, workdir)
        token_budget = build_batch_strategy(os.path.join(staging, names[2]))
        text_onnx = finalize_onnx(text_path, os.path.join(staging, names[2], "1"), False, args.external_data,
                                  {"embedding": [dim]}, token_guard(token_budget, names, clip.CONTEXT_LENGTH))
        image_onnx = finalize_onnx(image_path, os.path.join(staging, image_names[2], "1"), False,
                                   args.external_data, {"embedding": [dim]})
        figures = clip.parity_check(reference, tokenizer, text_onnx, image_onnx, image_size, 0.9999)
        write_tokenizer(tokenizer, clip.CONTEXT_LENGTH, os.path.join(staging, names[1], "1"))
        if cleaning:
            clip.write_text_cleaning(os.path.join(staging, names[1], "1"), cleaning)
        write_vectors(os.path.join(staging, names[3], "1"), [dim], calibration)
        # the text tower's graph (clip.py) returns `embedding` only: no embedding_unnormalized, no token_embeddings
        write_configs(staging, names, ["dense"], {"D": dim}, warmup, clip.CONTEXT_LENGTH, encoder_only=(),
                      with_dense=())
        write_warmup(staging, names[2], tokenizer, warmup)
        write_clip_image_configs(staging, args.name, *image_size, dim)
        image_config.write_preprocess(os.path.join(staging, image_names[1], "1"), pixels)
        manifest = {
            "id": args.name, "kind": "clip", "name": names[0], "tokenizer_model": names[1],
            "encoder_model": names[2], "bls_model": names[3], "rerank_model": None, "chunks_model": None,
            "image_model": image_names[0], "image_preprocess_model": image_names[1],
            "image_encoder_model": image_names[2], "model": args.model, "source": reference.source,
            "architecture": architecture, "pretrained": pretrained, "outputs": ["dense"], "embedding_size": dim,
            "colbert_size": None, "max_length": clip.CONTEXT_LENGTH, "image_size": list(image_size),
            "text_cleaning": cleaning, "dimensions": [dim], "prompts": {}, "default_prompt_name": None,
            "calibration": {k: v for k, v in calibration.items() if k != "ranges"}, "fp16": False,
            "token_budget_batching": token_budget, "opset": OPSET, "parity": figures,
            "onnx": [os.path.relpath(p, staging) for p in (text_onnx, image_onnx)],
            "served_names": args.served_names, "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        install_export(staging, repository, (*names[:4], *image_names), manifest, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
