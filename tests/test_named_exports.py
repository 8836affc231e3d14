"""Named exports beside a default export in the checkout (issue 40): each export serves its own prompts.

The user's steps, in a copy of the checkout (its tracked build/, model_library/ and model_repository/):
`build/export.py --model E5` writes the default export into the copy's own model_repository/ (as `make serve` does),
then `--name nomic` and `--name plain` export beside it. Named exports take their model code from that same folder,
where the default export's generated files (prompts.json...) now lie: a copy of those made every named export
prepend the default's prompts. Served by the real tritonserver; vectors against
SentenceTransformer.encode(prompt_name=...), through KServe and the HTTP front.
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
# Three prompt setups: the default export's, a named one with other prompts (and another default prompt), none.
EXPORTS = {
    None: {"seed": 5, "prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"},
    "nomic": {"seed": 7, "prompts": {"query": "search_query: ", "document": "search_document: "},
              "default_prompt_name": "document"},
    "plain": {"seed": 9, "prompts": None, "default_prompt_name": None},
}
# (input_type sent, the prompt name sentence-transformers is given) per export
# (sentence-transformers saves an empty "document" prompt beside e5's query / passage: input_type document picks it)
INPUT_TYPES = {None: [("query", "query"), ("document", "document"), (None, None)],
               "nomic": [("query", "query"), ("document", "document"), (None, None)],
               "plain": [("query", None), ("document", None), (None, None)]}


def tracked_copy(target):
    """The checkout's tracked build/, model_library/ and model_repository/ files copied to `target` (what a fresh
    clone holds)."""
    listed = subprocess.run(["git", "-C", PROJECT, "ls-files", "-z", "build", "model_repository",
                             "model_library"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for path in filter(None, listed):
        os.makedirs(os.path.join(target, os.path.dirname(path)), exist_ok=True)
        shutil.copyfile(os.path.join(PROJECT, path), os.path.join(target, path))
    return target


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_model_dir):
    return {name: tiny_sentence_transformer(tmp_path_factory.mktemp(f"st_{name or 'default'}"), minilm_model_dir,
                                            **setup)
            for name, setup in EXPORTS.items()}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, models):
    """A checkout copy whose own model_repository/ holds the default export, then the two named ones."""
    root = tracked_copy(tmp_path_factory.mktemp("checkout"))
    for name, folder in models.items():
        result = subprocess.run([sys.executable, os.path.join(root, "build", "export.py"), "--model", folder,
                                 *(["--name", name] if name else [])], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    return root


@pytest.fixture(scope="module")
def served(checkout, tmp_path_factory):
    yield from serve_until_done(os.path.join(checkout, "model_repository"), tmp_path_factory.mktemp("named_server"))


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


def test_each_export_keeps_the_prompts_its_own_export_wrote(checkout, models):
    """prompts.json of each export is its own model's (the default's is not copied into the named ones), and no
    two exports' generated files are byte-identical unless their sources are."""
    repository = os.path.join(checkout, "model_repository")
    for name in EXPORTS:
        tokenizer = f"{name}_tokenizer" if name else "tokenizer"
        prompts, default = saved_prompts(models[name])
        assert json.loads(generated(repository, tokenizer, "prompts.json")) == {
            "prompts": prompts, "default_prompt_name": default}, name
        if name != "plain":
            assert any(prompts.values()), name  # the model has prompts of its own
    for first, second in itertools.combinations(EXPORTS, 2):
        names = [(f"{n}_tokenizer" if n else "tokenizer", f"{n}_bls" if n else "ensemble_bls") for n in (first,
                                                                                                        second)]
        same_prompts = saved_prompts(models[first]) == saved_prompts(models[second])
        assert (generated(repository, names[0][0], "prompts.json") ==
                generated(repository, names[1][0], "prompts.json")) == same_prompts, (first, second)
        # vectors.json: calibration ranges of each model's own embeddings (different random weights)
        assert generated(repository, names[0][1], "vectors.json") != generated(repository, names[1][1],
                                                                               "vectors.json"), (first, second)


@pytest.mark.parametrize("name", list(EXPORTS))
def test_input_type_embeds_as_sentence_transformers_with_that_prompt(served, models, name):
    """Every export, default or named, through KServe (its BLS model) and the HTTP front: input_type query /
    document / none gives SentenceTransformer.encode(prompt_name=...) of its own model (cosine >= 0.9999)."""
    model_id = name or models[None]
    for input_type, prompt_name in INPUT_TYPES[name]:
        want = expected(models[name], prompt_name)
        for door, got in (("kserve", kserve_vectors(served, name, input_type)),
                          ("http", http_vectors(served, model_id, input_type))):
            cosines = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cosines.min() >= 0.9999, (name, input_type, door, cosines)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{name} {input_type} {door}")


def test_models_route_shows_each_exports_prompts(served, models):
    """GET /v1/models: each export's prompts and default prompt, so a user sees what input_type will do."""
    with urllib.request.urlopen(served.proxy_url + "/v1/models", timeout=30) as response:
        cards = {card["id"]: card for card in json.load(response)["data"]}
    for name in EXPORTS:
        card = cards[name or models[None]]
        assert (card["prompts"], card["default_prompt_name"]) == saved_prompts(models[name]), name
