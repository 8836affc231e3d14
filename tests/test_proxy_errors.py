"""The proxy's one error table and its dialects as units (issue 52): every error is a kind of errors.KINDS, no HTTP
status is written outside it, every dialect's body carries the field as data (and bulk_embed's HTTP door reads it
from there), each dialect's routes document their own error shape, the route lists are read from the routers, no
router imports another dialect's, an empty list of inputs is one kind everywhere, the proxy and bulk_embed name
no output tensor but through model_outputs, and the serving code no error kind but through model_errors.ErrorKind.
Over the fake service of tests/proxy_fakes.py."""
import ast
import glob
import io
import json
import os
import tokenize

import pytest

from conftest import PROJECT
from model_library import model_errors, model_outputs
from model_library.in_process import model_module
from proxy_fakes import error_of, errors, make_client

PROXY = os.path.join(PROJECT, "model_source", "proxy", "1", "http_front")
LONG = " ".join(["w"] * 20)  # over the fake models' 16 tokens


def code_of(name):
    with open(os.path.join(PROXY, name), encoding="utf-8") as handle:
        return handle.read()


def proxy_files():
    """Every file of the HTTP front, its dialects' folders included, by its path under http_front/."""
    return sorted(os.path.relpath(path, PROXY) for path in glob.glob(os.path.join(PROXY, "**", "*.py"), recursive=True))


def test_no_http_status_is_written_outside_the_error_table():
    """Error statuses live in errors.KINDS only: no number from 400 to 599 in the proxy's code elsewhere (docstrings
    and comments may name them) but these, which are no statuses: HTTPS's port, admission's REQUEST_COST, the
    metrics' INPUT_BUCKETS."""
    others = {"images.py": {"443"}, "admission.py": {"512"}, "metrics.py": {"512"}}
    found = []
    for name in proxy_files():
        if name == "errors.py":
            continue
        for token in tokenize.generate_tokens(io.StringIO(code_of(name)).readline):
            if token.type == tokenize.NUMBER and token.string.isdigit() and 400 <= int(token.string) <= 599 and \
                    token.string not in others.get(name, ()):
                found.append(f"{name}:{token.start[0]}: {token.line.strip()}")
    assert not found, found


def test_every_kind_has_every_column():
    for name, kind in errors.KINDS.items():
        assert 400 <= kind.status <= 599 and 400 <= kind.tei_status <= 599 and kind.type and kind.tei_type, name
        assert kind.routes in ("all", "api", "admin", "none"), name
    assert set(errors.FROM_MODEL) == set(model_errors.KINDS)  # every kind of the contract, mapped
    assert set(errors.FROM_MODEL.values()) <= set(errors.KINDS)
    with pytest.raises(ValueError, match="unknown error kind"):
        errors.ApiError("is wrong", "context_length_exceeded")


@pytest.mark.parametrize("path, body, shape, field, param", [
    ("/v1/embeddings", {"input": ["ok", " "]}, "openai", "input[1]", "input"),
    ("/v2/embed", {"texts": ["ok", " "]}, "cohere", "texts[1]", "texts"),
    ("/embed", {"inputs": ["ok", " "]}, "tei", "inputs[1]", "inputs"),
    ("/rerank", {"query": "q", "texts": ["ok", LONG]}, "tei", "texts[1]", "texts"),  # a shared rule, renamed
    ("/similarity", {"inputs": {"source_sentence": "q", "sentences": ["ok", LONG]}}, "tei", "inputs.sentences[1]",
     "inputs.sentences"),
    ("/v1/rerank", {"query": "q", "documents": ["ok", LONG], "truncate": False}, "cohere", "documents[1]",
     "documents"),
    ("/v1/embeddings", {"input": ["ok", "x" * 201]}, "openai", "input[1]", "input"),
    ("/v1/embeddings", {"input": "x", "dimensions": 12}, "openai", "dimensions", "dimensions"),
])
def test_every_dialects_body_carries_the_field(path, body, shape, field, param):
    """The field stays data to the end: the body's `field` is the item the message leads with, in the route's words,
    beside `param` and the kind (`code`); Cohere's routes add Cohere's own `message`."""
    response = make_client().post(path, json=body)
    error = error_of(response, response.status_code, field)
    assert (error["field"], error["param"]) == (field, param), error
    assert error["message"].startswith(field), error
    if shape == "cohere":
        assert response.json()["message"] == error["message"]
    assert isinstance(response.json()["error"], str) == (shape == "tei")


