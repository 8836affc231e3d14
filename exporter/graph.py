"""The ONNX graph every text embedding export shares: its outputs (OUTPUT_TENSORS, by output family: dense,
sparse, ColBERT, the vector before its L2 step, the token vectors), the module a model family builds (families/:
the encoder with its pooling, normalization and bge-m3's heads; SPLADE; static) exported with torch.onnx, then
finalized for Triton's onnxruntime backend (static output dims, IR version, optional fp16, external data above
protobuf's 2 GB, the token guard, ragged inputs).

This file and the family modules decide what every text embedding export's encoder returns: the export digest
(repository.templates_digest) covers them, so `make serve` re-exports an export made from another version."""
import os

from .progress import staged

OPSET = 17  # onnxruntime 1.18.1 (tritonserver 24.07) runs opset <= 20 and IR <= 9
MAX_IR_VERSION = 9
ONNX_PROTOBUF_LIMIT = 2 * 1024**3
# Graph outputs of each family: (name, Triton type, dims after the batch dim; "D" = the embedding's size (the last
# module's), "H" = the hidden size, "C" = ColBERT dim)
OUTPUT_TENSORS = {
    "dense": [("embedding", "TYPE_FP32", ["D"])],
    "sparse": [("sparse_indices", "TYPE_INT64", [-1]), ("sparse_values", "TYPE_FP32", [-1]),
               ("sparse_count", "TYPE_INT32", [1])],
    "colbert": [("colbert_vectors", "TYPE_FP32", [-1, "C"]), ("colbert_length", "TYPE_INT32", [1])],
    # the pooled dense vector before its L2 step (mean or CLS pooling; bge-m3's dense is CLS): what
    # SentenceTransformer.encode(normalize_embeddings=False) gives without a Normalize module, and TEI serves for
    # `normalize: false`. Every text export with `dense` has it, and the ensembles expose it (ensemble_bls asks the
    # encoder for it only for a request that asks for it); normalizing it gives `embedding`. Computed anyway: it is
    # the L2 step's input.
    "unnormalized": [("embedding_unnormalized", "TYPE_FP32", ["D"])],
    # the encoder's last hidden state, before pooling: the late chunking model pools it per chunk. Every embedding
    # export has it (the encoder's own output, not the ensemble's): it is computed anyway, and sent only when asked.
    "tokens": [("token_embeddings", "TYPE_FP32", [-1, "H"])],
}
ENCODER_ONLY = ("tokens",)  # families of the encoder graph that the ensembles do not expose
WITH_DENSE = ("unnormalized",)  # families a text export has whenever it has `dense` (not in export.json's outputs)


def public_families(outputs, with_dense=WITH_DENSE):
    """The families the ensembles expose: the chosen ones (export.json's `outputs`), then those that come with
    `dense` (with_dense=(): a graph without them, CLIP's text tower)."""
    return [*outputs, *(with_dense if "dense" in outputs else ())]


def graph_families(outputs):
    """The output families of an embedding graph, in its outputs' order: the public ones, then the encoder-only ones."""
    return [*public_families(outputs), *ENCODER_ONLY]


def output_names(outputs):
    """The graph's outputs: the chosen families', those that come with dense, then the encoder-only ones."""
    return [name for kind in graph_families(outputs) for name, _, _ in OUTPUT_TENSORS[kind]]


def declared_dims(outputs, sizes):
    """{output name: dims after the batch dim} with "D", "H" and "C" replaced by `sizes` (-1 stays dynamic)."""
    return {name: [sizes.get(d, d) for d in dims]
            for kind in graph_families(outputs) for name, _, dims in OUTPUT_TENSORS[kind]}


@staged("trace")
def export_onnx(encoder, tokenizer, outputs, workdir):
    import torch

    sample = tokenizer(["export sample", "a second, longer export sample"], padding=True, return_tensors="pt")
    path = os.path.join(workdir, "model.onnx")
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    for kind in graph_families(outputs):
        for name, _, dims in OUTPUT_TENSORS[kind]:
            axes[name] = {0: "batch", **{i + 1: f"{name}_{i}" for i, d in enumerate(dims) if d == -1}}
    with torch.no_grad():
        torch.onnx.export(encoder, (sample["input_ids"], sample["attention_mask"]), path,
                          input_names=["input_ids", "attention_mask"], output_names=output_names(outputs),
                          dynamic_axes=axes, opset_version=OPSET, do_constant_folding=True, dynamo=False)
    return path


