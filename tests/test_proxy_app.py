"""The proxy's HTTP app (model_source/proxy/1/app.py) with FastAPI's TestClient and an injected fake service
(tests/proxy_fakes.py): routes, validation and error codes, auth, limits, routing by model, admin gating, metrics.
No Triton here; tests/test_proxy.py covers the same app through the real server."""
import ast
import asyncio
import base64
import glob
import os
import sys
import types

import numpy as np
import pytest
from fastapi.testclient import TestClient

from conftest import PROJECT
from model_library.in_process import model_module
from proxy_fakes import DIM, FakeService, error_of, fake_vectors, make_client, proxy_app, proxy_service, settings

admission = model_module("proxy", "http_front.admission")
errors = model_module("proxy", "http_front.errors")
baseline = model_module("proxy", "http_front.baseline")
route_helpers = model_module("proxy", "http_front.route_helpers")
Metrics = model_module("proxy", "http_front.metrics").Metrics


@pytest.fixture
def client():
    return make_client()

# ---------------------------------------------------------------- the embedding routes
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_openai_embeddings(client, encoding):
    response = client.post("/v1/embeddings", json={"input": ["a b", "c"], "encoding_format": encoding})
    assert response.status_code == 200
    body = response.json()
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if encoding == "base64" else d["embedding"]
               for d in body["data"]]
    np.testing.assert_allclose(vectors, [fake_vectors("a b"), fake_vectors("c")], rtol=1e-6)
    assert body["model"] == "fake-dense" and body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in body["data"]] == [0, 1] and response.headers["x-truncated-inputs"] == "0"


def test_routing_by_model(client):
    assert client.post("/v1/embeddings", json={"input": "x", "model": "fake-m3"}).json()["model"] == "fake-m3"
    assert client.service.calls[-1][0] == "fake-m3"
    error = error_of(client.post("/v1/embeddings", json={"input": "x", "model": "nope"}), 404, "nope")
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
    assert client.post("/v1/embedding?model=fake-m3", json=[{"query": "x"}]).status_code == 200
    assert client.service.calls[-1][0] == "fake-m3"
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["fake-dense", "fake-m3"]
    assert client.get("/v1/models/fake-m3").json()["outputs"] == ["dense", "sparse", "colbert"]
    error_of(client.get("/v1/models/nope"), 404)


def test_seed_api(client):
    response = client.post("/v1/embedding", json=[{"query": "a"}, {"query": "b c"}])
    assert response.status_code == 200 and [list(item) for item in response.json()] == [["embedding"]] * 2


def test_truncate_false_is_422(client):
    long = " ".join(["w"] * 20)
    error = error_of(client.post("/v1/embeddings", json={"input": ["ok", long], "truncate": False}), 422,
                     "input[1]", "16 tokens")
    assert error["code"] == "too_long"
    truncated = client.post("/v1/embeddings", json={"input": ["ok", long]})
    assert truncated.json()["data"][1]["truncated"] is True and truncated.headers["x-truncated-inputs"] == "1"


def test_encode_returns_any_combination(client):
    body = {"input": ["a b", "b"], "model": "fake-m3", "return_sparse": True, "return_colbert": True}
    data = client.post("/v1/encode", json=body).json()["data"]
    assert set(data[0]) == {"index", "dense", "sparse", "colbert", "truncated"}
    assert set(data[0]["sparse"]) == {"indices", "values"} and len(data[0]["colbert"]) == 3
    only_sparse = client.post("/v1/encode", json={**body, "return_dense": False, "return_colbert": False})
    assert set(only_sparse.json()["data"][1]) == {"index", "sparse", "truncated"}
    assert client.service.calls[-1][2] == ("sparse",)  # only what was asked is requested from Triton
    error = error_of(client.post("/v1/encode", json={"input": "x", "return_sparse": True}), 400, "sparse")
    assert error["code"] == "not_served"


def test_embed_sparse_is_teis_shape(client):
    result = client.post("/embed_sparse", json={"inputs": ["a b"], "model": "fake-m3"}).json()
    assert isinstance(result, list) and set(result[0][0]) == {"index", "value"} and len(result[0]) == 2
    error = error_of(client.post("/embed_sparse", json={"inputs": "x"}), 422, "sparse")  # the default: dense only
    assert error["type"] == "Validation"  # TEI's route, TEI's status and shape


