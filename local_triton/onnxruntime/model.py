"""Local/CI stand-in for Triton's C++ onnxruntime backend (never shipped in the image).

Triton 2.48 serves a model whose config says `backend: "onnxruntime"` with
`<backend-directory>/onnxruntime/model.py` when no `libtriton_onnxruntime.so` is there
(the nvidia-pytriton wheel has none). In the tritonserver container the real backend is
found first, so this file never shadows it. It honours the same config.pbtxt: the
`default_model_filename`, the ORT thread parameters and arena shrinkage, and the dynamic batcher's batches
(requests arrive unstacked here, so rows are concatenated and run as one batch, like the
real backend does), and ragged batching: an input with `allow_ragged_batch` goes to the graph
flat, every request's elements back to back, with the config's batch inputs beside it (only
BATCH_ITEM_SHAPE, what a --ragged-batch export takes), as the real backend hands them.
"""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def _parameter(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        filename = config.get("default_model_filename") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if os.path.isdir(path):  # external-data layout: 1/model.onnx/model.onnx + data file
            path = os.path.join(path, "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(_parameter(config, "intra_op_thread_count", 0))
        options.inter_op_num_threads = int(_parameter(config, "inter_op_thread_count", 0))
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.run_options = ort.RunOptions()  # the real backend's run option parameter, as it passes it on
        shrinkage = _parameter(config, "memory.enable_memory_arena_shrinkage", "")
        if shrinkage:
            self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrinkage)
        self.input_names = [i["name"] for i in config["input"]]
        self.output_names = [o["name"] for o in config["output"]]
        self.ragged = {i["name"] for i in config["input"] if i.get("allow_ragged_batch")}
        self.batch_inputs = []  # (target name, source input): BATCH_ITEM_SHAPE only
        for batch_input in config.get("batch_input", []):
            if batch_input.get("kind") != "BATCH_ITEM_SHAPE":
                raise pb_utils.TritonModelException(f"the stand-in has no batch input {batch_input.get('kind')}")
            self.batch_inputs += [(target, batch_input["source_input"][0]) for target in batch_input["target_name"]]

    def execute(self, requests):
        feeds = [
            [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.input_names]
            for r in requests
        ]
        # The dynamic batcher only merges equal shapes, unless the inputs that differ are ragged; anything else runs
        # request by request.
        shapes = {tuple(a.shape[1:] for name, a in zip(self.input_names, f) if name not in self.ragged)
                  for f in feeds}
        groups = [list(range(len(requests)))] if len(shapes) == 1 else [[i] for i in range(len(requests))]
        responses = [None] * len(requests)
        for group in groups:
            batch = {
                name: (np.concatenate([feeds[i][k].reshape(-1) for i in group]) if name in self.ragged else
                       np.concatenate([feeds[i][k] for i in group]) if len(group) > 1 else feeds[group[0]][k])
                for k, name in enumerate(self.input_names)
            }
            for target, source in self.batch_inputs:  # per row of each request: its shape past the batch dim
                k = self.input_names.index(source)
                batch[target] = np.array([feeds[i][k].shape[1:] for i in group for _ in range(feeds[i][k].shape[0])],
                                         dtype=np.int32)
            # Only the outputs the group's requests asked for (all when none says), as the real backend returns:
            # token_embeddings, [rows, tokens, hidden], is large and wanted only by the late chunking model.
            asked = set().union(*(requests[i].requested_output_names() for i in group))
            names = [n for n in self.output_names if n in asked] or self.output_names
            try:
                outputs = self.session.run(names, batch, self.run_options)
            except Exception as error:  # noqa: BLE001 - ORT raises many types; report each to its requests
                for i in group:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {error}"))
                continue
            start = 0
            for i in group:
                rows = feeds[i][0].shape[0]
                tensors = [pb_utils.Tensor(n, o[start:start + rows]) for n, o in zip(names, outputs)]
                responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
                start += rows
        return responses
