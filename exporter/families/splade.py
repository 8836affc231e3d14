"""The SPLADE family: a SparseEncoder (MLMTransformer → SpladePooling): the masked-LM's vocabulary-wide weights
served as the sparse outputs bge-m3's are (/embed_sparse, KServe's sparse_*), never a dense vector of its
backbone; checked against SparseEncoder.encode (reference.check_sparse)."""
import inspect
import types

from .. import fail
from ..reference import check_sparse, load_reference
from ..source import detect_max_length

TITLE = "MLMTransformer (SPLADE)"  # the pipeline, as refusals name it
KIND = "splade"  # export.json's `pipeline`
MODULES = ("MLMTransformer", "SpladePooling")  # exactly these, in this order
REFERENCE = "SparseEncoder"
SPARSE_WIDTH = "vocabulary"  # its sparse output: as wide as the fullest run, not the text (ensemble_bls)


def build(args, folder, config, pipeline):
    """The graph of a SparseEncoder folder, its tokenizer and its reference (the one model the graph wraps)."""
    tokenizer, max_length, reference = load(args, folder, config, pipeline, folder)
    splade = reference[1]
    encoder = build_splade(reference[0].auto_model.eval(), splade.pooling_strategy, splade.activation_function)
    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=["sparse"], max_length=max_length,
                                 reference=reference, sizes={"H": config.hidden_size}, special_ids=[],
                                 model_type=config.model_type)


def load(args, folder, config, pipeline, mlm_folder):
    """(tokenizer, max length, reference) of a SparseEncoder folder whose MLMTransformer is in `mlm_folder` (the
    folder itself, or a Router's document route: inference_free.py); one line for what the graph does not build."""
    from transformers import AutoTokenizer

    if args.outputs not in (None, "sparse"):
        fail(f"--outputs {args.outputs}: a SPLADE model (SparseEncoder) has the sparse output only")
    tokenizer = AutoTokenizer.from_pretrained(mlm_folder)
    max_length = args.max_length or detect_max_length(mlm_folder, config, tokenizer)
    reference = load_reference(folder, pipeline, max_length)
    if getattr(reference, "max_active_dims", None):
        fail(f"config_sentence_transformers.json: max_active_dims {reference.max_active_dims} (the top weights "
             "only) is not built into the graph")
    return tokenizer, max_length, reference


def check(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged):
    """The reference check: the sparse weights (reference.check_sparse)."""
    return check_sparse(reference, onnx_path, tokenizer_json, prompts, ragged=ragged)


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

