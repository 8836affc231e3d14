"""Inference-free SPLADE (opensearch-neural-sparse-encoding-doc-v2/v3): a SparseEncoder whose one module is a Router
(router_config.json). The document side is SPLADE (MLMTransformer → SpladePooling: splade.py's graph, the encoder);
the query side a token-weight lookup (SparseStaticEmbedding: a weight per vocabulary id, no encoder), which the
tokenizer model answers from the files written beside tokenizer.json (model_library/query_lookup.py). The request's
Router task (prompt_name, input_type) picks the side; none: the Router's default route. Checked against
SparseEncoder.encode_document (the graph) and encode_query (the lookup, by the served code)."""
import json
import os
import types

import numpy as np

from .. import fail, read_json
from ..parity import PARITY_TEXTS
from ..reference import check_ids, check_sparse, serving_batch
from ..repository import fast_tokenizer
from . import splade

TITLE = "Router (inference-free SPLADE)"  # the pipeline, as refusals name it
KIND = "inference_free"  # export.json's `pipeline`
MODULES = ("Router",)  # exactly this; its routes are read from router_config.json
REFERENCE = "SparseEncoder"
SPARSE_WIDTH = "vocabulary"  # the document side's: SPLADE's
# the routes this export builds, by their modules' classes: the lookup (query) and SPLADE (document)
LOOKUP = ("SparseStaticEmbedding",)
ENCODER = ("MLMTransformer", "SpladePooling")


def read_router(folder):
    """{task: [(class name, path)]} of router_config.json, and its default route; one line for anything else."""
    config = read_json(folder, "router_config.json") or read_json(folder, "config.json") or {}
    types_, structure = config.get("types") or {}, config.get("structure") or {}
    parameters = config.get("parameters") or {}
    if not structure:
        fail("router_config.json: no routes (structure) for the Router")
    if parameters.get("route_mappings"):
        fail(f"router_config.json: route_mappings {parameters['route_mappings']} (routes by modality) are not "
             "built; this export serves a Router of query and document routes")
    routes = {task: [(str(types_.get(path, "")).rsplit(".", 1)[-1], path) for path in paths]
              for task, paths in structure.items()}
    default = parameters.get("default_route")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(routes))
    for task, modules in routes.items():
        names = tuple(name for name, _ in modules)
        if names not in (LOOKUP, ENCODER):
            fail(f"router_config.json: route {task!r} is {' → '.join(names) or 'empty'}; this export builds "
                 f"{' → '.join(LOOKUP)} (a weight lookup) and {' → '.join(ENCODER)} (SPLADE) routes")
    kinds = {task: "lookup" if tuple(name for name, _ in modules) == LOOKUP else "encoder"
             for task, modules in routes.items()}
    if sorted(kinds.values()) != ["encoder", "lookup"] or default not in routes:
        fail(f"router_config.json: routes {kinds}, default {default!r}; this export builds one lookup route and "
             "one SPLADE route, with a default route among them")
    return routes, kinds, default


def config_folder(folder):
    """Where the encoder's transformers config is: the SPLADE route's MLMTransformer folder."""
    routes, kinds, _ = read_router(folder)
    encoder = next(task for task, kind in kinds.items() if kind == "encoder")
    return os.path.join(folder, routes[encoder][0][1])


def build(args, folder, config, pipeline):
    """The document side's graph (splade.build_splade), its tokenizer, the reference, and the query side's files
    for the tokenizer model (tokenizer_files) with the routes for export.json (manifest)."""
    routes, kinds, default = read_router(folder)
    encoder_task = next(task for task, kind in kinds.items() if kind == "encoder")
    lookup_task = next(task for task, kind in kinds.items() if kind == "lookup")
    tokenizer, max_length, reference = splade.load(args, folder, config, pipeline,
                                                   os.path.join(folder, routes[encoder_task][0][1]))
    router = reference[0]
    mlm, pooling = router.sub_modules[encoder_task]
    static = router.sub_modules[lookup_task][0]
    encoder = splade.build_splade(mlm.auto_model.eval(), pooling.pooling_strategy, pooling.activation_function)
    query_max_length = getattr(static.tokenizer, "model_max_length", None)
    if not isinstance(query_max_length, int) or not 0 < query_max_length < 1_000_000:
        fail(f"{routes[lookup_task][0][1]}: the query tokenizer has no max length (model_max_length "
             f"{query_max_length}), which SparseStaticEmbedding cuts queries at")
    weights = static.weight.detach().to("cpu").float().numpy().reshape(-1)

    def tokenizer_files(directory):
        write_query_side(directory, static.tokenizer, weights, kinds, default, query_max_length)

    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=["sparse"], max_length=max_length,
                                 reference=reference, sizes={"H": config.hidden_size}, special_ids=[],
                                 model_type=config.model_type, tokenizer_files=tokenizer_files,
                                 manifest={"routes": kinds, "default_route": default,
                                           "query_max_length": query_max_length})


