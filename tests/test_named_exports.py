"""Named exports beside a default export in the checkout (issue 40): each export serves its own prompts.

The user's steps, in a copy of the checkout (its tracked build/, model_library/ and model_source/):
`build/export.py --model FOLDER` writes the default export into the copy's own serving repository model_repository/
(as `make serve` does), then `--name NAME` exports beside it. When the source and the served folders were one, named
exports took their model code from the folder where the default export's generated files (prompts.json...) lay: a
copy of those made every named export serve the default's prompts.
Two layouts, each served by the real tritonserver: a prompted default with a named export of
other prompts and one without prompts; a default without prompts with a prompted named export (the issue's case).
Vectors against SentenceTransformer.encode(prompt_name=...), through KServe and the HTTP front.
"""
import itertools
import json
import os
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from conftest import PROJECT, serve_until_done, tiny_sentence_transformer
from triton_clients import VARIED_TEXTS, client, outputs, text_input

TEXTS = VARIED_TEXTS[:5]
# Three models: e5-style prompts, nomic-style prompts (another default prompt), none.
MODELS = {
    "e5": {"seed": 5, "prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"},
    "nomic": {"seed": 7, "prompts": {"query": "search_query: ", "document": "search_document: "},
              "default_prompt_name": "document"},
    "plain": {"seed": 9, "prompts": None, "default_prompt_name": None},
}
# (input_type sent, the prompt name sentence-transformers is given) per model
# (sentence-transformers saves an empty "document" prompt beside e5's query / passage: input_type document picks it)
INPUT_TYPES = {"e5": [("query", "query"), ("document", "document"), (None, None)],
               "nomic": [("query", "query"), ("document", "document"), (None, None)],
               "plain": [("query", None), ("document", None), (None, None)]}
# {layout: {export name (None: the default export): model}}, exported in this order
LAYOUTS = {
    "prompted default": {None: "e5", "nomic": "nomic", "plain": "plain"},
    "default without prompts": {None: "plain", "prompted": "e5"},
}


