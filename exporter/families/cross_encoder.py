"""Cross-encoders (sequence-classification models: bge-reranker-v2-m3, ms-marco-MiniLM, Qwen3-Reranker-seq-cls...):
what the model's config says it is, the graph (a (query, passage) pair's token ids in, `logits` and `scores` out),
and the parity check against sentence-transformers' CrossEncoder.predict (and FlagEmbedding's
FlagReranker.compute_score for the XLM-R / BERT families).

Pairs are tokenized by the Triton tokenizer model with FlagReranker's rule: the query alone cut to
query_max_length (3/4 of max_length), then the passage cut so the pair fits max_length ('only_second'). For a query
shorter than the passage that is also CrossEncoder's rule ('longest_first' cuts the longer part first).

A decoder reranker whose folder has a chat template (Qwen3-Reranker) is fed by CrossEncoder (sentence-transformers
>= 5.4) the template rendered over the roles query and document, tokenized as one text without special tokens, cut
at max_length from the right, and then, when cut, the template's tail token ids written back over the last tokens
(Transformer._restore_chat_template_suffix). The tokenizer model has no jinja2: the template is rendered here once
with markers into fixed text (prefix, between, suffix; pair_template.json beside tokenizer.json) and the tokenizer
model builds prefix + query + between + document + suffix itself, with the same cut and tail."""
import json
import os

from . import fail

KINDS = ("embedding", "cross-encoder")
# The families whose pair layout is checked here: XLM-R / RoBERTa (<s> A </s></s> B </s>, no token types) and
# BERT ([CLS] A [SEP] B [SEP], token type 1 from the first [SEP] on, computed in the graph).
CROSS_ENCODER_TYPES = ("xlm-roberta", "roberta", "bert")
# Decoders transformers classifies at the last token that is not config.pad_token_id (GenericForSequenceClassification);
# the dense ones the TorchScript exporter traces as Qwen3 does.
DECODER_TYPES = ("qwen3", "qwen2", "llama", "mistral", "ministral", "gemma", "gemma2", "gemma3_text")
PAIR_TEMPLATE = "pair_template.json"  # beside tokenizer.json in NAME_tokenizer/1
# Markers a template renders in place of the texts (private-use characters: no real text holds them), and texts it
# must carry through unchanged (spaces at the ends, case, markup, braces, quotes) to be served as fixed text.
QUERY_MARK, DOCUMENT_MARK = "\ue000query\ue001", "\ue000document\ue001"
TEMPLATE_PROBES = [("  What is <b>X</b>?  ", "\n Doc {{ x }} & 'single' \"double\"\t"), ("UPPER lower", "ünï 日本 🚀")]
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
            if config.model_type not in CROSS_ENCODER_TYPES + DECODER_TYPES:
                fail(f"{architecture} is a cross-encoder of a family this export does not check "
                     f"({config.model_type}); supported: {', '.join(CROSS_ENCODER_TYPES + DECODER_TYPES)}")
            if config.model_type in DECODER_TYPES:
                if getattr(config, "pad_token_id", None) is None:
                    fail(f"{architecture} has no pad_token_id in its config: transformers (and CrossEncoder) "
                         f"cannot find a decoder's last token in a padded batch without it")
                if getattr(config, "use_bidirectional_attention", False):
                    fail(f"{architecture} with use_bidirectional_attention is not a decoder reranker this export "
                         f"traces")
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


def is_decoder(config):
    return config.model_type in DECODER_TYPES