def write_query_side(directory, hf_tokenizer, weights, kinds, default, max_length):
    """The tokenizer model's query side (model_library/query_lookup.py): query_side.json, query_tokenizer.json (the
    SparseStaticEmbedding's own tokenizer) and query_weights.npy."""
    from model_library import query_lookup

    fast = fast_tokenizer(hf_tokenizer)
    fast.no_padding()
    fast.enable_truncation(max_length)
    if fast.get_vocab_size(with_added_tokens=True) > len(weights):
        fail(f"the query side's weights hold {len(weights)} ids, fewer than its tokenizer's vocabulary "
             f"({fast.get_vocab_size(with_added_tokens=True)})")
    os.makedirs(directory, exist_ok=True)
    fast.save(os.path.join(directory, query_lookup.TOKENIZER_FILE))
    np.save(os.path.join(directory, query_lookup.WEIGHTS_FILE), weights.astype(np.float32))
    with open(os.path.join(directory, query_lookup.SIDE_FILE), "w", encoding="utf-8") as handle:
        json.dump({"routes": kinds, "default_route": default, "max_length": max_length}, handle, indent=2)


def check(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged):
    """Both sides: the graph against SparseEncoder.encode (the default route) and encode_document
    (reference.check_sparse), the query side's lookup (query_lookup.py, as the tokenizer model runs it from the
    files written) against encode_query: the same token ids, the same weights (within 1e-3)."""
    figures = check_sparse(reference, onnx_path, tokenizer_json, prompts, ragged=ragged)
    figures["document"] = check_document(reference, onnx_path, tokenizer_json, prompts)
    figures["query"] = check_query(reference, os.path.dirname(tokenizer_json), prompts)
    return figures


def check_document(reference, onnx_path, tokenizer_json, prompts, max_error=1e-3):
    """The graph on the served ids against SparseEncoder.encode_document (its prompt: document, passage or corpus)."""
    import onnxruntime as ort

    from model_library import request_rules

    name = request_rules.prompt(prompts, reference.default_prompt_name, None, "document", ValueError, ("document",))
    prefix = prompts.get(name, "") if name else ""
    served, ids, mask = serving_batch(tokenizer_json, [prefix + text for text in PARITY_TEXTS])
    features = reference.preprocess(PARITY_TEXTS, prompt=prefix or None, task="document")
    check_ids(served, [[int(t) for t, m in zip(row, keep) if m] for row, keep in
                       zip(features["input_ids"].tolist(), features["attention_mask"].tolist())], "document")
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    indices, values, counts = session.run(["sparse_indices", "sparse_values", "sparse_count"],
                                          {"input_ids": ids, "attention_mask": mask})
    want = reference.encode_document(PARITY_TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False,
                                     batch_size=len(PARITY_TEXTS)).numpy()
    return compare(indices, values, counts, want, "document", max_error, same_ids=False)


def check_query(reference, directory, prompts, max_error=1e-3):
    """The lookup on the query tokenizer's ids against SparseEncoder.encode_query (its prompt: query)."""
    from model_library import query_lookup, request_rules

    lookup = query_lookup.QueryLookup(directory)
    name = request_rules.prompt(prompts, reference.default_prompt_name, None, "query", ValueError, ("query",))
    prefix = prompts.get(name, "") if name else ""
    encodings = lookup.encode([prefix + text for text in PARITY_TEXTS])
    features = reference.preprocess(PARITY_TEXTS, prompt=prefix or None, task="query")
    check_ids([e.ids for e in encodings], [[int(t) for t, m in zip(row, keep) if m] for row, keep in
                                           zip(features["input_ids"].tolist(), features["attention_mask"].tolist())],
              "query")
    indices, values, counts = lookup.sparse([e.ids for e in encodings])
    want = reference.encode_query(PARITY_TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False,
                                  batch_size=len(PARITY_TEXTS)).numpy()
    return compare(indices, values, counts, want, "query", max_error)


def compare(indices, values, counts, want, side, max_error, same_ids=True):
    """Served sparse rows against the reference's dense rows: weights within max_error, and (same_ids) the same
    non-zero ids (the encoder's: an id only one side has weighs under max_error there, relu's edge)."""
    worst = 0.0
    for row in range(len(want)):
        count = int(counts[row, 0])
        got = np.zeros(want.shape[1], dtype=np.float32)
        got[indices[row, :count]] = values[row, :count]
        error = float(np.abs(got - want[row]).max())
        worst = max(worst, error)
        if error > max_error or same_ids and sorted(indices[row, :count].tolist()) != \
                np.flatnonzero(want[row]).tolist():
            fail(f"reference check failed ({side} side): text {row} ({PARITY_TEXTS[row][:40]!r}): sparse weights "
                 f"differ from SparseEncoder's by {error:.2e} ({count} non-zero here, {int((want[row] != 0).sum())} "
                 "there)")
    print(f"export: reference check ({side} side) vs SparseEncoder.encode_{side} on {len(want)} texts: "
          f"max_abs_diff {worst:.2e}")
    return {"max_abs_diff": worst, "non_zero": [int(c) for c in counts[:, 0]]}
