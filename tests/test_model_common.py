"""Unit tests of the models' library (model_library/model_common.py): the BYTES decoder no input can make raise, and
read_bytes' per-request errors naming the field. The served behaviour (every Python model, both KServe doors) is
test_hostile.py's test_every_python_model_answers_forged_bytes_with_a_400_naming_the_field."""
import os
import struct

import numpy as np
import pytest

from conftest import PROJECT
from model_library.in_process import import_python_model


class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = 3, 14, 13, 1  # (the codes model_errors.KINDS names)

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class Tensor:
    def __init__(self, array):
        self.array = array

    def as_numpy(self):
        return self.array


@pytest.fixture(scope="module")
def library():
    return import_python_model(os.path.join(PROJECT, "model_library", "model_common.py"),
                                      "model_common_under_test", TritonError=TritonError,
                                      get_input_tensor_by_name=lambda request, name: request.get(name))


def serialized(*items):
    return np.frombuffer(b"".join(struct.pack("<I", len(i)) + i for i in items), dtype=np.uint8)


def test_decoder_reads_tritons_layout(library):
    texts = [b"hello", b"", "日本語".encode(), b"\x00nul"]
    decoded = library.deserialize_bytes_tensor(serialized(*texts))
    assert decoded.dtype == np.object_ and decoded.tolist() == texts
    assert not any(isinstance(t, library.MalformedBytes) for t in decoded)
    assert decoded.reshape([2, 2]).shape == (2, 2)


@pytest.mark.parametrize("payload, rows, declared", [
    (b"\xe8\x03\x00\x00abc", 1, 1000),  # the stub-killing input of issue 9 and issue 36
    (bytes(serialized(b"fine")) + b"\xe8\x03\x00\x00abc", 2, 1000),
    (b"\xff\xff\xff\xff", 1, 2**32 - 1),
    (bytes(serialized(b"fine")) + b"\x05\x00", 2, 4),  # trailing bytes shorter than a length prefix
])
def test_decoder_marks_what_runs_past_the_end(library, payload, rows, declared):
    decoded = library.deserialize_bytes_tensor(np.frombuffer(payload, dtype=np.uint8))
    assert len(decoded) == rows and isinstance(decoded[-1], library.MalformedBytes)
    assert decoded[-1].declared == declared


def test_a_shape_the_elements_do_not_fill_is_flagged_not_raised(library):
    """The stub reshapes the decoder's array to the request's dims outside execute(): a raise there kills it."""
    decoded = library.deserialize_bytes_tensor(serialized(b"abc"))
    shaped = decoded.reshape([2**32, 1])
    assert shaped.wanted_shape == (2**32, 1) and shaped.tolist() == [b"abc"]
    with pytest.raises(library.InvalidInput, match=r"^text has shape \[4294967296, 1\] but holds 1 elements"):
        library.read_bytes({"text": Tensor(shaped)}, "text")


def test_read_bytes_names_the_field_and_element(library):
    decoded = library.deserialize_bytes_tensor(np.frombuffer(bytes(serialized(b"ok")) + b"\xe8\x03\x00\x00abc",
                                                             dtype=np.uint8)).reshape([2])
    with pytest.raises(library.InvalidInput) as caught:
        library.read_bytes({"documents": Tensor(decoded)}, "documents", rank=1)
    assert str(caught.value) == ("documents[1] is malformed: its length prefix says 1000 bytes but 3 follow "
                                 "[invalid_input documents[1]]")  # the error contract's tag: model_errors.py
    assert caught.value.field == "documents[1]" and caught.value.triton_error.code == TritonError.INVALID_ARG
    with pytest.raises(library.InvalidInput, match=r"^text arrived with shape \[1\], not 2 dimensions"):
        library.read_bytes({"text": Tensor(library.deserialize_bytes_tensor(serialized(b"ok")))}, "text", rank=2)
    with pytest.raises(library.InvalidInput, match="^query is missing"):
        library.read_bytes({}, "query")
    assert library.read_bytes({}, "query", optional=True) is None
    good = library.deserialize_bytes_tensor(serialized(b"a", b"b")).reshape([2, 1])
    assert library.read_bytes({"text": Tensor(good)}, "text", rank=2).tolist() == [b"a", b"b"]
