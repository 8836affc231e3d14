"""Dockerfile.triton installs (pinned) every third-party package the Python models under model_source/ import:
in the tritonserver container nothing else puts them there; and its build context (.dockerignore) holds what it
copies, never an export."""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import PROJECT
from local_triton.settings import SERVING_REPOSITORY_NAME

DOCKERFILE = os.path.join(PROJECT, "Dockerfile.triton")
PROVIDED = {"triton_python_backend_utils"}  # the Python backend provides it
PIP_NAMES = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow", "cv2": "opencv-python",
             "google.protobuf": "protobuf", "google": "protobuf", "attr": "attrs", "dateutil": "python-dateutil",
             "opentelemetry": "opentelemetry-api"}  # (a namespace: its packages are pinned beside the API)


def _normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def third_party_imports():
    """{import name: [files]} for absolute imports, anywhere in the file (also inside functions)."""
    found = {}
    library = glob.glob(os.path.join(PROJECT, "model_library", "*.py"))  # export installs it beside each model.py
    for path in glob.glob(os.path.join(PROJECT, "model_source", "**", "*.py"), recursive=True) + library:
        beside = glob.glob(os.path.join(os.path.dirname(path), "*"))  # modules and packages (the proxy's http_front)
        local = {os.path.splitext(os.path.basename(p))[0] for p in beside
                 if p.endswith(".py") or os.path.isfile(os.path.join(p, "__init__.py"))} | {"model_library"}
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in PROVIDED or top in local:
                    continue
                found.setdefault(top, []).append(os.path.relpath(path, PROJECT))
    return found


def requirement_pins(text):
    """{normalized name: version} of a requirements file's lines."""
    pins = {}
    for line in text.splitlines():
        word = line.split("#")[0].strip()
        if word and not word.startswith("-"):
            name, _, version = word.partition("==")
            pins[_normalize(re.split(r"[\[<>=!~]", name)[0])] = version.strip()
    return pins


def dockerfile_pins(text, root=PROJECT):
    """{normalized pip name: version} from every `pip install` in the Dockerfile (continuation lines joined),
    following `-r <file>` to the project's requirements file it names (COPY puts it in the image)."""
    joined = re.sub(r"\\\n", " ", text)
    pins = {}
    for line in joined.splitlines():
        line = line.split("#")[0] if line.lstrip().startswith("#") else line
        for command in re.findall(r"pip3?\s+install\s+([^&;|]*)", line):
            words = command.split()
            for i, word in enumerate(words):
                if word == "-r" and i + 1 < len(words):
                    with open(os.path.join(root, os.path.basename(words[i + 1])), encoding="utf-8") as handle:
                        pins.update(requirement_pins(handle.read()))
                if word.startswith("-") or (i and words[i - 1] == "-r"):
                    continue
                name, _, version = word.strip("'\"").partition("==")
                name = re.split(r"[\[<>=!~]", name)[0]
                pins[_normalize(name)] = version
    return pins


def test_parsers_on_a_sample():
    sample = ("FROM x AS runtime\n# pip install commented==1\nRUN pip install --no-cache-dir \\\n"
              "      numpy==1.26.4 \\\n      swagger-ui-bundle==1.1.0 PyYAML==6.0 && echo done\n")
    assert dockerfile_pins(sample) == {"numpy": "1.26.4", "swagger-ui-bundle": "1.1.0", "pyyaml": "6.0"}
    assert _normalize(PIP_NAMES.get("yaml", "yaml")) == "pyyaml"
    assert _normalize("swagger_ui_bundle") == "swagger-ui-bundle"


def test_model_imports_are_installed_by_dockerfile():
    if not os.path.exists(DOCKERFILE):
        pytest.fail("Dockerfile.triton is missing")
    imports = third_party_imports()
    assert {"numpy", "tokenizers"} <= set(imports), imports  # the tokenizer model's, at least
    runtime = open(DOCKERFILE, encoding="utf-8").read()
    # Only the stage the container runs counts: from the first FROM up to the export stage, if there is one.
    runtime = re.split(r"\nFROM [^\n]* AS export", runtime, flags=re.IGNORECASE)[0]
    pins = dockerfile_pins(runtime)
    missing = {name: files for name, files in imports.items()
               if _normalize(PIP_NAMES.get(name, name)) not in pins}
    assert not missing, f"imported by the Python models but not installed by Dockerfile.triton: {missing}"
    unpinned = sorted(n for n in imports if not pins[_normalize(PIP_NAMES.get(n, n))])
    assert not unpinned, f"not pinned (==) in Dockerfile.triton: {unpinned}"


def test_container_and_tests_share_the_serving_pins():
    """Token ids and the proxy are tested with requirements-serving.txt (the local venv includes it, the Python 3.10
    serving venv is built from it): the container installs exactly that file."""
    serving = requirement_pins(open(os.path.join(PROJECT, "requirements-serving.txt"), encoding="utf-8").read())
    assert serving["tokenizers"] and serving["prometheus-client"]
    assert "-r requirements-serving.txt" in open(os.path.join(PROJECT, "requirements.txt"), encoding="utf-8").read()
    runtime = re.split(r"\nFROM [^\n]* AS export", open(DOCKERFILE, encoding="utf-8").read(), flags=re.I)[0]
    assert dockerfile_pins(runtime) == serving


