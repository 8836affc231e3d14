"""Images over HTTP for CLIP exports (model_source/proxy/1/images.py and the routes using it), with the fake
service of tests/proxy_fakes.py: /infer, the CLIP admin seed routes, images in /v1/embeddings, base64 and data URI
decoding, limits, errors naming the item; URL fetching against a local http.server; and the real Service's image
path (pieces, error mapping, load/unload of the image models) with fakes of pb_utils and Triton's HTTP API."""
import asyncio
import base64
import ipaddress
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import numpy as np
import pytest

from model_library import model_errors
from model_library.in_process import model_module
from proxy_fakes import CLIP, DIM, JPEG, PNG, b64, error_of, fake_vectors, make_client, proxy_service, settings

pytestmark = pytest.mark.serial  # `make test` runs it alone: image fetch timeouts and slow senders

admission = model_module("proxy", "http_front.admission")
images = model_module("proxy", "http_front.images")
registry = model_module("proxy", "http_front.registry")
ADMIN = {"Authorization": "Bearer admin"}


def clip_client(**overrides):
    client = make_client(**overrides)
    client.service.models["fake-clip"] = CLIP
    return client


def image_vector(data):
    return fake_vectors(data.hex())


# ---------------------------------------------------------------- /infer
def test_infer_returns_text_and_image_embeddings_in_order():
    client = clip_client()
    response = client.post("/infer", json={"text": ["a dog", "a cat"], "image": [b64(PNG), b64(JPEG)]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"text_embeddings", "image_embeddings", "processingTimeMs"}
    np.testing.assert_allclose(body["text_embeddings"], [fake_vectors("a dog"), fake_vectors("a cat")], atol=1e-6)
    np.testing.assert_allclose(body["image_embeddings"], [image_vector(PNG), image_vector(JPEG)], atol=1e-6)
    assert isinstance(body["processingTimeMs"], float) and body["processingTimeMs"] >= 0
    assert client.service.calls[0][0] == "fake-clip"  # the only CLIP export, not the text default
    only_images = client.post("/infer", json={"image": [b64(PNG)]}).json()
    assert only_images["text_embeddings"] == [] and len(only_images["image_embeddings"]) == 1
    only_texts = client.post("/infer", json={"text": ["x"], "image": []}).json()
    assert only_texts["image_embeddings"] == [] and len(only_texts["text_embeddings"][0]) == DIM


def test_infer_refuses_no_input_a_text_model_and_no_clip_model():
    client = clip_client()
    error_of(client.post("/infer", json={}), 400, "'text' or 'image'")
    error_of(client.post("/infer", json={"text": [], "image": []}), 400, "'text' or 'image'")
    error = error_of(client.post("/infer", json={"text": ["x"], "model": "fake-dense"}), 400, "fake-dense",
                     "text only")
    assert error["code"] == "not_served"
    error_of(client.post("/infer", json={"image": [b64(PNG), "BAD!"]}), 400, "image[1]", "base64")
    error_of(make_client().post("/infer", json={"text": ["x"]}), 404, "no CLIP model", "build/export.py")


# ---------------------------------------------------------------- the CLIP admin seed routes
def test_clip_admin_routes_need_the_admin_key():
    error_of(clip_client().post("/load_clip_model", json={"model_name": "ViT-B-32"}), 403, "ADMIN_API_KEY")
    client = clip_client(admin_api_key="admin", api_key="user")
    for path in ("/load_clip_model", "/unload_clip_model", "/delete_clip_model"):
        error_of(client.post(path, json={"model_name": "ViT-B-32"}, headers={"Authorization": "Bearer user"}), 401)
    assert client.service.admin == []


def test_clip_admin_routes_load_unload_and_keep_files():
    client = clip_client(admin_api_key="admin")
    body = {"model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}
    loaded = client.post("/load_clip_model", json=body, headers=ADMIN).json()
    assert loaded == {"status": "loaded", "model": "fake-clip", "model_name": "ViT-B-32",
                      "pretrained": "laion2b_s34b_b79k", "seconds": 0.5}
    assert client.post("/load_clip_model", json={"model_name": "fake-clip"}, headers=ADMIN).status_code == 200
    unloaded = client.post("/unload_clip_model", json={"model_name": "ViT-B-32"}, headers=ADMIN).json()
    assert (unloaded["status"], unloaded["model"]) == ("unloaded", "fake-clip")
    deleted = client.post("/delete_clip_model", json={"model_name": "ViT-B-32"}, headers=ADMIN).json()
    assert deleted["status"] == "unloaded" and deleted["files_kept"] is True
    assert "python -m exporter.remove_export fake-clip" in deleted["message"]
    assert client.service.admin == [("load", "fake-clip"), ("load", "fake-clip"), ("unload", "fake-clip"),
                                    ("unload", "fake-clip")]


def test_load_clip_model_without_an_export_gives_the_export_command():
    client = clip_client(admin_api_key="admin")
    error = error_of(client.post("/load_clip_model", json={"model_name": "ViT-L-14", "pretrained": "openai"},
                                 headers=ADMIN), 404, "torch",
                     "python build/export.py --open-clip ViT-L-14 --pretrained openai --name <name>")
    assert error["code"] == "model_not_found"
    error_of(client.post("/load_clip_model", json={"model_name": "ViT-B-32", "pretrained": "openai"}, headers=ADMIN),
             404, "ViT-B-32 / openai")
    error_of(client.post("/load_clip_model", json={"model_name": "fake-dense"}, headers=ADMIN), 404)  # not CLIP
    assert client.service.admin == []


# ---------------------------------------------------------------- /v1/embeddings with images
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_mix_texts_and_images_in_input_order(encoding):
    client = clip_client()
    items = ["a b", {"image": b64(PNG)}, {"text": "c"}, {"image": "data:image/jpeg;base64," + b64(JPEG)}]
    response = client.post("/v1/embeddings", json={"input": items, "model": "fake-clip", "encoding_format": encoding})
    assert response.status_code == 200, response.text
    body = response.json()
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if encoding == "base64" else d["embedding"]
            for d in body["data"]]
    expected = [fake_vectors("a b"), image_vector(PNG), fake_vectors("c"), image_vector(JPEG)]
    np.testing.assert_allclose(rows, expected, atol=1e-6)
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}  # images count 0 tokens
    # one call for the texts, one for the images
    assert [call[2] for call in client.service.calls] == [("dense",), "images"]
    assert client.service.calls[0][1] == ["a b", "c"] and client.service.calls[1][1] == [PNG, JPEG]


