"""The end of every export: the staged models, export.json beside the ensemble, moved into the serving repository
(with the proxy), kept in the export cache when it is on; or an export from the cache installed as the exporter
installs the one it copies."""
import importlib.metadata
import json
import os
import sys
import tempfile
import time
import types

from model_library.parity_report import parity_report

from . import cache, pbtxt, progress, read_json
from .repository import ensure_proxy, install, remove_chunks, templates_digest

# The libraries a reference check may have used (module -> distribution): the versions of those this export loaded
# go into export.json, and so into the parity report (model_library/parity_report.py)
REFERENCE_PACKAGES = {"sentence_transformers": "sentence-transformers", "transformers": "transformers",
                      "FlagEmbedding": "FlagEmbedding", "open_clip": "open_clip_torch", "torch": "torch"}

# The export cache's entry the export being made goes into (cache.py; None: off, or not cacheable), and its printout
CACHING = types.SimpleNamespace(key=None, printout=None, lock=None)


def install_export(staging, repository, names, manifest, started):
    """The staged export, its manifest beside the ensemble, moved into the repository (with the proxy), and kept in
    the export cache when it is on."""
    progress.mark("install")
    manifest = {**manifest, "reference_versions": {**reference_versions(), **manifest.get("reference_versions", {})}}
    with open(os.path.join(staging, names[0], "1", "export.json"), "w", encoding="utf-8") as handle:
        json.dump({**manifest, "templates": templates_digest()}, handle, indent=2)
    add_parity_report(os.path.join(staging, names[0], "config.pbtxt"), parity_report(manifest))
    if CACHING.key:
        cache.store(CACHING.key, staging, names, repository, manifest, CACHING.printout.copy.getvalue())
    os.makedirs(repository, exist_ok=True)
    install(staging, repository, names)
    ensure_proxy(repository)
    progress.end()
    print(f"export: done in {time.monotonic() - started:.1f} s ({progress.summary()})")


def reference_versions():
    """{module: version} of the reference libraries this process imported (a family computing its reference in
    another process records its own in the manifest)."""
    found = {}
    for module, distribution in REFERENCE_PACKAGES.items():
        if module in sys.modules:
            try:
                found[module] = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                found[module] = getattr(sys.modules[module], "__version__", None)
    return found


def add_parity_report(path, report):
    """The ensemble's config gains the parity report as a parameter, so a KServe client reads it in
    GET /v2/models/NAME/config. Appended as rendered text (protobuf's text format takes a field anywhere), so the
    template's comments stay; the whole file is parsed again to prove it."""
    block = pbtxt.to_text(pbtxt.with_new_parameters(pbtxt.parse(""), {"parity_report": json.dumps(report)}))
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    text = text.rstrip("\n") + "\n\n# The export's reference check (model_library/parity_report.py)\n" + block
    pbtxt.parse(text, path)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def install_cached(staging, meta, args, repository, started):
    """An export from the cache: installed as install_export installs the one it copies (an embedding export
    without a late chunking model removes an earlier one, as export() does)."""
    names = tuple(meta["names"])
    with tempfile.TemporaryDirectory() as workdir:
        copy = cache.restore(staging, meta, workdir, repository, args)
        manifest = read_json(copy, names[0], "1", "export.json")
        if manifest["kind"] == "embedding" and not manifest.get("chunks_model"):
            remove_chunks(repository, args.name)
        os.makedirs(repository, exist_ok=True)
        install(copy, repository, names)
        ensure_proxy(repository)
    print(f"export: done in {time.monotonic() - started:.1f} s, a copy from the export cache "
          f"({cache.ENVIRONMENT}: {os.path.join(cache.folder(), CACHING.key)})")