def build_cross_encoder(model, tokenizer):
    """The classifier with its activation: logits [n, labels] and scores (sigmoid of one logit, as CrossEncoder
    and FlagReranker(normalize=True); softmax of several, as CrossEncoder(apply_softmax=True)).

    A decoder's head reads the last token that is not config.pad_token_id (transformers' rule, whichever side is
    padded). The tokenizer model pads on the right with the tokenizer's pad id, which need not be the config's: the
    padded places are set to the config's pad id here, so the rule finds the token CrossEncoder's left-padded batch
    gives it (a text ending in that id, e.g. an EOS when pad == eos, is read where transformers reads it)."""
    import torch

    labels = model.config.num_labels
    token_types, sep_token_id = uses_token_types(tokenizer), tokenizer.sep_token_id
    pad_id = model.config.pad_token_id if is_decoder(model.config) else None

    class CrossEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            extra = {}
            if token_types:  # BERT: 0 up to the first [SEP] included, 1 after it (padding is masked)
                sep = (input_ids == sep_token_id).to(torch.int64)
                extra["token_type_ids"] = ((torch.cumsum(sep, 1) - sep) > 0).to(torch.int64)
            if pad_id is not None:
                input_ids = torch.where(attention_mask.to(torch.bool), input_ids, torch.full_like(input_ids, pad_id))
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


def load_reference(folder, max_length):
    """sentence-transformers' CrossEncoder on the folder, as the parity check and the pair template read it."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return CrossEncoder(folder, max_length=max_length, device="cpu")


def _render(reference, tokenizer, query, document):
    """The text CrossEncoder renders for one pair: its own messages (the input formatter's roles and content
    shape) through the folder's chat template, as apply_chat_template renders them before tokenizing."""
    module = reference[0]
    _, inputs = module.input_formatter.batch_to_message("text", {"text": [(query, document)]})
    return tokenizer.apply_chat_template(inputs["message"][0], tokenize=False)


def pair_template(reference, tokenizer):
    """None when CrossEncoder tokenizes pairs as pairs; for a folder whose pairs go through its chat template, the
    template as fixed text {prefix, between, suffix} around the query and the document, with suffix_ids (the tail
    CrossEncoder writes back over a cut row). A template that is not fixed text around the two texts unchanged
    (it transforms, escapes or reorders them, or depends on them) stops the export: the tokenizer model could not
    reproduce it."""
    module = reference[0]
    if "message" not in (getattr(module, "modality_config", None) or {}):
        return None
    why = None
    try:
        text = _render(reference, tokenizer, QUERY_MARK, DOCUMENT_MARK)
    except Exception as error:  # noqa: BLE001 - any template failure gets the one-line answer
        text, why = "", f"it fails to render: {type(error).__name__}: {error}"
    if why is None and (text.count(QUERY_MARK) != 1 or text.count(DOCUMENT_MARK) != 1):
        why = "it does not render the query and the document once each"
    elif why is None and text.index(QUERY_MARK) > text.index(DOCUMENT_MARK):
        why = "it renders the document before the query"
    if why is None:
        prefix, rest = text.split(QUERY_MARK)
        between, suffix = rest.split(DOCUMENT_MARK)
        for query, document in TEMPLATE_PROBES:
            if _render(reference, tokenizer, query, document) != prefix + query + between + document + suffix:
                why = "it changes the texts or the text around them"
                break
    if why is not None:
        fail(f"the chat template does not render a (query, document) pair as fixed text around the two texts "
             f"({why}); the tokenizer model serves prefix + query + between + document + suffix only")
    template = {"prefix": prefix, "between": between, "suffix": suffix}
    template["suffix_ids"] = _suffix_ids(tokenizer.backend_tokenizer, template)
    return template


def _suffix_ids(backend, template):
    """The tail CrossEncoder restores on a cut row: the token ids two renders with different texts ("0" and
    "1 2 3 4") share at their end, so none of the texts' own; none when they never differ."""
    renders = [backend.encode(template["prefix"] + filler + template["between"] + filler + template["suffix"],
                              add_special_tokens=False).ids for filler in ("0", "1 2 3 4")]
    count = 0
    for left, right in zip(reversed(renders[0]), reversed(renders[1])):
        if left != right:
            break
        count += 1
    return renders[0][len(renders[0]) - count:] if 0 < count < min(map(len, renders)) else []


def write_pair_template(tokenizer_dir, template):
    if template is not None:
        with open(os.path.join(tokenizer_dir, PAIR_TEMPLATE), "w", encoding="utf-8") as handle:
            json.dump(template, handle, indent=2, ensure_ascii=False)


