"""The exporter: Hugging Face model or folder → a serving repository's models (ONNX, tokenizer files, rendered
configs, the models' code copied in). build/export.py is its command (the flags); `import exporter` from anywhere
(the project's editable install; build/export.py puts its own checkout first on the path).

    run.py             the order of the steps: the repository, --skip-if-exported, the cache, the family's export
    families/          a module per model family (encoder, SPLADE, static, cross-encoder, decoder reranker, CLIP),
                       registered in one table (families/__init__.py) that pipeline.py and run.py read (reference.py
                       loads the reference class a row names)
    embedding.py       a text embedding export (the five models, late chunking) over the family's graph
    source.py          where the Hugging Face model is and what it says of itself (its own code, max length,
                       outputs)
    pipeline.py        what a sentence-transformers folder computes (modules.json), read once
    graph.py           the graph's outputs, ONNX export and finalizing (token guard, ragged inputs)
    parity.py          the exported graph checked against PyTorch
    reference.py       the export checked against sentence-transformers' own class for the folder
    weights.py         every transformers load's report kept; a weight the graph reads that the checkpoint did not
                       hold stops the export
    vectors.py         prompts, Matryoshka widths, int8/uint8 calibration (calibration/corpus.txt)
    repository.py      the Triton side: names, rendered configs, warm-up and tokenizer files, batchstrategy.so, install
    install.py         the staged export installed (and kept in the export cache: cache.py)
    progress.py        where the export is: each stage's start, a heartbeat while one runs on, their times
    pbtxt.py           config.pbtxt through Triton's ModelConfig: parse, read and edit fields, write
    remove_export.py   `python -m exporter.remove_export NAME`: an export's models removed

Nothing under model_source/ or model_library/ (nor the serving repository export fills) imports these: export code
is never serving code.
"""
import json
import os


def fail(message):
    """Stop the export with a one-line message (the parts' errors are the command's errors)."""
    raise SystemExit(f"export: {message}")


def read_json(*parts):
    """The JSON file at os.path.join(*parts), or None when there is none."""
    path = os.path.join(*parts)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
