"""The ONNX graph: the Hugging Face encoder wrapped with its pooling, L2 normalization and bge-m3's heads (so the
graph returns final, usable outputs; and the pooled vector before its L2 step, TEI's `normalize: false`), exported
with torch.onnx, then finalized for Triton's onnxruntime backend (static output dims, IR version, optional fp16,
external data above protobuf's 2 GB).

This file decides what every text embedding export's encoder returns: the export digest
(repository.templates_digest) covers it, so `make serve` re-exports an export made from another version of it."""
import inspect
import os

from .source import M3_HEADS

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


def load_head(folder, kind, hidden_size):
    import torch

    state = torch.load(os.path.join(folder, M3_HEADS[kind]), map_location="cpu", weights_only=True)
    out_features = state["weight"].shape[0]
    head = torch.nn.Linear(hidden_size, out_features)
    head.load_state_dict(state)
    return head.eval()


FULL, SLIDING = "full_attention", "sliding_attention"


def traceable(model):
    """The model as the tracer can follow it. A bidirectional decoder (Gemma3 with use_bidirectional_attention:
    EmbeddingGemma) builds its masks in transformers 5 with torch.vmap over an autograd.Function, which the
    TorchScript exporter cannot trace (`unordered_map::at`): it gets its masks built here instead, with plain tensor
    ops, after audit_masks() found them equal to transformers' own. Every other model is traced as it is."""
    if not getattr(model.config, "use_bidirectional_attention", False):
        return model
    import torch

    if model.config._attn_implementation != "eager":
        raise ValueError("load the model with attn_implementation='eager'")
    audit_masks(model)

    class WithMasks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            masks = attention_masks(model.config, attention_mask, model.get_input_embeddings().weight.dtype)
            position_ids = (torch.cumsum(attention_mask, 1) - 1).clamp(min=0)  # 0..n-1 on each text's tokens
            return self.model(input_ids=input_ids, attention_mask=masks if len(masks) > 1 else masks[FULL],
                              position_ids=position_ids, use_cache=False)

    return WithMasks().eval()


