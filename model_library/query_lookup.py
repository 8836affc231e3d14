"""Inference-free SPLADE's query side (opensearch-neural-sparse-encoding-doc-v2/v3: a SparseEncoder whose Router sends
queries to a SparseStaticEmbedding): a weight per vocabulary id, a query's vector the weights of its tokens, no
encoder. The tokenizer model answers it from the files export writes beside tokenizer.json (exporter/families/
inference_free.py), and the export's reference check runs this same code against SparseEncoder.encode_query:

    query_side.json        the Router's routes ({"routes": {"query": "lookup", "document": "encoder"},
                           "default_route": "document"}) and the query tokenizer's max length
    query_tokenizer.json   the query side's own tokenizer (SparseStaticEmbedding tokenizes without special tokens,
                           cut at its tokenizer's model_max_length)
    query_weights.npy      the weights, float32, one per vocabulary id

A request's side is its Router task (request_rules.task: prompt_name or input_type); no task is the default route.
Plain Python and numpy (no Triton import)."""
import json
import os

import numpy as np

SIDE_FILE = "query_side.json"
TOKENIZER_FILE = "query_tokenizer.json"
WEIGHTS_FILE = "query_weights.npy"
LOOKUP = "lookup"  # a route answered by the weights
ENCODER = "encoder"  # a route the encoder answers (the document side)


class QueryLookup:
    """The query side of an inference-free SPLADE export, loaded from `folder` (the tokenizer model's version
    folder); `load(folder)` gives None where the export has no Router."""

    def __init__(self, folder):
        from tokenizers import Tokenizer

        with open(os.path.join(folder, SIDE_FILE), encoding="utf-8") as handle:
            side = json.load(handle)
        self.routes = dict(side["routes"])  # {task: "lookup" | "encoder"}
        self.default_route = side["default_route"]
        self.max_length = int(side["max_length"])
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, TOKENIZER_FILE))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        self.weights = np.load(os.path.join(folder, WEIGHTS_FILE)).astype(np.float32).reshape(-1)
        self.whole = None  # the query tokenizer without truncation (TEI's /tokenize), made when first asked for

    @classmethod
    def load(cls, folder):
        return cls(folder) if os.path.exists(os.path.join(folder, SIDE_FILE)) else None

    def looks_up(self, task):
        """Whether a request of Router task `task` (None: none given) is answered by the weights."""
        return self.routes.get(task if task in self.routes else self.default_route) == LOOKUP

    def encode(self, texts):
        """The query tokenizer's encodings of `texts` (prompt already prepended), no special tokens, cut at
        max_length (encoding.overflowing says so), as SparseStaticEmbedding.preprocess tokenizes."""
        if len(texts) == 1:
            return [self.tokenizer.encode(texts[0], add_special_tokens=False)]
        return self.tokenizer.encode_batch(texts, add_special_tokens=False)

    def untruncated(self):
        """The query tokenizer without truncation (the tokenizer model's tokenize task lists every token)."""
        if self.whole is None:
            from tokenizers import Tokenizer

            self.whole = Tokenizer.from_str(self.tokenizer.to_str())
            self.whole.no_truncation()
        return self.whole

    def sparse(self, rows):
        """rows: each text's token ids -> (indices int64 [n, k], values float32 [n, k], counts int32 [n, 1]): each
        text's distinct ids with a non-zero weight, by weight (largest first), -1 / 0 past its count, k the largest
        count (at least 1), as the SPLADE encoder gives its sparse outputs."""
        found = []
        for ids in rows:
            unique = np.unique(np.asarray(ids, dtype=np.int64))
            unique = unique[(unique >= 0) & (unique < len(self.weights))]
            values = self.weights[unique]
            keep = values != 0
            unique, values = unique[keep], values[keep]
            order = np.argsort(-values, kind="stable")
            found.append((unique[order], values[order]))
        width = max([1, *(len(ids) for ids, _ in found)])
        indices = np.full((len(rows), width), -1, dtype=np.int64)
        values = np.zeros((len(rows), width), dtype=np.float32)
        counts = np.zeros((len(rows), 1), dtype=np.int32)
        for row, (ids, weights) in enumerate(found):
            indices[row, :len(ids)], values[row, :len(ids)], counts[row, 0] = ids, weights, len(ids)
        return indices, values, counts
