"""Bad input to the ensemble, over HTTP and gRPC (after Triton's L0_input_validation / L0_nullchar_string /
test_batch_error): each gets a clear error naming the problem, or a documented result; good requests sent in the
same moment are unaffected; the server keeps serving afterwards. The error contract is the same for `ensemble_bls`
(the ensemble's twin for many texts): those tests run against both."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_clients import PROTOCOLS, VARIED_TEXTS, client, cosine, error_of, infer, settled_stats, url_for

MAX_TEXT_BYTES = 1024 * 1024  # tokenizer parameter max_text_bytes
MAX_BATCH_SIZE = {"ensemble": 64, "ensemble_bls": 256}  # rows per request: each model's max_batch_size
MODELS = list(MAX_BATCH_SIZE)
HTTP_BAD_REQUEST = 400

# Rejected by the tokenizer, per request: (texts, key words the message must contain)
REJECTED = {
    "empty": ([""], ["text[0]", "empty"]),
    "whitespace only": (["  \t\n "], ["text[0]", "empty", "whitespace"]),
    "invalid UTF-8": ([b"caf\xc3 \xff\xfe"], ["text[0]", "not valid UTF-8", "byte 3"]),
    "over max_text_bytes": (["x" * (MAX_TEXT_BYTES + 1)],
                            ["text[0]", f"{MAX_TEXT_BYTES + 1} bytes", f"limit of {MAX_TEXT_BYTES}",
                             "max_text_bytes"]),
    "one bad row of four": (["fine", "also fine", "\xa0", "fine again"], ["text[2]", "empty"]),
}


def _is_client_error(error):
    """HTTP 400 / gRPC INVALID_ARGUMENT, like Triton's own input validation (not 500 / INTERNAL)."""
    return str(error.status()) in (str(HTTP_BAD_REQUEST), "StatusCode.INVALID_ARGUMENT")


@pytest.fixture(scope="module")
def st_embed(sentence_transformer):
    def embed(texts):
        return sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    return embed


def test_limits_are_the_served_ones(server):
    """The limits these tests probe are the ones the served configs state."""
    connection = client("http", server.http_url)
    try:
        tokenizer = connection.get_model_config("tokenizer")
        assert tokenizer["parameters"]["max_text_bytes"]["string_value"] == str(MAX_TEXT_BYTES)
        for model, rows in MAX_BATCH_SIZE.items():
            assert connection.get_model_config(model)["max_batch_size"] == rows
    finally:
        connection.close()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", list(REJECTED))
def test_rejected_text_names_the_problem(server, protocol, case, model):
    texts, key_words = REJECTED[case]
    error = error_of(protocol, url_for(server, protocol), texts, model=model)
    for word in key_words:
        assert word in error.message(), (word, error.message())
    assert _is_client_error(error), (error.status(), error.message())


def _raw_request(protocol, url, model, name, datatype, shape, data):
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput(name, shape, datatype)
    tensor.set_data_from_numpy(data)
    connection = client(protocol, url)
    try:
        connection.infer(model, [tensor])
    except InferenceServerException as error:
        return error
    finally:
        connection.close()
    raise AssertionError(f"{protocol}: {name} {datatype} {shape} was accepted")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_datatype_shape_name_and_row_count(server, protocol, model):
    url = url_for(server, protocol)
    cases = [
        (("text", "INT32", [1, 1], np.array([[7]], dtype=np.int32)), ["data-type", "INT32", "BYTES"]),
        (("text", "FP32", [2, 1], np.ones((2, 1), dtype=np.float32)), ["data-type", "FP32", "BYTES"]),
        (("text", "BYTES", [1, 2], np.array([[b"a", b"b"]], dtype=object)), ["shape", "[-1,1]", "[1,2]"]),
        (("text", "BYTES", [2], np.array([b"a", b"b"], dtype=object)), ["shape", "[-1,1]", "[2]"]),
        (("txt", "BYTES", [1, 1], np.array([[b"a"]], dtype=object)), ["unexpected inference input", "txt"]),
    ]
    for request, key_words in cases:
        error = _raw_request(protocol, url, model, *request)
        for word in key_words:
            assert word in error.message(), (request[:3], error.message())
        assert _is_client_error(error), (error.status(), error.message())
    no_rows = error_of(protocol, url, [], model=model)  # a [0, 1] tensor
    assert "got 0" in no_rows.message() and _is_client_error(no_rows), no_rows.message()
    too_many = error_of(protocol, url, ["a"] * (MAX_BATCH_SIZE[model] + 1), model=model)
    assert f"batch-size must be <= {MAX_BATCH_SIZE[model]}" in too_many.message(), too_many.message()
    assert _is_client_error(too_many)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_nul_byte_is_accepted_and_embedded(server, st_embed, protocol):
    texts = ["abc\x00def", "\x00leading NUL", "trailing NUL\x00", "a NUL\x00in the middle of a sentence"]
    result = infer(protocol, url_for(server, protocol), texts)
    assert (cosine(result["embedding"], st_embed(texts)) >= 0.9999).all()
    assert not result["truncated"].any()
    # NUL bytes reach the tokenizer unchanged, a trailing one included: the byte count in this error shows it.
    error = error_of(protocol, url_for(server, protocol), ["\x00" + "z" * (MAX_TEXT_BYTES - 1) + "\x00"])
    assert f"{MAX_TEXT_BYTES + 1} bytes" in error.message(), error.message()


