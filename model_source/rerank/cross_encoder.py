"""A cross-encoder export's rerank model (build/export.py copies this file into <name>_rerank/1/model.py; the
rerank model beside it, 1/model.py, is bge-m3's). `query` and `documents` in, one relevance score per document
out, the classifier's own (sentence-transformers CrossEncoder.predict, FlagEmbedding FlagReranker.compute_score):
`logits` unnormalized, `scores` with the sigmoid (normalize=True).

The pairs are scored by the export's BLS model (length groups), the query sent once per call (the request
parameter `query`: the tokenizer pairs it with every document). Its errors name `text[i]`, reported here as
`documents[i]` (the error contract's field: model_errors.py); the query's name `query`. Settings: config.pbtxt,
read once here.
"""
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library import (
    model_common,
    model_errors,
    request_rules,
)
from model_library.model_outputs import LOGITS, NUM_TOKENS, QUERY_TRUNCATED, SCORES, TRUNCATED

OUTPUTS = [LOGITS, SCORES, NUM_TOKENS, TRUNCATED, QUERY_TRUNCATED]


InvalidInput = model_common.InvalidInput  # a request's error about one field (model_errors.py's contract)


class TritonPythonModel(model_common.RerankModel):
    def setup(self, args):
        super().setup(args)
        self.pairs_model = self.parameters["pairs_model"]
        self.label = int(self.parameters["label"])

    def work(self, request):
        """One rerank request: the documents paired with the query and scored (the BLS model, texts_per_call per
        call)."""
        query, documents = model_common.rerank_inputs(request, self.max_documents)
        deadline = model_common.Deadline(request)
        raw = query[0] if isinstance(query[0], bytes) else str(query[0]).encode()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInput("query", f"is not valid UTF-8 (byte {error.start})") from None
        # the query goes to the tokenizer once for every pair, and truncate (false: a pair over the max length is
        # refused there, before the encoder runs)
        passed = {"query": text}
        parameters = json.loads(request.parameters() or "{}")
        if "truncate" in parameters:
            passed["truncate"] = request_rules.truncate(parameters, InvalidInput)
        step = self.texts_per_call
        parts = self.pieces(lambda i: self.score(documents[i * step:(i + 1) * step], i * step, passed, deadline),
                            -(-len(documents) // step), deadline)
        deadline.check_answer()
        out = {name: np.concatenate([part[name] for part in parts]) for name in OUTPUTS}
        return [pb_utils.Tensor(SCORES, out[SCORES][:, self.label].astype(np.float32)),
                pb_utils.Tensor(LOGITS, out[LOGITS][:, self.label].astype(np.float32)),
                pb_utils.Tensor(NUM_TOKENS, np.array([out[NUM_TOKENS].sum()], dtype=np.int32)),
                pb_utils.Tensor(QUERY_TRUNCATED, np.array([bool(out[QUERY_TRUNCATED].any())])),
                pb_utils.Tensor(TRUNCATED, out[TRUNCATED].reshape(-1).copy())]

    def score(self, documents, first, passed, deadline):
        """documents[first:...] paired with the query (passed: the BLS model's parameters, the query's among them)
        -> {output: rows}, with what is left of the request's timeout; errors name the query or documents[i]."""
        def rename(field):  # the BLS model's text[i] is documents[first + i]
            name, i = model_errors.split_field(field)
            if name != "text":
                return field
            return "documents" if i is None else f"documents[{first + i}]"
        texts = pb_utils.Tensor("text", documents.astype(np.object_).reshape(-1, 1))
        return model_common.call(self.pairs_model, [texts], OUTPUTS, deadline, parameters=passed,
                                 rename=rename)
