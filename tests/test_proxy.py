"""The HTTP proxy (model_source/proxy), through the real tritonserver: both APIs against direct gRPC calls to
`ensemble`, the official OpenAI SDK, limits, errors, auth, the readiness gate, metrics, concurrency, shutdown."""
import asyncio
import base64
import random
import socket
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import MINILM, free_port, install_proxy, port_is_free, start_server
from local_triton import launch

pytestmark = pytest.mark.serial  # `make test` runs it alone: the admission gate measures the server's rate

TOLERANCE = 1e-6
MAX_LENGTH = 256  # all-MiniLM-L6-v2's max tokens, as exported
LONG_TEXT = "Paris is the capital of France. " * 80  # far over 256 tokens
TEXTS = [
    "Hello world",
    "Ünïcödé, 日本語のテキスト, and emoji 🚀🔥 all in one line.",
    "def add(a, b):\n    return a + b",
    "short",
    LONG_TEXT,
    "Triton Inference Server serves text embeddings from an ensemble of a tokenizer and an ONNX encoder.",
]


def grpc_embed(server, texts):
    """(embeddings, num_tokens, truncated) from `ensemble` over gRPC, in chunks the ensemble accepts."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    parts = []
    for start in range(0, len(texts), 32):
        chunk = texts[start:start + 32]
        text = grpcclient.InferInput("text", [len(chunk), 1], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in chunk], dtype=object).reshape(-1, 1))
        result = client.infer("ensemble", [text])
        parts.append((result.as_numpy("embedding"), result.as_numpy("num_tokens").reshape(-1),
                      result.as_numpy("truncated").reshape(-1)))
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


def decode_vectors(data):
    return np.array([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") if isinstance(
        item["embedding"], str) else item["embedding"] for item in data], dtype=np.float32)


def assert_error(response, status, *words):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    assert "Traceback" not in response.text
    for word in words:
        assert word in error["message"], error["message"]
    return error


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.proxy_url, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def expected(server):
    return grpc_embed(server, TEXTS)


# ---------------------------------------------------------------- the APIs against direct gRPC
def test_health(client):
    response = client.get("/health")
    assert (response.status_code, response.text) == (200, "ok")


def test_idle_keep_alive_connection_outlives_the_clients_expiry(server):
    """httpx (so the OpenAI SDK) reuses an idle connection for 5 s. With the proxy's keep-alive at 5 s too, a busy
    proxy closed connections as clients reused them: httpx.ReadError in CI under 200 clients. An idle connection
    must still answer after the client's own expiry, so the client always closes first."""
    def health(sock):
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\nok"):  # the whole answer, so the next one starts clean
            chunk = sock.recv(65536)
            assert chunk, f"the proxy closed the connection: {answer!r}"
            answer += chunk
        return answer.split(b"\r\n", 1)[0]

    with socket.create_connection(("127.0.0.1", server.proxy_port), timeout=10) as sock:
        assert health(sock) == b"HTTP/1.1 200 OK"
        time.sleep(6.0)  # past httpx's keepalive_expiry (5 s)
        assert health(sock) == b"HTTP/1.1 200 OK"


@pytest.mark.parametrize("encoding", ["float", "base64", None])
def test_openai_api_matches_grpc(client, expected, encoding):
    body = {"input": TEXTS, "model": MINILM, **({"encoding_format": encoding} if encoding else {})}
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    embeddings, tokens, truncated = expected
    assert result["object"] == "list" and result["model"] == MINILM
    assert [item["index"] for item in result["data"]] == list(range(len(TEXTS)))
    assert all(item["object"] == "embedding" for item in result["data"])
    if encoding == "base64":
        assert all(isinstance(item["embedding"], str) for item in result["data"])
    vectors = decode_vectors(result["data"])
    assert vectors.shape == (len(TEXTS), 384)
    assert np.abs(vectors - embeddings).max() <= TOLERANCE
    assert result["usage"] == {"prompt_tokens": int(tokens.sum()), "total_tokens": int(tokens.sum())}
    assert [item["truncated"] for item in result["data"]] == truncated.tolist()
    assert truncated.tolist() == [text is LONG_TEXT for text in TEXTS]
    assert response.headers["x-truncated-inputs"] == "1"


