"""The CLS-pooling path and the external-data ONNX layout: a tiny random XLM-RoBERTa (real 250k XLM-R tokenizer)
exported with `--pooling cls --external-data`, served by tritonserver, vs a PyTorch reference computed here."""
import json
import os
import shutil
import stat
import subprocess
import tempfile

import numpy as np
import pytest

from conftest import TINY_XLMR_MAX_LENGTH
from triton_clients import PROTOCOLS, VARIED_TEXTS, cosine, embed_one_by_one, infer, url_for


@pytest.fixture(scope="module")
def pytorch_reference(tiny_xlmr_dir, xlmr_hf_tokenizer):
    """HF model → CLS token of last_hidden_state → L2-normalized, each text alone (no padding)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_xlmr_dir, dtype=torch.float32).eval()
    vectors = []
    with torch.no_grad():
        for text in VARIED_TEXTS:
            batch = xlmr_hf_tokenizer(text, truncation=True, max_length=TINY_XLMR_MAX_LENGTH, return_tensors="pt")
            cls = model(**batch).last_hidden_state[:, 0]
            vectors.append(torch.nn.functional.normalize(cls, p=2.0, dim=1).numpy())
    return np.concatenate(vectors)


def test_external_data_layout(xlmr_repository):
    """`embedding/1/model.onnx` is a directory holding model.onnx + one data file (what Triton's ORT backend
    loads); the MiniLM model.onnx file it replaced is gone."""
    version = os.path.join(xlmr_repository, "embedding", "1")
    assert os.path.isdir(os.path.join(version, "model.onnx"))
    assert sorted(os.listdir(os.path.join(version, "model.onnx"))) == ["model.onnx", "model.onnx.data"]
    assert sorted(os.listdir(version)) == ["model.onnx"]
    graph = os.path.getsize(os.path.join(version, "model.onnx", "model.onnx"))
    data = os.path.getsize(os.path.join(version, "model.onnx", "model.onnx.data"))
    assert data > 250002 * 32 * 4 and graph < 1_000_000, (graph, data)  # the weights live in the data file
    manifest = json.load(open(os.path.join(xlmr_repository, "ensemble", "1", "export.json")))
    assert manifest["onnx"] == os.path.join("embedding", "1", "model.onnx", "model.onnx")
    assert manifest["pooling"] == "cls" and manifest["embedding_size"] == 32
    assert manifest["max_length"] == TINY_XLMR_MAX_LENGTH


IMAGE_USER = 1000  # Dockerfile.triton's USER triton-server


def test_an_external_data_export_is_readable_by_another_user(xlmr_repository):
    """Issue 72: onnx writes the external data file 0600, and tritonserver often runs as another user than the
    exporter (the image's triton-server; a repository synced to object storage). Every folder of each exported
    model is 0755 and every file at least 0644 (the repository's own folder is the user's); as root, uid 1000
    reads every file of a mode-keeping copy of the repository."""
    models = [os.path.join(xlmr_repository, m) for m in os.listdir(xlmr_repository)]
    for root, _, files in (walked for model in models for walked in os.walk(model)):
        for path in [root, *(os.path.join(root, f) for f in files)]:
            needed = 0o755 if os.path.isdir(path) else 0o644
            assert stat.S_IMODE(os.stat(path).st_mode) & needed == needed, (path, oct(os.stat(path).st_mode))
    if os.getuid() != 0:
        return  # only root can run a process as another user; the modes above are what that user needs
    scratch = tempfile.mkdtemp(prefix="triton-embed-uid-")
    try:
        os.chmod(scratch, 0o755)  # mkdtemp's 0700 would hide the copy from uid 1000 (pytest's tmp_path is 0700 too)
        copy = shutil.copytree(xlmr_repository, os.path.join(scratch, "repository"))  # copytree keeps the modes
        os.chmod(copy, 0o755)  # the repository's own folder (pytest's, 0700): the user's to open to the server
        files = [os.path.join(root, f) for root, _, names in os.walk(copy) for f in names]
        assert any(f.endswith("model.onnx.data") for f in files)
        # cat, not Python: the venv's interpreter lives under this machine's /root, which uid 1000 cannot enter
        result = subprocess.run(["cat", *files], user=IMAGE_USER, group=IMAGE_USER, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
    finally:
        shutil.rmtree(scratch)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cls_pooling_matches_pytorch(xlmr_server, pytorch_reference, protocol):
    url = url_for(xlmr_server, protocol)
    embeddings, num_tokens, truncated = embed_one_by_one(protocol, url, VARIED_TEXTS)
    assert embeddings.shape == pytorch_reference.shape == (len(VARIED_TEXTS), 32)
    similarity = cosine(embeddings, pytorch_reference)
    max_abs = float(np.abs(embeddings - pytorch_reference).max())
    print(f"\n{protocol}: tiny XLM-R CLS vs PyTorch on {len(VARIED_TEXTS)} texts: max abs diff {max_abs:.2e}, "
          f"min cosine {similarity.min():.8f} (1 - cos = {1 - similarity.min():.1e})")
    assert similarity.min() >= 0.9999 and max_abs <= 1e-4
    assert truncated[-2:].all() and (num_tokens[-2:] == TINY_XLMR_MAX_LENGTH).all()
    # Batched rows (one padded request) give the same vectors: padding does not leak into the CLS token.
    batched = infer(protocol, url, VARIED_TEXTS[:32])["embedding"]
    np.testing.assert_allclose(batched, embeddings[:32], atol=1e-5, rtol=0)


def test_cls_differs_from_mean(xlmr_server, pytorch_reference, tiny_xlmr_dir, xlmr_hf_tokenizer):
    """Guard against testing nothing: for this model mean pooling would give clearly different vectors."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_xlmr_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        batch = xlmr_hf_tokenizer(VARIED_TEXTS[4], return_tensors="pt")
        mean = torch.nn.functional.normalize(model(**batch).last_hidden_state.mean(1), dim=1).numpy()[0]
    served = infer("grpc", xlmr_server.grpc_url, [VARIED_TEXTS[4]])["embedding"][0]
    assert cosine(served, pytorch_reference[4]) >= 0.9999
    assert cosine(served, mean) < 0.999
