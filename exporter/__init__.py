"""build/export.py's parts: `import exporting` (the project's editable install maps it to build/exporting; export.py
finds it beside itself), never `import build.exporting`: `build` itself is pypa's package name.

    source.py      where the Hugging Face model is and what it says of itself (pooling, max length, outputs)
    graph.py       the encoder wrapper (pooling, heads, normalization), ONNX export and finalizing
    parity.py      the exported graph checked against PyTorch
    repository.py  the Triton side: names, rendered configs, warm-up and tokenizer files, batchstrategy.so, install
    pbtxt.py       config.pbtxt through Triton's ModelConfig: parse, read and edit fields, write

Nothing under model_source/ (nor the serving repository export fills) imports these: export code is never serving code.
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