def test_openai_single_string_input(client, expected):
    result = client.post("/v1/embeddings", json={"input": TEXTS[1], "model": MINILM, "dimensions": 384}).json()
    assert len(result["data"]) == 1
    assert np.abs(decode_vectors(result["data"])[0] - expected[0][1]).max() <= TOLERANCE
    assert result["usage"]["prompt_tokens"] == int(expected[1][1])


def test_seed_api_matches_grpc(client, expected):
    response = client.post("/v1/embedding", json=[{"query": text} for text in TEXTS])
    assert response.status_code == 200, response.text
    result = response.json()
    assert all(set(item) == {"embedding"} for item in result)
    vectors = np.array([item["embedding"] for item in result], dtype=np.float32)
    assert np.abs(vectors - expected[0]).max() <= TOLERANCE
    assert response.headers["x-truncated-inputs"] == "1"


def test_official_openai_sdk(server, expected):
    from openai import OpenAI

    sdk = OpenAI(base_url=server.proxy_url + "/v1", api_key="unused", max_retries=0)
    result = sdk.embeddings.create(input=TEXTS, model=MINILM)  # the SDK asks for base64 by default
    vectors = np.array([item.embedding for item in result.data], dtype=np.float32)
    assert np.abs(vectors - expected[0]).max() <= TOLERANCE
    assert result.usage.prompt_tokens == result.usage.total_tokens == int(expected[1].sum())
    assert [m.id for m in sdk.models.list()] == [MINILM]


def test_more_inputs_than_max_batch_size_are_split_in_order(client, server):
    texts = [f"text number {i}: " + "word " * (i % 9) for i in range(150)]  # 64 per BLS call -> 3 calls
    embeddings, tokens, _ = grpc_embed(server, texts)
    result = client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()
    assert np.abs(decode_vectors(result["data"]) - embeddings).max() <= TOLERANCE
    assert result["usage"]["prompt_tokens"] == int(tokens.sum())


def test_concurrent_mixed_requests_each_get_their_own_answer(server):
    # Short texts keep the compute small on a 2-core CI machine; request 0 has 70 texts (split into 2 BLS calls).
    rng = random.Random(3)
    sizes = [70] + [rng.choice([1, 1, 1, 2, 2, 3, 4, 8]) for _ in range(199)]
    requests = [[f"request {r} text {j} " + "lorem ipsum " * rng.randint(0, 6) for j in range(size)]
                for r, size in enumerate(sizes)]
    flat = [text for texts in requests for text in texts]
    embeddings = dict(zip(flat, grpc_embed(server, flat)[0]))
    executions_before = server.stats("tokenizer")["execution_count"]
    failures_before = server.stats("ensemble")["inference_stats"]["fail"]["count"]

    async def send_all():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.proxy_url, timeout=120, limits=limits) as http:
            async def one(i, texts):
                while True:  # a well-behaved client: a refusal (admission control) is retried after Retry-After
                    if i % 2:
                        response = await http.post("/v1/embedding", json=[{"query": t} for t in texts])
                    else:
                        response = await http.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
                    if response.status_code != 429:
                        return response.json()
                    assert response.json()["error"]["code"] == "overloaded", response.text
                    refused.append(i)
                    await asyncio.sleep(float(response.headers["retry-after"]))
            return await asyncio.gather(*(one(i, texts) for i, texts in enumerate(requests)))

    refused = []
    answers = asyncio.run(send_all())
    print(f"\n200 concurrent requests: {len(refused)} refusals (429, retried)")
    assert len(answers) == 200
    for i, (texts, answer) in enumerate(zip(requests, answers)):
        items = answer if i % 2 else answer["data"]
        vectors = np.array([item["embedding"] for item in items], dtype=np.float32) if i % 2 else decode_vectors(items)
        assert vectors.shape == (len(texts), 384)
        assert np.abs(vectors - np.stack([embeddings[t] for t in texts])).max() <= TOLERANCE, f"request {i}"
    assert server.stats("ensemble")["inference_stats"]["fail"]["count"] == failures_before
    # 201 BLS calls (request 0 is split in two): had they reached Triton one at a time, the tokenizer would have
    # run once per call; concurrent calls let its dynamic batcher merge them.
    assert server.stats("tokenizer")["execution_count"] - executions_before < 201