def test_rerank_orders_by_the_models_scores(client):
    documents = ["red apple", "green tree", "apple pie"]
    body = {"query": "apple", "documents": documents, "model": "fake-m3", "top_n": 2, "return_documents": True,
            "weights": [0.4, 0.2, 0.4]}
    results = client.post("/v1/rerank", json=body).json()["results"]
    expected = [float(fake_vectors("apple") @ fake_vectors(d)) for d in documents]
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -expected[i])[:2]
    assert client.service.calls[-1] == ("fake-m3", ["apple", *documents], (0.4, 0.2, 0.4))
    for result in results:
        i = result["index"]
        assert result["relevance_score"] == pytest.approx(expected[i], abs=1e-6)
        assert result["document"] == {"text": documents[i]}
        assert result["scores"] == pytest.approx({"dense": expected[i], "sparse": 2 * expected[i],
                                                  "colbert": 3 * expected[i]}, abs=1e-6)
    dense_only = client.post("/v1/rerank", json={"query": "apple", "documents": documents}).json()["results"]
    assert len(dense_only) == 3 and all(set(r["scores"]) == {"dense"} and "document" not in r for r in dense_only)


@pytest.mark.parametrize("body, status, param, words", [
    ({"query": " ", "documents": ["a"]}, 400, "query", ["query is empty"]),
    ({"query": "q", "documents": ["a", ""]}, 400, "documents", ["documents[1] is empty"]),
    ({"query": "q", "documents": ["a", "BAD"]}, 400, "documents", ["documents[1]", "UTF-8"]),
    ({"query": "q", "documents": []}, 400, "documents", []),
    ({"query": "q " * 20, "documents": ["a"], "truncate": False}, 422, "query", ["query is longer"]),
    ({"query": "q", "documents": ["a", "b " * 20], "truncate": False}, 422, "documents", ["documents[1] is longer"]),
])
def test_rerank_errors_name_the_query_or_the_document(client, body, status, param, words):
    """The query is not documents[0]: each error names what the client sent."""
    assert error_of(client.post("/v1/rerank", json=body), status, *words)["param"] == param


# ---------------------------------------------------------------- validation, limits, error codes
@pytest.mark.parametrize("body, status, code, words", [
    (b"{not json", 400, "invalid_json", ["not valid JSON"]),
    (b'{"input": ["\xff\xfe"]}', 400, "invalid_json", ["not valid JSON"]),
    (b"", 400, None, []),
    (b'["hello"]', 400, "invalid_type", []),
    (b'{"model": "m"}', 400, "missing", ["input"]),
    (b'{"input": 5}', 400, "invalid_type", ["input"]),
    (b'{"input": []}', 400, "invalid_input", ["non-empty list"]),
    (b'{"input": ""}', 400, "invalid_input", ["input[0] is empty"]),  # the tokenizer's rule, its error
    (b'{"input": ["fine", "   "]}', 400, "invalid_input", ["input[1] is empty"]),
    (b'{"input": ["fine", 3]}', 400, "invalid_type", ["input"]),
    (b'{"input": [1, 2, 3]}', 400, "invalid_input", ["token arrays"]),
    (b'{"input": "x", "encoding_format": "int4"}', 400, "invalid_value", ["encoding_format"]),
    (b'{"input": "x", "dimensions": 128}', 400, "not_served", ["dimensions", str(DIM)]),
    (b'{"input": "x", "dimensions": "x"}', 400, "invalid_type", ["dimensions"]),
    (b'{"input": "x", "model": 5}', 400, "invalid_type", ["model"]),
    (b'{"input": "x", "truncate": "no"}', 400, "invalid_type", ["truncate"]),
    (b'{"input": "\\ud800"}', 400, "invalid_input", ["input[0] is not valid Unicode: a lone surrogate"]),
    ('{"input": "x"}'.encode("utf-16"), 400, "invalid_json", ["not valid JSON"]),  # JSON is UTF-8 here
    (b'{"input": ["BAD"]}', 400, "invalid_input", ["input[0]", "UTF-8"]),
    (b"[" * 1500 + b"]" * 1500, 400, "invalid_json", ["not valid JSON"]),  # nesting: no RecursionError, no 500
])
def test_bad_requests_get_their_code(client, body, status, code, words):
    error = error_of(client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"}),
                     status, *words)
    if code:
        assert error["code"] == code, error


def test_limits(client):
    error_of(client.post("/v1/embeddings", json={"input": ["a"] * 17}), 422, "17", "max_inputs_per_request")
    error_of(client.post("/v1/embeddings", json={"input": ["ok", "b" * 201]}), 422, "input[1]", "max_input_chars")
    error_of(client.post("/v1/embeddings", content=b'{"input": "' + b"a" * 5000 + b'"}',
                         headers={"content-type": "application/json"}), 413, "4096", "max_body_bytes")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_only_json_bodies_are_accepted(client, content_type):
    """Cross-site "simple" POSTs (no preflight) can only send these content types: refused."""
    headers = {"content-type": content_type} if content_type else {}
    error = error_of(client.post("/v1/embeddings", content=b'{"input": "x"}', headers=headers), 415, "JSON")
    assert error["code"] == "unsupported_media_type"


