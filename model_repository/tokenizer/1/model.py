"""Tokenizer step of the ensemble: `text` (one string per row) -> input_ids, attention_mask, num_tokens,
truncated.

All requests of one execute are encoded in one `encode_batch` call, then grouped by length: each group is
padded to its longest row rounded up to `pad_to_multiple_of`, and a group is closed before its real/padded
token ratio drops below `min_padding_efficiency`. Responses are sent group by group, so the requests of a
group reach the encoder's FIFO dynamic batcher back to back with equal shapes and merge into one run.
A bad request gets its own error; the rest of the batch is unaffected.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _parameter(config, key):
    return config["parameters"][key]["string_value"]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.max_length = int(_parameter(config, "max_length"))
        self.multiple = max(1, int(_parameter(config, "pad_to_multiple_of")))
        self.min_efficiency = float(_parameter(config, "min_padding_efficiency"))
        self.overhead = float(_parameter(config, "batch_overhead_tokens"))  # one more encoder run, in tokens
        self.max_text_bytes = int(_parameter(config, "max_text_bytes"))
        here = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(here, "tokenizer.json"))
        if self.tokenizer.padding is None:
            raise pb_utils.TritonModelException("tokenizer.json has no pad token: re-run build/export.py")
        self.pad_id = self.tokenizer.padding["pad_id"]
        self.tokenizer.no_padding()  # padding is done per length group below
        self.tokenizer.enable_truncation(self.max_length)

    def _decode(self, request):
        texts = []
        for row, raw in enumerate(pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)):
            raw = raw if isinstance(raw, bytes) else str(raw).encode()
            if len(raw) > self.max_text_bytes:
                raise ValueError(f"text[{row}] is {len(raw)} bytes, over the limit of {self.max_text_bytes} "
                                 f"(tokenizer parameter max_text_bytes)")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"text[{row}] is not valid UTF-8 (byte {error.start})") from None
            if not text.strip():
                raise ValueError(f"text[{row}] is empty" + (" (whitespace only)" if text else ""))
            texts.append(text)
        return texts

    def _groups(self, lengths):
        """Requests sorted longest first and cut into contiguous groups that minimize the encoder's work:
        sum over groups of (batch_overhead_tokens + rows x padded width). Fewer, larger groups save the per-run
        cost; more groups save padding. A group of several requests must also keep real/padded >=
        min_padding_efficiency. Exact dynamic programme over the sorted order, O(requests^2)."""
        order = sorted(lengths, key=lambda i: max(lengths[i]), reverse=True)
        widths = [-(-max(lengths[i]) // self.multiple) * self.multiple for i in order]
        rows, real = [0], [0]  # prefix sums over the sorted order
        for i in order:
            rows.append(rows[-1] + len(lengths[i]))
            real.append(real[-1] + sum(lengths[i]))
        n = len(order)
        best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
        for end in range(1, n + 1):
            for start in range(end):
                width, count = widths[start], rows[end] - rows[start]
                if end - start > 1 and real[end] - real[start] < self.min_efficiency * count * width:
                    continue
                cost = best[start] + self.overhead + count * width
                if cost < best[end]:
                    best[end], cut[end] = cost, start
        groups, end = [], n
        while end > 0:
            start = cut[end]
            groups.append((order[start:end], widths[start]))
            end = start
        return groups[::-1]

    def execute(self, requests):
        texts, encodings, lengths = {}, {}, {}
        for i, request in enumerate(requests):
            try:
                texts[i] = self._decode(request)
            except ValueError as error:
                # INVALID_ARG: a client error (HTTP 400 / gRPC INVALID_ARGUMENT), like Triton's own input checks.
                request.get_response_sender().send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG)), flags=FINAL)
        flat = [text for i in texts for text in texts[i]]
        batch = self.tokenizer.encode_batch(flat) if flat else []
        start = 0
        for i in texts:
            encodings[i] = batch[start:start + len(texts[i])]
            lengths[i] = [len(e.ids) for e in encodings[i]]
            start += len(texts[i])
        for group, width in self._groups(lengths):
            for i in group:
                rows = len(lengths[i])
                input_ids = np.full((rows, width), self.pad_id, dtype=np.int64)
                attention_mask = np.zeros((rows, width), dtype=np.int64)
                for row, encoding in enumerate(encodings[i]):
                    input_ids[row, :lengths[i][row]] = encoding.ids
                    attention_mask[row, :lengths[i][row]] = 1
                outputs = [
                    pb_utils.Tensor("input_ids", input_ids),
                    pb_utils.Tensor("attention_mask", attention_mask),
                    pb_utils.Tensor("num_tokens", np.array(lengths[i], dtype=np.int32).reshape(rows, 1)),
                    pb_utils.Tensor("truncated", np.array([bool(e.overflowing) for e in encodings[i]])
                                    .reshape(rows, 1)),
                ]
                requests[i].get_response_sender().send(pb_utils.InferenceResponse(output_tensors=outputs),
                                                       flags=FINAL)
        return None