def test_the_runtime_stage_holds_every_project_package_the_launcher_imports():
    """The image's CMD runs `python3 -m local_triton.launch` in /opt/triton-embed: every project package its modules
    import (local_triton itself, model_library) must be copied there, or the container exits at its first line."""
    packages = {"local_triton"}
    for path in glob.glob(os.path.join(PROJECT, "local_triton", "*.py")):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            packages |= {n.split(".")[0] for n in names if os.path.isdir(os.path.join(PROJECT, n.split(".")[0]))}
    runtime = re.split(r"\nFROM [^\n]* AS export", open(DOCKERFILE, encoding="utf-8").read(), flags=re.I)[0]
    copied = set(re.findall(r"^COPY\s+(\w+)/\s+/opt/triton-embed/\1/", runtime, flags=re.M))
    assert packages == {"local_triton", "model_library"} and packages <= copied, (packages, copied)


def test_the_image_user_owns_the_repository_it_serves():
    """Issue 72: the default target copies the repository exported in its build stage owned by the runtime stage's
    USER (tritonserver runs as that user; export's own modes are tested in test_cls_path.py)."""
    text = open(DOCKERFILE, encoding="utf-8").read()
    user = re.search(r"^USER\s+(\S+)", text, flags=re.M).group(1)
    copy = re.search(r"^COPY\s+--from=export\s+(.*?)\s*/models\s+/models\s*$", text, flags=re.M)
    assert user == "triton-server" and copy and f"--chown={user}:{user}" in copy.group(1).split(), (user, copy)


def dockerignore_patterns(text):
    """[(exception, regex)] of a .dockerignore, as Docker reads it: `#` lines skipped, each pattern cleaned (no
    leading /), `*` and `?` within one path element, `**` any number of them, `!` an exception."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if exception else line).lstrip("/")
        regex = re.sub(r"\\\*\\\*/|\\\*\\\*|\\\*|\\\?", lambda m: {r"\*\*/": "(?:.*/)?", r"\*\*": ".*", r"\*": "[^/]*",
                                                                 r"\?": "[^/]"}[m.group()], re.escape(pattern))
        patterns.append((exception, re.compile(regex + "$")))
    return patterns


def in_context(path, patterns):
    """Whether Docker sends `path` (relative to the context) in the build context: the last pattern that matches it
    or one of its folders decides."""
    parts = path.split("/")
    folders = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for exception, regex in patterns:
        if any(regex.match(folder) for folder in folders):
            excluded = not exception
    return not excluded


def test_dockerignore_reading_on_a_sample():
    patterns = dockerignore_patterns("# a comment\n*\n!src\n**/*.onnx\n/cache\n")
    assert in_context("src/a.py", patterns) and in_context("src/deep/b.txt", patterns)
    assert not in_context("src/deep/model.onnx", patterns) and not in_context("src/model.onnx/model.onnx.data",
                                                                               patterns)
    assert not in_context("other/a.py", patterns) and not in_context("cache", patterns)


def test_the_build_context_holds_what_the_image_copies_and_never_an_export():
    """Issue 67: .dockerignore keeps the image's build context to what Dockerfile.triton copies (every COPY source
    and the tracked files under it are sent), and never sends the serving repository, a named export's ONNX weights
    wherever an export wrote them in the checkout, the export cache, venvs or results."""
    patterns = dockerignore_patterns(open(os.path.join(PROJECT, ".dockerignore"), encoding="utf-8").read())
    text = re.sub(r"\\\n", " ", open(DOCKERFILE, encoding="utf-8").read())
    sources = [words[-2] for words in (line.split() for line in text.splitlines() if line.startswith("COPY "))
               if not any(word.startswith("--from") for word in words)]
    assert {"build/export.py", "exporter/", "model_source/", "model_library/"} <= set(sources), sources
    tracked = subprocess.run(["git", "-C", PROJECT, "ls-files", "-z", *sources], capture_output=True,
                             check=True).stdout.decode().split("\0")
    assert len(tracked) > len(sources)
    sent = [path for path in filter(None, tracked) if not path.endswith(".onnx")]
    assert all(in_context(path.rstrip("/"), patterns) for path in sources + sent), \
        [path for path in sources + sent if not in_context(path.rstrip("/"), patterns)]
    serving = SERVING_REPOSITORY_NAME
    never = [f"{serving}/embedding/1/model.onnx", f"{serving}/e5-small_embedding/1/model.onnx",
             f"{serving}/e5-small_embedding/1/model.onnx/model.onnx.data", f"{serving}/e5-small/1/export.json",
             "exports/e5-small_embedding/1/model.onnx", "model_source/embedding/1/model.onnx",
             "model_source/e5-small_embedding/1/model.onnx", ".cache/exports/0a1b/staging/embedding/1/model.onnx",
             ".venv/bin/python", "bench/results/families/results.json", "exporter/__pycache__/run.cpython-311.pyc"]
    assert not [path for path in never if in_context(path, patterns)]