def through_fastapi(**overrides):
    """The app with every request through FastAPI's pipeline (no direct.py), behind the same gate: the baseline."""
    return TestClient(baseline.create_baseline_app(settings(**overrides), FakeService(), Metrics()))


BAD_BODIES = [  # (content type, body, kind)
    ("text/plain", b'{"input": "x"}', "unsupported_media_type"),
    ("text/x+json", b'{"input": "x"}', "unsupported_media_type"),  # was let through, then a 400 invalid_type body
    (None, b'{"input": "x"}', "unsupported_media_type"),
    ("application/json", b"{not json", "invalid_json"),
    ("application/vnd.api+json; charset=utf-8", b"[1, 2", "invalid_json"),
    ("application/json", b"", "missing"),
    ("application/json", b'{"input": "' + b"a" * 5000 + b'"}', "body_too_large"),
]
BODY_ROUTES = [("/v1/embeddings", "openai"), ("/v1/embedding", "openai"), ("/v2/embed", "cohere"),
               ("/v1/rerank", "cohere"), ("/embed", "tei"), ("/", "tei"), ("/rerank", "tei")]


@pytest.mark.parametrize("content_type, body, kind", BAD_BODIES)
def test_a_bad_body_gets_one_answer_on_every_route(content_type, body, kind):
    """One body pipeline (bodies.py), one content type rule: the same bad body gets the same kind, with its
    dialect's status (errors.KINDS) and shape, on every route that takes a body: direct ones, the seed API's (query
    parameters too), TEI's / and /rerank (which pick their schema from the body), and each through FastAPI's
    pipeline."""
    headers = {"content-type": content_type} if content_type else {}
    row = errors.KINDS[kind]
    for client in (make_client(), through_fastapi()):
        for path, shape in BODY_ROUTES:
            response = client.post(path, content=body, headers=headers)
            error = error_of(response, row.tei_status if shape == "tei" else row.status)
            assert error["code"] == kind and error["type"] == (row.tei_type if shape == "tei" else row.type), path
            assert ("message" in response.json()) == (shape == "cohere"), path


def test_a_lone_surrogate_is_named_on_every_route():
    """JSON's escaped lone surrogate is parsed one way (bodies.loads) on every route, so the field that holds it is
    named (the seed API's route, once on FastAPI's pipeline, answered invalid_json)."""
    for client in (make_client(), through_fastapi()):
        for path, body, field in (("/v1/embeddings", b'{"input": "\\ud800"}', "input[0]"),
                                  ("/v1/embedding", b'[{"query": "\\ud800"}]', "query[0]"),
                                  ("/embed", b'{"inputs": ["a", "\\ud800"]}', "inputs[1]")):
            error = error_of(client.post(path, content=body, headers={"content-type": "application/json"}),
                             422 if path == "/embed" else 400, "lone surrogate")
            assert error["code"] == "invalid_input" and error["field"] == field, path


def test_api_key_bearer_scheme_is_case_insensitive():
    client = make_client(api_key="s3cret")
    assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 401
    for scheme in ("Bearer", "bearer", "BEARER"):
        response = client.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"{scheme} s3cret"})
        assert response.status_code == 200, scheme
    error = error_of(client.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Basic s3cret"}),
                     401, "API key")
    assert error["type"] == "authentication_error"
    assert client.get("/health").status_code == 200  # probes need no key


@pytest.mark.parametrize("path, body", [("/v1/embeddings", {"inputs": 5}), ("/v1/rerank", {"query": 1}),
                                        ("/v1/encode", {}), ("/embed_sparse", {"x": []}), ("/v1/embedding", {})])
def test_the_key_is_checked_before_the_body(path, body):
    """A caller without the key gets 401, never a 400 that spells out the request schema (issue 16)."""
    client = make_client(api_key="s3cret", admin_api_key="adm1n")
    error = error_of(client.post(path, json=body), 401, "key")
    assert "input" not in error["message"] and error["param"] is None
    error_of(client.post("/v1/models/x/load", content=b"{not json", headers={"content-type": "application/json",
                                                                          "Authorization": "Bearer s3cret"}), 401)


