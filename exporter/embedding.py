"""A text embedding export (the families of families.EMBEDDERS: encoder, SPLADE, static): the folder's pipeline
read (pipeline.py), its family's module builds the graph and loads the reference, and this writes the five models
(and the late chunking model where the token vectors are the embedding's space), checked against PyTorch (parity.py)
and the reference (the family's check) before anything is installed."""
import os
import tempfile
import time

from . import fail, weights
from .graph import OPSET, declared_dims, export_onnx, finalize_onnx
from .install import install_export
from .parity import parity_check
from .pipeline import read_pipeline
from .progress import mark
from .repository import (
    build_batch_strategy,
    chunks_name,
    model_names,
    remove_chunks,
    token_guard,
    warmup_lengths,
    write_chunks_config,
    write_configs,
    write_tokenizer,
    write_warmup,
)
from .vectors import calibrate, detect_dimensions, detect_prompts, write_muvera, write_prompts, write_vectors


def export(args, folder, config, repository, started):
    """The export of an embedding model's folder (its transformers config, or None: a static embedding's)."""
    pipeline = read_pipeline(folder, args.pooling)
    prompts, default_prompt = detect_prompts(folder)
    if not pipeline.include_prompt and prompts:
        fail("Pooling's include_prompt is false: pooling without the prompt's tokens needs the prompt's length in "
             "the graph, which this export does not build")
    family = pipeline.family  # families.EMBEDDERS: the module that builds this pipeline
    made = family.build(args, folder, config, pipeline)
    encoder, tokenizer, outputs, max_length, reference = (made.encoder, made.tokenizer, made.outputs,
                                                          made.max_length, made.reference)
    weights.check((encoder, weights.sample(tokenizer)))  # before anything is traced: no weight it reads is random
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
        if getattr(made, "tokenizer_files", None):  # the family's own files for the tokenizer model (a query lookup)
            made.tokenizer_files(os.path.join(staging, names[1], "1"))
        served_tokenizer = os.path.join(staging, names[1], "1", "tokenizer.json")
        mark("reference")
        figures["reference"] = family.check(reference, pipeline, onnx_path, served_tokenizer, prompts, min_cosine,
                                            args.ragged_batch)
        write_vectors(os.path.join(staging, names[3], "1"), dimensions, calibration)
        encoding = None
        if "colbert" in outputs:  # MUVERA's parameters beside the BLS model that encodes with them
            encoding = write_muvera(os.path.join(staging, names[3], "1"), getattr(args, "muvera", None),
                                    made.sizes["C"])
            made.sizes["M"] = encoding["size"]
        write_configs(staging, names, outputs, made.sizes, warmup, max_length, ragged=args.ragged_batch,
                      sparse_width=family.SPARSE_WIDTH, routes=tuple(getattr(made, "manifest", {}).get("routes", ())),
                      colbert_score=getattr(made, "manifest", {}).get("colbert_score", "mean"),
                      colbert_width=getattr(family, "COLBERT_WIDTH", "tokens-1"))
        if chunks:
            write_chunks_config(staging, names, chunks, dim, max_length)
            # the chunks' vectors are the embedding's space (above): the same widths and calibrated ranges
            write_vectors(os.path.join(staging, chunks, "1"), dimensions, calibration)
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
            "muvera": encoding,  # its parameters and size (model_library/muvera.py), exports with ColBERT outputs
            "fp16": args.fp16, "token_budget_batching": token_budget, "ragged_batch": args.ragged_batch,
            "opset": OPSET,
            "onnx": os.path.relpath(onnx_path, staging), "parity": figures,
            # the encoder's embedding_unnormalized (TEI's normalize: false), with a dense output only
            "unnormalized_output": "dense" in outputs,
            "served_names": args.served_names, "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **getattr(made, "manifest", {}),  # the family's own fields (a Router's routes)
        }
        install_export(staging, repository, tuple(m for m in (*names, chunks) if m), manifest, started)
    return 0
