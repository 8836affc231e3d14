"""Tokenizer step of the ensemble: `text` (one string per row) -> input_ids, attention_mask, num_tokens,
truncated.

A caller that runs the encoder itself (the BLS model beside the ensemble) asks for the output `length_group`:
then the request is one piece padded to its longest row, is not held to max_batch_tokens, and each row is told
its length group (group index, padded width) for the caller to send as separate encoder runs.

All requests of one execute are encoded together, then cut into length groups (grouping.py); each request is
padded to its group's width and the responses go out group by group, so the encoder's dynamic batcher receives
each group as a run of equal shapes. A bad request gets its own INVALID_ARG error (HTTP 400 / gRPC
INVALID_ARGUMENT); the rest of the batch is unaffected. Settings: config.pbtxt parameters, read once here.

Prompts (prompts.json beside tokenizer.json, from the model's config_sentence_transformers.json): the request
parameter `prompt_name`, or `input_type` (a prompt name, or query / document and Cohere's names for them), picks
the prompt prepended to every text of the request, as SentenceTransformer.encode(prompt_name=...) does; none named:
the model's default prompt. Token counts and truncation include it.
"""
import json
import os
import struct
import sys

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grouping import plan_groups, round_up  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# input_type values that are not prompt names: the prompt names they stand for, first found wins
INPUT_TYPES = {"query": ("query",), "search_query": ("query",), "document": ("document", "passage"),
               "search_document": ("document", "passage"), "passage": ("passage", "document"),
               "classification": ("classification",), "clustering": ("clustering",)}


class MalformedText(bytes):
    """A BYTES element whose length prefix runs past the end of the tensor; `declared` is what it claimed."""

    declared = 0


def deserialize_bytes_tensor(encoded):
    """Replaces triton_python_backend_utils.deserialize_bytes_tensor in this process. Why: the stub deserializes
    BYTES inputs before execute() runs, outside any error handling, and Triton 2.48 does not check the last
    element's length prefix; the original raised on `\\xe8\\x03\\x00\\x00abc` (1000 bytes declared, 3 sent)
    and the stub died. Here such an element becomes a MalformedText, answered as a per-request error."""
    data = encoded.tobytes()
    texts, offset, end = [], 0, len(data)
    while offset + 4 <= end:
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + size > end:
            malformed = MalformedText(data[offset:end])
            malformed.declared = size
            texts.append(malformed)
            break
        texts.append(data[offset:offset + size])
        offset += size
    return np.array(texts, dtype=np.object_)