def test_embeddings_with_images_only_and_errors_naming_the_item():
    client = clip_client()
    only = client.post("/v1/embeddings", json={"input": [{"image": b64(PNG)}], "model": "fake-clip"})
    assert only.status_code == 200 and only.json()["usage"]["total_tokens"] == 0
    items = [{"image": b64(PNG)}, "ok", "   "]
    error_of(client.post("/v1/embeddings", json={"input": items, "model": "fake-clip"}), 400, "input[2] is empty")
    items = [{"image": b64(PNG)}, "ok", "BAD"]  # the text service's error, named by the client's index
    error_of(client.post("/v1/embeddings", json={"input": items, "model": "fake-clip"}), 400, "input[2]", "UTF-8")
    items = ["ok", {"image": b64(PNG)}, "ok", {"image": b64(b"BAD image")}]  # the image model's error
    error = error_of(client.post("/v1/embeddings", json={"input": items, "model": "fake-clip"}), 400,
                     "input[3] is not an image")
    assert error["param"] == "input"
    items = ["ok", {"image": "not base64 at all!"}]
    error_of(client.post("/v1/embeddings", json={"input": items, "model": "fake-clip"}), 400, "input[1]", "base64")


@pytest.mark.parametrize("body, words", [
    ({"input": [{"image": "AAAA"}]}, ["fake-dense", "text only"]),
    ({"input": [{"image": "AAAA"}], "model": "fake-clip", "encoding_format": "int8"},
     ["encoding_format int8", "float only"]),
    ({"input": ["x", {"image": "AAAA"}], "model": "fake-clip", "dimensions": 4}, ["dimensions 4", "float only"]),
    ({"input": [{"image": "AAAA", "text": "x"}], "model": "fake-clip"}, ["input"]),
    ({"input": [{"picture": "AAAA"}], "model": "fake-clip"}, ["input"]),
])
def test_embeddings_refuse_what_images_cannot_have(body, words):
    client = clip_client()
    error_of(client.post("/v1/embeddings", json=body), 400, *words)
    assert client.service.calls == []