def pair_ids(tokenizer, query, passage, max_length, template=None):
    """The tokenizer model's rule for one pair, with the same `tokenizers` calls. Without a template,
    FlagReranker.compute_score's: the query cut to 3/4 of max_length, then the passage cut so the pair fits
    ('only_second'). With one, CrossEncoder's: the rendered text cut at max_length, its tail written back."""
    backend = tokenizer.backend_tokenizer
    if template is not None:
        text = template["prefix"] + query + template["between"] + passage + template["suffix"]
        ids = backend.encode(text, add_special_tokens=False).ids[:max_length]
        keep = min(len(template["suffix_ids"]), len(ids))
        if len(ids) >= max_length and keep:
            ids = ids[:len(ids) - keep] + template["suffix_ids"][len(template["suffix_ids"]) - keep:]
        return ids
    q = backend.encode(query, add_special_tokens=False)
    q.truncate(max_length * 3 // 4)
    p = backend.encode(passage, add_special_tokens=False)
    p.truncate(max_length - len(q.ids) - backend.num_special_tokens_to_add(True))
    return backend.post_process(q, p, add_special_tokens=True).ids


def parity_pairs(tokenizer, decoder):
    """The pairs checked: every query with every passage, and for a decoder a passage ending in its pad token (an
    EOS where pad == eos: transformers then reads the token before it)."""
    passages = list(PARITY_PASSAGES)
    if decoder and tokenizer.pad_token:
        passages.append("The answer ends with the pad token" + tokenizer.pad_token)
    return [(q, p) for q in PARITY_QUERIES for p in passages]


def parity_check(folder, tokenizer, onnx_path, max_length, tolerance, reference=None, template=None, decoder=False):
    """The tokenizer model's token ids against CrossEncoder's own preprocessing, pair for pair, then the ONNX graph
    on those ids against CrossEncoder.predict (activation as exported) and, for the XLM-R / BERT families,
    FlagReranker.compute_score (normalize off and on). Returns the figures; stops the export if they differ."""
    import numpy as np
    import onnxruntime as ort

    reference = reference or load_reference(folder, max_length)
    pairs = parity_pairs(tokenizer, decoder)
    rows = [pair_ids(tokenizer, q, p, max_length, template) for q, p in pairs]
    features = reference.preprocess(pairs)
    for i, ((query, passage), row) in enumerate(zip(pairs, rows)):
        theirs = features["input_ids"][i][features["attention_mask"][i].bool()].tolist()
        if row != theirs:
            at = next((k for k, (a, b) in enumerate(zip(row, theirs)) if a != b), min(len(row), len(theirs)))
            fail(f"parity check failed: pair {i} ({query[:40]!r}, {passage[:40]!r}) is tokenized as {len(row)} ids, "
                 f"CrossEncoder's {len(theirs)}, first different at token {at}")
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    logits, scores = session.run(["logits", "scores"], {"input_ids": ids, "attention_mask": mask})
    labels = logits.shape[1]
    expected = reference.predict(pairs, apply_softmax=labels > 1, convert_to_numpy=True).reshape(len(pairs), -1)
    differences = np.abs(scores - expected).max(axis=1)
    figures = {"pairs": len(pairs), "same_token_ids": len(pairs),
               "cross_encoder_max_abs_diff": float(differences.max())}
    worst_pair = int(differences.argmax())
    if labels == 1 and not decoder:
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
    if template is not None:
        figures["pair_template"] = True
    worst = max(v for k, v in figures.items() if k.endswith("_diff"))
    oracles = "sentence-transformers CrossEncoder" + ("" if decoder else " and FlagEmbedding FlagReranker")
    print(f"export: parity on {len(pairs)} pairs (one passage over max length) vs {oracles}: {figures}")
    if worst > tolerance:
        query, passage = pairs[worst_pair]
        fail(f"parity check failed: scores differ by {worst:.3g} > {tolerance} from the reference implementations "
             f"(CrossEncoder's worst: pair {worst_pair}, {query[:40]!r}, {passage[:40]!r})")
    return figures
