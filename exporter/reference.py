"""The reference check: the export as it will serve (the tokenizer.json and prompts the tokenizer model reads, the
finished ONNX graph) against the reference implementation of the folder, sentence-transformers' own class for it
(the one its family names in families.EMBEDDERS: SentenceTransformer, SparseEncoder), on texts of mixed lengths
(one truncated), under every prompt the folder has.
A folder without sentence-transformers files is compared with transformers plus the pooling export was told
(sentence-transformers' Transformer and Pooling modules over the folder: its tokenizer, its model, its pooling).

Any text whose vector disagrees (cosine < 0.9999; 0.999 in fp16), whose token ids differ, or, where the reference's
vectors are not unit length, whose norm differs (relative 1e-3), fails the export with that text and figure: no
export installs vectors the reference does not give. parity.py, before this, checks every output of the graph
against the PyTorch module it was traced from."""
import json

import numpy as np

from . import fail
from .graph import ragged_feeds
from .parity import PARITY_TEXTS

MODEL_KWARGS = {"attn_implementation": "eager"}  # the graph is traced from the same module: eager attention
# sentence_bert_config.json settings that change what sentence-transformers computes and the export does not build
UNBUILT_SETTINGS = ("do_lower_case", "query_length", "document_length", "query_expansion")


def load_reference(folder, pipeline, max_length, trust_remote_code=False):
    """The reference object for the folder (its model is the one the graph wraps: loaded once), its max length set
    to the export's (so both cut the long text at the same token). trust_remote_code: the folder's own code is run
    (--trust-remote-code), and the graph wraps that model: the check compares with what that code computes."""
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from . import read_json

    settings = read_json(folder, "sentence_bert_config.json") or {}
    unbuilt = [key for key in UNBUILT_SETTINGS if settings.get(key)]
    if unbuilt:
        fail(f"sentence_bert_config.json: {', '.join(f'{k}={settings[k]!r}' for k in unbuilt)} changes the texts "
             "before the model and this export does not build it")
    kwargs = {**MODEL_KWARGS, "dtype": torch.float32}
    if pipeline.reference is not None:  # the class the folder's family names (pipeline.py read it)
        model = getattr(sentence_transformers, pipeline.reference)(folder, device="cpu", model_kwargs=kwargs,
                                                                   trust_remote_code=trust_remote_code)
    else:
        trust = {"trust_remote_code": trust_remote_code}
        transformer = Transformer(folder, model_kwargs={**kwargs, **trust}, config_kwargs=trust,
                                  processor_kwargs=trust)
        size = transformer.auto_model.config.hidden_size
        model = SentenceTransformer(modules=[transformer, Pooling(size, pipeline.pooling)], device="cpu")
    model.eval()
    if max_length is not None:  # a static embedding has no max length of its own: its tokenizer.json's truncation
        model.max_seq_length = max_length
    return model