def test_rerank_on_a_clip_export_is_a_clear_400():
    error = error_of(clip_client().post("/v1/rerank", json={"query": "q", "documents": ["a"], "model": "fake-clip"}),
                     400, "model 'fake-clip' has no rerank model")
    assert error["param"] == "model"


# ---------------------------------------------------------------- decoding and limits
@pytest.mark.parametrize("item", [
    b64(PNG), b64(PNG, padded=False), b64(PNG, urlsafe=True), b64(PNG, urlsafe=True, padded=False),
    "\n".join(b64(PNG)[i:i + 76] for i in range(0, len(b64(PNG)), 76)),
    "data:image/png;base64," + b64(PNG), "DATA:image/png;BASE64," + b64(PNG, urlsafe=True, padded=False),
    "data:image/png," + urllib.parse.quote_from_bytes(PNG),
])
def test_items_decode_to_the_same_bytes(item):
    assert "-" in b64(PNG, urlsafe=True) or "_" in b64(PNG, urlsafe=True)  # the URL-safe alphabet is exercised
    assert asyncio.run(images.load([item], "image", settings())) == [PNG]


@pytest.mark.parametrize("item, status, words", [
    ("", 400, ["image[0] is empty"]),
    ("data:image/png;base64", 400, ["image[0] is not a valid data URI"]),
    ("@@@@", 400, ["image[0] is neither base64"]),
    ("A", 400, ["image[0] is neither base64"]),
    ("ftp://example.com/a.png", 400, ["image[0]", "'ftp:' URL is not fetched"]),
    ("file:///etc/passwd", 400, ["image[0]", "'file:'"]),
    (b64(bytes(1001)), 413, ["image[0] has 1001 bytes", "1000", "max_image_bytes"]),
    ("data:image/png;base64," + b64(bytes(3000)), 413, ["image[0]", "max_image_bytes"]),
    ("data:image/png," + "%00" * 1001, 413, ["image[0] has 1001 bytes"]),
])
def test_bad_items_name_the_item_and_the_cause(item, status, words):
    client = clip_client()
    error = error_of(client.post("/infer", json={"image": [item]}), status, *words)
    assert error["param"] == "image" and client.service.calls == []


def test_too_many_images():
    client = clip_client()
    error_of(client.post("/infer", json={"image": [b64(PNG)] * 5}), 422, "5 images", "max_images_per_request")
    error_of(client.post("/v1/embeddings", json={"input": [{"image": b64(PNG)}] * 5, "model": "fake-clip"}), 422,
             "max_images_per_request")
    assert client.service.calls == []


# ---------------------------------------------------------------- URL fetching
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sent = {}  # path -> bytes the server managed to send (the endless body)

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        path, _, query = self.path.partition("?")
        if path == "/img":
            return self.answer(200, PNG)
        if path == "/big":  # declares its size
            return self.answer(200, bytes(5000))
        if path.startswith("/status/"):
            return self.answer(int(path.split("/")[2]), b"nope")
        if path == "/redirect":
            return self.answer(302, b"", {"Location": urllib.parse.parse_qs(query)["to"][0]})
        if path.startswith("/chain/"):
            left = int(path.split("/")[2])
            return self.answer(302, b"", {"Location": f"/chain/{left - 1}" if left else "/img"}) if left else \
                self.answer(200, PNG)
        if path == "/endless":  # no Content-Length: the client must stop reading at its limit
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            sent = 0
            try:
                while sent < 256 * 2**20:
                    self.wfile.write(bytes(65536))
                    sent += 65536
            except OSError:
                pass
            finally:
                Handler.sent[path] = sent
            return None
        if path == "/slow":  # a byte at a time: each read is quick, the whole is not
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
            return None
        return self.answer(404, b"")

    def answer(self, status, body, headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def fetch_error(client, url, *words):
    error = error_of(client.post("/infer", json={"image": [b64(PNG), url]}), 400, "image[1]", *words)
    assert client.service.calls == []
    return error


LOCAL = {"image_url_hosts": "127.0.0.1", "image_url_allow_private": True}


def test_url_fetching_is_off_by_default(http_server):
    error = fetch_error(clip_client(), f"{http_server}/img", "off", "image_url_hosts")
    assert error["code"] == "image_urls_off"


def test_a_host_not_on_the_allow_list_is_refused(http_server):
    fetch_error(clip_client(image_url_hosts="example.com, images.example.org"), f"{http_server}/img",
                "host '127.0.0.1' is not in image_url_hosts")


def test_loopback_is_refused_without_allow_private_even_when_allow_listed(http_server):
    for hosts in ("127.0.0.1", "localhost"):
        fetch_error(clip_client(image_url_hosts=hosts), f"{http_server.replace('127.0.0.1', hosts)}/img",
                    "private, loopback", "image_url_allow_private")


def test_fetching_an_allow_listed_host(http_server):
    client = clip_client(**LOCAL)
    response = client.post("/infer", json={"image": [f"{http_server}/img", b64(JPEG)]})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["image_embeddings"], [image_vector(PNG), image_vector(JPEG)],
                               atol=1e-6)
    assert client.service.calls[-1][1] == [PNG, JPEG]
    mixed = client.post("/v1/embeddings", json={"input": ["t", {"image": f"{http_server}/chain/3"}],
                                                "model": "fake-clip"})  # 3 redirects: allowed
    assert mixed.status_code == 200, mixed.text
    np.testing.assert_allclose(mixed.json()["data"][1]["embedding"], image_vector(PNG), atol=1e-6)


