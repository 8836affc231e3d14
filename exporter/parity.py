"""The parity check: the exported graph in onnxruntime against the PyTorch module it came from, on texts of mixed
lengths (one truncated), for every output. The export stops here, before the repository is touched, if they
differ.

`embedding_unnormalized` is checked in direction (cosine) and in length (its norm, which is what it adds to
`embedding`), and normalizing it must give the graph's own `embedding`. Its PyTorch side is the module's pooled
vector: sentence-transformers' Transformer + Pooling output, i.e. SentenceTransformer.encode(normalize_embeddings=
False) of the model without its Normalize module (tests/test_export.py checks that against sentence-transformers;
the export image has no sentence-transformers, so the export itself compares with the module)."""
import json

from . import fail
from .graph import output_names, ragged_feeds
from .progress import staged

PARITY_TEXTS = [
    "Hello world",
    "A somewhat longer sentence about Triton Inference Server serving text embeddings on a CPU.",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "short",
    "the the the repeated repeated tokens tokens",
    "Paris is the capital of France. " * 40,  # longer than small models' max length: exercises truncation
]



@staged("parity")
def parity_check(encoder, tokenizer, onnx_path, outputs, max_length, min_cosine, max_norm_error=None, ragged=False):
    """ORT vs the PyTorch module on mixed lengths (one truncated), for every output. Returns the figures.
    ragged: the graph takes ragged inputs (graph.add_ragged_inputs); it gets each text unpadded, as one batch.
    max_norm_error: the largest relative difference of embedding_unnormalized's norms (default 1e-3, 1e-2 when
    min_cosine is below 0.9999: fp16)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    batch = tokenizer(PARITY_TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        expected = [t.numpy() for t in encoder(batch["input_ids"], batch["attention_mask"])]
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    names = output_names(outputs)
    feeds = {"input_ids": batch["input_ids"].numpy(), "attention_mask": batch["attention_mask"].numpy()}
    actual = dict(zip(names, session.run(names, ragged_feeds(**feeds) if ragged else feeds)))
    expected = dict(zip(names, expected))

    def cosines(a, b):
        norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
        return np.where(norms > 0, (a * b).sum(-1) / np.maximum(norms, 1e-30), 1.0)

    figures = {}
    if "dense" in outputs:
        cos = cosines(actual["embedding"], expected["embedding"])
        figures["dense"] = {"min_cosine": float(cos.min()),
                            "max_abs_diff": float(np.abs(actual["embedding"] - expected["embedding"]).max())}
    if "embedding_unnormalized" in names:
        got, want = actual["embedding_unnormalized"], expected["embedding_unnormalized"]
        norms_got, norms_want = np.linalg.norm(got, axis=-1), np.linalg.norm(want, axis=-1)
        renormalized = got / np.maximum(norms_got[:, None], 1e-12)
        figures["unnormalized"] = {
            "min_cosine": float(cosines(got, want).min()),
            "max_norm_error": float((np.abs(norms_got - norms_want) / np.maximum(norms_want, 1e-12)).max()),
            "norms": [float(norms_want.min()), float(norms_want.max())],
            "normalized_vs_embedding": float(np.abs(renormalized - actual["embedding"]).max())}
        limit = max_norm_error if max_norm_error is not None else 1e-3 if min_cosine >= 0.9999 else 1e-2
        if figures["unnormalized"]["max_norm_error"] > limit:
            fail(f"parity check failed: embedding_unnormalized's norms differ by up to "
                 f"{figures['unnormalized']['max_norm_error']:.2e} (relative) > {limit}")
        if figures["unnormalized"]["normalized_vs_embedding"] > 1e-3:
            fail("parity check failed: embedding_unnormalized, L2-normalized, is not the graph's embedding "
                 f"(max abs diff {figures['unnormalized']['normalized_vs_embedding']:.2e})")
    if "sparse" in outputs:
        # Compare as {token id: weight}: equal weights may sort in either order.
        worst, same_ids = 0.0, True
        for row in range(len(PARITY_TEXTS)):
            got, want = ({int(i): float(v) for i, v, in zip(out["sparse_indices"][row], out["sparse_values"][row])
                          if i >= 0} for out in (actual, expected))
            same_ids &= got.keys() == want.keys()
            worst = max([worst] + [abs(got[k] - want[k]) for k in got.keys() & want.keys()])
        figures["sparse"] = {"same_token_ids": bool(same_ids), "max_abs_diff": worst}
        if not same_ids:
            fail("parity check failed: sparse token ids differ between onnxruntime and PyTorch")
    if "colbert" in outputs:
        lengths = expected["colbert_length"].reshape(-1)
        cos = np.concatenate([cosines(actual["colbert_vectors"][r, :n], expected["colbert_vectors"][r, :n])
                              for r, n in enumerate(lengths)])
        figures["colbert"] = {"min_cosine": float(cos.min()),
                              "same_lengths": bool((actual["colbert_length"] == expected["colbert_length"]).all())}
    # token_embeddings: each real token's vector (padding positions are not used by anyone)
    mask = batch["attention_mask"].numpy().astype(bool)
    cos = cosines(actual["token_embeddings"][mask], expected["token_embeddings"][mask])
    figures["tokens"] = {"min_cosine": float(cos.min()), "max_abs_diff": float(
        np.abs(actual["token_embeddings"][mask] - expected["token_embeddings"][mask]).max())}
    summary = "; ".join(f"{kind} {json.dumps(f)}" for kind, f in figures.items())
    print(f"export: parity vs PyTorch on {len(PARITY_TEXTS)} texts (mixed lengths, one truncated): {summary}")
    worst_cosine = min([f["min_cosine"] for f in figures.values() if "min_cosine" in f], default=1.0)
    if worst_cosine < min_cosine:
        fail(f"parity check failed: min cosine {worst_cosine:.7f} < {min_cosine}")
    return figures

