"""The ensemble's contract for requests of many texts: `text` in, the ensemble's outputs out, rows in the request's
order, computed without padding every text to the longest one.

One request: the tokenizer (BLS) tokenizes all its texts at once and, asked for `length_group`, says which rows
share a padded width (its grouping.py, the same cost model as for the ensemble); each group goes to the encoder as
its own request, all at once; the rows come back in the request's order. Outputs with a per-token dimension
(sparse, ColBERT) are padded to the request's longest row, as the ensemble returns them. Errors are the steps'
own (the tokenizer's `text[i] ...` carry the request's row numbers). Settings: config.pbtxt, read once here.

Vectors for a store (request parameters and outputs): `dimensions` (a width from vectors.json, which export writes:
the Matryoshka widths) truncates `embedding` and re-normalizes it; `embedding_int8`, `embedding_uint8`,
`embedding_binary`, `embedding_ubinary` are that vector quantized exactly as sentence_transformers'
quantize_embeddings does, int8 / uint8 with the width's ranges calibrated at export. `prompt_name` and `input_type`
go to the tokenizer, which prepends the prompt.

A cross-encoder export's BLS model takes (query, text) pairs: the input `query` per row, or the request parameter
`query` for every row (its rerank model sends one query so); both go to the tokenizer as they came.
"""
import json
import os
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
INPUT_ERROR = re.compile(r"^(text\[\d+\] |query(\[\d+\])? |the request holds |prompt_name |input_type |prompts apply )")
QUEUE_FULL = "Exceeds maximum queue size"
QUANTIZED = {"embedding_int8": "int8", "embedding_uint8": "uint8", "embedding_binary": "binary",
             "embedding_ubinary": "ubinary"}
VECTORS = {"embedding", *QUANTIZED}  # their -1 dimension is the request's width, not a per-token one
PROMPT_PARAMETERS = ("prompt_name", "input_type")


def quantize(vectors, precision, ranges):
    """sentence_transformers.quantization.quantize_embeddings(vectors, precision, ranges), line for line."""
    if precision == "binary":
        return (np.packbits(vectors > 0, axis=-1) - 128).astype(np.int8)
    if precision == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    q_vals = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return q_vals.astype(np.uint8) if precision == "uint8" else (q_vals - 128).astype(np.int8)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config["parameters"].items()}
        self.tokenizer_model = parameters["tokenizer_model"]
        self.encoder_model = parameters["encoder_model"]
        # per output: which dimensions (after the row) follow the padded width: those grow to the request's width
        self.outputs = [o["name"] for o in config["output"]]
        self.variable_dims = {o["name"]: [i for i, d in enumerate(o["dims"]) if int(d) == -1] for o in config["output"]
                              if o["name"] not in VECTORS}
        self.tokenizer_outputs = TOKENIZER_OUTPUTS + [n for n in self.outputs if n == "query_truncated"]
        path = os.path.join(args["model_repository"], args["model_version"], "vectors.json")
        vectors = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                vectors = json.load(handle)
        self.dimensions = vectors.get("dimensions") or []
        ranges = (vectors.get("calibration") or {}).get("ranges", {})
        self.ranges = {int(width): np.asarray(r, dtype=np.float32) for width, r in ranges.items()}
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

    def options(self, request):
        """(dimensions or None, the tokenizer's parameters: prompt, pairs' shared query) from the request's
        parameters; StepError names a bad one."""
        parameters = json.loads(request.parameters() or "{}")
        prompt = {key: parameters[key] for key in PROMPT_PARAMETERS if key in parameters}
        for key, value in prompt.items():
            if not isinstance(value, str):
                raise invalid(f"{key} must be a string, not {json.dumps(value)}")
        if "query" in parameters:
            prompt["query"] = parameters["query"]
        width = parameters.get("dimensions")
        if width is None:
            return None, prompt
        allowed = ", ".join(map(str, self.dimensions))
        if isinstance(width, str) and width.strip().isdigit():
            width = int(width)
        if not isinstance(width, int) or isinstance(width, bool) or width not in self.dimensions:
            detail = f"one of this model's Matryoshka widths: {allowed}" if len(self.dimensions) > 1 else \
                f"{allowed}: this model is not Matryoshka and gives only its full size"
            raise invalid(f"dimensions {json.dumps(width)} is not served; dimensions must be {detail}")
        return (None if width == max(self.dimensions) else width), prompt

    def vectors(self, results, wanted, width):
        """`embedding` at the request's width (truncated, re-normalized) and its quantized forms."""
        dense = results.get("embedding")
        if dense is None:
            return
        if width is not None:
            dense = dense[:, :width]
            dense = (dense / np.maximum(np.linalg.norm(dense, axis=1, keepdims=True), 1e-12)).astype(np.float32)
            results["embedding"] = dense
        for name in wanted:
            if name in QUANTIZED:
                ranges = self.ranges.get(dense.shape[1])
                if ranges is None and QUANTIZED[name].endswith("int8"):
                    raise invalid(f"{name}: no calibrated ranges for width {dense.shape[1]}: re-run build/export.py")
                results[name] = quantize(dense, QUANTIZED[name], ranges)

    def embed(self, request, deadline):
        wanted = request.requested_output_names() or self.outputs
        dimensions, parameters = self.options(request)
        inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("text", "query")]
        inputs = [tensor for tensor in inputs if tensor is not None]
        tokens = self.call(self.tokenizer_model, inputs, self.tokenizer_outputs, deadline, parameters)
        encoder_outputs = [name for name in wanted if name not in FROM_TOKENIZER and name not in VECTORS]
        if VECTORS & set(wanted):
            encoder_outputs.append("embedding")  # the quantized forms are computed here from it
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
                    for dim in self.variable_dims.get(name, ()):
                        shape[dim + 1] += width - cut  # sparse: `width` ids; ColBERT: `width - 1` vectors
                    shape[0] = len(ids)
                    results[name] = np.full(shape, PAD_VALUES.get(name, 0), dtype=part.dtype)
                target = results[name]
                target[(rows, *(slice(0, n) for n in part.shape[1:]))] = part
        self.vectors(results, wanted, dimensions)
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


def invalid(message):
    """A bad request parameter: INVALID_ARG (HTTP 400) naming it."""
    return StepError(pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
