"""What every Python model of the repository shares: reading BYTES inputs so that no input, however malformed, can
kill a stub; the per-request error every model answers with, in the error contract of model_errors.py (a kind and
a field); the BLS call, which carries the request's deadline and passes a step's error on in that contract.

build/export.py installs this file beside each Python model's model.py (MODEL_CODE in exporter/repository.py)
and counts it in the export digest, so a mounted repository runs with nothing beside it. Import it as
`import model_common`; it needs only numpy, the backend's triton_python_backend_utils, model_errors.py,
request_rules.py and tracing.py (installed beside it).

Why the decoder: Triton 2.48's stub turns every BYTES input into numpy before execute() runs, outside any error
handling, with triton_python_backend_utils.deserialize_bytes_tensor(...).reshape(dims). The stock decoder raises on
an element whose length prefix runs past the buffer (`\\xe8\\x03\\x00\\x00abc`: 1000 bytes declared, 3 sent), and the
reshape raises when the shape's element count does not match the elements sent (Triton core lets through shapes
whose element count wraps past 2^32); either exception kills the stub. install_decoder() replaces the decoder in the
model's process: a bad element becomes a MalformedBytes, a bad shape a flag on the array, and read_bytes() turns both
into that request's INVALID_ARG naming the field.
"""
import json
import os
import struct
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import triton_python_backend_utils as pb_utils

from model_library import model_errors, request_rules, tracing
from model_library.model_errors import ErrorKind


class MalformedBytes(bytes):
    """A BYTES element whose length prefix runs past the end of the tensor; `declared` is what it claimed."""

    declared = 0


class DecodedBytes(np.ndarray):
    """The decoder's array of elements. Its reshape() does not raise when the shape's element count is not the
    number of elements sent: it keeps the elements as they came and records the shape that was asked for."""

    def __array_finalize__(self, source):
        self.wanted_shape = getattr(source, "wanted_shape", None)

    def reshape(self, *shape, **kwargs):
        try:
            return super().reshape(*shape, **kwargs)
        except (ValueError, OverflowError, MemoryError):
            flat = super().reshape(-1)
            flat.wanted_shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
            return flat


def deserialize_bytes_tensor(encoded):
    """triton_python_backend_utils.deserialize_bytes_tensor, made total: never raises on any buffer."""
    data = encoded.tobytes()
    items, offset, end = [], 0, len(data)
    while offset + 4 <= end:
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + size > end:
            malformed = MalformedBytes(data[offset:end])
            malformed.declared = size
            items.append(malformed)
            break
        items.append(data[offset:offset + size])
        offset += size
    if offset < end and (not items or not isinstance(items[-1], MalformedBytes)):
        trailing = MalformedBytes(data[offset:end])  # 1-3 bytes: not even a length prefix
        trailing.declared = 4
        items.append(trailing)
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.view(DecodedBytes)