def token_guard_message(budget, encoder, splitter):
    """The guard node's name: onnxruntime quotes it in the error of a request the guard refuses."""
    return (f"request over max_batch_tokens: more than {budget} padded tokens (rows x width of input_ids, shapes "
            f"below) in one run of model '{encoder}'; send it through '{splitter}', which splits it")


def add_token_guard(model, budget, message):
    """Refuse, before any real work, a run of more than `budget` padded tokens (rows x width of input_ids).

    Triton's batcher cannot refuse a request: token_budget.c closes a batch before it passes max_batch_tokens, but
    the first request of a batch is always taken (core 24.07 only logs an error from the include function, and not
    taking a batch's first request would stall the queue), so a direct call to the encoder with rows x width over
    the budget would run whole, however large. The guard lives in the graph, so it holds in Triton's C++
    onnxruntime backend too: Reshape(input_ids, [rows, width + over]) with over = 1 past the budget fails at once,
    and onnxruntime's error quotes the node's name (`message`) and both shapes. Everything downstream reads the
    reshaped input_ids, so nothing heavy runs first. A batch the strategy formed never passes the budget (a request
    over it is always alone), so the guard only ever refuses the request that is over it."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    if "input_ids" not in [i.name for i in graph.input]:
        return
    guarded = "input_ids_within_max_batch_tokens"

    def rename(nodes):
        for node in nodes:
            for i, name in enumerate(node.input):
                if name == "input_ids":
                    node.input[i] = guarded
            for attribute in node.attribute:  # subgraphs (If, Loop) may read input_ids from the outer scope
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    rename(sub.node)

    rename(graph.node)
    graph.initializer.extend([numpy_helper.from_array(np.array([budget], np.int64), "token_guard/budget"),
                              numpy_helper.from_array(np.array([1], np.int64), "token_guard/one"),
                              numpy_helper.from_array(np.array([0, 1], np.int64), "token_guard/width_axis")])
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["token_guard/shape"], name="token_guard/Shape"),
        helper.make_node("ReduceProd", ["token_guard/shape"], ["token_guard/tokens"], name="token_guard/Tokens",
                         keepdims=1),
        helper.make_node("LessOrEqual", ["token_guard/tokens", "token_guard/budget"], ["token_guard/fits"],
                         name="token_guard/Fits"),
        helper.make_node("Cast", ["token_guard/fits"], ["token_guard/fits64"], name="token_guard/Cast", to=7),
        helper.make_node("Sub", ["token_guard/one", "token_guard/fits64"], ["token_guard/over"],
                         name="token_guard/Over"),
        helper.make_node("Mul", ["token_guard/over", "token_guard/width_axis"], ["token_guard/extra"],
                         name="token_guard/Extra"),
        helper.make_node("Add", ["token_guard/shape", "token_guard/extra"], ["token_guard/new_shape"],
                         name="token_guard/NewShape"),
        helper.make_node("Reshape", ["input_ids", "token_guard/new_shape"], [guarded], name=message),
    ]
    for node in reversed(nodes):
        graph.node.insert(0, node)


RAGGED_LENGTHS = "row_lengths"  # the batch input Triton fills (BATCH_ITEM_SHAPE of input_ids): each row's width


def add_ragged_inputs(model, pad_id):
    """Let one encoder run hold requests of any widths (Triton's ragged batching, `--ragged-batch`).

    Triton's onnxruntime backend hands a ragged input to the graph as one flat 1-D tensor, every request's tokens
    back to back, and fills the batch input `row_lengths` ([rows, 1] int32, BATCH_ITEM_SHAPE) with each row's width.
    These nodes, put at the head of the graph, rebuild the padded [rows, widest] input_ids and attention_mask the rest
    of the graph reads: Gather(flat, start of row + position) where the position is inside the row, else `pad_id` and
    a mask of 0, so the added padding is the tokenizer's own and every row's outputs are those of the padded graph.
    Runs after add_token_guard, whose Shape then measures the rebuilt batch (rows x widest), what the run costs."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    rebuilt = {"input_ids": "ragged/input_ids", "attention_mask": "ragged/attention_mask"}

    def rename(nodes):
        for node in nodes:
            for i, name in enumerate(node.input):
                if name in rebuilt:
                    node.input[i] = rebuilt[name]
            for attribute in node.attribute:
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    rename(sub.node)

    rename(graph.node)
    graph.initializer.extend([numpy_helper.from_array(np.array(value, np.int64), f"ragged/{name}") for name, value in
                              (("zero", 0), ("one", 1), ("axis0", [0]), ("axis1", [1]), ("pad", pad_id))])
    node = helper.make_node
    nodes = [
        node("Squeeze", [RAGGED_LENGTHS, "ragged/axis1"], ["ragged/lengths32"], name="ragged/Squeeze"),
        node("Cast", ["ragged/lengths32"], ["ragged/lengths"], name="ragged/Cast", to=TensorProto.INT64),
        node("CumSum", ["ragged/lengths", "ragged/zero"], ["ragged/ends"], name="ragged/Ends"),
        node("Sub", ["ragged/ends", "ragged/lengths"], ["ragged/starts"], name="ragged/Starts"),
        node("ReduceMax", ["ragged/lengths"], ["ragged/width"], name="ragged/Width", keepdims=0),
        node("Range", ["ragged/zero", "ragged/width", "ragged/one"], ["ragged/positions"], name="ragged/Positions"),
        node("Unsqueeze", ["ragged/positions", "ragged/axis0"], ["ragged/columns"], name="ragged/Columns"),
        node("Unsqueeze", ["ragged/starts", "ragged/axis1"], ["ragged/row_starts"], name="ragged/RowStarts"),
        node("Unsqueeze", ["ragged/lengths", "ragged/axis1"], ["ragged/row_lengths"], name="ragged/RowLengths"),
        node("Less", ["ragged/columns", "ragged/row_lengths"], ["ragged/inside"], name="ragged/Inside"),
        node("Add", ["ragged/row_starts", "ragged/columns"], ["ragged/index"], name="ragged/Index"),
        node("Where", ["ragged/inside", "ragged/index", "ragged/zero"], ["ragged/safe_index"], name="ragged/Safe"),
        node("Gather", ["input_ids", "ragged/safe_index"], ["ragged/ids"], name="ragged/GatherIds", axis=0),
        node("Where", ["ragged/inside", "ragged/ids", "ragged/pad"], [rebuilt["input_ids"]], name="ragged/PadIds"),
        node("Gather", ["attention_mask", "ragged/safe_index"], ["ragged/mask"], name="ragged/GatherMask", axis=0),
        node("Where", ["ragged/inside", "ragged/mask", "ragged/zero"], [rebuilt["attention_mask"]],
             name="ragged/PadMask"),
    ]
    for item in reversed(nodes):
        graph.node.insert(0, item)
    for tensor in graph.input:
        if tensor.name in rebuilt:
            shape = tensor.type.tensor_type.shape
            while len(shape.dim) > 1:
                shape.dim.pop()
            shape.dim[0].Clear()
            shape.dim[0].dim_param = "tokens"
    graph.input.append(helper.make_tensor_value_info(RAGGED_LENGTHS, TensorProto.INT32, ["rows", 1]))


def ragged_feeds(input_ids, attention_mask):
    """A right-padded batch as Triton's ragged batching hands it to the graph when each row is its own request:
    every row's tokens (its padding left out) back to back, and each row's width."""
    import numpy as np

    lengths = np.maximum(attention_mask.sum(axis=1), 1)
    rows = [slice(r * input_ids.shape[1], r * input_ids.shape[1] + n) for r, n in enumerate(lengths)]
    return {"input_ids": np.concatenate([input_ids.reshape(-1)[r] for r in rows]),
            "attention_mask": np.concatenate([attention_mask.reshape(-1)[r] for r in rows]),
            RAGGED_LENGTHS: lengths.astype(np.int32).reshape(-1, 1)}


@staged("onnx")
def finalize_onnx(exported, version_dir, fp16, external_data, static_dims, token_guard=None, ragged_pad_id=None):
    """Fix the declared output shapes (Triton's ORT backend compares them with config.pbtxt exactly), optionally
    convert to fp16, add the token guard (token_guard = (budget, message): add_token_guard), take ragged inputs
    (ragged_pad_id, the tokenizer's pad id: add_ragged_inputs), and save in the layout Triton's ORT backend loads."""
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
    if token_guard is not None:
        add_token_guard(model, *token_guard)
    if ragged_pad_id is not None:
        add_ragged_inputs(model, ragged_pad_id)
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