ONE_MB_TEXT = ("Long input about the Triton Inference Server. " * 23000)[:1_000_000]


@pytest.fixture(scope="module")
def one_mb_reference(st_embed):
    return st_embed([ONE_MB_TEXT])[0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_megabyte_text_is_truncated(server, one_mb_reference, protocol):
    assert len(ONE_MB_TEXT.encode()) == 1_000_000 < MAX_TEXT_BYTES
    result = infer(protocol, url_for(server, protocol), [ONE_MB_TEXT])
    assert result["truncated"].reshape(-1).tolist() == [True]
    assert result["num_tokens"].reshape(-1).tolist() == [256]
    assert cosine(result["embedding"][0], one_mb_reference) >= 0.9999


def test_text_of_exactly_max_text_bytes_is_accepted(server):
    at_limit = infer("grpc", server.grpc_url, ["yes " * (MAX_TEXT_BYTES // 4)], names=["num_tokens", "truncated"])
    assert at_limit["num_tokens"].reshape(-1).tolist() == [256] and at_limit["truncated"].all()


def _burst(protocol, url, requests, model="ensemble"):
    """Send every request (a list of texts) at the same moment; return results or exceptions, in order."""
    barrier = threading.Barrier(len(requests))
    results = [None] * len(requests)

    def send(i):
        connection = client(protocol, url)
        try:
            connection.is_server_live()  # connect before the barrier, so all start together
            barrier.wait(timeout=60)
            results[i] = infer(protocol, url, requests[i], model=model, connection=connection)["embedding"]
        except InferenceServerException as error:
            results[i] = error
        finally:
            connection.close()

    with ThreadPoolExecutor(len(requests)) as pool:
        list(pool.map(send, range(len(requests))))
    return results


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_requests_do_not_affect_concurrent_good_ones(server, st_embed, protocol, model):
    good = [[t] for t in VARIED_TEXTS[:12]] + [VARIED_TEXTS[12:15]]  # 13 requests, the last with 3 rows
    bad = [texts for texts, _ in REJECTED.values()]
    expected = st_embed(VARIED_TEXTS[:15])
    requests = []
    for i, texts in enumerate(good):  # good, bad, good, good, bad, ...
        requests.append(texts)
        if i % 3 == 0 and i // 3 < len(bad):
            requests.append(bad[i // 3])
    assert len(requests) == len(good) + len(bad)
    tokenizer_before = settled_stats(server, "tokenizer")
    results = _burst(protocol, url_for(server, protocol), requests, model)
    tokenizer_after = settled_stats(server, "tokenizer")
    for texts, result in zip(requests, results):
        if texts in bad:
            assert isinstance(result, InferenceServerException) and "text[" in result.message(), (texts, result)
        else:
            assert not isinstance(result, Exception), (texts, result)
            indices = [VARIED_TEXTS.index(t) for t in texts]
            assert (cosine(result, expected[indices]) >= 0.9999).all(), texts
    # The burst really shared tokenizer executions (good and bad requests in the same execute).
    executions = int(tokenizer_after["execution_count"]) - int(tokenizer_before["execution_count"])
    print(f"\n{protocol} {model}: {len(requests)} concurrent requests (good and bad) in {executions} tokenizer "
          f"executions")
    assert executions < len(requests)


def test_server_keeps_serving_after_bad_input(server, st_embed):
    """Last in this module: after every bad request above, good requests still succeed on both protocols."""
    assert server.process.poll() is None
    for protocol in PROTOCOLS:
        result = infer(protocol, url_for(server, protocol), VARIED_TEXTS[:3])
        assert (cosine(result["embedding"], st_embed(VARIED_TEXTS[:3])) >= 0.9999).all()
    assert "Stub process" not in server.log() or "is not healthy" not in server.log()