def config_parameters(args):
    """(the model's config, its `parameters` as {key: string value}) from initialize()'s args."""
    config = json.loads(args["model_config"])
    return config, {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def start_model(args):
    """What every Python model's initialize() does first: the decoder installed before the first request is loaded,
    its spans named after it (tracing.py); returns (its config, its version folder)."""
    install_decoder()
    tracing.name_model(args.get("model_name"))
    return json.loads(args["model_config"]), os.path.join(args["model_repository"], args["model_version"])


def install_decoder():
    """Call first in initialize(): the stub looks the decoder up for each request it loads."""
    pb_utils.deserialize_bytes_tensor = deserialize_bytes_tensor


class ModelError(Exception):
    """One request's own error, answered as its response (the other requests of the batch go on): `kind` (one of
    model_errors.KINDS) about `field` (None: no field), with a message that leads with the field and ends with the
    contract's tag. Its KServe code is the kind's."""

    def __init__(self, kind, field, problem):
        message = model_errors.tagged(kind, field, problem)
        super().__init__(message)
        self.kind, self.field = kind, field
        # CANCELLED is missing from some python_backend builds: UNAVAILABLE is the nearest
        code = getattr(pb_utils.TritonError, model_errors.KINDS[kind], pb_utils.TritonError.UNAVAILABLE)
        self.triton_error = pb_utils.TritonError(message, code)


class InvalidInput(ModelError, ValueError):
    """A client's error about `field` (invalid_input unless `kind` says which). A ValueError too, so the tokenizer's
    per-request handlers take it as they are."""

    def __init__(self, field, problem, kind=ErrorKind.INVALID_INPUT):
        super().__init__(kind, field, problem)


def read_bytes(request, name, rank=None, optional=False):
    """The BYTES input `name` as a flat object array of bytes (None: absent and optional), or InvalidInput naming it
    (`name` for its shape, `name[i]` for an element). `rank`: the dimensions the model's config gives the input,
    batch included; give it for every input of a batching model (max_batch_size > 0). Why: Triton 2.48 keeps a
    request's batch size in 32 bits, taken from the first input it looks at: rows that are a multiple of 2^32 (2^32,
    2^40: one element sent) make a batch of 0, and the model gets the input without its batch dimension, which the
    rank refuses. Nothing in a model can tell the rest (probed on 2.48, tests/test_hostile.py): 2^32 + 1 rows wrap to
    a batch of 1; an ensemble hands its first step a batch of 0 as one row; and in a request of two batched inputs
    (a cross-encoder's `text` and `query`) where Triton looks at the wrapped one first (the one sent last), the other
    sets the batch and the wrapped input arrives as [batch, 1] holding its one element: a well-formed request."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if optional:
            return None
        raise InvalidInput(name, "is missing")
    array = tensor.as_numpy()
    wanted = getattr(array, "wanted_shape", None)
    if wanted is not None:
        raise InvalidInput(name, f"has shape {list(wanted)} but holds {array.size} elements")
    if rank is not None and array.ndim != rank:
        raise InvalidInput(name, f"arrived with shape {list(array.shape)}, not {rank} dimensions: its shape does not "
                                 f"match its elements (an element count past 2^32?)")
    flat = np.asarray(array, dtype=np.object_).reshape(-1)
    for row, item in enumerate(flat):
        if isinstance(item, MalformedBytes):
            raise InvalidInput(f"{name}[{row}]", f"is malformed: its length prefix says {item.declared} bytes but "
                                                 f"{len(item)} follow")
    return flat


INT32_MAX = 2**31 - 1


def whole_number(parameters, name, low=1, high=INT32_MAX, meaning=""):
    """The request parameter `name` as an int in [low, high] (None: absent), or InvalidInput naming it. KServe JSON
    clients may send numbers as strings; a bool is not a number."""
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(name, f"must be a whole number from {low} to {high}{meaning}, not "
                                 f"{json.dumps(value) if not isinstance(value, str) else json.dumps(value[:40])}",
                           ErrorKind.INVALID_VALUE)
    return value


def rerank_inputs(request, max_documents):
    """(query, documents) of a rerank request (both rerank models: bge-m3's and a cross-encoder's), as flat object
    arrays, checked: one query, 1 to `max_documents` documents (their parameter max_documents)."""
    query = read_bytes(request, "query", rank=1)
    documents = read_bytes(request, "documents", rank=1)
    if len(query) != 1:
        raise InvalidInput("query", f"must hold one text, not {len(query)}")
    request_rules.documents(len(documents), max_documents, InvalidInput)
    return query, documents


def answer(request, work):
    """The per-request execute wrapper: the response of `work(request)` (its output tensors), or that request's own
    error. Nothing a request does fails the batch or reaches the stub: anything unforeseen is that request's
    internal error. The error's frames are dropped first (forget_frames): they would keep the request alive.
    Traced (tracing.py): the request's own span, with the error's kind."""
    if tracing.ENABLED:
        with tracing.model_span(request) as span:
            response = _answer(request, work)
            if span is not None and response.has_error():
                tracing.answered(span, model_errors.parse(response.error().message()).kind)
            return response
    return _answer(request, work)


def _answer(request, work):
    try:
        return pb_utils.InferenceResponse(output_tensors=work(request))
    except ModelError as error:
        forget_frames(error)
        return pb_utils.InferenceResponse(error=error.triton_error)
    except Exception as error:  # noqa: BLE001 - see the docstring
        forget_frames(error)
        return pb_utils.InferenceResponse(error=ModelError(ErrorKind.INTERNAL, None, f"{type(error).__name__}: {error}")
                                          .triton_error)


def forget_frames(error):
    """Drops the tracebacks of `error` and of the errors chained to it. Why (issue 59): an error raised in a step's
    thread (a BLS piece, an encoder run) is kept by its Future and raised again by result() in the frame that holds
    that Future, so its traceback closes a reference cycle (error -> frames -> Future -> error) through the request.
    The Python backend (24.07) frees a request's response factory, which holds its model, only once the request's
    Python object is gone: until the cyclic GC happens to run (never, in an idle stub) the model cannot unload, and
    a drain, an admin unload or tritonserver's exit waits for it until it times out and the stubs are killed."""
    found, seen = [error], set()
    while found:
        error = found.pop()
        if error is not None and id(error) not in seen:
            seen.add(id(error))
            error.__traceback__ = None
            found += [error.__cause__, error.__context__]


class RequestModel:
    """The frame of the repository's Python models that answer requests one by one (subclass it as
    TritonPythonModel): initialize() installs the decoder before the first request is loaded and reads the config
    (self.config, self.parameters: config_parameters), then runs setup(args); execute() answers each request with
    answer(request, self.work). A model that runs its requests side by side overrides execute()."""

    def initialize(self, args):
        start_model(args)
        self.config, self.parameters = config_parameters(args)
        self.setup(args)

    def setup(self, args):
        """The model's own settings from self.parameters."""

    def execute(self, requests):
        return [answer(request, self.work) for request in requests]

    def work(self, request):
        """One request's output tensors, or a ModelError."""
        raise NotImplementedError


class RerankModel(RequestModel):
    """Both rerank models' frame (bge-m3's, a cross-encoder's): query and documents in, their config's
    texts_per_call (documents per BLS call) and max_documents; a request's calls run on self.pool, CALLS_AHEAD at
    a time (`pieces`)."""

    def setup(self, args):
        self.texts_per_call = int(self.parameters["texts_per_call"])
        self.max_documents = int(self.parameters.get("max_documents") or 2048)
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="rerank-call")

    def pieces(self, work, count, deadline):
        """[work(i) for i in range(count)], run on self.pool CALLS_AHEAD at a time, in order. Why not all at once: a
        long request's calls would take every instance of the BLS model and hold the other requests behind it; and a
        call once sent runs to its end in Triton (24.07's BLS cannot cancel it, and the encoder has no queue
        policy), so a request whose client has gone or whose timeout has passed must not have sent the rest: the
        next piece starts only while the deadline holds (issue 49: a 2,000-sentence /similarity ran 137 s after its
        client had left). The first error stops the rest."""
        results, running, started = [None] * count, deque(), 0
        try:
            while started < count or running:
                while started < count and len(running) < CALLS_AHEAD:
                    deadline.left_us()  # raises once the request is cancelled or its time is up
                    running.append((started, self.pool.submit(work, started)))
                    started += 1
                i, call = running.popleft()
                try:  # answered at the deadline, not when a call that ignores it returns
                    results[i] = call.result(timeout=deadline.left_s())
                except FutureTimeout:
                    raise ModelError(ErrorKind.TIMEOUT, None, "the request's timeout expired while it ran") from None
        finally:
            for _, call in running:
                call.cancel()
        return results

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