BODIES = [b"", b"{not json", b"[1, 2", b"[" * 1500 + b"]" * 1500, b"null", b"5", b"[]", b"{}", b'{"input": 5}',
          b'{"input": ["a", 3]}', b'{"input": "x", "model": "nope"}', b'{"input": "x", "encoding_format": "hex"}',
          b'{"query": "q", "documents": ["a", ""]}', b'{"model_name": 7}', b'{"input": "x", "dimensions": -1}',
          b'{"inputs": "BAD"}', b'{"input": "BAD"}', b'{"input": "ok", "truncate": "maybe"}', b'{"input": "\\ud800"}',
          b'[{"query": "q"}]', b'[{"query": "q"}, {"query": 5}]']
QUERIES = ["", "?truncate=false", "?truncate=maybe", "?model=nope&truncate=x", "?model=x&model=fake-m3"]


@pytest.mark.parametrize("api_key, authorization", [("", None), ("s3cret", None), ("s3cret", "Bearer s3cret")])
def test_direct_routes_answer_as_fastapi_does(api_key, authorization):
    """direct.py answers the plain routes without FastAPI's pipeline: every route it takes, for valid, malformed,
    mistyped and unauthenticated bodies, gets the status, body and headers FastAPI gives (the app wired without it)."""
    direct = make_client(api_key=api_key, admin_api_key="adm1n")
    baseline = through_fastapi(api_key=api_key, admin_api_key="adm1n")
    routes = direct.app.app.app.routes  # metrics -> gate -> DirectRoutes
    assert {("POST", "/v1/embeddings"), ("POST", "/v1/rerank"), ("GET", "/health")} <= set(routes)
    assert ("POST", "/v1/embedding") in routes  # query parameters too: every route with a body is direct
    headers = {"content-type": "application/json", **({"authorization": authorization} if authorization else {})}
    statuses = set()
    for method, path in sorted(routes, key=lambda route: (route[1] == "/metrics", route)):  # /metrics: last
        for body, query in [(b, q) for b in BODIES for q in QUERIES[:1 + 4 * (path == "/v1/embedding")]] \
                if method == "POST" else [(None, "")]:
            got, wanted = (client.request(method, path + query, content=body, headers=headers)
                           for client in (direct, baseline))
            if path == "/metrics":  # latencies differ; the counts must not
                got, wanted = ([line for line in r.text.splitlines() if line.startswith("proxy_requests_total")]
                               for r in (got, wanted))
                assert got == wanted and len(got) > 20
                continue
            assert (got.status_code, got.content, got.headers) == (wanted.status_code, wanted.content,
                                                                   wanted.headers), (method, path, (body or b"")[:40])
            statuses.add(got.status_code)
    assert statuses >= ({200, 401} if api_key and not authorization else {200, 400, 404})


def test_direct_routes_never_skip_a_routers_own_gates():
    """A router's own dependencies (an auth gate) or prefix are applied by FastAPI when it is included: direct.py
    refuses such a router rather than answer its routes without them."""
    from fastapi import APIRouter, Depends

    direct = model_module("proxy", "http_front.direct")

    app = proxy_app.create_app(settings(), FakeService(), Metrics())
    for router in (APIRouter(dependencies=[Depends(route_helpers.user_key)]), APIRouter(prefix="/v2")):
        with pytest.raises(ValueError, match="no prefix and no dependencies"):
            direct.DirectRoutes(app, router)
    assert ("POST", "/v1/embeddings") in direct.DirectRoutes(app, proxy_app.router).routes


def test_admin_routes_are_off_without_an_admin_key_and_never_open_to_the_api_key():
    client = make_client(api_key="user")
    error = error_of(client.post("/v1/models/fake-m3/load", headers={"Authorization": "Bearer user"}), 403,
                     "ADMIN_API_KEY")
    assert error["code"] == "admin_disabled"
    client = make_client(api_key="user", admin_api_key="admin")
    for headers in ({}, {"Authorization": "Bearer user"}, {"Authorization": "Bearer wrong"}):
        error_of(client.post("/v1/models/fake-m3/unload", headers=headers), 401, "admin key")
    admin = {"Authorization": "Bearer admin"}
    assert client.post("/v1/models/fake-m3/load", headers=admin).json() == {"id": "fake-m3", "status": "loaded",
                                                                          "seconds": 0.5}
    assert client.post("/v1/models/fake-m3/unload", headers=admin).json()["status"] == "unloaded"
    assert client.service.admin == [("load", "fake-m3"), ("unload", "fake-m3")]
    error_of(client.delete("/v1/models/fake-m3", headers=admin), 405)  # files go with exporter/remove_export.py
    # A hub id's '/' is part of the id (it is looked up among the exports, never used as a path)
    assert client.post("/v1/models/org/model-x/load", headers=admin).json()["id"] == "org/model-x"


