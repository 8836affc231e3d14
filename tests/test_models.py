"""Several embedding models in one server (issue 11), through the real tritonserver and the proxy: all-MiniLM-L6-v2
(the default export) beside a tiny random XLM-R exported with --name; routing by `model`, interleaved concurrent
requests, load / unload at run time with memory measured from /proc, exporter/remove_export.py, broken exports, admin
keys, the official OpenAI SDK, and LOAD_MODELS.

The load/unload timings and the RSS before/after the cycles are printed (pytest -s shows them)."""
import asyncio
import os
import random
import shutil
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from conftest import MINILM, PROJECT, TINY_XLMR_MAX_LENGTH, export, pbtxt, start_server, wait_for_proxy
from local_triton import launch
from triton_clients import VARIED_TEXTS, cosine

pytestmark = pytest.mark.serving  # every test here goes through a real server

TINY = "tiny-xlmr"  # --name of the tiny XLM-R export: its id and its Triton ensemble's name
STEP_SUFFIXES = ("", "_tokenizer", "_embedding", "_bls", "_rerank", "_chunks")  # an export NAME's six Triton models
USER_KEY, ADMIN_KEY = "user-secret", "admin-secret"
USER, ADMIN = {"Authorization": f"Bearer {USER_KEY}"}, {"Authorization": f"Bearer {ADMIN_KEY}"}
TEXTS = VARIED_TEXTS  # 53 texts: scripts, emoji, code, and two over every max length
SIZES = {MINILM: 384, TINY: 32}
MIN_COSINE = 0.9999


# ---------------------------------------------------------------- helpers
def embed(client, model, texts, **extra):
    body = {"input": texts, **({"model": model} if model else {}), **extra}
    response = client.post("/v1/embeddings", json=body, headers=USER)
    assert response.status_code == 200, response.text
    return response.json()


def vectors(result):
    return np.array([item["embedding"] for item in result["data"]], dtype=np.float32)


def assert_error(response, status, code=None, *words):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if code:
        assert error["code"] == code, error
    for word in words:
        assert word in error["message"], error["message"]
    return error


def assert_matches(got, expected, what):
    similarity = cosine(got, expected)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    assert similarity.min() >= MIN_COSINE, f"{what}: text {int(similarity.argmin())} cosine {similarity.min()}"
    return similarity


def admin(client, action, model, key=ADMIN):
    return client.post(f"/v1/models/{model}/{action}", headers=key)


def admin_ok(client, action, model):
    """An admin action that must succeed; returns the seconds the service reports."""
    started = time.perf_counter()
    response = admin(client, action, model)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == {"load": "loaded", "unload": "unloaded"}[action]
    return time.perf_counter() - started


def remove_export(server, repository, name):
    """`python -m exporter.remove_export` against the running server: (exit code, its output)."""
    result = subprocess.run([sys.executable, "-m", "exporter.remove_export", name,
                             "--repository", str(repository), "--triton", f"http://{server.http_url}"],
                            capture_output=True, text=True, timeout=60, cwd=PROJECT,
                            env={**os.environ, "ADMIN_API_KEY": ADMIN_KEY})
    return result.returncode, result.stdout + result.stderr


def remove_ok(server, repository, name):
    code, output = remove_export(server, repository, name)
    assert code == 0, output


def listed(client):
    response = client.get("/v1/models", headers=USER)
    assert response.status_code == 200, response.text
    return {card["id"]: card for card in response.json()["data"]}


def process_tree_rss(pid):
    """{pid: (VmRSS KiB, model folder or 'tritonserver')} of tritonserver and its stub processes (its children)."""
    def rss(p):
        with open(f"/proc/{p}/status") as handle:
            return next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), 0)

    found = {pid: (rss(pid), "tritonserver")}
    for child, (state, argv) in launch.children(pid).items():
        if state != "Z":
            try:
                model = os.path.basename(os.path.dirname(os.path.dirname(argv[1].decode()))) if len(argv) > 1 else "?"
                found[child] = (rss(child), model)
            except OSError:  # it just exited
                pass
    return found


