"""Late chunking: `text` and its chunks in, one vector per chunk out, pooled from the whole text's single forward
pass (Günther et al., "Late Chunking", 2024), so each chunk's vector sees the text around it.

Chunks: the input `spans` ([n, 2] character spans, [start, end), Unicode code points of the text, in any order),
or the request parameter `chunk_tokens`: the text cut into sentences (after . ! ? and their CJK forms followed by
whitespace, and at line breaks), consecutive sentences grouped while the group holds at most chunk_tokens tokens; a
sentence longer than that is cut between tokens. One of the two, not both.

Steps (BLS): the tokenizer model tokenizes the text as for embeddings (same prompt, same max length) and, asked for
`offsets`, says which characters each token came from; the encoder runs once on the whole text and returns its
`token_embeddings` (the last hidden state, before the model's pooling). A chunk's vector is the mean of the vectors
of the tokens that overlap its span (a token cut by a span's edge counts for both sides; special tokens and the
prompt's tokens never count), L2-normalized: the model's normalization. The mean whatever the model's own pooling:
a CLS model's CLS token holds the whole text, not a chunk.

A text longer than the max length is refused (the tokenizer's too_long, asked with `truncate` false: INVALID_ARG
naming the limit), not windowed: windows would give the tokens of each a different context than one forward pass.
Bad spans are refused naming the span. Settings: config.pbtxt, read once here.
"""
import json
import re
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library import (
    model_common,
    model_errors,
)
from model_library.model_outputs import (
    ATTENTION_MASK,
    CHUNK_SPANS,
    DENSE,
    INPUT_IDS,
    LENGTH_GROUP,
    NUM_TOKENS,
    OFFSETS,
    TEXT_TOKENS,
    TOKEN_EMBEDDINGS,
)

SENTENCE_END = re.compile(r"(?<=[.!?。！？])[\"'”’)\]]*\s+|\n\s*|(?<=[。！？])")
PROMPT_PARAMETERS = ("prompt_name", "input_type")


InvalidInput = model_common.InvalidInput  # a request's error about one field (model_errors.py's contract)


def check_spans(spans, length):
    """The client's spans [n, 2] against a text of `length` characters; InvalidInput names the first bad one."""
    if len(spans) == 0:
        raise InvalidInput("spans", "is empty: give at least one [start, end]")
    for i, (start, end) in enumerate(spans.tolist()):
        if start < 0 or end > length:
            raise InvalidInput(f"spans[{i}]", f"[{start}, {end}] is out of range: the text has {length} characters "
                                              f"(spans are [start, end) in characters)")
        if end < start:
            raise InvalidInput(f"spans[{i}]", f"[{start}, {end}] ends before it starts")
        if end == start:
            raise InvalidInput(f"spans[{i}]", f"[{start}, {end}] is empty")
    order = np.argsort(spans[:, 0], kind="stable")
    for a, b in zip(order[:-1], order[1:]):
        if spans[b, 0] < spans[a, 1]:
            raise InvalidInput(f"spans[{b}]", f"{spans[b].tolist()} overlaps spans[{a}] {spans[a].tolist()}")


def members(offsets, start, end):
    """Tokens (of offsets [L, 2], (-1, -1): not from the text) overlapping [start, end)."""
    return (offsets[:, 0] >= 0) & (offsets[:, 0] < end) & (offsets[:, 1] > start)


def sentence_chunks(text, offsets, budget):
    """[start, end) spans of consecutive sentences holding at most `budget` tokens each; a longer sentence is cut
    between tokens."""
    cuts = [0] + [m.end() for m in SENTENCE_END.finditer(text)] + [len(text)]
    sentences = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        piece = text[a:b]
        if piece.strip():
            start = a + len(piece) - len(piece.lstrip())
            sentences.append((start, a + len(piece.rstrip())))
    chunks, current, count = [], None, 0
    for start, end in sentences:
        tokens = np.flatnonzero(members(offsets, start, end))
        if not len(tokens):  # characters no token comes from (zero-width, control)
            continue
        if len(tokens) > budget:  # alone, cut between tokens
            if current:
                chunks.append(current)
            current, count = None, 0
            for first in range(0, len(tokens), budget):
                part = tokens[first:first + budget]
                chunks.append((max(start, int(offsets[part[0], 0])), min(end, int(offsets[part[-1], 1]))))
        elif current and count + len(tokens) <= budget:
            current, count = (current[0], end), count + len(tokens)
        else:
            if current:
                chunks.append(current)
            current, count = (start, end), len(tokens)
    if current:
        chunks.append(current)
    return np.array(chunks, dtype=np.int64).reshape(-1, 2)