def test_one_name_for_one_error_in_every_dialect():
    """Too long (characters, tokens with truncate false) is `too_long`, too many is `too_many`, whatever the route
    or the limit; TEI gives each kind its own status (413 for too_many) and OpenAI's routes theirs."""
    client = make_client()
    codes = {error_of(client.post(path, json=body), status)["code"] for path, body, status in (
        ("/v1/embeddings", {"input": ["x" * 201]}, 422), ("/v1/embeddings", {"input": [LONG], "truncate": False}, 422),
        ("/embed", {"inputs": [LONG]}, 422), ("/decode", {"ids": [1] * 201}, 422),
        ("/predict", {"inputs": [[LONG]], "model": "fake-m3"}, 422))}
    assert codes == {"too_long", "not_served"}  # (/predict on an embedding model: not served, before its length)
    for path, body, status in (("/v1/embeddings", {"input": ["x"] * 17}, 422), ("/embed", {"inputs": ["x"] * 17}, 413),
                               ("/decode", {"ids": [[1]] * 17}, 413)):
        assert error_of(client.post(path, json=body), status)["code"] == "too_many", path



@pytest.mark.parametrize("path, body, status, field", [
    ("/v1/embeddings", {"input": []}, 400, "input"), ("/v1/encode", {"input": []}, 400, "input"),
    ("/v1/chunk_embeddings", {"input": []}, 400, "input"), ("/v2/embed", {"texts": []}, 400, "texts"),
    ("/v1/embed", {"texts": []}, 400, "texts"), ("/v1/rerank", {"query": "q", "documents": []}, 400, "documents"),
    ("/v2/rerank", {"query": "q", "documents": []}, 400, "documents"), ("/embed", {"inputs": []}, 422, "inputs"),
    ("/embed_all", {"inputs": []}, 422, "inputs"), ("/tokenize", {"inputs": []}, 422, "inputs"),
    ("/rerank", {"query": "q", "texts": []}, 422, "texts"), ("/decode", {"ids": []}, 422, "ids"),
    ("/similarity", {"inputs": {"source_sentence": "q", "sentences": []}}, 422, "inputs.sentences"),
    ("/predict", {"inputs": [], "model": "fake-xe"}, 422, "inputs"),
])
def test_an_empty_list_is_invalid_input_in_every_dialect(path, body, status, field):
    """An empty list of inputs is the input being wrong: `invalid_input` naming it on every route (pydantic's
    min_length would make it `invalid_value` on some: schemas.NOT_EMPTY), with the rerank models' own words for
    documents."""
    error = error_of(make_client().post(path, json=body), status, f"{field} is empty")
    assert (error["code"], error["field"]) == ("invalid_input", field), error
    if "rerank" in path or path == "/similarity":
        assert error["message"].endswith("send at least one document"), error

def test_each_dialect_documents_its_own_error_shape():
    spec = make_client().get("/openapi.json").json()

    def schema(path, method, status):
        content = spec["paths"][path][method]["responses"][str(status)]["content"]["application/json"]
        return content["schema"]["$ref"].rsplit("/", 1)[1]
    assert schema("/embed", "post", 422) == schema("/rerank", "post", 413) == "TeiErrorResponse"
    assert schema("/v2/embed", "post", 400) == schema("/v1/rerank", "post", 422) == "CohereErrorResponse"
    assert schema("/v1/embeddings", "post", 400) == schema("/v1/embedding", "post", 422) == "ErrorResponse"
    assert schema("/v1/models/{model_id}/load", "post", 403) == "ErrorResponse"
    assert "400" not in spec["paths"]["/embed"]["post"]["responses"]  # TEI answers a validation error 422
    assert set(spec["components"]["schemas"]["TeiErrorResponse"]["properties"]) == {
        "error", "error_type", "code", "param", "field"}