def test_a_post_with_no_body_at_all_needs_no_content_type():
    """`curl -X POST .../load` sends neither a body nor Content-Length: not a 415."""
    client = make_client(admin_api_key="admin")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/models/fake-m3/load", "raw_path": b"/v1/models/fake-m3/load", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"x"), (b"authorization", b"Bearer admin")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent, messages = [], [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():  # the request, then nothing until the answer is out (the client stays)
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(client.app(scope, receive, send))
    assert sent[0]["status"] == 200 and client.service.admin == [("load", "fake-m3")]


def hold_embeddings(client):
    """The fake service's embed() waits for the returned event; `held` lists the texts of the calls waiting."""
    release, held = asyncio.Event(), []
    original = client.service.embed

    async def held_embed(card, texts, outputs, param, parameters=None):
        proxy_service.admit_request()  # admitted (or refused) before it is held, as at a first Triton call
        held.append(texts)
        await release.wait()
        return await original(card, texts, outputs, param, parameters)
    client.service.embed = held_embed
    return release, held


def test_requests_over_max_concurrent_requests_get_429_at_once():
    """Admission control: with 2 inference requests held in the service, the third is refused at once (429,
    Retry-After); admin routes and GETs are not counted; once the two finish, requests are admitted again."""
    import httpx

    client = make_client(max_concurrent_requests=2, admin_api_key="adm1n")
    release, held = hold_embeddings(client)

    async def scenario():
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
            first = [asyncio.ensure_future(http.post("/v1/embeddings", json={"input": f"text {i}"})) for i in range(2)]
            while len(held) < 2:
                await asyncio.sleep(0.01)
            refused = await http.post("/v1/embeddings", json={"input": "one more"})
            probe = await http.get("/health")
            admin = await http.post("/v1/models/fake-dense/load", headers={"Authorization": "Bearer adm1n"})
            release.set()
            done = await asyncio.gather(*first)
            after = await http.post("/v1/embeddings", json={"input": "after"})
        return refused, probe, admin, done, after

    refused, probe, admin, done, after = asyncio.run(scenario())
    error = error_of(refused, 429, "busy", "max_concurrent_requests")
    assert error["code"] == "overloaded" and error["type"] == "rate_limit_error"
    assert refused.headers["retry-after"] == "1"
    assert probe.status_code == 200 and admin.status_code == 200
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200


def test_draining_answers_503_with_retry_after(client):
    client.service.draining = True
    response = client.post("/v1/embeddings", json={"input": "x"})
    error_of(response, 503, "shutting down")
    assert response.headers["retry-after"] == "1"
    health = client.get("/health")
    assert (health.status_code, health.text) == (503, "shutting down")


def test_not_live_refuses_new_work_with_503_until_the_restart(client):
    """BLS threads stranded on dead stubs: the supervisor restarts the server, so new work gets 503 (a request served
    now would be cut by the restart); probes still answer."""
    client.service.failed = "3 of the 4 BLS threads wait for ever on dead stubs"
    response = client.post("/v1/embeddings", json={"input": "x"})
    error = error_of(response, 503, "being restarted", "3 of the 4 BLS threads")
    assert error["code"] == "restarting" and response.headers["retry-after"] == "2"
    assert client.get("/health/live").status_code == 503 and client.get("/v1/models").status_code == 200
    assert client.service.calls == []
    client.service.failed = ""
    assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 200


def test_metrics_are_labelled_by_model(client):
    client.post("/v1/embeddings", json={"input": ["one", "two"], "model": "fake-m3"})
    client.post("/v1/embeddings", json={"input": []})
    text = client.get("/metrics").text
    assert 'proxy_requests_total{model="fake-m3",route="/v1/embeddings",status="200"} 1.0' in text
    assert 'proxy_requests_total{model="",route="/v1/embeddings",status="400"} 1.0' in text
    assert 'proxy_tokens_total{model="fake-m3"} 6.0' in text
    assert 'proxy_request_inputs_count{model="fake-m3"} 1.0' in text
    assert "_created" not in text


def test_openapi_document_comes_from_the_models(client):
    spec = client.get("/openapi.json").json()
    assert {"/v1/embeddings", "/v1/embedding", "/v1/encode", "/embed_sparse", "/v1/rerank", "/v1/models",
            "/v1/models/{model_id}", "/v1/models/{model_id}/load", "/health", "/metrics"} <= set(spec["paths"])
    request = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert request["$ref"].endswith("/EmbeddingsRequest")
    schema = spec["components"]["schemas"]["EmbeddingsRequest"]
    assert schema["required"] == ["input"] and schema["properties"]["encoding_format"]["enum"] == [
        "float", "base64", "int8", "uint8", "binary", "ubinary"]