def layer_types(config):
    """The mask each decoder layer uses, as the model's forward picks it."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds[:config.num_hidden_layers])
    return [SLIDING if getattr(config, "sliding_window", None) is not None else FULL] * config.num_hidden_layers


def attention_masks(config, attention_mask, dtype):
    """{layer type: additive [rows, 1, width, width] mask} of a bidirectional decoder, from the 2-D mask: a layer
    may attend to every real token (full), or to those less than sliding_window positions away (sliding; Gemma3's
    config already holds its half window). 0 where allowed, the dtype's minimum elsewhere (transformers' eager)."""
    import torch

    keep = attention_mask.to(torch.bool)[:, None, None, :]
    positions = torch.cumsum(torch.ones_like(attention_mask[0]), 0) - 1  # from the input's shape: stays dynamic
    distance = (positions[:, None] - positions[None, :]).abs()
    masks = {}
    for kind in dict.fromkeys(layer_types(config)):
        allowed = keep & (distance < config.sliding_window) if kind == SLIDING else keep & (distance >= 0)
        masks[kind] = torch.where(allowed, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)
    return masks


def audit_masks(model, rows=2):
    """traceable()'s masks against those transformers itself hands each layer, exactly, on a right-padded batch
    wider than every sliding window (the layers are swapped for a recorder meanwhile: no attention runs). A later
    transformers with other mask rules stops the export here rather than giving another model's vectors."""
    import torch

    config = model.config
    kinds = layer_types(config)
    width = max([16, *[config.sliding_window + 3 for k in kinds if k == SLIDING]])
    ids = torch.ones((rows, width), dtype=torch.long)
    mask = torch.ones((rows, width), dtype=torch.long)
    mask[0, width // 2 + 1:] = 0
    seen, layers = {}, model.layers[:config.num_hidden_layers]

    def recorder(i):
        def forward(hidden_states, *args, attention_mask=None, **kwargs):
            seen[i] = attention_mask
            return hidden_states
        return forward

    for i, layer in enumerate(layers):
        layer.forward = recorder(i)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for layer in layers:
            del layer.forward
    ours = attention_masks(config, mask, model.get_input_embeddings().weight.dtype)
    for i, kind in enumerate(kinds):
        theirs = seen.get(i)
        if theirs is None or theirs.dim() != 4:
            raise SystemExit(f"export: layer {i} of {type(model).__name__} got no 4-D mask from transformers; "
                             "this export cannot build its bidirectional attention")
        theirs = (theirs if theirs.dtype == torch.bool else theirs == 0).expand(rows, 1, width, width)
        if not torch.equal(theirs, ours[kind] == 0):
            raise SystemExit(f"export: layer {i} ({kind}) of {type(model).__name__}: transformers masks it "
                             "otherwise than this export would; refused rather than served with other attention")


def pool(modes, hidden, attention_mask):
    """sentence-transformers' Pooling over a right-padded batch, each mode as it defines it, concatenated in order.
    Rows always hold a real token (the tokenizer model refuses texts that give none)."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    positions = torch.arange(hidden.shape[1], dtype=attention_mask.dtype).unsqueeze(0)
    counts = mask.sum(1).clamp(min=1e-9)
    pooled = []
    for mode in modes:
        if mode == "cls":
            pooled.append(hidden[:, 0])  # right padding: the first real token is at 0
        elif mode == "max":
            pooled.append(hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            pooled.append((hidden * mask).sum(1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            pooled.append((hidden * mask).sum(1) / torch.sqrt(counts))
        elif mode == "weightedmean":  # position weights 1..width (no left padding to take off)
            weights = mask * (positions + 1).unsqueeze(-1).to(hidden.dtype)
            pooled.append((hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":  # the text's last token (the EOS a decoder embedder appends): right padding
            last = (attention_mask.sum(1) - 1).clamp(min=0)
            pooled.append(torch.gather(hidden * mask, 1, last.view(-1, 1, 1).expand(-1, 1, hidden.shape[2]))[:, 0])
        else:
            raise ValueError(f"pooling mode {mode}")
    return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)


def build_encoder(model, pooling, outputs, heads, special_ids, projections=()):
    """HF encoder + pooling (+ the sentence-transformers modules after it) + normalization (+ bge-m3's heads), so
    the ONNX graph returns final, usable outputs.

    pooling: a mode or a tuple of modes (pool()). projections: the Dense modules after Pooling, sentence-
      transformers' own objects (their activations as they load them), applied in order to the pooled vector.
    sparse (FlagEmbedding's lexical weights): relu(sparse_linear(hidden)) per token; special tokens and padding get
      weight 0; one weight per distinct token id, the maximum over its occurrences; zero weights dropped. Done in
      the graph with sorts only (opset 17): rank tokens by weight, sort by (id, rank) so each id's run starts with
      its largest weight, keep run starts, then sort those by weight. Returned padded to the row width:
      sparse_indices (-1 past sparse_count), sparse_values (0 past it), sparse_count.
    colbert: normalize(colbert_linear(hidden[:, 1:]) * mask[:, 1:]); colbert_length = real tokens - 1 vectors.
    Outputs in output_names' order: the families', then (with dense) the vector before normalize, then the
    last hidden state."""
    import torch

    takes_token_type_ids = "token_type_ids" in inspect.signature(model.forward).parameters
    modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.heads = torch.nn.ModuleDict(heads)
            self.projections = torch.nn.ModuleList(projections)

        def forward(self, input_ids, attention_mask):
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if takes_token_type_ids else {}
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            results = []
            if "dense" in outputs:
                pooled = pool(modes, hidden, attention_mask)
                for projection in self.projections:
                    pooled = projection({"sentence_embedding": pooled})["sentence_embedding"]
                results.append(torch.nn.functional.normalize(pooled, p=2.0, dim=1))
            if "sparse" in outputs:
                results += self.sparse(input_ids, attention_mask, hidden)
            if "colbert" in outputs:
                vectors = self.heads["colbert"](hidden[:, 1:]) * mask[:, 1:]
                length = (attention_mask.sum(1, keepdim=True) - 1).to(torch.int32)
                results += [torch.nn.functional.normalize(vectors, p=2.0, dim=-1), length]
            if "dense" in outputs:
                results.append(pooled)  # embedding_unnormalized (WITH_DENSE): the L2 step's input
            results.append(hidden)  # token_embeddings (ENCODER_ONLY), always last
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


def build_splade(model, pooling_strategy, activation):
    """A SparseEncoder's MLMTransformer + SpladePooling (SPLADE) as sentence-transformers computes them: the
    masked-LM logits, zero on padding before the activation (log1p(relu(x)), or log1p of that for `log1p_relu`),
    then the max (or sum) over the tokens: one weight per vocabulary id, special tokens' positions included. Out: the
    sparse family (sparse_indices, sparse_values, sparse_count: the non-zero weights by weight, -1 / 0 past each
    row's count, as wide as the run's largest count, at least 1) and token_embeddings (the last hidden state)."""
    import torch

    takes_token_type_ids = "token_type_ids" in inspect.signature(model.forward).parameters

    class Splade(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if takes_token_type_ids else {}
            result = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                                **extra)
            logits = result.logits * attention_mask.unsqueeze(-1).to(result.logits.dtype)
            weights = torch.log1p(torch.relu(logits))
            if activation == "log1p_relu":
                weights = torch.log1p(weights)
            weights = weights.amax(dim=1) if pooling_strategy == "max" else weights.sum(dim=1)
            count = (weights > 0).sum(dim=1, keepdim=True)
            # a tensor k: the tracer records a TopK whose k the graph computes, not the export sample's
            values, ids = torch.topk(weights, count.max().clamp(min=1), dim=1, largest=True, sorted=True)
            present = values > 0
            return (torch.where(present, ids, torch.full_like(ids, -1)), values * present.to(values.dtype),
                    count.to(torch.int32), result.hidden_states[-1])

    return Splade().eval()


def build_static(table):
    """A StaticEmbedding (no transformer): each token's row of `table` (its loaded weights, model2vec's per-token
    weights folded in), averaged over the text's tokens (EmbeddingBag's mean). Out: the dense family's embedding,
    embedding_unnormalized and token_embeddings (each token's row; zero on padding)."""
    import torch

    class Static(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(table.detach().to(torch.float32).clone(), requires_grad=False)

        def forward(self, input_ids, attention_mask):
            mask = attention_mask.unsqueeze(-1).to(self.table.dtype)
            tokens = torch.nn.functional.embedding(input_ids, self.table) * mask
            pooled = tokens.sum(1) / mask.sum(1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1), pooled, tokens

    return Static().eval()


def graph_families(outputs):
    """The families of build_encoder's graph, in its outputs' order: the public ones, then the encoder-only ones."""
    return [*public_families(outputs), *ENCODER_ONLY]


def output_names(outputs):
    """The graph's outputs: the chosen families', those that come with dense, then the encoder-only ones."""
    return [name for kind in graph_families(outputs) for name, _, _ in OUTPUT_TENSORS[kind]]


def declared_dims(outputs, sizes):
    """{output name: dims after the batch dim} with "D", "H" and "C" replaced by `sizes` (-1 stays dynamic)."""
    return {name: [sizes.get(d, d) for d in dims]
            for kind in graph_families(outputs) for name, _, dims in OUTPUT_TENSORS[kind]}


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

