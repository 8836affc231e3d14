"""The ensemble's contract for requests of many texts: `text` in, the ensemble's outputs out, rows in the request's
order, computed without padding every text to the longest one.

One request: the tokenizer (BLS) tokenizes all its texts at once and, asked for `length_group`, says which rows
share a padded width (its grouping.py, the same cost model as for the ensemble); each group goes to the encoder as
its own request, all at once; the rows come back in the request's order. Outputs with a per-token dimension
(sparse, ColBERT) are padded to the request's longest row, as the ensemble returns them. Errors are the steps'
own (the tokenizer's `text[i] ...` carry the request's row numbers). Settings: config.pbtxt, read once here.

A cross-encoder export's BLS model takes (query, text) pairs: the input `query` per row, or the request parameter
`query` for every row (its rerank model sends one query so); both go to the tokenizer as they came.
"""
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

TOKENIZER_OUTPUTS = ["input_ids", "attention_mask", "num_tokens", "truncated", "length_group"]
FROM_TOKENIZER = {"num_tokens", "truncated", "query_truncated"}
PAD_VALUES = {"sparse_indices": -1}  # the encoder pads sparse ids with -1; every other output with 0
# A BLS response's error arrives with code INTERNAL in 24.07 whatever the step said. The tokenizer's per-request
# errors (its model.py: decode, check) get back their INVALID_ARG (HTTP 400, as via the ensemble), a step's full
# queue (its max_queue_size) its UNAVAILABLE.
INPUT_ERROR = re.compile(r"^(text\[\d+\] |query(\[\d+\])? |the request holds )")
QUEUE_FULL = "Exceeds maximum queue size"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config["parameters"].items()}
        self.tokenizer_model = parameters["tokenizer_model"]
        self.encoder_model = parameters["encoder_model"]
        # per output: which dimensions (after the row) follow the padded width: those grow to the request's width
        self.variable_dims = {o["name"]: [i for i, d in enumerate(o["dims"]) if int(d) == -1] for o in config["output"]}
        self.tokenizer_outputs = TOKENIZER_OUTPUTS + [n for n in self.variable_dims if n == "query_truncated"]
        threads = int(parameters.get("bls_threads") or 32)
        self.requests_pool = ThreadPoolExecutor(threads, thread_name_prefix="bls-request")
        self.runs_pool = ThreadPoolExecutor(threads, thread_name_prefix="bls-run")

    def execute(self, requests):
        return list(self.requests_pool.map(self.answer, requests))

    def answer(self, request):
        try:
            return pb_utils.InferenceResponse(output_tensors=self.embed(request, Deadline(request)))
        except StepError as error:
            return pb_utils.InferenceResponse(error=error.triton_error)
        except Exception as error:  # noqa: BLE001 - a step not loaded, stopping...: this request fails, not the batch
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(error).__name__}: {error}",
                                                                         pb_utils.TritonError.UNAVAILABLE))

    def call(self, model, inputs, outputs, deadline, parameters=None):
        """One BLS request; StepError carries a step's error (its message, and the codes above)."""
        request = pb_utils.InferenceRequest(
            model_name=model, inputs=inputs, requested_output_names=outputs, parameters=parameters or {},
            timeout=deadline.left_us(),
            # outputs come back in host memory even when the encoder runs on a GPU (as_numpy needs that)
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
        response = request.exec()
        if response.has_error():
            error = response.error()
            if INPUT_ERROR.match(error.message()):
                error = pb_utils.TritonError(error.message(), pb_utils.TritonError.INVALID_ARG)
            elif QUEUE_FULL in error.message():
                error = pb_utils.TritonError(error.message(), pb_utils.TritonError.UNAVAILABLE)
            raise StepError(error)
        return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}

    def embed(self, request, deadline):
        wanted = request.requested_output_names() or list(self.variable_dims)
        inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("text", "query")]
        inputs = [tensor for tensor in inputs if tensor is not None]
        query = json.loads(request.parameters() or "{}").get("query")
        tokens = self.call(self.tokenizer_model, inputs, self.tokenizer_outputs, deadline,
                           None if query is None else {"query": query})
        encoder_outputs = [name for name in wanted if name not in FROM_TOKENIZER]
        results = {name: tokens[name] for name in wanted if name in FROM_TOKENIZER}
        if not encoder_outputs:
            return [pb_utils.Tensor(name, array) for name, array in results.items()]
        ids, mask, groups = tokens["input_ids"], tokens["attention_mask"], tokens["length_group"]
        width = ids.shape[1]
        runs = []
        for group in np.unique(groups[:, 0]):
            rows = np.flatnonzero(groups[:, 0] == group)
            cut = int(groups[rows[0], 1])
            inputs = [pb_utils.Tensor("input_ids", np.ascontiguousarray(ids[rows, :cut])),
                      pb_utils.Tensor("attention_mask", np.ascontiguousarray(mask[rows, :cut]))]
            runs.append((rows, cut, self.runs_pool.submit(self.call, self.encoder_model, inputs, encoder_outputs,
                                                          deadline)))
        for rows, cut, run in runs:
            for name, part in run.result().items():
                if name not in results:
                    shape = list(part.shape)
                    for dim in self.variable_dims[name]:
                        shape[dim + 1] += width - cut  # sparse: `width` ids; ColBERT: `width - 1` vectors
                    shape[0] = len(ids)
                    results[name] = np.full(shape, PAD_VALUES.get(name, 0), dtype=part.dtype)
                target = results[name]
                target[(rows, *(slice(0, n) for n in part.shape[1:]))] = part
        return [pb_utils.Tensor(name, results[name]) for name in wanted]

    def finalize(self):
        self.requests_pool.shutdown(wait=False, cancel_futures=True)
        self.runs_pool.shutdown(wait=False, cancel_futures=True)


class Deadline:
    """The request's own timeout (µs; 0: none) and cancellation, checked before each step: work whose client has
    gone or whose time is up is not started, and each step gets only what is left."""

    def __init__(self, request):
        self.request, timeout_us = request, request.timeout()
        self.end = time.monotonic() + timeout_us / 1e6 if timeout_us else None

    def left_us(self):
        if self.request.is_cancelled():
            raise StepError(pb_utils.TritonError("the request was cancelled", getattr(
                pb_utils.TritonError, "CANCELLED", pb_utils.TritonError.UNAVAILABLE)))
        if self.end is None:
            return 0
        left = int((self.end - time.monotonic()) * 1e6)
        if left <= 0:
            raise StepError(pb_utils.TritonError("Request timeout expired before its next step",
                                                 pb_utils.TritonError.UNAVAILABLE))
        return left


class StepError(Exception):
    def __init__(self, triton_error):
        super().__init__(triton_error.message())
        self.triton_error = triton_error
