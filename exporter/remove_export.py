"""Remove an export's models from the model repository: the files build/export.py wrote for NAME.

    python -m exporter.remove_export NAME [--repository model_repository] [--triton http://127.0.0.1:8000]

Refused while Triton holds any of its models (loaded, loading or unloading: unload it first with
`POST /v1/models/NAME/unload`), asked through Triton's repository API with ADMIN_API_KEY (or ADMIN_API_KEY_FILE)
when a server answers at --triton; for the default export (tokenizer/embedding/ensemble: export over it instead);
and on read-only storage. NAME is the export's name or its model id. This is file work, so it is a command beside
export, not a route of the HTTP proxy (which only translates HTTP to Triton calls).
"""
import argparse
import glob
import json
import os
import shutil
import sys
import urllib.error
import urllib.request

from local_triton.settings import SERVING_REPOSITORY
from model_library.triton_server import secret  # ADMIN_API_KEY or ADMIN_API_KEY_FILE, as the launcher reads it

MODEL_KEYS = ("name", "tokenizer_model", "encoder_model", "bls_model", "rerank_model", "chunks_model",
              "image_model", "image_preprocess_model", "image_encoder_model")  # the last three: CLIP exports


def fail(message):
    print(f"remove_export: {message}", file=sys.stderr)
    sys.exit(1)


def find_export(repository, name):
    for path in glob.glob(os.path.join(repository, "*", "1", "export.json")):
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        if name in (manifest.get("name"), manifest.get("id")):
            return manifest
    return None


def held_by_triton(url, models):
    """The models Triton holds now; None when no server answers at `url`."""
    request = urllib.request.Request(f"{url.rstrip('/')}/v2/repository/index", b"{}",
                                     {"Content-Type": "application/json", "admin-key": secret("ADMIN_API_KEY")})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            index = json.loads(response.read())
    except urllib.error.HTTPError as error:
        fail(f"Triton at {url} refused its repository index ({error.code}): set ADMIN_API_KEY to the server's key")
    except OSError:
        return None
    return sorted({e["name"] for e in index if e["name"] in models and e.get("state") in
                   ("READY", "LOADING", "UNLOADING")})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("--repository", default=SERVING_REPOSITORY)
    parser.add_argument("--triton", default=f"http://127.0.0.1:{os.environ.get('HTTP_PORT') or 8000}",
                        help="Triton's HTTP address, asked whether the models are loaded")
    args = parser.parse_args(argv)
    manifest = find_export(args.repository, args.name)
    if manifest is None:
        fail(f"no export named '{args.name}' in {args.repository}")
    if manifest["name"] == "ensemble":
        fail("the default export (tokenizer/embedding/ensemble) is what the proxy serves when a request names no "
             "model: export another model over it instead")
    models = [manifest[key] for key in MODEL_KEYS if manifest.get(key)]
    held = held_by_triton(args.triton, models)
    if held:
        fail(f"'{args.name}' is loaded ({', '.join(held)} in Triton): unload it first "
             f"(POST /v1/models/{args.name}/unload)")
    folders = [os.path.join(args.repository, m) for m in models if os.path.lexists(os.path.join(args.repository, m))]
    if not os.access(args.repository, os.W_OK) or not all(os.access(f, os.W_OK) for f in folders):
        fail(f"the model repository is read-only: cannot remove '{args.name}'")
    for folder in folders:
        shutil.rmtree(folder)
    checked = "" if held is not None else f" (no Triton answered at {args.triton})"
    print(f"remove_export: removed {', '.join(os.path.basename(f) for f in folders)}{checked}")


if __name__ == "__main__":
    main()