def tracked_copy(target):
    """The checkout's tracked build/, exporter/, model_library/ and model_source/ files copied to `target` (what a
    fresh clone holds)."""
    listed = subprocess.run(["git", "-C", PROJECT, "ls-files", "-z", "build", "exporter", "model_source",
                             "model_library"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for path in filter(None, listed):
        os.makedirs(os.path.join(target, os.path.dirname(path)), exist_ok=True)
        shutil.copyfile(os.path.join(PROJECT, path), os.path.join(target, path))
    return target


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_model_dir):
    return {key: tiny_sentence_transformer(tmp_path_factory.mktemp(f"st_{key}"), minilm_model_dir, **setup)
            for key, setup in MODELS.items()}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def served(request, models, tmp_path_factory):
    """A checkout copy whose own serving repository (model_repository/) holds the layout's default export, then its
    named ones, served."""
    layout = LAYOUTS[request.param]
    root = tracked_copy(tmp_path_factory.mktemp("checkout"))
    for name, key in layout.items():
        result = subprocess.run([sys.executable, os.path.join(root, "build", "export.py"), "--model", models[key],
                                 *(["--name", name] if name else [])], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    for running in serve_until_done(os.path.join(root, "model_repository"), tmp_path_factory.mktemp("named_server")):
        running.layout = layout
        yield running


def expected(folder, prompt_name):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu")
    return model.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True)


def kserve_vectors(server, name, input_type):
    connection = client("grpc", server.grpc_url)
    try:
        result = connection.infer(f"{name}_bls" if name else "ensemble_bls", [text_input("grpc", TEXTS)],
                                  outputs=outputs("grpc", ("embedding",)),
                                  parameters={"input_type": input_type} if input_type else None)
        return result.as_numpy("embedding")
    finally:
        connection.close()


def http_vectors(server, model_id, input_type):
    body = {"model": model_id, "input": TEXTS, **({"input_type": input_type} if input_type else {})}
    request = urllib.request.Request(server.proxy_url + "/v1/embeddings", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return np.asarray([row["embedding"] for row in json.load(response)["data"]], dtype=np.float32)


def saved_prompts(folder):
    """The prompts sentence-transformers saved with the model (it may add empty ones), as export reads them."""
    with open(os.path.join(folder, "config_sentence_transformers.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    return config.get("prompts") or {}, config.get("default_prompt_name")


def generated(repository, model, name):
    with open(os.path.join(repository, model, "1", name), "rb") as handle:
        return handle.read()


def test_each_export_keeps_the_prompts_its_own_export_wrote(served, models):
    """prompts.json of each export is its own model's (the default's is not copied into the named ones, nor theirs
    into it), and no two exports' generated files are byte-identical unless their sources are."""
    for name, key in served.layout.items():
        tokenizer = f"{name}_tokenizer" if name else "tokenizer"
        prompts, default = saved_prompts(models[key])
        assert json.loads(generated(served.repository, tokenizer, "prompts.json")) == {
            "prompts": prompts, "default_prompt_name": default}, name
        assert any(prompts.values()) == (key != "plain"), name  # the model has prompts of its own, or none
    for (first, a), (second, b) in itertools.combinations(served.layout.items(), 2):
        names = [(f"{n}_tokenizer" if n else "tokenizer", f"{n}_bls" if n else "ensemble_bls") for n in (first,
                                                                                                        second)]
        same_prompts = saved_prompts(models[a]) == saved_prompts(models[b])
        assert (generated(served.repository, names[0][0], "prompts.json") ==
                generated(served.repository, names[1][0], "prompts.json")) == same_prompts, (first, second)
        # vectors.json: calibration ranges of each model's own embeddings (different random weights)
        assert generated(served.repository, names[0][1], "vectors.json") != \
            generated(served.repository, names[1][1], "vectors.json"), (first, second)


def test_input_type_embeds_as_sentence_transformers_with_that_prompt(served, models):
    """Every export, default or named, through KServe (its BLS model) and the HTTP front: input_type query /
    document / none gives SentenceTransformer.encode(prompt_name=...) of its own model (cosine >= 0.9999)."""
    for name, key in served.layout.items():
        model_id = name or models[key]
        for input_type, prompt_name in INPUT_TYPES[key]:
            want = expected(models[key], prompt_name)
            for door, got in (("kserve", kserve_vectors(served, name, input_type)),
                              ("http", http_vectors(served, model_id, input_type))):
                cosines = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
                assert cosines.min() >= 0.9999, (name, input_type, door, cosines)
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{name} {input_type} {door}")


def test_models_route_shows_each_exports_prompts(served, models):
    """GET /v1/models: each export's prompts and default prompt, so a user sees what input_type will do."""
    with urllib.request.urlopen(served.proxy_url + "/v1/models", timeout=30) as response:
        cards = {card["id"]: card for card in json.load(response)["data"]}
    for name, key in served.layout.items():
        card = cards[name or models[key]]
        assert (card["prompts"], card["default_prompt_name"]) == saved_prompts(models[key]), name


def test_every_export_returns_embedding_unnormalized(served, models):
    """Each export, default or named (ensemble and BLS model over KServe), asked for `embedding_unnormalized`: its own
    model's SentenceTransformer.encode(normalize_embeddings=False) (mean pooling, no Normalize module; the default
    prompt applied), and normalized it is `embedding`."""
    from sentence_transformers import SentenceTransformer

    for name, key in served.layout.items():
        want = SentenceTransformer(models[key], device="cpu").encode(TEXTS, normalize_embeddings=False)
        connection = client("grpc", served.grpc_url)
        try:
            for model in ((name, f"{name}_bls") if name else ("ensemble", "ensemble_bls")):
                result = connection.infer(model, [text_input("grpc", TEXTS)],
                                          outputs=outputs("grpc", ("embedding_unnormalized", "embedding")))
                got, normalized = result.as_numpy("embedding_unnormalized"), result.as_numpy("embedding")
                norms = np.linalg.norm(got, axis=1)
                assert got.shape == want.shape and np.abs(norms - 1).max() > 0.1, (model, norms)
                np.testing.assert_allclose(got, want, atol=1e-5 * max(1.0, norms.max()), rtol=0, err_msg=model)
                np.testing.assert_allclose(got / norms[:, None], normalized, atol=1e-6, rtol=0, err_msg=model)
        finally:
            connection.close()
