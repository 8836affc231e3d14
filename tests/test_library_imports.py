"""The models' library is one package, imported one way everywhere (`from model_library import ...`): in Triton
from export's copy beside each model.py (the stub puts the version folder on sys.path), outside from the checkout.
Checked from the source (no model edits sys.path, nothing imports a library module by its bare name) and in a
process that imports the proxy's app, a model's code, the launcher and the bulk client: one module object per file."""
import os
import re
import subprocess
import sys

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = sorted(name[:-3] for name in os.listdir(os.path.join(PROJECT, "model_library"))
                 if name.endswith(".py") and name != "__init__.py")
BARE_IMPORT = re.compile(r"^\s*(import|from)\s+(" + "|".join(LIBRARY) + r")\b", re.MULTILINE)


def tracked_python(*folders):
    listed = subprocess.run(["git", "-C", PROJECT, "ls-files", *folders], capture_output=True, text=True,
                            check=True).stdout.split()
    return [path for path in listed if path.endswith(".py")]


def test_no_model_edits_sys_path_and_nothing_imports_the_library_by_a_bare_name():
    bare, path_edits = [], []
    for path in tracked_python():
        with open(os.path.join(PROJECT, path), encoding="utf-8") as handle:
            source = handle.read()
        bare += [f"{path}: {match.group(0).strip()}" for match in BARE_IMPORT.finditer(source)]
        if path.startswith("model_source/") and "sys.path" in source:
            path_edits.append(path)
    assert not bare, bare
    assert not path_edits, path_edits


PROBE = """
import json, os, sys
import proxy_fakes  # the proxy's app, service, errors... as the model imports them
from model_library.in_process import MODEL_SOURCE, import_python_model
class TritonError(Exception):
    pass
import_python_model(os.path.join(MODEL_SOURCE, "tokenizer", "1", "model.py"), "tokenizer_model",
                    TRITONSERVER_RESPONSE_COMPLETE_FINAL=1, TritonError=TritonError, TritonModelException=RuntimeError)
import bulk_embed.doors, local_triton.launch  # noqa: E401
files = {{}}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and os.path.realpath(path).startswith({project!r}):
        files.setdefault(os.path.realpath(path), []).append(name)
print(json.dumps(files))
"""


def test_a_process_holds_one_module_object_per_library_file():
    import json

    # run from tests/ (`python -c` puts the working folder first on sys.path: the tests' helpers import)
    probe = PROBE.format(project=PROJECT + os.sep)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=os.path.join(PROJECT, "tests"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(done.stdout.strip().splitlines()[-1])
    assert not {path: names for path, names in files.items() if len(names) > 1}
    library = {names[0] for path, names in files.items()
               if os.path.dirname(path) == os.path.join(PROJECT, "model_library")}
    # (model_common is imported afresh per model code import_python_model runs, and forgotten after it)
    assert {f"model_library.{name}" for name in ("model_errors", "model_outputs", "request_rules", "tracing",
                                                 "triton_server", "in_process")} <= library
    assert not set(LIBRARY) & set(sys.modules)  # and this process (the suite's) holds none by a bare name


def test_a_parity_report_says_when_an_export_was_not_checked():
    """Issue 70 item 4: an export without a reference check (no figures: an export.json written by hand, or by an
    export that had none) is reported as unchecked, with why, never as a pass."""
    from model_library.parity_report import parity_report

    for manifest in ({"kind": "embedding"}, {"kind": "embedding", "parity": {"dense": {"min_cosine": 1.0}}},
                     {"kind": "cross-encoder", "parity": {"pairs": 16}}):
        report = parity_report(manifest)
        assert report["checked"] is False and report["why"], (manifest, report)
    checked = parity_report({"kind": "embedding", "reference_versions": {"sentence_transformers": "6.2.0"},
                             "parity": {"dense": {"min_cosine": 0.99995},
                                        "reference": {"against": "SentenceTransformer", "texts": 6, "by_prompt": {
                                            "none": {"min_cosine": 1.0}, "query": {"min_cosine": 0.99991}}}}})
    assert checked["checked"] and checked["reference_version"] == "6.2.0" and checked["prompts"] == ["none", "query"]
    assert checked["worst_cosine"] == 0.99991 and checked["graph_vs_pytorch_worst_cosine"] == 0.99995
