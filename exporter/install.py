"""The end of every export: the staged models, export.json beside the ensemble, moved into the serving repository
(with the proxy), kept in the export cache when it is on; or an export from the cache installed as the exporter
installs the one it copies."""
import json
import os
import tempfile
import time
import types

from . import cache, progress, read_json
from .repository import ensure_proxy, install, remove_chunks, templates_digest

# The export cache's entry the export being made goes into (cache.py; None: off, or not cacheable), and its printout
CACHING = types.SimpleNamespace(key=None, printout=None, lock=None)


def install_export(staging, repository, names, manifest, started):
    """The staged export, its manifest beside the ensemble, moved into the repository (with the proxy), and kept in
    the export cache when it is on."""
    progress.mark("install")
    with open(os.path.join(staging, names[0], "1", "export.json"), "w", encoding="utf-8") as handle:
        json.dump({**manifest, "templates": templates_digest()}, handle, indent=2)
    if CACHING.key:
        cache.store(CACHING.key, staging, names, repository, manifest, CACHING.printout.copy.getvalue())
    os.makedirs(repository, exist_ok=True)
    install(staging, repository, names)
    ensure_proxy(repository)
    progress.end()
    print(f"export: done in {time.monotonic() - started:.1f} s ({progress.summary()})")


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
