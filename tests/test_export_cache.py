"""The export cache (exporter/cache.py, on in the suite): an identical export is a copy of the first, installed
as the exporter installs it; any input that decides an export's bytes changed misses; random weights and failed
exports are never kept. These tests use their own cache folder, never the suite's."""
import filecmp
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import PROJECT, tiny_sentence_transformer
from exporter import cache

EXPORT = os.path.join(PROJECT, "build", "export.py")


def export_with_cache(cache_dir, repository, *args):
    env = {**os.environ, cache.ENVIRONMENT: str(cache_dir)}
    return subprocess.run([sys.executable, EXPORT, "--repository", str(repository), *args], capture_output=True,
                          text=True, timeout=600, env=env)


def entries(cache_dir):
    return sorted(name for name in os.listdir(cache_dir) if not name.startswith(".")) if cache_dir.exists() else []


def test_an_identical_export_is_a_copy_installed_as_the_exporter_installs(tmp_path, minilm_model_dir):
    cache_dir = tmp_path / "cache"
    model = tiny_sentence_transformer(tmp_path / "model", minilm_model_dir, seed=66)
    first = export_with_cache(cache_dir, tmp_path / "first", "--model", model, "--max-length", "32")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "export cache" not in first.stdout and len(entries(cache_dir)) == 1

    # the same files in another folder, into a repository that holds an earlier export of the same name
    moved = shutil.copytree(model, tmp_path / "elsewhere")
    second_repository = tmp_path / "second"
    shutil.copytree(tmp_path / "first", second_repository)
    (second_repository / "embedding" / "1" / "stale.onnx").write_bytes(b"an earlier export's file")
    second = export_with_cache(cache_dir, second_repository, "--model", str(moved), "--max-length", "32")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "a copy from the export cache" in second.stdout and len(entries(cache_dir)) == 1
    # the exporter's own lines, with this run's paths: the reference check is what the copy was checked by
    assert "export: reference check vs SentenceTransformer" in second.stdout
    assert f"{moved} (bert" in second.stdout and str(second_repository) in second.stdout

    compared = filecmp.dircmp(tmp_path / "first", second_repository)
    differing = []

    def walk(node, prefix=""):
        differing.extend(prefix + name for name in node.left_only + node.right_only + node.diff_files)
        for name, child in node.subdirs.items():
            walk(child, f"{prefix}{name}/")
    walk(compared)
    # install() keeps files it does not own (a model's code folder); everything the export wrote is the same
    assert sorted(differing) == ["embedding/1/stale.onnx", "ensemble/1/export.json"], differing
    before = json.loads((tmp_path / "first" / "ensemble" / "1" / "export.json").read_text())
    after = json.loads((second_repository / "ensemble" / "1" / "export.json").read_text())
    assert after["model"] == after["id"] == str(moved)
    assert {k: v for k, v in after.items() if k not in ("model", "id", "exported")} == \
        {k: v for k, v in before.items() if k not in ("model", "id", "exported")}


def test_a_refused_export_is_not_kept(tmp_path, minilm_model_dir):
    cache_dir = tmp_path / "cache"
    model = tiny_sentence_transformer(tmp_path / "model", minilm_model_dir, seed=67)
    refused = export_with_cache(cache_dir, tmp_path / "repository", "--model", model, "--outputs", "dense,sparse")
    assert refused.returncode != 0 and "sparse_linear.pt" in refused.stdout + refused.stderr
    assert entries(cache_dir) == []