def test_abandoned_requests_over_the_admission_bound_never_reach_triton(server):
    """Issue 16: 20 clients send 16 long texts each and leave after 1 s. Admission by work refuses what would wait
    over admission_target_s at once (429), so those never reach Triton; the admitted ones still run (Triton 24.07's
    BLS cannot cancel a call), and ensemble_bls's success counter rises by at most their number. Before admission
    by work, all 20 were admitted and ran."""
    texts = [f"abandoned {i} " + "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 30 for i in range(16)]
    with httpx.Client(base_url=server.proxy_url, timeout=120) as http:
        end = time.monotonic() + 4  # the gate measures the server's rate first (admission.MIN_MEASURED_S busy)
        while time.monotonic() < end:
            assert http.post("/v1/embeddings", json={"input": texts}).status_code == 200
    successes = lambda: server.stats("ensemble_bls")["inference_stats"]["success"]["count"]  # noqa: E731
    before = None
    while before != successes():  # Triton counts a success after its response has gone: let the counter settle
        before = successes()
        time.sleep(1)

    async def leave_after_1_s():
        async with httpx.AsyncClient(base_url=server.proxy_url, timeout=1.0,
                                     limits=httpx.Limits(max_connections=20)) as http:
            async def one():
                try:
                    return (await http.post("/v1/embeddings", json={"input": texts})).status_code
                except httpx.TimeoutException:
                    return "left"
            return await asyncio.gather(*(one() for _ in range(20)))

    outcomes = asyncio.run(leave_after_1_s())
    left, refused = outcomes.count("left"), outcomes.count(429)
    last, steady_since, deadline = successes(), time.monotonic(), time.monotonic() + 60
    # until the admitted ones have run (an execute of ensemble_bls answers its requests together: wait a while)
    while time.monotonic() - steady_since < 10 and time.monotonic() < deadline:
        time.sleep(0.5)
        if successes() != last:
            last, steady_since = successes(), time.monotonic()
    ran = successes() - before
    print(f"\n20 abandoned requests: {refused} refused at once, {left} admitted and left, {ran} ran in Triton")
    assert refused >= 5 and left + refused + outcomes.count(200) == 20, outcomes
    assert ran <= 20 - refused, (ran, outcomes)
    assert client_ok(server)


def client_ok(server):
    """The proxy still answers (a 429 while admitted work drains is retried after its Retry-After)."""
    with httpx.Client(base_url=server.proxy_url, timeout=60) as http:
        for _ in range(30):
            response = http.post("/v1/embeddings", json={"input": ["still serving"]})
            if response.status_code != 429:
                return response.status_code == 200
            time.sleep(float(response.headers["retry-after"]))
    return False


# ---------------------------------------------------------------- truncation and limits
def test_truncation_is_default_and_truncate_false_is_an_error(client):
    result = client.post("/v1/embeddings", json={"input": [LONG_TEXT], "truncate": True}).json()
    assert result["data"][0]["truncated"] is True and result["usage"]["prompt_tokens"] == MAX_LENGTH
    error = assert_error(client.post("/v1/embeddings", json={"input": ["ok", LONG_TEXT], "truncate": False}), 422,
                         "input[1]", str(MAX_LENGTH), "tokens")
    assert error["code"] == "too_long"
    assert_error(client.post("/v1/embedding", params={"truncate": "false"}, json=[{"query": LONG_TEXT}]), 422,
                 "query[0]", str(MAX_LENGTH))
    short = client.post("/v1/embeddings", json={"input": ["short"], "truncate": False})
    assert short.status_code == 200 and short.headers["x-truncated-inputs"] == "0"


def test_body_over_limit_is_413(client):
    response = client.post("/v1/embeddings", content=b'{"input": ["' + b"a" * (3 * 2**20) + b'"]}',
                           headers={"content-type": "application/json"})
    assert_error(response, 413, "2097152", "max_body_bytes")


def test_too_many_inputs_and_too_many_characters_are_422(client):
    assert_error(client.post("/v1/embeddings", json={"input": ["a"] * 2049}), 422, "2049", "2048",
                 "max_inputs_per_request")
    assert_error(client.post("/v1/embedding", json=[{"query": "a"}] * 2049), 422, "max_inputs_per_request")
    assert_error(client.post("/v1/embeddings", json={"input": ["ok", "b" * 262145]}), 422, "input[1]", "262144",
                 "max_input_chars")


def test_bad_requests_are_client_errors_and_the_server_keeps_serving(client):
    """The full table of bad requests and their codes runs against the app alone (test_proxy_app.py); through the
    real server, a sample of each kind gets its 4xx and the proxy keeps serving."""
    for body, status in ((b"{not json", 400), (b'{"input": [1, 2]}', 400), (b'{"input": "x", "model": 5}', 400),
                         (b"[" * 1500 + b"]" * 1500, 400), (b'{"input": ["\xff"]}', 400)):
        response = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert response.status_code == status, (body[:40], response.text)
        assert "Traceback" not in response.text
    assert client.post("/v1/embeddings", content=b'{"input": "x"}', headers={"content-type": "text/plain"}) \
        .status_code == 415
    assert client.get("/health").status_code == 200


def test_bad_query_parameter_is_400(client):
    assert_error(client.post("/v1/embedding", params={"truncate": "maybe"}, json=[{"query": "x"}]), 400, "truncate")


# ---------------------------------------------------------------- the other routes
def test_models(client):
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == [MINILM]
    card = client.get(f"/v1/models/{MINILM}").json()
    assert card["id"] == MINILM and card["object"] == "model" and card["embedding_size"] == 384
    assert_error(client.get("/v1/models/not-a-model"), 404, "not-a-model")
    assert_error(client.get("/no/such/route"), 404)


def test_metrics_counters_move(client):
    def sample(text, name):
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    ok = f'proxy_requests_total{{model="{MINILM}",route="/v1/embeddings",status="200"}}'
    bad = 'proxy_requests_total{model="",route="/v1/embeddings",status="400"}'
    tokens = f'proxy_tokens_total{{model="{MINILM}"}}'
    inputs = f'proxy_request_inputs_count{{model="{MINILM}"}}'
    before = client.get("/metrics").text
    client.post("/v1/embeddings", json={"input": ["one", "two", "three"]})
    client.post("/v1/embeddings", json={"input": []})
    after = client.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    assert sample(after.text, ok) == sample(before, ok) + 1
    assert sample(after.text, bad) == sample(before, bad) + 1
    assert sample(after.text, tokens) >= sample(before, tokens) + 9  # 3 x (CLS word SEP)
    assert sample(after.text, inputs) == sample(before, inputs) + 1
    assert 'proxy_request_duration_seconds_bucket{le="+Inf",route="/v1/embeddings"}' in after.text


def test_openapi_and_offline_swagger_ui(client):
    spec = client.get("/openapi.json").json()
    assert {"/v1/embeddings", "/v1/embedding", "/v1/models", "/health", "/metrics"} <= set(spec["paths"])
    page = client.get("/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    assert "cdn" not in page.text and "https://" not in page.text  # no asset from the internet
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"):
        assert f"/docs/assets/{asset}" in page.text
        assert client.get(f"/docs/assets/{asset}").status_code == 200


def test_triton_inference_on_the_proxy_model_points_to_http(server):
    unused = grpcclient.InferInput("unused_input", [1], "BOOL")
    unused.set_data_from_numpy(np.array([True]))
    with pytest.raises(InferenceServerException, match="HTTP"):
        grpcclient.InferenceServerClient(server.grpc_url).infer("proxy", [unused])


# ---------------------------------------------------------------- other servers: readiness gate, auth, lifecycle
@pytest.fixture(scope="module")
def proxy_only_repository(tmp_path_factory):
    """A repository with the proxy and no ensemble: the proxy loads, the ensemble is never ready."""
    repository = tmp_path_factory.mktemp("proxy_only")
    install_proxy(repository)
    return repository


def test_readiness_gate_auth_and_clean_stop(proxy_only_repository, tmp_path):
    running = start_server(proxy_only_repository, str(tmp_path), extra_env={"API_KEY": "s3cret"})
    try:
        with httpx.Client(base_url=running.proxy_url, timeout=30) as http:
            health = http.get("/health")  # open without the key
            assert (health.status_code, health.text) == (503, "no model is served")
            assert http.get("/health/live").status_code == 200
            body = {"input": ["hello"]}
            error = assert_error(http.post("/v1/embeddings", json=body), 401, "API key")
            assert error["type"] == "authentication_error"
            assert_error(http.post("/v1/embeddings", json=body, headers={"Authorization": "Bearer wrong"}), 401)
            assert_error(http.get("/v1/models"), 401)
            key = {"Authorization": "Bearer s3cret"}
            assert_error(http.post("/v1/embeddings", json=body, headers=key), 503, "no model is served")
            assert_error(http.post("/v1/embedding", json=[{"query": "x"}], headers=key), 503)
            assert http.get("/v1/models", headers=key).json() == {
                "object": "list", "data": [], "onnxruntime_backend": launch.describe_onnxruntime_backend()}
            assert http.get("/metrics").status_code == 200
        # The key is read from the environment, never from a config Triton serves back.
        config = httpx.get(f"http://{running.http_url}/v2/models/proxy/config", timeout=10).text
        assert "s3cret" not in config and "api_key" not in config
    finally:
        launch.stop(running.process)
    assert running.process.returncode == 0
    assert "proxy: stopped, port released" in running.log()
    assert port_is_free(running.proxy_port)


def test_busy_port_fails_the_model_load_with_a_clear_message(proxy_only_repository, tmp_path):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        with pytest.raises(RuntimeError) as failure:
            start_server(proxy_only_repository, str(tmp_path), extra_env={"PROXY_PORT": str(port)})
    assert "did not start" in str(failure.value)
    with open(tmp_path / "tritonserver.log", encoding="utf-8", errors="replace") as log:
        assert f"cannot listen on 127.0.0.1:{port}" in log.read()


def test_unloading_the_proxy_model_releases_its_port_and_reloading_serves_again(proxy_only_repository, tmp_path):
    """Triton's model control (explicit mode): unload stops the HTTP server thread and frees the port without
    stopping Triton; a load starts it again on the same port."""
    running = start_server(proxy_only_repository, str(tmp_path), extra_env={"ADMIN_API_KEY": "root"})
    repository_api = f"http://{running.http_url}/v2/repository/models/proxy"
    admin = {"admin-key": "root"}  # Triton's repository API is restricted (launcher: --http-restricted-api)
    try:
        assert httpx.get(f"{running.proxy_url}/health", timeout=10).status_code == 503  # up, no ensemble
        assert httpx.post(f"{repository_api}/unload", timeout=60).status_code == 403
        assert httpx.post(f"{repository_api}/unload", timeout=60, headers=admin).status_code == 200
        for _ in range(100):  # unload returns before finalize() has finished
            if "proxy: stopped, port released" in running.log():
                break
            time.sleep(0.1)
        assert "proxy: stopped, port released" in running.log(), running.log()[-3000:]
        assert port_is_free(running.proxy_port)
        assert httpx.post(f"{repository_api}/load", timeout=60, headers=admin).status_code == 200
        assert httpx.get(f"{running.proxy_url}/health", timeout=10).status_code == 503
    finally:
        launch.stop(running.process)
    assert running.process.returncode == 0