def call(model, inputs, outputs, deadline, parameters=None, rename=None, optional=()):
    """One BLS request to `model` with what is left of the request's timeout (Deadline.left_us: cancellation and
    time checked first): its outputs {name: array}, in host memory even when the step runs on a GPU (as_numpy needs
    that). A step's error is raised as this request's ModelError of the same kind, its field passed through
    `rename(field)` (the caller's name for it: the tokenizer's `text[0]` is a rerank request's `query`). optional:
    outputs the step may leave out (absent from the answer: the tokenizer's lookup outputs). Traced (tracing.py):
    Triton's trace of the request, or a span of ours, goes with the call."""
    if tracing.ENABLED:
        with tracing.child_call(deadline.request, model, parameters) as (parameters, trace):
            return _call(model, inputs, outputs, deadline, parameters, rename, {} if trace is None else
                         {"trace": trace}, optional)
    return _call(model, inputs, outputs, deadline, parameters, rename, {}, optional)


def _call(model, inputs, outputs, deadline, parameters, rename, traced, optional=()):
    request = pb_utils.InferenceRequest(
        model_name=model, inputs=inputs, requested_output_names=outputs, parameters=parameters or {},
        timeout=deadline.left_us(), preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        **traced)
    try:
        response = request.exec()
    except pb_utils.TritonModelException as error:  # Triton refused the call itself: stopping, or not loaded
        raise ModelError(ErrorKind.UNAVAILABLE, None, f"model '{model}' did not take the request: {error}") from None
    if response.has_error():
        info = model_errors.parse(response.error().message())
        field = rename(info.field) if rename is not None and info.field else info.field
        raise ModelError(info.kind, field, model_errors.problem(info))
    if not optional:
        return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}
    found = {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}
    return {name: tensor.as_numpy() for name, tensor in found.items() if tensor is not None or name not in optional}