def test_redirects_are_checked_and_bounded(http_server):
    client = clip_client(**LOCAL)
    other = http_server.replace("127.0.0.1", "localhost")
    fetch_error(client, f"{http_server}/redirect?to={urllib.parse.quote(other + '/img')}",
                "host 'localhost' is not in image_url_hosts")
    fetch_error(client, f"{http_server}/redirect?to=file:///etc/passwd", "'file:' URLs are not fetched")
    fetch_error(client, f"{http_server}/chain/4", "more than 3 redirects")
    # the address rule holds for every redirect too: allow-listed, but loopback without allow_private
    strict = clip_client(image_url_hosts="127.0.0.1,localhost")
    fetch_error(strict, f"{http_server}/redirect?to={urllib.parse.quote(other + '/img')}", "loopback")


def test_http_errors_and_sizes(http_server):
    client = clip_client(**LOCAL)
    fetch_error(client, f"{http_server}/status/404", "HTTP 404")
    fetch_error(client, f"{http_server}/big", "Content-Length 5000 is over the limit of 1000")


def test_an_endless_body_is_cut_at_the_limit_without_reading_it_all(http_server):
    config = settings(image_url_hosts="127.0.0.1", image_url_allow_private=True, image_url_max_bytes=100_000,
                      max_image_bytes=10**9)
    started = time.monotonic()
    with pytest.raises(images.FetchError, match="body is over the limit of 100000 bytes"):
        images.fetch(f"{http_server}/endless", config)
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 10
    while "/endless" not in Handler.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Handler.sent["/endless"] < 256 * 2**20  # the server could not send it all: the client hung up


def test_a_slow_server_is_cut_at_the_total_timeout(http_server):
    client = clip_client(**LOCAL, image_url_timeout_s=0.5)
    started = time.monotonic()
    fetch_error(client, f"{http_server}/slow", "timed out after 0.5 s", "image_url_timeout_s")
    assert time.monotonic() - started < 3  # 100 bytes at 0.1 s each would take 10 s


@pytest.mark.parametrize("address, public", [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True), ("127.0.0.1", False), ("10.1.2.3", False),
    ("172.16.0.1", False), ("192.168.1.1", False), ("169.254.169.254", False), ("0.0.0.0", False),
    ("224.0.0.1", False), ("240.0.0.1", False), ("100.64.0.1", False), ("::1", False), ("fe80::1", False),
    ("fc00::1", False), ("::ffff:127.0.0.1", False), ("::", False), ("ff02::1", False),
])
def test_the_address_rule(address, public):
    assert images.public(ipaddress.ip_address(address)) is public