def load_export_script():
    spec = importlib.util.spec_from_file_location("export_script_under_test", EXPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def other_value(action):
    """A value of `action`'s option other than its default, as it is written on a command line."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [next(c for c in action.choices if c != action.default)]
    if action.type is int:
        return ["7"]
    return ["something-else"]


@pytest.fixture()
def project_copy(tmp_path, monkeypatch):
    """The code the key reads, copied, and the key reading the copy."""
    root = tmp_path / "project"
    for part in cache.CODE:
        source, target = os.path.join(PROJECT, part), root / part
        if os.path.isdir(source):
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    monkeypatch.setattr(cache, "PROJECT", str(root))
    return root


def test_any_changed_input_misses_and_nothing_else_does(tmp_path, monkeypatch, project_copy):
    script = load_export_script()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one text\nanother\n")
    base_argv = ["--model", str(model), "--calibration-corpus", str(corpus)]

    def key(argv=(), folder=model):
        return cache.key(script.parse_args([*base_argv, *argv]), str(folder))

    base = key()
    assert base is not None and key() == base
    # what decides nothing of the bytes: where the export goes, --skip-if-exported, where the model's files are
    assert key(["--repository", str(tmp_path / "elsewhere"), "--skip-if-exported"]) == base
    assert key(folder=shutil.copytree(model, tmp_path / "copied")) == base

    changed = {}
    # every option of the command, set to another value than its default
    for action in script.build_parser()._actions:
        if not action.option_strings or action.dest in (*cache.NOT_KEYED, "help", "model", "calibration_corpus"):
            continue
        argv = [action.option_strings[-1], *other_value(action)]
        if action.dest == "pretrained":
            argv = [*argv, "--open-clip", "ViT-S-32"]
            checkpoint = tmp_path / "checkpoint.pt"
            checkpoint.write_bytes(b"weights")
            argv[1] = str(checkpoint)
        changed[action.dest] = key(argv)
    # the model's files: a byte, a name, one more
    (model / "model.safetensors").write_bytes(b"\0" * 63 + b"\1")
    changed["a model file's bytes"] = key()
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (model / "model.safetensors").rename(model / "weights.safetensors")
    changed["a model file's name"] = key()
    (model / "weights.safetensors").rename(model / "model.safetensors")
    (model / "tokenizer.json").write_text("{}")
    changed["one more model file"] = key()
    (model / "tokenizer.json").unlink()
    assert key() == base
    corpus.write_text("one text\nanother one\n")
    changed["the calibration corpus's content"] = key()
    corpus.write_text("one text\nanother\n")
    # the code: one byte more in a file of each part, and a new file
    for part in cache.CODE:
        path = project_copy / part
        path = path if path.is_file() else next(p for p in sorted(path.rglob("*")) if p.is_file())
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        changed[f"{part}: {path.name}"] = key()
        path.write_bytes(original)
    (project_copy / "model_source" / "new_model.py").write_text("")
    changed["a new file in model_source/"] = key()
    (project_copy / "model_source" / "new_model.py").unlink()
    assert key() == base
    # the packages that trace, check and write the graph
    for package in ("torch", "onnx", "transformers"):
        with monkeypatch.context() as patched:
            patched.setattr(cache, "_version", lambda name, package=package: "0.0" if name == package else "1")
            changed[f"{package}'s version"] = key()

    assert len(changed) >= 20, sorted(changed)  # 11 options, 3 model, 1 corpus, 6 code, 3 package changes
    assert base not in changed.values(), [name for name, value in changed.items() if value == base]
    assert len(set(changed.values())) == len(changed), "two different changes gave one key"


def test_random_or_downloaded_weights_are_never_cached(tmp_path):
    script = load_export_script()
    for pretrained in ("none", "laion2b_s34b_b79k"):
        args = script.parse_args(["--open-clip", "ViT-S-32", "--pretrained", pretrained, "--name", "clip"])
        assert cache.key(args, args.pretrained) is None



def test_a_copy_names_this_runs_model_and_checkpoint(tmp_path, capsys):
    """The manifest's fields that say where the inputs were (the key holds only their content) name this run's
    files: the proxy finds an open_clip export by its checkpoint's path (its seed admin routes), a default export by
    its model."""
    script = load_export_script()
    staging = tmp_path / "staging"
    (staging / "clip" / "1").mkdir(parents=True)
    (staging / "clip" / "1" / "export.json").write_text(json.dumps(
        {"id": "clip", "model": "open_clip:ViT-S-32", "pretrained": "/earlier/vit.pt", "kind": "clip"}))
    meta = {"names": ["clip"], "repository": "/earlier/repository", "model": "open_clip:ViT-S-32",
            "pretrained": "/earlier/vit.pt", "printout": "export: /earlier/vit.pt → /earlier/repository\n"}
    args = script.parse_args(["--open-clip", "ViT-S-32", "--pretrained", "/now/vit.pt", "--name", "clip"])
    (tmp_path / "work").mkdir()
    copy = cache.restore(str(staging), meta, str(tmp_path / "work"), "/now/repository", args)
    manifest = json.loads((tmp_path / "work" / "repository" / "clip" / "1" / "export.json").read_text())
    assert copy == str(tmp_path / "work" / "repository")
    assert (manifest["id"], manifest["model"], manifest["pretrained"]) == ("clip", "open_clip:ViT-S-32",
                                                                          "/now/vit.pt")
    assert capsys.readouterr().out == "export: /now/vit.pt → /now/repository\n"

    (staging / "clip" / "1" / "export.json").write_text(json.dumps({"id": "/earlier/model", "model": "/earlier/model",
                                                                    "kind": "embedding"}))
    meta.update(model="/earlier/model", pretrained=None, printout="export: /earlier/model\n")
    args = script.parse_args(["--model", "/now/model"])
    cache.restore(str(staging), meta, str(tmp_path / "again"), "/now/repository", args)
    manifest = json.loads((tmp_path / "again" / "repository" / "clip" / "1" / "export.json").read_text())
    assert manifest["id"] == manifest["model"] == "/now/model"
    assert capsys.readouterr().out == "export: /now/model\n"