def settled_rss(server, quiet_s=1.0, timeout_s=30.0):
    """Total RSS (MiB) of the server's process tree once its set of processes and total have stopped changing."""
    deadline = time.monotonic() + timeout_s
    last = now = process_tree_rss(server.process.pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = process_tree_rss(server.process.pid)
        if set(now) == set(last) and abs(sum(v[0] for v in now.values()) - sum(v[0] for v in last.values())) < 2048:
            break
        last = now
    return sum(v[0] for v in now.values()) / 1024, sorted(v[1] for v in now.values())


def stub_models(server):
    return {model for _, model in process_tree_rss(server.process.pid).values()}


def clone_export(repository, source, name):
    """A copy of the export `source` named `name` (folders and the names inside its ensemble config and manifest):
    the quick way to a second export of the same files, to break one part of it."""
    for suffix in STEP_SUFFIXES:
        shutil.copytree(repository / f"{source}{suffix}", repository / f"{name}{suffix}",
                        ignore=shutil.ignore_patterns("__pycache__"))
    def renamed(model):
        return name + model[len(source):] if model.startswith(source) else model

    ensemble = pbtxt.read(repository / name / "config.pbtxt")
    for step in ensemble.ensemble_scheduling.step:
        step.model_name = renamed(step.model_name)
    pbtxt.write(repository / name / "config.pbtxt", ensemble)
    for path in (repository / f"{name}{suffix}" / "config.pbtxt" for suffix in ("_bls", "_rerank", "_chunks")):
        config = pbtxt.read(path)
        pbtxt.write(path, pbtxt.with_parameters(config, {key: renamed(value) for key, value in
                                                         pbtxt.parameters(config).items()}))
    manifest = repository / name / "1" / "export.json"  # every name in it that starts with the source's
    manifest.write_text(manifest.read_text().replace(f'"{source}', f'"{name}'))


class Load:
    """Background requests to one model from `workers` threads, until stopped: counts, and every failure kept."""

    def __init__(self, server, model, workers=2):
        self.server, self.model, self.workers = server, model, workers
        self.ok, self.failures, self.stopping, self.threads = 0, [], threading.Event(), []

    def run(self, seed):
        rng = random.Random(seed)
        with httpx.Client(base_url=self.server.proxy_url, timeout=60) as client:
            while not self.stopping.is_set():
                texts = rng.sample(TEXTS[:50], rng.choice([1, 2, 4]))
                try:
                    response = client.post("/v1/embeddings", json={"input": texts, "model": self.model}, headers=USER)
                    if response.status_code == 200 and len(response.json()["data"]) == len(texts):
                        self.ok += 1
                    else:
                        self.failures.append(f"{response.status_code} {response.text[:300]}")
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))

    def wait_for(self, requests, timeout_s=30.0):
        """Until `requests` more have been answered (so the load overlaps what it is meant to overlap)."""
        target, deadline = self.ok + requests, time.monotonic() + timeout_s
        while self.ok < target and not self.failures and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self):
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(self.workers)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def multi_repository(minilm_repository, tiny_xlmr_dir, tmp_path_factory):
    """MiniLM as the default export (tokenizer/embedding/ensemble) + the tiny XLM-R (CLS, max length 128) exported
    with --name into the same repository."""
    repository = tmp_path_factory.mktemp("models") / "repository"
    shutil.copytree(minilm_repository, repository, ignore=shutil.ignore_patterns("__pycache__"))
    export(repository, "--model", str(tiny_xlmr_dir), "--name", TINY, "--pooling", "cls",
           "--max-length", str(TINY_XLMR_MAX_LENGTH))
    return repository


@pytest.fixture(scope="module")
def multi_server(multi_repository, tmp_path_factory):
    running = start_server(multi_repository, tmp_path_factory.mktemp("models_server"),
                           extra_env={"API_KEY": USER_KEY, "ADMIN_API_KEY": ADMIN_KEY})
    try:
        wait_for_proxy(running)
    except Exception:
        launch.stop(running.process)
        raise
    yield running
    launch.stop(running.process)
    log = running.log()
    assert "proxy: stopped, port released" in log, log[-3000:]
    assert running.process.returncode == 0, f"tritonserver exited with {running.process.returncode}:\n{log[-3000:]}"