def test_no_hand_written_schema_or_metrics_remain():
    """Issue 7: prometheus_client and pydantic do these jobs; no dict schemas or exposition code by hand."""
    folder = os.path.join(PROJECT, "model_source", "proxy", "1", "http_front")
    code = "".join(open(path).read() for path in glob.glob(os.path.join(folder, "**", "*.py"), recursive=True))
    assert '"type": "object"' not in code and "openapi_extra" not in code
    assert "# TYPE" not in code and "_bucket{" not in code


def test_module_imports_no_triton():
    assert isinstance(proxy_app, types.ModuleType) and "triton_python_backend_utils" not in sys.modules


def served_modules():
    """The proxy's own modules the served app imports: model.py's http_front imports, and theirs, followed (from the
    source: the test process imports the others too)."""
    root = os.path.join(PROJECT, "model_source", "proxy", "1")

    def exists(name):
        path = os.path.join(root, *name.split("."))
        return os.path.exists(path + ".py") or os.path.exists(os.path.join(path, "__init__.py"))

    def imports(name, path):
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package up
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    found = f"{base}.{alias.name}" if exists(f"{base}.{alias.name}") else base
                    if found.startswith("http_front"):
                        yield found
    seen, todo = set(), list(imports("model", os.path.join(root, "model.py")))
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # a module's packages are imported with it
            module = ".".join(parts[:k])
            if module not in seen:
                seen.add(module)
                path = os.path.join(root, *parts[:k])
                todo += imports(module, path + ".py" if os.path.exists(path + ".py") else
                                os.path.join(path, "__init__.py"))
    return seen


def test_the_baseline_is_out_of_the_served_import_graph():
    """baseline.py (FastAPI's pipeline for every request: the bench's and these tests' baseline) is never imported by
    the served app, and dialects.py, which every router imports, imports only FastAPI."""
    served = served_modules()
    assert {"http_front.app", "http_front.tei.routes", "http_front.busy", "http_front.dialects"} <= served
    assert "http_front.baseline" not in served
    dialects = ast.parse(open(os.path.join(PROJECT, "model_source", "proxy", "1", "http_front", "dialects.py")).read())
    assert [node.module for node in ast.walk(dialects) if isinstance(node, ast.ImportFrom)] == ["fastapi"]


# ---------------------------------------------------------------- the service contract
@pytest.mark.parametrize("implementation", [FakeService, proxy_service.Service], ids=["fake", "real"])
def test_the_fake_and_the_real_service_follow_the_apps_protocol(implementation):
    """app.ServiceProtocol is what the routes call: the fake above and service.Service (the BLS one) must both have
    every member, with the same parameters and the same sync/async kind, so a test on the fake holds for the real
    one."""
    import inspect

    members = [name for name in vars(proxy_app.ServiceProtocol) if not name.startswith("_")]
    assert {"cards", "resolve", "health", "live", "embed", "rerank", "load", "unload"} <= set(members)
    for name in members:
        wanted = getattr(proxy_app.ServiceProtocol, name)
        got = getattr(implementation, name)
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(wanted), name
        assert list(inspect.signature(got).parameters) == list(inspect.signature(wanted).parameters), name
    assert "draining" in proxy_app.ServiceProtocol.__annotations__
    assert isinstance(getattr(implementation, "draining", None), property) or "draining" in vars(implementation())


# ---------------------------------------------------------------- late chunking (the route's own checks)
def test_chunk_embeddings_route_translates_spans(client):
    """One text: its spans as one list; a list of texts: one list per text; the service's chunks come back per
    text with their spans (values: tests/test_late_chunking.py, through the real server)."""
    response = client.post("/v1/chunk_embeddings", json={"input": "hello big world", "spans": [[0, 5], [6, 15]]})
    assert response.status_code == 200, response.text
    chunks = response.json()["data"][0]["chunks"]
    assert [c["span"] for c in chunks] == [[0, 5], [6, 15]]
    np.testing.assert_allclose(chunks[1]["embedding"], fake_vectors("big world"), atol=1e-6)
    response = client.post("/v1/chunk_embeddings", json={"input": ["a b", "c d"], "spans": [[[0, 1]], [[2, 3]]]})
    assert [d["chunks"][0]["span"] for d in response.json()["data"]] == [[0, 1], [2, 3]]
    response = client.post("/v1/chunk_embeddings", json={"input": ["a b c"], "chunk_tokens": 5})
    assert response.status_code == 200 and client.service.calls[-1][3]["chunk_tokens"] == 5


