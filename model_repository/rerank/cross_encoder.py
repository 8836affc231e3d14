"""A cross-encoder export's rerank model (build/export.py copies this file into <name>_rerank/1/model.py; the
rerank model beside it, 1/model.py, is bge-m3's). `query` and `documents` in, one relevance score per document
out, the classifier's own (sentence-transformers CrossEncoder.predict, FlagEmbedding FlagReranker.compute_score):
`logits` unnormalized, `scores` with the sigmoid (normalize=True).

The pairs are scored by the export's BLS model (length groups), the query sent once per call (the request
parameter `query`: the tokenizer pairs it with every document). Its errors name `text[i]`, reported here as
`documents[i]`; the query's are `query ...`. Settings: config.pbtxt, read once here.
"""
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common  # noqa: E402  (installed beside this file by build/export.py)

ROW_ERROR = re.compile(r"^text\[(\d+)\]")
INPUT_ERROR = re.compile(r"^(text\[\d+\] |query |the request holds )")
OUTPUTS = ["logits", "scores", "num_tokens", "truncated", "query_truncated"]


RequestError = model_common.RequestError  # one request's own error (INVALID_ARG unless a code is given)


class TritonPythonModel:
    def initialize(self, args):
        model_common.install_decoder()  # before the first request is loaded
        _, parameters = model_common.config_parameters(args)
        self.pairs_model = parameters["pairs_model"]
        self.label = int(parameters["label"])
        self.texts_per_call = int(parameters["texts_per_call"])
        self.max_documents = int(parameters.get("max_documents") or 2048)
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="rerank-call")

    def execute(self, requests):
        return [model_common.answer(request, self.rerank) for request in requests]

    def rerank(self, request):
        query, documents = model_common.rerank_inputs(request, self.max_documents)
        deadline = model_common.Deadline(request)
        raw = query[0] if isinstance(query[0], bytes) else str(query[0]).encode()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(f"query is not valid UTF-8 (byte {error.start})") from None
        calls = [self.pool.submit(self.score, documents[start:start + self.texts_per_call], start, text, deadline)
                 for start in range(0, len(documents), self.texts_per_call)]
        parts = [call.result() for call in calls]
        deadline.check_answer()
        out = {name: np.concatenate([part[name] for part in parts]) for name in OUTPUTS}
        return [pb_utils.Tensor("scores", out["scores"][:, self.label].astype(np.float32)),
                pb_utils.Tensor("logits", out["logits"][:, self.label].astype(np.float32)),
                pb_utils.Tensor("num_tokens", np.array([out["num_tokens"].sum()], dtype=np.int32)),
                pb_utils.Tensor("query_truncated", np.array([bool(out["query_truncated"].any())])),
                pb_utils.Tensor("truncated", out["truncated"].reshape(-1).copy())]

    def score(self, documents, first, query, deadline):
        """documents[first:...] paired with the query -> {output: rows}, with what is left of the request's timeout;
        errors name the query or documents[i]."""
        request = pb_utils.InferenceRequest(
            model_name=self.pairs_model, requested_output_names=OUTPUTS, parameters={"query": query},
            timeout=deadline.left_us(),
            inputs=[pb_utils.Tensor("text", documents.astype(np.object_).reshape(-1, 1))],
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
        response = request.exec()
        if response.has_error():
            message = response.error().message()
            renamed = ROW_ERROR.sub(lambda match: f"documents[{first + int(match[1])}]", message, count=1)
            # the BLS model's 400s keep INVALID_ARG here; other errors (a step not ready) say UNAVAILABLE
            raise RequestError(renamed, None if INPUT_ERROR.match(message) else pb_utils.TritonError.UNAVAILABLE)
        return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in OUTPUTS}

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