def _parameter(config, key):
    return config["parameters"][key]["string_value"]


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.deserialize_bytes_tensor = deserialize_bytes_tensor  # before the first request is loaded
        config = json.loads(args["model_config"])
        here = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(here, "tokenizer.json"))
        if self.tokenizer.padding is None or self.tokenizer.truncation is None:
            raise pb_utils.TritonModelException("tokenizer.json lacks padding or truncation: re-run build/export.py")
        exported = self.tokenizer.truncation["max_length"]
        self.max_length = int(_parameter(config, "max_length") or exported)
        if not 0 < self.max_length <= exported:
            raise pb_utils.TritonModelException(f"max_length {self.max_length} must be in 1..{exported} (export)")
        self.pad_id = self.tokenizer.padding["pad_id"]
        self.tokenizer.no_padding()  # padding is done per length group
        self.tokenizer.enable_truncation(self.max_length)
        self.special_tokens = len(self.tokenizer.encode("").ids)  # what a text with no content becomes
        prompts = {}
        if os.path.exists(os.path.join(here, "prompts.json")):
            with open(os.path.join(here, "prompts.json"), encoding="utf-8") as handle:
                prompts = json.load(handle)
        self.prompts = prompts.get("prompts") or {}
        self.default_prompt = prompts.get("default_prompt_name")
        self.prompt_tokens = {name: len(self.tokenizer.encode(text).ids) for name, text in self.prompts.items()}
        self.multiple = max(1, int(_parameter(config, "pad_to_multiple_of")))
        self.overhead = float(_parameter(config, "batch_overhead_tokens"))
        self.min_efficiency = float(_parameter(config, "min_padding_efficiency"))
        self.max_batch_tokens = int(_parameter(config, "max_batch_tokens"))
        self.max_text_bytes = int(_parameter(config, "max_text_bytes"))
        self.max_request_bytes = int(_parameter(config, "max_request_bytes"))
        if self.max_batch_tokens < round_up(self.max_length, self.multiple):
            raise pb_utils.TritonModelException(f"max_batch_tokens {self.max_batch_tokens} must hold one text of "
                                                f"max_length {self.max_length} padded to {self.multiple}")

    def prompt(self, request):
        """The prompt name the request's parameters pick (or the default; None: no prompt), or ValueError."""
        parameters = json.loads(request.parameters() or "{}")
        name, kind = parameters.get("prompt_name"), parameters.get("input_type")
        names = ", ".join(self.prompts) or "none"
        if name is not None and kind is not None:
            raise ValueError("prompt_name and input_type: give one of them, not both")
        if name is not None:
            if name not in self.prompts:
                raise ValueError(f"prompt_name {json.dumps(name)} is not one of this model's prompts ({names})")
            return name
        if kind is not None:
            if kind in self.prompts:
                return kind
            if kind not in INPUT_TYPES:
                raise ValueError(f"input_type {json.dumps(kind)} is not one of {', '.join(INPUT_TYPES)} or this "
                                 f"model's prompts ({names})")
            return next((p for p in INPUT_TYPES[kind] if p in self.prompts), self.default_prompt)
        return self.default_prompt

    def decode(self, request):
        """The request's texts, or ValueError naming the first bad row. Messages never echo the text."""
        raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
        total = sum(len(item) for item in raw)
        if total > self.max_request_bytes:
            raise ValueError(f"the request holds {total} bytes of text, over the limit of {self.max_request_bytes} "
                             f"(tokenizer parameter max_request_bytes)")
        texts = []
        for row, item in enumerate(raw):
            if isinstance(item, MalformedText):
                raise ValueError(f"text[{row}] is malformed: its length prefix says {item.declared} bytes but "
                                 f"{len(item)} follow")
            item = item if isinstance(item, bytes) else str(item).encode()
            if len(item) > self.max_text_bytes:
                raise ValueError(f"text[{row}] is {len(item)} bytes, over the limit of {self.max_text_bytes} "
                                 f"(tokenizer parameter max_text_bytes)")
            try:
                text = item.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"text[{row}] is not valid UTF-8 (byte {error.start})") from None
            if not text.strip():
                raise ValueError(f"text[{row}] is empty" + (" (whitespace only)" if text else ""))
            texts.append(text)
        return texts

    def decode_with_prompt(self, request):
        """(the request's texts with its prompt prepended, the token count of the prompt alone), or ValueError."""
        name = self.prompt(request)
        texts = self.decode(request)
        if name is None:
            return texts, self.special_tokens
        return [self.prompts[name] + text for text in texts], self.prompt_tokens[name]

    def check(self, encodings, split, empty=None):
        """Per-request checks that need the tokens: content (more tokens than `empty`, what the prompt alone
        gives), and the padded size against the token budget (unless the caller splits the request into runs
        itself)."""
        for row, encoding in enumerate(encodings):
            if len(encoding.ids) <= (self.special_tokens if empty is None else empty):
                raise ValueError(f"text[{row}] has no content tokens (only whitespace, control or zero-width "
                                 f"characters)")
        if split:
            return
        padded = len(encodings) * round_up(max(len(e.ids) for e in encodings), self.multiple)
        if padded > self.max_batch_tokens:
            raise ValueError(f"the request pads to {padded} tokens, over the limit of {self.max_batch_tokens} "
                             f"(tokenizer parameter max_batch_tokens): send fewer texts per request")

    @staticmethod
    def reject(request, message):
        error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
        request.get_response_sender().send(pb_utils.InferenceResponse(error=error), flags=FINAL)

    def execute(self, requests):
        texts, spans = [], []  # all good texts, and (request index, first text, text count) per good request
        for i, request in enumerate(requests):
            try:
                decoded, empty = self.decode_with_prompt(request)
            except ValueError as error:
                self.reject(request, str(error))
                continue
            spans.append((i, len(texts), len(decoded), empty))
            texts.extend(decoded)
        if not texts:
            return None
        # encode() avoids encode_batch's thread-pool hand-off for the common single-text execute.
        encodings = self.tokenizer.encode_batch(texts) if len(texts) > 1 else [self.tokenizer.encode(texts[0])]
        accepted = []
        for i, start, count, empty in spans:
            split = "length_group" in requests[i].requested_output_names()
            try:
                self.check(encodings[start:start + count], split, empty)
            except ValueError as error:
                self.reject(requests[i], str(error))
                continue
            if split:  # goes out at once: its caller, not the encoder's batcher, groups its rows
                self.send_split(requests[i], encodings[start:start + count])
                continue
            accepted.append((i, encodings[start:start + count]))
        lengths = [[len(e.ids) for e in request_encodings] for _, request_encodings in accepted]
        for group, width in plan_groups(lengths, self.multiple, self.overhead, self.min_efficiency,
                                        self.max_batch_tokens):
            for k in group:
                i, request_encodings = accepted[k]
                self.send(requests[i], request_encodings, lengths[k], width)
        return None

    def send_split(self, request, encodings):
        lengths = [len(e.ids) for e in encodings]
        groups = np.zeros((len(lengths), 2), dtype=np.int32)  # per row: (group index, the group's padded width)
        plan = plan_groups([[n] for n in lengths], self.multiple, self.overhead, self.min_efficiency,
                           self.max_batch_tokens)
        for index, (rows, width) in enumerate(plan):
            groups[rows] = (index, width)
        self.send(request, encodings, lengths, round_up(max(lengths), self.multiple),
                  [pb_utils.Tensor("length_group", groups)])

    def send(self, request, encodings, lengths, width, extra=()):
        rows = len(encodings)
        input_ids = np.full((rows, width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((rows, width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, :lengths[row]] = encoding.ids
            attention_mask[row, :lengths[row]] = 1
        outputs = [
            pb_utils.Tensor("input_ids", input_ids),
            pb_utils.Tensor("attention_mask", attention_mask),
            pb_utils.Tensor("num_tokens", np.array(lengths, dtype=np.int32).reshape(rows, 1)),
            pb_utils.Tensor("truncated", np.array([bool(e.overflowing) for e in encodings]).reshape(rows, 1)),
            *extra,
        ]
        request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL)