class TritonPythonModel(model_common.RequestModel):
    def setup(self, args):
        self.tokenizer_model = self.parameters["tokenizer_model"]
        self.encoder_model = self.parameters["encoder_model"]

    def options(self, request):
        """(chunk_tokens or None, the tokenizer's parameters) from the request's parameters."""
        parameters = json.loads(request.parameters() or "{}")
        prompt = {key: parameters[key] for key in PROMPT_PARAMETERS if key in parameters}
        return model_common.whole_number(parameters, "chunk_tokens"), prompt

    def work(self, request):
        """One text and its chunks (spans, or chunk_tokens) -> a vector per chunk."""
        deadline = model_common.Deadline(request)
        budget, prompt = self.options(request)
        spans = pb_utils.get_input_tensor_by_name(request, "spans")
        if (spans is None) == (budget is None):
            raise InvalidInput("spans", "or the request parameter chunk_tokens gives the chunks: "
                               + ("one of them, not both" if budget is not None else "neither was given"))
        raw = model_common.read_bytes(request, "text", rank=1)
        if len(raw) != 1:
            raise InvalidInput("text", f"must hold one text, not {len(raw)}")
        text_in = pb_utils.Tensor("text", raw.reshape(1, 1))
        # truncate false: the tokenizer refuses a text over the max length (too_long naming `text`), never cut
        tokens = call(self.tokenizer_model, [text_in], [INPUT_IDS, ATTENTION_MASK, NUM_TOKENS, OFFSETS,
                                                         LENGTH_GROUP], deadline, {**prompt, "truncate": False},
                      rename=one_text)
        count = int(tokens[NUM_TOKENS][0, 0])
        text = raw[0].decode("utf-8")  # the tokenizer has checked it
        offsets = tokens[OFFSETS][0, :count]
        if spans is None:
            chunks = sentence_chunks(text, offsets, budget)  # not empty: the tokenizer refuses a text without tokens
        else:
            chunks = spans.as_numpy().astype(np.int64).reshape(-1, 2)
            check_spans(chunks, len(text))
        selected = [members(offsets, start, stop) for start, stop in chunks.tolist()]
        for i, mask in enumerate(selected):
            if not mask.any():  # only whitespace (or characters no token comes from)
                raise InvalidInput(f"spans[{i}]", f"{chunks[i].tolist()} covers no token of the text")
        inputs = [pb_utils.Tensor(name, np.ascontiguousarray(tokens[name][:, :count]))
                  for name in (INPUT_IDS, ATTENTION_MASK)]
        hidden = call(self.encoder_model, inputs, [TOKEN_EMBEDDINGS], deadline)[TOKEN_EMBEDDINGS][0]
        deadline.check_answer()
        vectors = np.stack([hidden[:count][mask].astype(np.float64).mean(0) for mask in selected])
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return [pb_utils.Tensor(DENSE, vectors.astype(np.float32)),
                pb_utils.Tensor(CHUNK_SPANS, chunks),
                pb_utils.Tensor(NUM_TOKENS, np.array([m.sum() for m in selected], dtype=np.int32)),
                pb_utils.Tensor(TEXT_TOKENS, np.array([count], dtype=np.int32))]


call = model_common.call  # the library's BLS call: the request's deadline, a step's error in the contract


def one_text(field):
    """The tokenizer's field in this model's terms: its text[0] is this request's only text, `text`."""
    return "text" if model_errors.split_field(field)[0] == "text" else field