def test_route_lists_are_read_from_the_routers():
    dialects = model_module("proxy", "http_front.dialects")
    admin_routes = model_module("proxy", "http_front.admin.routes")
    tei_routes = model_module("proxy", "http_front.tei.routes")

    tei = {route.path for route in tei_routes.router.routes}
    assert tei == {"/", "/embed", "/embed_all", "/embed_sparse", "/rerank", "/predict", "/similarity", "/tokenize",
                   "/decode", "/info"}
    assert all(dialects.shape({"path": path}) == "tei" for path in tei)
    assert dialects.shape({"path": "/v2/rerank"}) == "cohere" and dialects.shape({"path": "/nope"}) == "openai"
    assert {route.path for route in admin_routes.router.routes} == {
        "/v1/models/{model_id:path}/load", "/v1/models/{model_id:path}/unload", "/load_clip_model",
        "/unload_clip_model", "/delete_clip_model"}
    assert dialects.admin("/v1/models/org/x/load") and dialects.admin("/load_clip_model")
    assert not dialects.admin("/v1/models/org/x") and not dialects.admin("/v1/embeddings")


def test_no_dialect_imports_another_dialects_folder():
    """A folder per dialect, its routes beside its types: what two dialects share is outside them (route_helpers.py,
    schemas.py), never one dialect's module imported by another's."""
    dialects = {os.path.dirname(name) for name in proxy_files() if os.path.basename(name) == "routes.py"}
    assert dialects == {"openai", "seed", "cohere", "tei", "admin", "server", "voyage"}
    for dialect in dialects:
        for name in (name for name in proxy_files() if os.path.dirname(name) == dialect):
            tree = ast.parse(code_of(name))
            imported = {(node.module or alias.name).split(".")[0] for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom)
                        for alias in node.names if node.level == 2}  # from .. import x / from ..x import y
            assert not imported & (dialects - {dialect}), (name, imported & dialects)
            assert not [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 2], name
    app = ast.parse(code_of("app.py"))  # the app only assembles: no route of its own
    assert not [node for node in ast.walk(app) if isinstance(node, ast.AsyncFunctionDef) and any(
        isinstance(d, ast.Call) and getattr(d.func, "attr", "") in ("get", "post") for d in node.decorator_list)]


# ---------------------------------------------------------------- output names: model_library/model_outputs.py's only
# The output names that are also words of another vocabulary: OpenAI's `object` and item field `embedding` and an
# export's kind `embedding`; the answers' fields `num_tokens` and `truncated` (and the bulk output's column); Cohere
# v1's per-mode `scores`. Those are refused only in the code that handles tensors: the proxy's BLS calls and the bulk
# client's doors, but for the named parts there that read the HTTP front's JSON.
OTHER_WORDS = (model_outputs.DENSE, model_outputs.NUM_TOKENS, model_outputs.TRUNCATED, model_outputs.SCORES,
               model_outputs.MUVERA)  # /v1/encode's item field `muvera` too
TENSOR_CODE = {os.path.join(PROXY, "inference.py"): (), os.path.join(PROJECT, "bulk_embed", "doors.py"): ("HttpDoor",)}
MODEL_CODE = [os.path.join(PROJECT, "model_source", path) for path in (
    "tokenizer/1/model.py", "tokenizer/1/grouping.py", "tokenizer/image_preprocess.py", "ensemble_bls/1/model.py",
    "rerank/1/model.py", "rerank/cross_encoder.py", "late_chunking/1/model.py", "supervisor/1/model.py")]


