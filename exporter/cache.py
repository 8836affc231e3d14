"""The export cache: an export whose every input is the same as one already made is a copy of that one.

Off unless TRITON_EMBED_EXPORT_CACHE names a folder (the test suite sets it: a run exports the same tiny models many
times, and a second run in the same clone finds them all). The key is a sha256 of everything that decides an
export's bytes:
  - the export code and what it installs: build/export.py, every file of exporter/, model_source/ and
    model_library/, and local_triton/settings.py, as this checkout has them;
  - the versions of the Python and of the packages that trace, check and write the graph;
  - the arguments (all but --repository, which says where it goes, not what it is), --calibration-corpus by its
    content;
  - the model by its files' content (names and bytes, whatever folder or hub id named it), or an open_clip
    checkpoint file's.
An export with an input that is not a file (open_clip's random weights, `--pretrained none`; a hub tag) is never
cached, nor is one that failed. A hit installs the staged export exactly as the exporter would (the repository's
earlier export of those names replaced, the proxy refreshed), with export.json saying the model as given this time and
when, and the exporter's own printout of that run, paths renamed.
"""
import hashlib
import io
import json
import os
import shutil
import sys
import time
import uuid
from importlib import metadata

ENVIRONMENT = "TRITON_EMBED_EXPORT_CACHE"
MAX_BYTES_ENVIRONMENT = "TRITON_EMBED_EXPORT_CACHE_MAX_GB"
DEFAULT_MAX_GB = 8  # least recently used entries go past this: a run of the test suite holds about 2 GB
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = (os.path.join("build", "export.py"), "exporter", "model_source", "model_library",
        os.path.join("local_triton", "settings.py"))
PACKAGES = ("torch", "transformers", "sentence-transformers", "tokenizers", "onnx", "onnxruntime", "numpy",
            "safetensors", "FlagEmbedding", "open_clip_torch", "pillow")
NOT_KEYED = ("repository", "skip_if_exported")  # where it goes and whether to skip: not what it is
META = "cache.json"


def folder():
    """The cache's folder, or None when the cache is off."""
    return os.environ.get(ENVIRONMENT) or None


def _files(root):
    """Every file under `root` (or `root` itself), sorted, bytecode caches left out."""
    if os.path.isfile(root):
        return [root]
    found = []
    for parent, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found.extend(os.path.join(parent, name) for name in sorted(names) if not name.endswith(".pyc"))
    return found


def _digest_files(digest, root):
    for path in _files(root):
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")


def _version(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def key(args, model_folder):
    """The sha256 of what decides the export `args` (parsed) makes of `model_folder` (a folder, a checkpoint file,
    or None: nothing to read), or None when something that decides it is not a file."""
    if args.open_clip and (not args.pretrained or not os.path.isfile(args.pretrained)):
        return None  # random weights, or a tag the hub resolves: no file says what they are
    digest = hashlib.sha256(b"triton-embed export cache 1\0")
    for part in CODE:
        digest.update(part.encode() + b"\0")
        _digest_files(digest, os.path.join(PROJECT, part))
    digest.update(json.dumps({"python": sys.version, "packages": {p: _version(p) for p in PACKAGES},
                              "cc": os.environ.get("CC")}, sort_keys=True).encode())
    arguments = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_KEYED}
    arguments["model"] = arguments["pretrained"] = None  # by their files' content below
    digest.update(json.dumps(arguments, sort_keys=True, default=str).encode() + b"\0")
    if args.calibration_corpus and os.path.exists(args.calibration_corpus):
        _digest_files(digest, args.calibration_corpus)
    digest.update(b"model\0")
    if model_folder:
        _digest_files(digest, model_folder)
    return digest.hexdigest()


class Printout(io.TextIOBase):
    """stdout as it is, and a copy: a hit prints what the export it copies printed."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()

    @property
    def encoding(self):
        return self.stream.encoding

    @property
    def errors(self):
        return self.stream.errors

    def fileno(self):
        return self.stream.fileno()

    def isatty(self):
        return self.stream.isatty()


def store(entry_key, staging, names, repository, manifest, printout):
    """The staged export (export.json written) kept under `entry_key`, written aside and renamed into place, so a
    reader never sees half an entry and two writers of one key keep one."""
    root = folder()
    os.makedirs(root, exist_ok=True)
    scratch = os.path.join(root, f".writing-{uuid.uuid4().hex}")
    try:
        shutil.copytree(staging, os.path.join(scratch, "staging"))
        with open(os.path.join(scratch, META), "w", encoding="utf-8") as handle:
            json.dump({"names": list(names), "repository": repository, "model": manifest["model"],
                       "pretrained": manifest.get("pretrained"), "printout": printout}, handle)
        os.rename(scratch, os.path.join(root, entry_key))
    except OSError:  # another writer of the same key won, or the disk is full: the export itself stands
        shutil.rmtree(scratch, ignore_errors=True)
        return
    _evict(root)


def hold(entry_key):
    """One export of a key at a time (parallel test workers make the same export): the lock file's lock, held until
    this process ends, so the second waits for the first's entry instead of making it again."""
    import fcntl

    os.makedirs(folder(), exist_ok=True)
    handle = open(os.path.join(folder(), f".lock-{entry_key}"), "w")  # noqa: SIM115 - held for the process's life
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def lookup(entry_key):
    """(staging folder, meta) of a cached export, or None."""
    if entry_key is None or folder() is None:
        return None
    entry = os.path.join(folder(), entry_key)
    try:
        with open(os.path.join(entry, META), encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError):
        return None
    os.utime(os.path.join(entry, META))  # recently used: the eviction keeps it
    return os.path.join(entry, "staging"), meta


def restore(staging, meta, workdir, repository, args):
    """A copy of the cached staging in `workdir`, its export.json saying this run's model and time; prints the
    cached run's printout with this run's paths. Returns the copy's path."""
    copy = os.path.join(workdir, "repository")
    shutil.copytree(staging, copy)
    manifest_path = os.path.join(copy, meta["names"][0], "1", "export.json")
    with open(manifest_path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    # the fields that name where the inputs were (the key holds their content): this run's paths
    renamed = {}
    if args.model is not None:  # None: an open_clip export, whose manifest names its architecture
        if manifest.get("id") == manifest["model"]:  # a default export's id is its model
            manifest["id"] = args.model
        manifest["model"] = renamed[meta["model"]] = args.model
    if args.open_clip:  # the checkpoint file the proxy finds this export by (its seed admin routes)
        manifest["pretrained"] = renamed[meta["pretrained"]] = args.pretrained
    manifest["exported"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(manifest_path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2)
    printout = meta["printout"].replace(meta["repository"], repository)
    for before, now in renamed.items():
        printout = printout.replace(before, now) if before else printout
    sys.stdout.write(printout)
    return copy


def _evict(root):
    """Least recently used entries removed while the cache is over its size."""
    limit = float(os.environ.get(MAX_BYTES_ENVIRONMENT) or DEFAULT_MAX_GB) * 1e9
    entries = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".") or not os.path.isfile(os.path.join(path, META)):
            continue
        size = sum(os.path.getsize(f) for f in _files(path))
        entries.append((os.path.getmtime(os.path.join(path, META)), size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        shutil.rmtree(path, ignore_errors=True)
        total -= size
