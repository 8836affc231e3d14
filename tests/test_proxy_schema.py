"""Property-based test of the proxy against its own OpenAPI document (schemathesis): no request the document
describes (positive cases) nor any violating it (negative cases) may produce a 5xx. 30 examples per operation
and mode keep it within a couple of minutes. (The admin routes are off on this server: 403, never a 5xx.)"""
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

from model_library.in_process import model_module

# Every operation of the app's routers (each its own test), read from them as the document is written from them:
# a route added to a dialect's router is tested with no list to extend; checked against the live document below.
OPERATIONS = [(method, route.path_format) for route in model_module("proxy", "http_front.app").router.routes
              for method in sorted(route.methods)]


@pytest.fixture(scope="module")
def proxy_schema(server):
    return schemathesis.openapi.from_url(server.proxy_url + "/openapi.json")


def test_document_lists_the_tested_operations(proxy_schema):
    listed = {(op.ok().method.upper(), op.ok().path) for op in proxy_schema.get_all_operations()}
    assert listed == set(OPERATIONS)


# Negative cases exist only where there is something to break: the request bodies (and the seed's query). TEI's / and
# /rerank pick their body's type themselves (either of two), so the document gives them no body to break.
CASES = [(method, path, GenerationMode.POSITIVE) for method, path in OPERATIONS] + [
    (method, path, GenerationMode.NEGATIVE) for method, path in OPERATIONS
    if method == "POST" and not path.endswith(("/load", "/unload", "_clip_model")) and path not in ("/", "/rerank")]


@pytest.mark.parametrize("method, path, mode", CASES)
def test_no_server_errors(proxy_schema, method, path, mode):
    operation = proxy_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        case.call_and_validate(checks=[not_a_server_error], timeout=60)

    check()