@pytest.mark.parametrize("body, words", [
    ({"input": "a b", "spans": [[0, 1, 2]]}, "spans[0] must be [start, end]"),
    ({"input": ["a b", "c"], "spans": [[[0, 1]]]}, "one list of [start, end] per input text"),
    ({"input": "a b"}, "spans or the request parameter chunk_tokens gives the chunks"),  # the model's rule
    ({"input": "a b", "spans": [[0, 1]], "chunk_tokens": 3}, "spans or the request parameter chunk_tokens"),
    ({"input": "   ", "spans": [[0, 1]]}, "input is empty"),
])
def test_chunk_embeddings_route_refuses_bad_bodies(client, body, words):
    response = client.post("/v1/chunk_embeddings", json=body)
    assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def admit(gate, cost):
    """gate's ticket for `cost`, or None where it refuses it (what admission.RequestAdmission.enter does)."""
    return None if gate.refusal(cost) else gate.admit(cost)


def test_work_gate_refuses_work_that_would_wait_over_the_target():
    """Little's law: with a measured rate of 1000 cost/s and a 2 s target, 2000 in flight is the bound; a request is
    always admitted when nothing is in flight; before a rate is measured only the request count bounds."""
    clock = FakeClock()
    gate = admission.WorkGate(2.0, 100, clock)
    tickets = [admit(gate, 1000) for _ in range(5)]  # no rate yet: all admitted
    assert all(tickets) and gate.rate() is None
    for ticket in tickets:  # 5000 finished over 5 busy seconds: 1000 per second
        clock.now += 1.0
        ticket.close()
    assert gate.rate() == pytest.approx(1000.0) and gate.in_flight == 0
    clock.now += 60.0  # idle time does not count: the rate is per busy second
    assert gate.rate() == pytest.approx(1000.0)
    first, second = admit(gate, 1500), admit(gate, 500)  # the first counts for half the budget (1000) at most
    assert first and second and gate.in_flight == 1500
    assert admit(gate, 600) is None  # 2100 in flight would take 2.1 s
    assert "admission_target_s" in gate.refusal(600)
    assert admission.WorkGate(0, 100, clock).admit(1) and not admission.WorkGate(0, 100, clock).refusal(10**9)


def test_work_gate_one_long_request_never_locks_everyone_out():
    """Issue 49: one legal 1 MB request refused every client for minutes. Now it counts for half the budget at most,
    the rate does not decay while it runs without a finish, and when its client leaves it leaves the gate at once."""
    clock = FakeClock()
    gate = admission.WorkGate(2.0, 100, clock)
    gate.samples.extend([(0.0, 0), (5.0, 5000)])  # measured: 1000 cost per busy second
    gate.busy_s, gate.finished = 5.0, 5000
    big = admit(gate, 1_000_000)
    assert big is not None and gate.in_flight == 1000  # half of 2 s x 1000/s
    clock.now += 20.0  # 20 s with no finish: the rate stands
    assert gate.rate() == pytest.approx(1000.0)
    for _ in range(3):  # the big job runs on, 60 s in all: others are still admitted beside it
        small = admit(gate, 600)
        assert small is not None
        clock.now += 20.0
        small.close()  # (the rate drops, busy with the big job; the big job's share drops with it)
        assert gate.in_flight == pytest.approx(gate.share())
    second = admit(gate, 10**6)  # a second big one fills the budget...
    assert second is not None and admit(gate, 10**6) is None  # ...the next big one waits: never past its deadline
    light = admit(gate, 1)  # a light one still gets in: a share of the budget is kept for them (issue 59)
    assert light is not None and light.light is True
    light.close()
    second.close()
    release = big.hold()
    big.abandon()  # its client left: out of the gate now, its BLS call still running
    assert gate.in_flight == 0 and gate.requests == 0 and not gate.samples  # measured afresh from here...
    assert gate.rate() == gate.last_rate is not None  # ...the last rate standing meanwhile (issue 69)
    release()  # the call returns later: nothing counted twice, nothing finished
    assert gate.requests == 0 and gate.finished == 5000 + 3 * 600 + 10**6 + 1


def test_work_gate_bounds_the_requests_admitted():
    gate = admission.WorkGate(2.0, 2, FakeClock())
    first, second = admit(gate, 10), admit(gate, 10)
    assert first and second and admit(gate, 10) is None
    assert "max_concurrent_requests" in gate.refusal(10)
    first.close()
    assert admit(gate, 10) is not None


