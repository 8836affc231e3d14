"""The static embedding family: a StaticEmbedding (sentence-transformers' or model2vec's layout), no transformer:
token rows averaged, behind the same tokenizer model, with its own tokenizer without the special tokens it never
adds; [→ Normalize]."""
import json
import types

from .. import fail
from ..reference import check_dense, load_reference

TITLE = "StaticEmbedding"  # the pipeline, as refusals name it
KIND = "static"  # export.json's `pipeline`
MODULES = ("StaticEmbedding", "Normalize")  # StaticEmbedding, Normalize optional
REFERENCE = "SentenceTransformer"
SPARSE_WIDTH = "tokens"  # (no sparse output)
# a static embedding's tokens per text when its tokenizer.json sets no truncation (sentence-transformers sets none;
# the tokenizer model needs one, and says when it cuts): --max-length changes it
STATIC_MAX_LENGTH = 2048


def build(args, folder, config, pipeline):
    """The graph of a StaticEmbedding folder, the tokenizer the tokenizer model serves, and the reference."""
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


def check(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged):
    """The reference check: the vectors (reference.check_dense)."""
    return check_dense(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged=ragged)


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