def output_names():
    """Every output name model_outputs defines (its constants' strings, its tables' values; not MODES: kinds)."""
    names = set()
    for key, value in vars(model_outputs).items():
        if key.isupper() and key != "MODES":
            for item in value.values() if isinstance(value, dict) else [value]:
                names.update([item] if isinstance(item, str) else item)
    return names


def test_output_names_are_written_only_in_model_outputs():
    """The proxy, bulk_embed and the Python models name the models' outputs through model_outputs, never as string
    literals: a renamed output is renamed once."""
    names = output_names()
    assert {"embedding", "sparse_count", "colbert_vectors_int8", "num_tokens", "mode_scores", "chunk_spans",
            "decoded"} <= names and not names & {"dense", "sparse", "colbert"}
    files = [os.path.join(PROXY, name) for name in proxy_files()]
    files += [os.path.join(PROJECT, "bulk_embed", n) for n in sorted(os.listdir(os.path.join(PROJECT, "bulk_embed")))
              if n.endswith(".py")]
    files += MODEL_CODE  # the models' own code handles tensors only: every output name there is model_outputs'
    tensor_code = {**TENSOR_CODE, **dict.fromkeys(MODEL_CODE, ())}
    found = []
    for path in files:
        tree = ast.parse(open(path, encoding="utf-8").read())
        json_readers = {id(node) for part in ast.walk(tree) if isinstance(part, (ast.ClassDef, ast.FunctionDef))
                        and part.name in tensor_code.get(path, ()) for node in ast.walk(part)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and (
                    node.value not in OTHER_WORDS or (path in tensor_code and id(node) not in json_readers)):
                found.append(f"{os.path.relpath(path, PROJECT)}:{node.lineno}: {node.value!r}")
    assert not found, found


# ---------------------------------------------------------------- error kinds: model_errors.ErrorKind's members only
# The literals equal to a kind's value that are no kind, per file: pydantic's error types that http_errors.py maps to
# kinds, and Triton's words that give its untagged errors their kind (TRITON_WORDING). (A pydantic error raised as
# data, {"type": "missing", ...}, is told by its key.)
NOT_KINDS = {"model_source/proxy/1/http_front/http_errors.py": {"too_long": 1, "missing": 1},
             "model_library/model_errors.py": {"cancelled": 1, "unavailable": 1}}


def serving_code():
    """Every file of the serving code: the models' source (proxy included), their library, the bulk client."""
    for folder, pattern in (("model_source", "**/*.py"), ("model_library", "*.py"), ("bulk_embed", "*.py")):
        yield from sorted(glob.glob(os.path.join(PROJECT, folder, pattern), recursive=True))


def test_error_kinds_are_named_only_as_error_kind_members():
    """No kind is a string literal in the serving code but in ErrorKind's own definition (the wire's words are its
    values), and every `ErrorKind.NAME` names a member: a kind renamed or misspelt fails here, not at the one
    request that raises it."""
    values = {kind.value for kind in model_errors.ErrorKind}
    literals, unknown = {}, []
    for path in serving_code():
        name = os.path.relpath(path, PROJECT)
        tree = ast.parse(open(path, encoding="utf-8").read())
        not_kinds = {id(node) for part in ast.walk(tree) if isinstance(part, ast.ClassDef) and
                     part.name == "ErrorKind" for node in ast.walk(part)}
        not_kinds |= {id(value) for part in ast.walk(tree) if isinstance(part, ast.Dict)
                      for key, value in zip(part.keys, part.values) if getattr(key, "value", None) == "type"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in values and id(node) not in not_kinds:
                literals.setdefault(name, {}).setdefault(node.value, []).append(node.lineno)
            elif isinstance(node, ast.Attribute) and (getattr(node.value, "id", None) == "ErrorKind" or getattr(
                    node.value, "attr", None) == "ErrorKind") and node.attr not in model_errors.ErrorKind.__members__:
                unknown.append(f"{name}:{node.lineno}: ErrorKind.{node.attr}")
    assert {name: {value: len(lines) for value, lines in found.items()} for name, found in literals.items()} == \
        NOT_KINDS, literals
    assert not unknown, unknown


def test_every_error_kind_is_in_a_table_and_every_table_kind_in_the_enum():
    """The proxy's table and the error contract's are keyed by ErrorKind members (FROM_MODEL maps members to
    members), and every member is a kind of one of them: none defined that nothing answers."""
    error_kind = errors.model_errors.ErrorKind  # the proxy's copy of the library, as inside Triton
    tables = (errors.KINDS, errors.model_errors.KINDS, errors.FROM_MODEL, dict.fromkeys(errors.FROM_MODEL.values()))
    assert all(isinstance(kind, error_kind) for table in tables for kind in table)
    assert set(model_errors.ErrorKind) == set(errors.KINDS) | set(model_errors.KINDS)
    assert set(model_errors.CLIENT_KINDS) <= set(errors.KINDS) & set(model_errors.KINDS)


def test_an_error_kind_travels_as_its_value():
    """A member is its wire word in a tag, a body, a label; a tag's text is read back as the member."""
    kind = model_errors.ErrorKind.TOO_LONG
    assert str(kind) == f"{kind}" == kind == "too_long" and json.dumps({"code": kind}) == '{"code": "too_long"}'
    info = model_errors.parse(model_errors.tagged(kind, "text[2]", "is over the limit"))
    assert info.kind is kind and info.field == "text[2]"
    assert model_errors.parse("in ensemble 'x', the request was cancelled").kind is model_errors.ErrorKind.CANCELLED


# ---------------------------------------------------------------- bulk_embed's HTTP door reads the body, not the prose
class Answer:
    def __init__(self, status, body, headers=None):
        self.status, self.body, self.headers = status, json.dumps(body).encode(), headers or {}

    def read(self):
        return self.body

    def getheader(self, name):
        return self.headers.get(name)


class Connection:
    def __init__(self, answer):
        self.answer = answer

    def request(self, *args):
        pass

    def getresponse(self):
        return self.answer


def door_answering(status, body, headers=None):
    from bulk_embed.doors import HttpDoor

    door = HttpDoor("http://proxy", None, ["float"], {})
    door.local.connection = Connection(Answer(status, body, headers))
    return door


def test_the_http_door_reads_the_kind_and_the_field_from_the_body():
    from bulk_embed.doors import JobError, Refused, Retry

    client = make_client()
    for texts, kind, problem in ((["ok", " "], "invalid_input", "is empty"),
                                 (["ok", "x" * 201], "too_long", "holds 201 characters")):
        response = client.post("/v1/embeddings", json={"input": texts})  # the front's own answer, as it is
        with pytest.raises(Refused) as refused:
            door_answering(response.status_code, response.json()).request("POST", "/v1/embeddings", {})
        assert (refused.value.index, refused.value.kind) == (1, kind) and refused.value.message.startswith(problem)
    # a message that leads with `input[0]` but whose field is another: no reject (was read from the prose once)
    body = {"error": {"message": "input[0] looks wrong", "type": "x", "param": "model", "code": "not_served",
                      "field": "model"}}
    with pytest.raises(JobError):
        door_answering(400, body).request("POST", "/v1/embeddings", {})
    with pytest.raises(Retry) as fault:
        door_answering(500, {"error": {"message": "x", "code": "inference_failed"}}).request("GET", "/info")
    assert fault.value.kind == "internal"
    with pytest.raises(Retry) as busy:
        door_answering(429, {"error": {"message": "busy", "code": "overloaded"}}, {"Retry-After": "1"}).request(
            "POST", "/v1/embeddings", {})
    assert (busy.value.kind, busy.value.after_s) == ("overloaded", 1.0)
    tei = client.post("/decode", json={"ids": [[1], []]}).json()  # TEI's shape (GET /info's errors)
    from bulk_embed.doors import error_body
    assert error_body(json.dumps(tei).encode()) == ("ids[1] is empty: send at least one token id", "invalid_input",
                                                    "ids[1]")
