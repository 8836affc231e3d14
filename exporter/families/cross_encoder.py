"""The cross-encoder family: sequence-classification models (bge-reranker-v2-m3, ms-marco-MiniLM, ms-marco-electra,
and the decoder rerankers of decoder_reranker.py): a (query, passage) pair's token ids in, `logits` and `scores` out;
the graph, the export (the five models over pairs), and the parity check against sentence-transformers'
CrossEncoder.predict (and FlagEmbedding's FlagReranker.compute_score for the encoder families). Which model types
are cross-encoders, and which of them decoders: families.CROSS_ENCODERS.

Pairs are tokenized by the Triton tokenizer model with FlagReranker's rule: the query alone cut to
query_max_length (3/4 of max_length), then the passage cut so the pair fits max_length ('only_second'). For a query
shorter than the passage that is also CrossEncoder's rule ('longest_first' cuts the longer part first). The pair
layouts of the encoder families: XLM-R / RoBERTa (<s> A </s></s> B </s>, no token types), ModernBERT's ([CLS] A
[SEP] B [SEP], no token types) and BERT's, which ELECTRA and DeBERTa-v2 share ([CLS] A [SEP] B [SEP], token type 1
from the first [SEP] on, computed in the graph: uses_token_types)."""
import os
import tempfile
import time
from dataclasses import dataclass, field

from .. import fail, weights
from ..graph import OPSET, finalize_onnx
from ..install import install_export
from ..progress import staged
from ..repository import (
    build_batch_strategy,
    model_names,
    token_guard,
    warmup_lengths,
    write_cross_encoder_configs,
    write_tokenizer,
    write_warmup,
)
from ..source import detect_max_length
from .decoder_reranker import pair_template, write_pair_template

DECODER = False  # an encoder: its classifier reads the first token
PARITY_QUERIES = ["what is the capital of France?", "q", "Triton Inference Server", "日本の首都は?"]
PARITY_PASSAGES = [
    "Paris is the capital and most populous city of France.",
    "short",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "Paris is the capital of France. " * 60,  # longer than small models' max length: the passage is cut
]


def check_config(config, architecture):
    """Nothing in an encoder's config keeps it from being served as CrossEncoder computes it."""


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


def build_cross_encoder(model, tokenizer, decoder=False):
    """The classifier with its activation: logits [n, labels] and scores (sigmoid of one logit, as CrossEncoder
    and FlagReranker(normalize=True); softmax of several, as CrossEncoder(apply_softmax=True)).

    A decoder's head reads the last token that is not config.pad_token_id (transformers' rule, whichever side is
    padded). The tokenizer model pads on the right with the tokenizer's pad id, which need not be the config's: the
    padded places are set to the config's pad id here, so the rule finds the token CrossEncoder's left-padded batch
    gives it (a text ending in that id, e.g. an EOS when pad == eos, is read where transformers reads it)."""
    import torch

    labels = model.config.num_labels
    token_types, sep_token_id = uses_token_types(tokenizer), tokenizer.sep_token_id
    pad_id = model.config.pad_token_id if decoder else None

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


@staged("trace")
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


def load_reference(folder, max_length, trust_remote_code=False):
    """sentence-transformers' CrossEncoder on the folder, as the parity check and the pair template read it (the
    folder's own code run when --trust-remote-code said so, as the graph's model is)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return CrossEncoder(folder, max_length=max_length, device="cpu", trust_remote_code=trust_remote_code)


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


def flag_reranker_ids(flag, pairs, max_length):
    """The ids FlagReranker.compute_score feeds its model for each pair, by its own preprocessing (the query cut to
    3/4 of max_length, the passage to max_length, then FlagEmbedding's pair preparation), or None where this
    FlagEmbedding has no such step to ask."""
    try:
        from FlagEmbedding.utils.tokenizer_compat import prepare_for_model_compat
    except ImportError:
        return None
    tokenizer, rows = flag.tokenizer, []
    for query, passage in pairs:
        q = tokenizer(query, add_special_tokens=False, max_length=max_length * 3 // 4, truncation=True)["input_ids"]
        p = tokenizer(passage, add_special_tokens=False, max_length=max_length, truncation=True)["input_ids"]
        rows.append(list(prepare_for_model_compat(tokenizer, q, p, truncation="only_second", max_length=max_length,
                                                  padding=False)["input_ids"]))
    return rows


@staged("parity")
def parity_check(folder, tokenizer, onnx_path, max_length, tolerance, reference=None, template=None, decoder=False,
                 trust_remote_code=False):
    """The tokenizer model's token ids against CrossEncoder's own preprocessing, pair for pair, then the ONNX graph
    on those ids against CrossEncoder.predict (activation as exported) and, for the XLM-R / BERT families,
    FlagReranker.compute_score (normalize off and on). Returns the figures; stops the export if they differ."""
    import numpy as np
    import onnxruntime as ort

    reference = reference or load_reference(folder, max_length, trust_remote_code)
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
            flag = FlagReranker(folder, use_fp16=False, devices="cpu", max_length=max_length,
                                trust_remote_code=trust_remote_code)
            theirs = flag_reranker_ids(flag, pairs, max_length)
            other = sum(a != b for a, b in zip(rows, theirs)) if theirs is not None else 0
            if other:  # not an oracle of this tokenizer: CrossEncoder (the reference) alone decides
                figures["flag_reranker"] = (f"not compared: it feeds other ids for {other} of {len(pairs)} pairs "
                                            "(FlagEmbedding's transformers-5 pairs: ids decoded, then tokenized again)")
            else:
                raw = np.asarray(flag.compute_score(pairs, max_length=max_length))
                normalized = np.asarray(flag.compute_score(pairs, max_length=max_length, normalize=True))
                figures["flag_reranker_max_abs_diff"] = float(np.abs(logits[:, 0] - raw).max())
                figures["flag_reranker_normalized_max_abs_diff"] = float(np.abs(scores[:, 0] - normalized).max())
    figures["truncated_pairs"] = int(sum(len(r) == max_length for r in rows))
    if template is not None:
        figures["pair_template"] = True
    worst = max(v for k, v in figures.items() if k.endswith("_diff"))
    oracles = "sentence-transformers CrossEncoder" + (" and FlagEmbedding FlagReranker"
                                                      if "flag_reranker_max_abs_diff" in figures else "")
    print(f"export: parity on {len(pairs)} pairs (one passage over max length) vs {oracles}: {figures}")
    if worst > tolerance:
        query, passage = pairs[worst_pair]
        fail(f"parity check failed: scores differ by {worst:.3g} > {tolerance} from the reference implementations "
             f"(CrossEncoder's worst: pair {worst_pair}, {query[:40]!r}, {passage[:40]!r})")
    return figures


def export(args, folder, config, repository, started, decoder=False):
    """A sequence-classification model: (query, passage) pairs in, logits and scores out; the five models over pairs.
    decoder: a decoder reranker (decoder_reranker.py): its head reads the last token that is not the pad id."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    trust = args.trust_remote_code  # the folder's own code, run by the graph's model and the reference alike
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32, trust_remote_code=trust,
                                                               attn_implementation="eager").eval()
    if decoder and tokenizer.pad_token_id is None:
        fail(f"{args.model}: the tokenizer has no pad token, which CrossEncoder (and the tokenizer model) pad with")
    reference = load_reference(folder, max_length, trust)
    template = pair_template(reference, tokenizer)  # refused here, before the graph is traced
    labels = config.num_labels
    layout = ", pairs through its chat template" if template else ""
    return install(args, folder, config, repository, started, Scorer(
        graph=build_cross_encoder(model, tokenizer, decoder), tokenizer=tokenizer, max_length=max_length,
        reference=reference, template=template, decoder=decoder, labels=labels,
        label_names=[str((config.id2label or {}).get(i, f"LABEL_{i}")) for i in range(labels)],
        title=f"cross-encoder, {config.model_type}, {labels} label(s), max length {max_length}{layout}"))


