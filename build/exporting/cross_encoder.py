"""Cross-encoders (sequence-classification models: bge-reranker-v2-m3, ms-marco-MiniLM...): what the model's config
says it is, the graph (a (query, passage) pair's token ids in, `logits` and `scores` out), and the parity check
against sentence-transformers' CrossEncoder.predict and FlagEmbedding's FlagReranker.compute_score.

Pairs are tokenized by the Triton tokenizer model with FlagReranker's rule: the query alone cut to
query_max_length (3/4 of max_length), then the passage cut so the pair fits max_length ('only_second'). For a query
shorter than the passage that is also CrossEncoder's rule ('longest_first' cuts the longer part first)."""
from . import fail

KINDS = ("embedding", "cross-encoder")
# The families whose pair layout is checked here: XLM-R / RoBERTa (<s> A </s></s> B </s>, no token types) and
# BERT ([CLS] A [SEP] B [SEP], token type 1 from the first [SEP] on, computed in the graph).
CROSS_ENCODER_TYPES = ("xlm-roberta", "roberta", "bert")
# Heads whose output an embedding export would silently drop: refused instead of served wrongly.
DROPPED_HEADS = ("ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice", "ForCausalLM",
                 "ForConditionalGeneration", "ForMaskedLM")
PARITY_QUERIES = ["what is the capital of France?", "q", "Triton Inference Server", "日本の首都は?"]
PARITY_PASSAGES = [
    "Paris is the capital and most populous city of France.",
    "short",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "Paris is the capital of France. " * 60,  # longer than small models' max length: the passage is cut
]


def detect_kind(config, sentence_transformers_folder=False):
    """'cross-encoder' for a sequence-classification model of a supported family, 'embedding' for an encoder;
    anything else stops the export with one line (it would be served as something it is not). A sentence-
    transformers folder is an embedder whatever head its config names (Qwen3-Embedding's says Qwen3ForCausalLM,
    all-mpnet-base-v2's MPNetForMaskedLM): sentence-transformers loads its base model, and so does the export."""
    architectures = list(getattr(config, "architectures", None) or [])
    for architecture in architectures:
        if architecture.endswith("ForSequenceClassification"):
            if config.model_type not in CROSS_ENCODER_TYPES:
                fail(f"{architecture} is a cross-encoder of a family this export does not check "
                     f"({config.model_type}); supported: {', '.join(CROSS_ENCODER_TYPES)}")
            return "cross-encoder"
        if architecture.endswith(DROPPED_HEADS) and not sentence_transformers_folder:
            fail(f"{architecture} has a head that an embedding export would drop; this export serves encoders "
                 f"(embeddings) and sequence-classification cross-encoders only")
    return "embedding"


def check_arguments(args):
    """The flags that mean nothing for a cross-encoder are refused, not ignored."""
    misplaced = [flag for flag, value in (("--pooling", args.pooling), ("--outputs", args.outputs)) if value]
    if misplaced:
        fail(f"{', '.join(misplaced)}: this model is a cross-encoder (sequence classification): it scores (query, "
             f"passage) pairs and has no pooling or embedding outputs")
    if args.name is None:
        fail("a cross-encoder is served beside the embedding models: give it a name with --name NAME "
             "(its models are NAME, NAME_tokenizer, NAME_embedding, NAME_bls and NAME_rerank)")


def uses_token_types(tokenizer):
    """Whether the references feed token types: the tokenizer gives them and its pair layout marks the second part
    (BERT); XLM-R's gives none (its models see zeros)."""
    if "token_type_ids" not in tokenizer.model_input_names:
        return False
    return any(tokenizer.backend_tokenizer.encode("a", "b").type_ids)