@pytest.fixture(scope="module")
def client(multi_server):
    with httpx.Client(base_url=multi_server.proxy_url, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def references(sentence_transformer, tiny_xlmr_dir, xlmr_hf_tokenizer):
    """{model id: reference vectors of TEXTS}: sentence-transformers for MiniLM; for the tiny XLM-R, PyTorch's CLS
    token of last_hidden_state, L2-normalized, each text alone (as tests/test_cls_path.py computes it)."""
    import torch
    from transformers import AutoModel

    minilm = sentence_transformer.encode(TEXTS, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)
    model = AutoModel.from_pretrained(tiny_xlmr_dir, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            batch = xlmr_hf_tokenizer(text, truncation=True, max_length=TINY_XLMR_MAX_LENGTH, return_tensors="pt")
            rows.append(torch.nn.functional.normalize(model(**batch).last_hidden_state[:, 0], dim=1).numpy())
    return {MINILM: minilm.astype(np.float32), TINY: np.concatenate(rows)}


# ---------------------------------------------------------------- two models at once
def test_both_models_are_listed_with_their_sizes(client):
    cards = listed(client)
    assert set(cards) == {MINILM, TINY}
    assert (cards[MINILM]["embedding_size"], cards[MINILM]["max_input_tokens"]) == (384, 256)
    assert (cards[TINY]["embedding_size"], cards[TINY]["max_input_tokens"]) == (32, TINY_XLMR_MAX_LENGTH)
    assert client.get(f"/v1/models/{TINY}", headers=USER).json()["embedding_size"] == 32


def test_each_model_gives_its_own_reference_vectors(client, references):
    for model in (MINILM, TINY):
        result = embed(client, model, TEXTS)
        got = vectors(result)
        similarity = assert_matches(got, references[model], model)
        print(f"\n{model} through the proxy vs its reference on {len(TEXTS)} texts: min cosine "
              f"{similarity.min():.8f}, max abs diff {np.abs(got - references[model]).max():.2e}")
        assert result["model"] == model and got.shape[1] == SIZES[model]
        assert [item["truncated"] for item in result["data"]][-2:] == [True, True]
    # The Triton ensemble's name selects the same model; no `model` goes to the default (MiniLM's `ensemble`).
    for model in ("ensemble", None):
        result = embed(client, model, TEXTS[:5])
        assert result["model"] == MINILM
        assert_matches(vectors(result), references[MINILM][:5], f"model={model}")
    # The seed route takes ?model=.
    response = client.post("/v1/embedding", params={"model": TINY}, json=[{"query": t} for t in TEXTS[:5]],
                           headers=USER)
    assert response.status_code == 200, response.text
    assert_matches(np.array([r["embedding"] for r in response.json()], dtype=np.float32), references[TINY][:5], "seed")


def test_interleaved_concurrent_requests_are_never_mixed_up(multi_server, references):
    """200 requests, each for one model picked at random, with 1-6 texts picked at random, 16 in flight: every
    answer carries its own model's vectors of its own texts, in order."""
    rng = random.Random(11)
    plan = [(rng.choice((MINILM, TINY)), rng.sample(range(len(TEXTS) - 2), rng.randint(1, 6))) for _ in range(200)]
    plan[0] = (TINY, list(range(len(TEXTS))))  # one with the long texts too

    async def run():
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=multi_server.proxy_url, timeout=120, headers=USER) as http:
            async def one(model, indices):
                async with limit:
                    while True:  # a refusal by admission control (429) is retried after its Retry-After
                        response = await http.post("/v1/embeddings", json={"model": model,
                                                                           "input": [TEXTS[i] for i in indices]})
                        if response.status_code != 429:
                            return response
                        assert response.json()["error"]["code"] == "overloaded", response.text
                        refused.append(model)
                        await asyncio.sleep(float(response.headers["retry-after"]))
            return await asyncio.gather(*(one(model, indices) for model, indices in plan))

    refused = []

    started = time.perf_counter()
    responses = asyncio.run(run())
    elapsed = time.perf_counter() - started
    worst = 1.0
    for (model, indices), response in zip(plan, responses):
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["model"] == model
        worst = min(worst, assert_matches(vectors(result), references[model][indices], model).min())
    counts = {m: sum(1 for model, _ in plan if model == m) for m in (MINILM, TINY)}
    print(f"\n200 interleaved requests ({counts[MINILM]} MiniLM, {counts[TINY]} tiny XLM-R), 16 in flight: "
          f"{elapsed:.1f} s, {len(refused)} refusals (429, retried), all answers their own model's vectors "
          f"(min cosine {worst:.8f})")
    # Statistics per model: the proxy's counters and Triton's own nv_* metrics are labelled by model.
    proxy_metrics = httpx.get(multi_server.proxy_url + "/metrics", timeout=10).text
    triton_metrics = httpx.get(f"http://127.0.0.1:{multi_server.metrics_port}/metrics", timeout=10).text
    for model, ensemble in ((MINILM, "ensemble"), (TINY, TINY)):
        assert f'model="{model}"' in proxy_metrics
        assert f'nv_inference_request_success{{model="{ensemble}",version="1"}}' in triton_metrics


def test_official_openai_sdk_with_each_model(multi_server, references):
    import openai

    sdk = openai.OpenAI(base_url=multi_server.proxy_url + "/v1", api_key=USER_KEY, max_retries=0)
    for model in (MINILM, TINY):
        result = sdk.embeddings.create(input=TEXTS[:20], model=model)  # the SDK asks for base64
        got = np.array([item.embedding for item in result.data], dtype=np.float32)
        assert result.model == model and got.shape == (20, SIZES[model])
        assert_matches(got, references[model][:20], f"OpenAI SDK, model={model}")
    assert {m.id for m in sdk.models.list()} == {MINILM, TINY}
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.embeddings.create(input=["hello"], model="no-such-model")
    assert missing.value.code == "model_not_found"


# ---------------------------------------------------------------- errors and admin keys
def test_unknown_model_is_404(client):
    assert_error(client.post("/v1/embeddings", json={"input": ["x"], "model": "no-such-model"}, headers=USER),
                 404, "model_not_found", "no-such-model")
    assert_error(client.post("/v1/embedding", params={"model": "no-such-model"}, json=[{"query": "x"}],
                             headers=USER), 404, "model_not_found")
    assert_error(client.get("/v1/models/no-such-model", headers=USER), 404, "model_not_found")
    assert_error(admin(client, "load", "no-such-model"), 404, "model_not_found")


@pytest.mark.parametrize("action", ["load", "unload"])
def test_admin_routes_need_the_admin_key(client, action):
    for key in ({}, {"Authorization": "Bearer wrong"}, USER, {"Authorization": ADMIN_KEY}):  # the last: no scheme
        error = assert_error(admin(client, action, TINY, key), 401, "invalid_api_key", "admin key")
        assert error["type"] == "authentication_error"
    assert TINY in listed(client)  # nothing happened


def test_removing_a_loaded_model_is_refused(client, multi_server, multi_repository):
    code, output = remove_export(multi_server, multi_repository, TINY)
    assert code == 1 and "unload it first" in output, output
    assert (multi_repository / TINY / "1" / "export.json").exists()
    code, output = remove_export(multi_server, multi_repository, "ensemble")
    assert code == 1 and "default export" in output, output
    assert TINY in listed(client)


# ---------------------------------------------------------------- load / unload under load, memory
CYCLES = 3  # each load/unload cycle leaves what it leaks: 3 show a trend as 5 did, in 25 s less


def test_load_unload_cycles_while_the_other_model_serves(client, multi_server, references):
    """Unload the tiny XLM-R, then 3 x (load, use, unload) and a last load, all while MiniLM is under load: no
    MiniLM request fails, and the server's memory (tritonserver + stubs) returns to its level before the loads."""
    warm = Load(multi_server, MINILM)  # MiniLM's arenas reach their size under this mix before anything is measured
    with warm:
        time.sleep(3)
    unload_first = admin_ok(client, "unload", TINY)
    assert_error(client.post("/v1/embeddings", json={"input": ["x"], "model": TINY}, headers=USER), 404,
                 "model_not_found", "not loaded")
    assert set(listed(client)) == {MINILM}
    assert not {f"{TINY}{suffix}" for suffix in STEP_SUFFIXES} & stub_models(multi_server)  # steps went too
    before, before_processes = settled_rss(multi_server)

    loads, unloads, loaded_rss = [], [], []
    with Load(multi_server, MINILM) as background:
        background.wait_for(1)
        for cycle in range(CYCLES):
            loads.append(admin_ok(client, "load", TINY))
            assert_matches(vectors(embed(client, TINY, TEXTS[:8])), references[TINY][:8], f"cycle {cycle}")
            loaded_rss.append(sum(v[0] for v in process_tree_rss(multi_server.process.pid).values()) / 1024)
            unloads.append(admin_ok(client, "unload", TINY))
            assert_error(client.post("/v1/embeddings", json={"input": ["x"], "model": TINY}, headers=USER), 404)
        served_during_cycles = background.ok
    after, after_processes = settled_rss(multi_server)
    with Load(multi_server, MINILM) as last:  # and load again, under load, leaving it loaded for what follows
        last.wait_for(1)
        loads.append(admin_ok(client, "load", TINY))
        assert_matches(vectors(embed(client, TINY, TEXTS)), references[TINY], "after the cycles")
        last.wait_for(1)
    assert set(listed(client)) == {MINILM, TINY}

    print(f"\nfirst unload {unload_first:.2f} s; load ({CYCLES + 1}): {', '.join(f'{s:.2f}' for s in loads)} s "
          f"(median {np.median(loads):.2f}); unload ({CYCLES}): {', '.join(f'{s:.2f}' for s in unloads)} s "
          f"(median {np.median(unloads):.2f})")
    print(f"RSS of tritonserver + stubs, tiny XLM-R unloaded: before the loads {before:.1f} MiB "
          f"({len(before_processes)} processes), after {CYCLES} load/unload cycles {after:.1f} MiB "
          f"({len(after_processes)} processes): {100 * (after - before) / before:+.1f} %; "
          f"loaded, during the cycles: {', '.join(f'{r:.0f}' for r in loaded_rss)} MiB")
    print(f"MiniLM under load meanwhile: {served_during_cycles} requests during the cycles, {last.ok} during the "
          f"last load, {len(background.failures) + len(last.failures)} failed")
    assert not background.failures and not last.failures, (background.failures + last.failures)[:5]
    assert served_during_cycles > 0 and last.ok > 0
    assert before_processes == after_processes
    assert abs(after - before) <= 0.10 * before, (before, after)


# ---------------------------------------------------------------- exports after start-up, broken ones, removal
def test_a_model_exported_after_start_up_is_found_loadable_and_removable(client, multi_server, multi_repository,
                                                                         tiny_xlmr_dir, references):
    export(multi_repository, "--model", str(tiny_xlmr_dir), "--name", "late-xlmr", "--pooling", "cls",
           "--max-length", str(TINY_XLMR_MAX_LENGTH))
    time.sleep(2.1)  # unknown ids rescan the repository at most every 2 s
    error = assert_error(client.post("/v1/embeddings", json={"input": ["x"], "model": "late-xlmr"}, headers=USER),
                         404, "model_not_found", "POST /v1/models/late-xlmr/load")
    assert "not loaded" in error["message"]
    assert "late-xlmr" not in listed(client)
    seconds = admin_ok(client, "load", "late-xlmr")
    assert listed(client)["late-xlmr"]["embedding_size"] == 32
    assert_matches(vectors(embed(client, "late-xlmr", TEXTS[:10])), references[TINY][:10], "late-xlmr")
    print(f"\nexported after start-up, then loaded in {seconds:.2f} s")
    # Removing it: refused while loaded; once unloaded, its five folders go and nothing else.
    assert "unload it first" in remove_export(multi_server, multi_repository, "late-xlmr")[1]
    admin_ok(client, "unload", "late-xlmr")
    remove_ok(multi_server, multi_repository, "late-xlmr")
    time.sleep(2.1)  # the proxy rescans the repository for unknown ids at most every 2 s
    assert not any((multi_repository / f"late-xlmr{suffix}").exists() for suffix in STEP_SUFFIXES)
    assert (multi_repository / TINY).exists() and (multi_repository / "ensemble").exists()
    assert_error(client.post("/v1/embeddings", json={"input": ["x"], "model": "late-xlmr"}, headers=USER), 404)
    assert_error(admin(client, "load", "late-xlmr"), 404, "model_not_found")
    assert set(listed(client)) == {MINILM, TINY}


def break_onnx(repository, name):
    (repository / f"{name}_embedding" / "1" / "model.onnx").write_bytes(b"this is not an ONNX model")


def break_tokenizer(repository, name):
    (repository / f"{name}_tokenizer" / "1" / "tokenizer.json").write_text('{"truncated": ')


def remove_steps(repository, name):
    shutil.rmtree(repository / f"{name}_tokenizer")
    shutil.rmtree(repository / f"{name}_embedding")
    shutil.rmtree(repository / f"{name}_bls")


@pytest.mark.parametrize("name, damage, words, attempts", [
    # twice: a failed load leaves nothing behind (its tokenizer did load) that breaks the next
    # (the stand-in's onnxruntime says INVALID_PROTOBUF, Triton's backend "onnx runtime error 7": both say this)
    ("bad-onnx", break_onnx, ("bad-onnx_embedding", "Protobuf parsing failed"), 2),
    ("bad-tokenizer", break_tokenizer, ("bad-tokenizer_tokenizer", "failed"), 1),
    ("no-steps", remove_steps, ("export is incomplete", "no-steps_tokenizer, no-steps_embedding, no-steps_bls"), 1),
])
def test_a_broken_model_fails_its_load_with_a_4xx_and_the_others_keep_serving(client, multi_server, multi_repository,
                                                                              references, name, damage, words,
                                                                              attempts):
    clone_export(multi_repository, TINY, name)
    damage(multi_repository, name)
    with Load(multi_server, TINY) as background:
        background.wait_for(1)
        for _ in range(attempts):
            started = time.perf_counter()
            error = assert_error(admin(client, "load", name), 422, "load_failed", *words)
            print(f"\n{name}: 422 in {time.perf_counter() - started:.2f} s: {error['message'][:160]}...")
        background.wait_for(1)
    assert not background.failures, background.failures[:3]
    assert background.ok >= 2
    assert client.get("/health").text == "ok"
    assert httpx.get(f"http://{multi_server.http_url}/v2/health/live", timeout=10).status_code == 200
    assert set(listed(client)) == {MINILM, TINY}
    for model in (MINILM, TINY):
        assert_matches(vectors(embed(client, model, TEXTS[:4])), references[model][:4], model)
    assert_error(client.post("/v1/embeddings", json={"input": ["x"], "model": name}, headers=USER), 404)
    # The steps that did load were unloaded again, and the folders can go.
    assert not {f"{name}{suffix}" for suffix in STEP_SUFFIXES[1:]} & stub_models(multi_server)
    remove_ok(multi_server, multi_repository, name)
    assert not (multi_repository / name).exists()


def test_triton_stays_ready_after_a_failed_load(client, multi_server, multi_repository):
    """In explicit mode the launcher runs tritonserver with --strict-readiness=false: a failed admin load must not
    turn /v2/health/ready (the pods' readiness probe) to 400."""
    clone_export(multi_repository, TINY, "bad-ready")
    break_tokenizer(multi_repository, "bad-ready")
    try:
        assert_error(admin(client, "load", "bad-ready"), 422, "load_failed")
        assert client.get("/health").text == "ok"  # the proxy's own readiness is fine
        assert httpx.get(f"http://{multi_server.http_url}/v2/health/ready", timeout=10).status_code == 200
    finally:
        remove_ok(multi_server, multi_repository, "bad-ready")


# ---------------------------------------------------------------- LOAD_MODELS, admin routes off
def test_load_models_starts_only_the_ones_named(multi_repository, multi_server, references, tmp_path):
    """LOAD_MODELS=proxy,tiny-xlmr: only the tiny XLM-R is served (and is the default); MiniLM is 404 until the
    admin route loads it, named by its hub id (a '/' in the path)."""
    running = start_server(multi_repository, str(tmp_path), extra_env={
        "API_KEY": USER_KEY, "ADMIN_API_KEY": ADMIN_KEY, "LOAD_MODELS": f"proxy,{TINY}"})
    try:
        wait_for_proxy(running)
        with httpx.Client(base_url=running.proxy_url, timeout=120) as http:
            assert set(listed(http)) == {TINY}
            assert "ensemble" not in stub_models(running) and "embedding" not in stub_models(running)
            assert_error(http.post("/v1/embeddings", json={"input": ["x"], "model": MINILM}, headers=USER), 404,
                         "model_not_found", "not loaded")
            assert embed(http, None, ["hello"])["model"] == TINY  # the default: the one served
            seconds = admin_ok(http, "load", MINILM)
            assert set(listed(http)) == {MINILM, TINY}
            assert_matches(vectors(embed(http, MINILM, TEXTS[:10])), references[MINILM][:10], "loaded MiniLM")
            print(f"\nLOAD_MODELS=proxy,{TINY}: MiniLM loaded through the admin route in {seconds:.2f} s")
    finally:
        launch.stop(running.process)
    assert running.process.returncode == 0, running.log()[-3000:]


def test_admin_routes_are_off_without_an_admin_key(multi_repository, multi_server, tmp_path):
    """No ADMIN_API_KEY: the admin routes answer 403, whatever key is sent (the API key opens nothing)."""
    running = start_server(multi_repository, str(tmp_path), extra_env={"API_KEY": USER_KEY, "LOAD_MODELS": "proxy"})
    try:
        with httpx.Client(base_url=running.proxy_url, timeout=60) as http:
            deadline = time.monotonic() + 30
            while http.get("/health/live").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert listed(http) == {}
            for action in ("load", "unload"):
                for key in ({}, USER, ADMIN):
                    assert_error(admin(http, action, TINY, key), 403, "admin_disabled", "ADMIN_API_KEY")
            assert listed(http) == {}
    finally:
        launch.stop(running.process)
    assert running.process.returncode == 0, running.log()[-3000:]