@dataclass
class Scorer:
    """What a pair-scoring export is made of, whatever its family computes: the graph (input_ids and attention_mask
    in, logits and scores out), the tokenizer and its pair template, the reference CrossEncoder (None where it
    cannot score the folder's pairs: more_checks is then the reference), the labels (TEI's
    /predict names them), and the family's own checks beyond CrossEncoder's (`more_checks(onnx_path, pairs, rows)`
    -> figures; it stops the export when they differ)."""
    graph: object
    tokenizer: object
    max_length: int
    reference: object
    template: dict | None
    decoder: bool
    labels: int
    label_names: list
    title: str
    more_checks: object = None
    manifest: dict = field(default_factory=dict)


def install(args, folder, config, repository, started, scorer):
    """The five models over pairs around `scorer`'s graph, checked against CrossEncoder (and the family's own
    checks), then installed."""
    tokenizer, max_length, labels, template = scorer.tokenizer, scorer.max_length, scorer.labels, scorer.template
    weights.check((scorer.graph, weights.sample(tokenizer, pairs=True)))  # no weight the graph reads is random
    names = model_names(args.name)
    print(f"export: {args.model} ({scorer.title}) → {repository} as {names[0]}")
    warmup = warmup_lengths(max_length)
    with tempfile.TemporaryDirectory() as workdir:
        staging = os.path.join(workdir, "repository")
        exported = export_onnx(scorer.graph, tokenizer, os.path.join(workdir, "model.onnx"), OPSET)
        token_budget = build_batch_strategy(os.path.join(staging, names[2]))
        onnx_path = finalize_onnx(exported, os.path.join(staging, names[2], "1"), args.fp16, args.external_data,
                                  {"logits": [labels], "scores": [labels]},
                                  token_guard(token_budget, names, max_length))
        tolerance = 1e-2 if args.fp16 else 1e-4
        if scorer.reference is not None:
            figures = parity_check(folder, tokenizer, onnx_path, max_length, tolerance, scorer.reference, template,
                                   scorer.decoder, args.trust_remote_code)
        else:  # CrossEncoder cannot score this folder's pairs (more_checks names the reference it is checked against)
            figures = {"cross_encoder": "does not render this folder's pairs", "pair_template": template is not None}
        if scorer.more_checks is not None:
            figures.update(scorer.more_checks(onnx_path, tolerance))
        write_tokenizer(tokenizer, max_length, os.path.join(staging, names[1], "1"))
        write_pair_template(os.path.join(staging, names[1], "1"), template)
        write_cross_encoder_configs(staging, names, labels, warmup, max_length)
        write_warmup(staging, names[2], tokenizer, warmup)
        manifest = {
            "id": args.name, "kind": "cross-encoder", "name": names[0], "tokenizer_model": names[1],
            "encoder_model": names[2], "bls_model": names[3], "rerank_model": names[4], "model": args.model,
            "model_type": config.model_type, "num_labels": labels, "outputs": ["logits", "scores"],
            # the classifier's label names (TEI's /predict and /info answer with them)
            "labels": scorer.label_names,
            "embedding_size": None, "colbert_size": None, "max_length": max_length, "fp16": args.fp16,
            "token_budget_batching": token_budget, "opset": OPSET, "onnx": os.path.relpath(onnx_path, staging),
            "parity": figures, "served_names": args.served_names, "pair_template": template is not None,
            **scorer.manifest, "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        install_export(staging, repository, names, manifest, started)
    return 0