# ---------------------------------------------------------------- the real service's image path
class FakePb:
    """pb_utils for Service.infer: the image ensemble embeds each row; a row starting with b"BAD" fails the request
    with the preprocess model's message (prefixed as an ensemble prefixes it)."""
    TRITONSERVER_MEMORY_CPU = 0

    def __init__(self):
        self.requests = []
        pb = self

        class InferenceRequest:
            def __init__(self, model_name, requested_output_names, parameters, inputs, timeout, preferred_memory):
                self.model, self.inputs = model_name, dict(inputs)

            def exec(self):
                rows = [row[0] for row in self.inputs["image"]]
                pb.requests.append((self.model, rows))
                bad = [i for i, row in enumerate(rows) if row.startswith(b"BAD")]
                if bad:
                    # the image model's error in the contract (model_errors.py), behind the ensemble's words
                    message = f"in ensemble '{self.model}', " + model_errors.tagged(
                        "invalid_input", f"image[{bad[0]}]", "is not an image (cannot identify image file)")
                    error = SimpleNamespace(message=lambda: message)
                    return SimpleNamespace(has_error=lambda: True, error=lambda: error)
                return SimpleNamespace(has_error=lambda: False,
                                       outputs={"embedding": np.stack([image_vector(row) for row in rows])})
        self.InferenceRequest = InferenceRequest

    @staticmethod
    def Tensor(name, array):  # noqa: N802 - pb_utils' name
        return name, array

    @staticmethod
    def PreferredMemory(*args):  # noqa: N802
        return args

    @staticmethod
    def get_output_tensor_by_name(response, name):
        return SimpleNamespace(as_numpy=lambda: response.outputs[name])


MANIFEST = {"id": "clip", "kind": "clip", "name": "clip", "tokenizer_model": "clip_tokenizer",
            "encoder_model": "clip_embedding", "bls_model": "clip_bls", "rerank_model": None, "chunks_model": None,
            "image_model": "clip_image", "image_preprocess_model": "clip_image_preprocess",
            "image_encoder_model": "clip_image_embedding", "model": "open_clip:ViT-B-32", "source": "open_clip",
            "architecture": "ViT-B-32", "pretrained": "laion2b_s34b_b79k", "outputs": ["dense"],
            "embedding_size": 512, "max_length": 77, "image_size": [224, 224]}
MODELS = ("clip", "clip_tokenizer", "clip_embedding", "clip_bls", "clip_image", "clip_image_preprocess",
          "clip_image_embedding")


class FakeTriton:
    def __init__(self):
        self.controls = []

    def ready(self, model):
        return True

    def config(self, model):
        return {"max_batch_size": 64}

    def control(self, action, model, unload_dependents=False):
        self.controls.append((action, model))

    def states(self):
        return {}


@pytest.fixture
def clip_service(tmp_path):
    for model in MODELS:
        (tmp_path / model / "1").mkdir(parents=True)
        (tmp_path / model / "config.pbtxt").write_text("")
    (tmp_path / "clip" / "1" / "export.json").write_text(json.dumps(MANIFEST))
    config = SimpleNamespace(load_models="*", default_model="", request_timeout_s=10.0, model_control="explicit")
    executor = ThreadPoolExecutor(4)
    service = proxy_service.Service(FakePb(), registry.Registry(str(tmp_path), config), FakeTriton(), config,
                                    executor)
    service.triton_started = True
    yield service
    executor.shutdown()


def test_a_clip_manifest_makes_a_card_with_the_image_models(clip_service):
    card = registry.read_card(clip_service.registry.repository, "clip")
    assert card.models == MODELS and card.rerank is None and card.chunks is None
    assert (card.kind, card.architecture, card.pretrained) == ("clip", "ViT-B-32", "laion2b_s34b_b79k")
    assert clip_service.exports() == [card]
    assert set(clip_service.own_steps(card)) == set(MODELS) - {"clip"}


def test_embed_images_splits_by_the_image_models_batch_size_and_names_the_clients_item(clip_service):
    card = registry.read_card(clip_service.registry.repository, "clip")
    clip_service.bls_rows["clip_image"] = 2
    pictures = [bytes([i]) * 10 for i in range(5)]
    embedded = asyncio.run(clip_service.embed_images(card, pictures, "image"))
    vectors = embedded.dense
    assert vectors.dtype == np.float32 and vectors.shape == (5, DIM) and embedded.inference_ms > 0
    np.testing.assert_allclose(vectors, [image_vector(p) for p in pictures], atol=1e-6)
    assert sorted(len(rows) for _, rows in clip_service.pb.requests) == [1, 2, 2]
    assert {model for model, _ in clip_service.pb.requests} == {"clip_image"}
    pictures[3] = b"BAD"  # row 1 of the second request; the client's item 7
    with pytest.raises(proxy_service.ClientError, match=r"^input\[7\] is not an image \(cannot identify") as caught:
        asyncio.run(clip_service.embed_images(card, pictures, "input", [1, 3, 5, 7, 9]))
    assert caught.value.param == "input"