def build_cross_encoder(model, tokenizer):
    """The classifier with its activation: logits [n, labels] and scores (sigmoid of one logit, as CrossEncoder
    and FlagReranker(normalize=True); softmax of several, as CrossEncoder(apply_softmax=True))."""
    import torch

    labels = model.config.num_labels
    token_types, sep_token_id = uses_token_types(tokenizer), tokenizer.sep_token_id

    class CrossEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            extra = {}
            if token_types:  # BERT: 0 up to the first [SEP] included, 1 after it (padding is masked)
                sep = (input_ids == sep_token_id).to(torch.int64)
                extra["token_type_ids"] = ((torch.cumsum(sep, 1) - sep) > 0).to(torch.int64)
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
            scores = torch.sigmoid(logits) if labels == 1 else torch.softmax(logits, dim=-1)
            return logits, scores

    return CrossEncoder().eval()


def export_onnx(graph, tokenizer, path, opset):
    import torch

    sample = tokenizer(["export sample", "a query"], ["a passage", "a second, longer export passage"], padding=True,
                       return_tensors="pt")
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "logits": {0: "batch"}, "scores": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(graph, (sample["input_ids"], sample["attention_mask"]), path,
                          input_names=["input_ids", "attention_mask"], output_names=["logits", "scores"],
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)
    return path


def pair_ids(tokenizer, query, passage, max_length):
    """The tokenizer model's rule for one pair, with the same `tokenizers` calls (FlagReranker.compute_score's rule):
    the query cut to 3/4 of max_length, then the passage cut so the pair fits ('only_second')."""
    backend = tokenizer.backend_tokenizer
    q = backend.encode(query, add_special_tokens=False)
    q.truncate(max_length * 3 // 4)
    p = backend.encode(passage, add_special_tokens=False)
    p.truncate(max_length - len(q.ids) - backend.num_special_tokens_to_add(True))
    return backend.post_process(q, p, add_special_tokens=True).ids


def parity_check(folder, tokenizer, onnx_path, max_length, tolerance):
    """The ONNX graph on the tokenizer model's pairs against CrossEncoder.predict (activation as exported) and
    FlagReranker.compute_score (normalize off and on). Returns the figures; stops the export if they differ."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(max(1, torch.get_num_threads()))
    pairs = [(q, p) for q in PARITY_QUERIES for p in PARITY_PASSAGES]
    rows = [pair_ids(tokenizer, q, p, max_length) for q, p in pairs]
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    logits, scores = session.run(["logits", "scores"], {"input_ids": ids, "attention_mask": mask})
    reference = CrossEncoder(folder, max_length=max_length, device="cpu")
    labels = logits.shape[1]
    expected = reference.predict(pairs, apply_softmax=labels > 1, convert_to_numpy=True).reshape(len(pairs), -1)
    figures = {"pairs": len(pairs), "cross_encoder_max_abs_diff": float(np.abs(scores - expected).max())}
    if labels == 1:
        try:
            from FlagEmbedding import FlagReranker
        except ImportError:  # the oracle of the tests; exports without it are checked against CrossEncoder only
            figures["flag_reranker"] = "FlagEmbedding not installed"
        else:
            flag = FlagReranker(folder, use_fp16=False, devices="cpu", max_length=max_length)
            raw = np.asarray(flag.compute_score(pairs, max_length=max_length))
            normalized = np.asarray(flag.compute_score(pairs, max_length=max_length, normalize=True))
            figures["flag_reranker_max_abs_diff"] = float(np.abs(logits[:, 0] - raw).max())
            figures["flag_reranker_normalized_max_abs_diff"] = float(np.abs(scores[:, 0] - normalized).max())
    figures["truncated_pairs"] = int(sum(len(r) == max_length for r in rows))
    worst = max(v for k, v in figures.items() if k.endswith("_diff"))
    print(f"export: parity on {len(pairs)} pairs (one passage over max length) vs sentence-transformers "
          f"CrossEncoder and FlagEmbedding FlagReranker: {figures}")
    if worst > tolerance:
        fail(f"parity check failed: scores differ by {worst:.3g} > {tolerance} from the reference implementations")
    return figures