def test_work_gate_keeps_the_cost_until_the_bls_calls_return():
    """An answered request whose BLS calls still run (given up after a stub died) keeps its cost until they return;
    a request abandoned (client gone, deadline passed) leaves the gate at once."""
    clock = FakeClock()
    gate = admission.WorkGate(2.0, 100, clock)
    request = admission.RequestAdmission(gate, 700, 60.0, clock)
    assert request.enter() is None and request.enter() is None  # admitted once, by its first call
    releases = [request.hold(), request.hold()]
    request.close()  # answered
    assert gate.in_flight == 700
    releases[0]()
    releases[0]()  # released twice (done callback and abort): counted once
    assert gate.in_flight == 700
    releases[1]()
    assert gate.in_flight == 0 and gate.finished == 700 and gate.requests == 0
    left = admission.RequestAdmission(gate, 300, 60.0, clock)
    assert left.enter() is None
    release = left.hold()
    left.abandon()
    assert gate.in_flight == 0 and gate.requests == 0
    release()
    assert gate.in_flight == 0 and gate.finished == 700
    clock.now += 61.0
    assert left.left_s() < 0  # the deadline runs from the request's arrival, for all its calls


def test_proxy_refuses_work_over_admission_target_after_auth_and_validation():
    """Through the app: once a rate is measured, a request that would wait over admission_target_s is refused at
    its first Triton call (429, Retry-After, the setting named); while busy, a request without its key still gets
    401 and a bad body 400/404/422 (they can never succeed: a 429 would make clients retry them); GETs and admin
    routes are not gated."""
    import httpx

    client = make_client(admin_api_key="adm1n", api_key="k3y")
    gate = None
    release, held = hold_embeddings(client)
    key = {"Authorization": "Bearer k3y"}

    async def scenario():
        nonlocal gate
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
            guard_layer = client.app.app  # MetricsMiddleware -> HttpGuard
            gate = guard_layer.gate
            gate.samples.extend([(gate.busy_s - 10.0, gate.finished - 1000), (gate.busy_s, gate.finished)])
            gate.heavy_samples.extend([(gate.heavy_busy_s - 10.0, gate.heavy_finished - 1000),
                                       (gate.heavy_busy_s, gate.heavy_finished)])
            # measured: 100 cost per busy second, heavy work's too (else heavy requests run one at a time); budget
            # 200, one request counts 100 at most: two fill it
            first = [asyncio.ensure_future(http.post("/v1/embeddings", json={"input": "x " * 50}, headers=key))
                     for _ in range(2)]
            while len(held) < 2:
                await asyncio.sleep(0.01)
            refused = await http.post("/v1/embeddings", json={"input": "one more"}, headers=key)
            no_key = await http.post("/v1/embeddings", json={"input": "one more"})
            bad = [await http.post("/v1/embeddings", json=body, headers=key) for body in
                   ({"input": None}, {"input": "a", "model": "no-such-model"}, {"input": ["a"] * 17})]
            probe = await http.get("/health")
            admin = await http.post("/v1/models/fake-dense/load", headers={"Authorization": "Bearer adm1n"})
            release.set()
            done = await asyncio.gather(*first)
            after = await http.post("/v1/embeddings", json={"input": "after"}, headers=key)
        return refused, no_key, bad, probe, admin, done, after

    refused, no_key, bad, probe, admin, done, after = asyncio.run(scenario())
    error = error_of(refused, 429, "busy", "admission_target_s")
    assert error["code"] == "overloaded" and refused.headers["retry-after"] == "1"
    assert no_key.status_code == 401, no_key.text
    assert [r.status_code for r in bad] == [400, 404, 422], [r.text for r in bad]
    assert probe.status_code == 200 and admin.status_code == 200
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200 and gate.in_flight == 0


def test_a_requests_work_leaves_the_gate_before_its_answer_goes_out():
    """A client that sends its next request the moment it has an answer must not find its own finished request
    still in flight (a sequential client got 429s once the server answered fast enough): when the answer's last
    message is sent, the gate holds nothing."""
    client = make_client()
    gate = client.app.app.gate  # MetricsMiddleware -> HttpGuard
    body = b'{"input": ["one text"]}'
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings",
             "query_string": b"", "root_path": "", "scheme": "http", "server": ("proxy", 80), "client": ("c", 1),
             "http_version": "1.1", "state": {},
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    messages, in_flight_when_answered = [{"type": "http.request", "body": body, "more_body": False}], []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)

    async def send(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            in_flight_when_answered.append(gate.in_flight)

    asyncio.run(client.app(scope, receive, send))
    assert in_flight_when_answered == [0] and gate.finished == len(body) + 512
