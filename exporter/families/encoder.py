"""The encoder family: a transformer (encoder, or decoder as the embedders built on one are) with sentence-
transformers' pipeline Transformer → Pooling (any of its modes, or several, concatenated) → Dense... → Normalize, or
a transformers folder with --pooling; bge-m3's sparse and ColBERT heads where the folder has them. The graph wraps
the reference's own model (sentence-transformers' class for the folder: loaded once) with its pooling, its Dense
modules and the L2 step, so it returns final, usable outputs, and the pooled vector before its L2 step (TEI's
`normalize: false`). A bidirectional decoder (Gemma3's, EmbeddingGemma) gets its masks built from plain tensor ops
(traceable()), after checking them equal to transformers' own."""
import inspect
import os
import types

from .. import fail
from ..reference import check_dense, load_reference
from ..source import M3_HEADS, choose_outputs, detect_max_length

TITLE = "Transformer"  # the pipeline, as refusals name it
KIND = "dense"  # export.json's `pipeline`
MODULES = ("Transformer", "Pooling", "Dense", "Normalize")  # the sentence-transformers modules it builds
REFERENCE = "SentenceTransformer"  # the class it is checked against (a folder without modules.json: its modules)
SPARSE_WIDTH = "tokens"  # bge-m3's sparse output: as wide as the text


def build(args, folder, config, pipeline):
    """A transformer (encoder or decoder) with its pooling and the modules after it, bge-m3's heads where the folder
    has them; the reference (sentence-transformers' class for the folder) holds the one model the graph wraps."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=args.trust_remote_code)
    # the reference at its own length first: the served length is the reference's (or refused naming both)
    reference = load_reference(folder, pipeline, None, args.trust_remote_code)
    own_length = reference.max_seq_length if pipeline.reference else None  # a folder's own, not ours
    max_length = args.max_length or detect_max_length(folder, config, tokenizer, own_length,
                                                      reference[0].auto_model, args.model)
    reference.max_seq_length = max_length  # both cut the long text at the same token
    outputs = choose_outputs(folder, args.outputs)
    if pipeline.projects and outputs != ["dense"]:
        fail(f"--outputs {','.join(outputs)}: bge-m3's heads read the hidden states of a model whose pipeline "
             f"({' → '.join(pipeline.modules)}) projects its pooled vector; export dense only")
    heads = {kind: load_head(folder, kind, config.hidden_size) for kind in outputs if kind in M3_HEADS}
    # FlagEmbedding's rule: these never carry lexical weight.
    special_ids = sorted({t for t in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                      tokenizer.unk_token_id) if t is not None})
    encoder = build_encoder(traceable(reference[0].auto_model.eval()), pipeline.pooling, outputs, heads, special_ids,
                            [reference[i] for i in pipeline.dense_modules])
    dim = embedding_size(encoder, tokenizer) if "dense" in outputs else config.hidden_size
    sizes = {"D": dim, "H": config.hidden_size, "C": heads["colbert"].out_features if "colbert" in heads else None}
    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=outputs, max_length=max_length,
                                 reference=reference, sizes=sizes, special_ids=special_ids,
                                 model_type=config.model_type)


def check(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged):
    """The reference check: the vectors (reference.check_dense)."""
    return check_dense(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged=ragged)


def embedding_size(encoder, tokenizer):
    """The width of the graph's `embedding`: the last module's output (a Dense module's, or the pooled modes')."""
    import torch

    sample = tokenizer(["size"], return_tensors="pt")
    with torch.no_grad():
        return int(encoder(sample["input_ids"], sample["attention_mask"])[0].shape[-1])


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