def test_calls_on_a_dead_stub_fail_at_once_and_only_the_running_ones_are_stranded(clip_service):
    """A stub that died never answers: its calls fail at once (503), and the calls still queued for a BLS thread are
    cancelled, so the proxy counts as stranded (its liveness) only the threads that really wait for ever."""
    card = registry.read_card(clip_service.registry.repository, "clip")
    started, dead = [], threading.Event()

    class DeadStubRequest:
        def __init__(self, **_):
            pass

        def exec(self):
            started.append(time.monotonic())
            dead.wait(30)

    clip_service.pb.InferenceRequest = DeadStubRequest
    clip_service.executor = one_thread = ThreadPoolExecutor(1)

    async def scenario():
        calls = [asyncio.ensure_future(clip_service.infer(card, "clip_image", {"image": np.zeros((1, 1))}, ["e"], None))
                 for _ in range(3)]
        while not started:
            await asyncio.sleep(0.01)
        stranded = await asyncio.to_thread(clip_service.abort_inflight, "clip_image", "model 'clip_image' stopped "
                                                                                     "being ready")
        return stranded, await asyncio.gather(*calls, return_exceptions=True)

    try:
        stranded, results = asyncio.run(scenario())
        assert all(isinstance(r, proxy_service.Unavailable) and "stopped being ready" in str(r) for r in results)
        assert len(stranded) == 1 and not stranded[0].done() and len(started) == 1  # the queued two never ran
    finally:
        dead.set()
        one_thread.shutdown()
    assert len(started) == 1


def test_a_call_past_request_timeout_s_fails_at_its_deadline_and_its_work_leaves_admission_at_once(clip_service):
    """The proxy's own deadline (504 inference_timeout): the request fails at request_timeout_s from its arrival, and
    its work leaves admission (admission.WorkGate) then, though its BLS call, which Triton cannot cancel, still runs:
    the gate counts work somebody waits for."""
    card = registry.read_card(clip_service.registry.repository, "clip")
    clip_service.settings.request_timeout_s = 0.3
    returned = threading.Event()
    answer = clip_service.pb.InferenceRequest

    class SlowRequest(answer):
        def exec(self):
            time.sleep(1.0)
            try:
                return super().exec()
            finally:
                returned.set()

    clip_service.pb.InferenceRequest = SlowRequest

    async def scenario():
        gate = admission.WorkGate(2.0, 100)
        request = admission.RequestAdmission(gate, 100, clip_service.settings.request_timeout_s)
        admission.begin(request)  # as HttpGuard does for each inference request
        started = time.monotonic()
        with pytest.raises(proxy_service.Timeout, match="within 0.3 s") as caught:
            await clip_service.infer(card, "clip_image", {"image": np.array([[b"img"]], dtype=np.object_)},
                                     ["embedding"], None)
        failed_after, calls_then, in_flight_then = time.monotonic() - started, request.ticket.calls, gate.in_flight
        request.close()  # the request is over; its call is not
        await asyncio.to_thread(returned.wait, 10)
        await asyncio.sleep(0.05)  # the call's return reaches the loop
        return (caught.value.code, failed_after, calls_then, in_flight_then, request.ticket.calls, gate.in_flight,
                gate.finished, clip_service.inflight)

    code, failed_after, calls_then, in_flight_then, calls_after, in_flight, finished, inflight = asyncio.run(scenario())
    assert code == "inference_timeout" and 0.25 < failed_after < 0.9
    assert (calls_then, in_flight_then, calls_after, in_flight, finished, inflight) == (1, 0, 0, 0, 0, set())


def test_load_and_unload_cover_the_image_models(clip_service):
    clip_service.load_now("clip")
    assert clip_service.triton.controls == [("load", "clip"), ("load", "clip_bls"), ("load", "clip_image")]
    assert clip_service.bls_rows["clip_image"] == 64  # learnt for embed_images
    assert clip_service.registry.is_ready(clip_service.registry.find("clip"))
    clip_service.triton.controls.clear()
    clip_service.unload_now("clip")
    assert clip_service.triton.controls[0] == ("unload", "clip")
    assert {model for _, model in clip_service.triton.controls[1:]} == set(MODELS) - {"clip"}