# The launcher's drain creates this file when work must stop feeding (local_triton/launch.py, drain()); unset or
# absent: never (a server started otherwise).
STOP_FILE = os.environ.get("TRITON_EMBED_STOP_FILE")
CALLS_AHEAD = 1  # a rerank request's BLS calls in flight at once: one, so a BLS instance stays free for other requests


class Deadline:
    """The request's own timeout (µs; 0: none) and cancellation, checked before each step (left_us): work whose
    client has gone or whose time is up is not started, and each step's BLS request gets only what is left (its
    `timeout=`), so the models behind it refuse it from their queues too."""

    def __init__(self, request):
        self.request, timeout_us = request, request.timeout()
        self.end = time.monotonic() + timeout_us / 1e6 if timeout_us else None

    def left_us(self):
        if self.request.is_cancelled():
            raise ModelError(ErrorKind.CANCELLED, None, "the request was cancelled")
        if STOP_FILE and os.path.exists(STOP_FILE):  # one stat per step
            raise ModelError(ErrorKind.UNAVAILABLE, None,
                             "the server is stopping: work that would outlast its drain is not started")
        if self.end is None:
            return 0
        left = int(self.left_s() * 1e6)
        if left <= 0:
            raise ModelError(ErrorKind.TIMEOUT, None, "the request's timeout expired before its next step")
        return left

    def left_s(self):
        """Seconds left (None: no timeout; 0 once past it), for a wait."""
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    def check_answer(self):
        """After the work: a result the client has left, or that is past its timeout, is not answered as a success.
        Why: an encoder run, once queued, ignores timeouts (the encoder has no queue policy: bench/TUNING.md), so
        a late answer would otherwise arrive as if on time."""
        if self.request.is_cancelled():
            raise ModelError(ErrorKind.CANCELLED, None, "the request was cancelled")
        if self.end is not None and time.monotonic() > self.end:
            raise ModelError(ErrorKind.TIMEOUT, None, "the request's timeout expired while it ran")