def serving_batch(tokenizer_json, texts):
    """The ids and mask the tokenizer model gives `texts` (prompt already prepended): tokenizer.json's truncation,
    right padding with its pad id."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    pad_id = tokenizer.padding["pad_id"]
    tokenizer.no_padding()
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(texts), width), dtype=np.int64)
    for row, encoding in enumerate(encodings):
        ids[row, :len(encoding.ids)] = encoding.ids
        mask[row, :len(encoding.ids)] = 1
    return [e.ids for e in encodings], ids, mask


def reference_ids(reference, texts, prompt):
    """The token ids the reference feeds its model for each text under `prompt` (as its encode() does)."""
    features = reference.preprocess(texts, prompt=prompt or None)
    if "offsets" in features:  # StaticEmbedding: every text's ids back to back, and where each starts
        flat, starts = features["input_ids"].tolist(), features["offsets"].tolist()
        return [flat[start:end] for start, end in zip(starts, [*starts[1:], len(flat)])]
    return [[int(t) for t, m in zip(row, mask) if m] for row, mask in
            zip(features["input_ids"].tolist(), features["attention_mask"].tolist())]


def served_runs(reference, onnx_path, tokenizer_json, prompts, ragged):
    """(prompt name, run(output names) -> the graph's outputs) under no prompt (the default one) and every named
    one, the served ids checked against the reference's first."""
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    for prompt_name in [None, *prompts]:
        prefix = prompts.get(prompt_name if prompt_name is not None else reference.default_prompt_name, "")
        served_ids, ids, mask = serving_batch(tokenizer_json, [prefix + text for text in PARITY_TEXTS])
        check_ids(served_ids, reference_ids(reference, PARITY_TEXTS, prefix), prompt_name)
        feeds = {"input_ids": ids, "attention_mask": mask}
        yield prompt_name, lambda names, feeds=feeds: session.run(names, ragged_feeds(**feeds) if ragged else feeds)


def check_dense(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged=False):
    """`embedding` and `embedding_unnormalized` against reference.encode, under no prompt (the default one) and every
    named prompt. Returns the figures; fails on the first text that disagrees."""
    figures = {}
    for prompt_name, run in served_runs(reference, onnx_path, tokenizer_json, prompts, ragged):
        got, unnormalized = run(["embedding", "embedding_unnormalized"])
        want = reference.encode(PARITY_TEXTS, prompt_name=prompt_name, convert_to_numpy=True,
                                normalize_embeddings=False, batch_size=len(PARITY_TEXTS))
        cosines = (got * want).sum(-1) / np.maximum(np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1),
                                                    1e-30)
        worst = int(np.argmin(cosines))
        label = prompt_name or "none"
        if got.shape[1] != want.shape[1] or cosines[worst] < min_cosine:
            fail(f"reference check failed: text {worst} ({PARITY_TEXTS[worst][:40]!r}, prompt {label}): cosine "
                 f"{cosines[worst]:.6f} against {type(reference).__name__} (< {min_cosine}; widths {got.shape[1]} "
                 f"and {want.shape[1]}): the graph does not compute this model's vectors")
        figure = {"min_cosine": float(cosines.min())}
        if not pipeline.normalized:  # the reference's vector is the one before the L2 step: its length counts
            norms_got, norms_want = np.linalg.norm(unnormalized, axis=-1), np.linalg.norm(want, axis=-1)
            error = np.abs(norms_got - norms_want) / np.maximum(norms_want, 1e-12)
            figure["max_norm_error"] = float(error.max())
            limit = 1e-3 if min_cosine >= 0.9999 else 1e-2
            if error.max() > limit:
                worst = int(np.argmax(error))
                fail(f"reference check failed: text {worst} ({PARITY_TEXTS[worst][:40]!r}, prompt {label}): "
                     f"embedding_unnormalized's norm differs from {type(reference).__name__}'s by {error.max():.2e} "
                     f"(relative, > {limit})")
        figures[label] = figure
    print(f"export: reference check vs {type(reference).__name__} on {len(PARITY_TEXTS)} texts x "
          f"{len(figures)} prompt(s): {json.dumps(figures)}")
    return {"against": type(reference).__name__, "texts": len(PARITY_TEXTS), "by_prompt": figures}


def check_ids(served, expected, prompt_name):
    """The tokenizer model's ids (tokenizer.json) must be the reference's: a different EOS or BOS rule moves a
    decoder's last token, and no vector check on the export's own texts would see all of it."""
    for row, (got, want) in enumerate(zip(served, expected)):
        if got != want:
            fail(f"reference check failed: text {row} ({PARITY_TEXTS[row][:40]!r}, prompt {prompt_name or 'none'}): "
                 f"the served tokenizer gives ids {got[:6]}...{got[-3:]} ({len(got)}), the reference "
                 f"{want[:6]}...{want[-3:]} ({len(want)})")


def check_sparse(reference, onnx_path, tokenizer_json, prompts, ragged=False, max_error=1e-3):
    """A SPLADE export's sparse outputs against SparseEncoder.encode, under no prompt and every named one: the same
    non-zero token ids (an id only one side has must weigh under max_error there: relu's edge) and weights within
    max_error. Returns the figures; fails on the first text that disagrees."""
    figures = {}
    for prompt_name, run in served_runs(reference, onnx_path, tokenizer_json, prompts, ragged):
        indices, values, counts = run(["sparse_indices", "sparse_values", "sparse_count"])
        want = reference.encode(PARITY_TEXTS, prompt_name=prompt_name, convert_to_tensor=True,
                                convert_to_sparse_tensor=False, batch_size=len(PARITY_TEXTS)).numpy()
        worst, label = 0.0, prompt_name or "none"
        for row in range(len(PARITY_TEXTS)):
            got = np.zeros(want.shape[1], dtype=np.float32)
            count = int(counts[row, 0])
            got[indices[row, :count]] = values[row, :count]
            error = float(np.abs(got - want[row]).max())
            worst = max(worst, error)
            if error > max_error:
                fail(f"reference check failed: text {row} ({PARITY_TEXTS[row][:40]!r}, prompt {label}): sparse "
                     f"weights differ from SparseEncoder's by {error:.2e} (> {max_error}; {count} non-zero here, "
                     f"{int((want[row] > 0).sum())} there)")
        figures[label] = {"max_abs_diff": worst, "non_zero": [int(c) for c in counts[:, 0]]}
    print(f"export: reference check vs {type(reference).__name__} on {len(PARITY_TEXTS)} texts x "
          f"{len(figures)} prompt(s): {json.dumps(figures)}")
    return {"against": type(reference).__name__, "texts": len(PARITY_TEXTS), "by_prompt": figures}
