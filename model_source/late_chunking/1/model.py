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
Bad spans are refused naming the span.

A document as its chunks (the input `chunks`, instead of `text`: Voyage's contextualized chunk embeddings, issue 70)
is their text joined with one space (JOIN: a text splitter drops the whitespace it cut at), each chunk a span of it.
When it fits the max length it is one text as above. When it does not, it runs in windows (plan_windows): each
window holds some chunks whole, its targets (at most half the window's tokens), and as many whole chunks around them
as fit, nearest first, on both sides: the overlap between windows, so a chunk near a window's edge still sees the
text on both sides. Each chunk's vector is pooled from the one window whose target it is, as the text above
(`chunk_windows` says which: its [start, end) in the joined text). A chunk over the max length alone is refused
naming it. A window's tokens are counted chunk by chunk (each chunk tokenized alone); a window whose joined text
still comes out too long loses its outermost context chunk until it fits.

`dimensions` (a Matryoshka width: truncated, L2-normalized again) and the quantized outputs (embedding_int8...:
int8 / uint8 with the ranges export calibrated, binary packed) are the BLS model's forms (vector_forms.py), read
from the same vectors.json. Settings: config.pbtxt, read once here.
"""
import json
import os
import re
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library import (
    model_common,
    model_errors,
    model_outputs,
    request_rules,
)
from model_library.model_errors import ErrorKind
from model_library.model_outputs import (
    ATTENTION_MASK,
    CHUNK_SPANS,
    CHUNK_WINDOWS,
    DENSE,
    INPUT_IDS,
    LENGTH_GROUP,
    NUM_TOKENS,
    OFFSETS,
    TEXT_TOKENS,
    TOKEN_EMBEDDINGS,
)
from model_library.vector_forms import at_width, quantize, read_vectors_json

SENTENCE_END = re.compile(r"(?<=[.!?。！？])[\"'”’)\]]*\s+|\n\s*|(?<=[。！？])")
PROMPT_PARAMETERS = ("prompt_name", "input_type")
JOIN = " "  # a document's chunks, joined: a text splitter drops the whitespace it cut at
TARGET_SHARE = 0.5  # of a window's tokens, at most this much its own chunks (the rest: context around them)
COUNT_ROWS = 64  # chunks per tokenizer call when counting a document's tokens
QUANTIZED = {name: precision for precision, name in model_outputs.QUANTIZED.items()}  # output -> its precision


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


def plan_windows(tokens, room):
    """Windows over a document's chunks, `tokens` each (their own, specials and prompt left out), `room` tokens a
    window: [(first, target_start, target_end, end)], chunks [first, end) in the window, [target_start, target_end)
    pooled from it. Targets take at most TARGET_SHARE of the room (one chunk at least); context chunks are added
    whole, nearest first, one side then the other, while they fit. A document that fits is one window. IndexError
    (the chunk) when a chunk alone is over the room."""
    count = len(tokens)
    for i, n in enumerate(tokens):
        if n > room:
            raise IndexError(i)
    if sum(tokens) <= room:
        return [(0, 0, count, count)]
    windows, start = [], 0
    while start < count:
        end, used = start + 1, tokens[start]
        while end < count and used + tokens[end] <= room * TARGET_SHARE:
            used += tokens[end]
            end += 1
        first, last, grew = start, end, True
        while grew:
            grew = False
            if first > 0 and used + tokens[first - 1] <= room:
                first, used, grew = first - 1, used + tokens[first - 1], True
            if last < count and used + tokens[last] <= room:
                last, used, grew = last + 1, used + tokens[last], True
        windows.append((first, start, end, last))
        start = end
    return windows


def joined(chunks):
    """The text of `chunks` (str) joined with JOIN, and each one's [start, end) in it."""
    spans, at = [], 0
    for chunk in chunks:
        spans.append((at, at + len(chunk)))
        at += len(chunk) + len(JOIN)
    return JOIN.join(chunks), np.array(spans, dtype=np.int64).reshape(-1, 2)


class TritonPythonModel(model_common.RequestModel):
    def setup(self, args):
        self.tokenizer_model = self.parameters["tokenizer_model"]
        self.encoder_model = self.parameters["encoder_model"]
        self.max_length = int(self.parameters.get("max_length") or 0)  # 0: an older config (no windows)
        self.dimensions, self.ranges = read_vectors_json(os.path.join(args["model_repository"],
                                                                      args["model_version"]))

    def options(self, request):
        """(chunk_tokens or None, the tokenizer's parameters, the width asked or None) from the request's
        parameters."""
        parameters = json.loads(request.parameters() or "{}")
        prompt = {key: parameters[key] for key in PROMPT_PARAMETERS if key in parameters}
        width = parameters.get("dimensions")
        if width is not None:
            width = request_rules.width(self.dimensions or [], width, InvalidInput)
        return model_common.whole_number(parameters, "chunk_tokens"), prompt, width

    def work(self, request):
        """One text and its chunks (spans, or chunk_tokens), or a document as its chunks -> a vector per chunk."""
        deadline = model_common.Deadline(request)
        budget, prompt, width = self.options(request)
        spans = pb_utils.get_input_tensor_by_name(request, "spans")
        document = model_common.read_bytes(request, "chunks", rank=1, optional=True)
        if document is not None:
            if spans is not None or budget is not None or pb_utils.get_input_tensor_by_name(request, "text"):
                raise InvalidInput("chunks", "are the document's chunks: give them alone (no text, spans or "
                                             "chunk_tokens)")
            vectors, chunks, counts, text_tokens, windows = self.document(document, prompt, deadline)
        else:
            if (spans is None) == (budget is None):
                raise InvalidInput("spans", "or the request parameter chunk_tokens gives the chunks: "
                                   + ("one of them, not both" if budget is not None else "neither was given"))
            raw = model_common.read_bytes(request, "text", rank=1)
            if len(raw) != 1:
                raise InvalidInput("text", f"must hold one text, not {len(raw)}")
            spans = None if spans is None else spans.as_numpy().astype(np.int64).reshape(-1, 2)
            vectors, chunks, counts, text_tokens = self.pooled(raw[0], spans, budget, prompt, deadline)
            windows = np.array([[0, len(raw[0].decode("utf-8"))]] * len(chunks), dtype=np.int64).reshape(-1, 2)
        deadline.check_answer()
        if width is not None and width != max(self.dimensions):
            vectors = at_width(vectors, width)
        answer = [pb_utils.Tensor(DENSE, vectors.astype(np.float32)), pb_utils.Tensor(CHUNK_SPANS, chunks),
                  pb_utils.Tensor(NUM_TOKENS, np.asarray(counts, dtype=np.int32)),
                  pb_utils.Tensor(TEXT_TOKENS, np.array([text_tokens], dtype=np.int32)),
                  pb_utils.Tensor(CHUNK_WINDOWS, windows)]
        for name in request.requested_output_names() or ():
            if name in QUANTIZED:
                ranges = self.ranges.get(vectors.shape[1])
                if ranges is None and QUANTIZED[name].endswith("int8"):
                    raise model_common.ModelError(ErrorKind.INTERNAL, None, f"{name}: no calibrated ranges for "
                                                                            f"width {vectors.shape[1]}: export again")
                answer.append(pb_utils.Tensor(name, quantize(vectors, QUANTIZED[name], ranges)))
        return answer

    def pooled(self, raw, spans, budget, prompt, deadline, rename=None):
        """One text (bytes) and its chunks (spans [n, 2], or None and chunk_tokens `budget`) -> (vectors [n, H],
        the chunks' spans, tokens per chunk, the text's tokens)."""
        text_in = pb_utils.Tensor("text", np.array([raw], dtype=np.object_).reshape(1, 1))
        # truncate false: the tokenizer refuses a text over the max length (too_long naming `text`), never cut
        tokens = call(self.tokenizer_model, [text_in], [INPUT_IDS, ATTENTION_MASK, NUM_TOKENS, OFFSETS,
                                                         LENGTH_GROUP], deadline, {**prompt, "truncate": False},
                      rename=rename or one_text)
        count = int(tokens[NUM_TOKENS][0, 0])
        text = raw.decode("utf-8")  # the tokenizer has checked it
        offsets = tokens[OFFSETS][0, :count]
        if spans is None:
            chunks = sentence_chunks(text, offsets, budget)  # not empty: the tokenizer refuses a text without tokens
        else:
            chunks = spans
            check_spans(chunks, len(text))
        selected = [members(offsets, start, stop) for start, stop in chunks.tolist()]
        for i, mask in enumerate(selected):
            if not mask.any():  # only whitespace (or characters no token comes from)
                raise InvalidInput(f"spans[{i}]", f"{chunks[i].tolist()} covers no token of the text")
        inputs = [pb_utils.Tensor(name, np.ascontiguousarray(tokens[name][:, :count]))
                  for name in (INPUT_IDS, ATTENTION_MASK)]
        hidden = call(self.encoder_model, inputs, [TOKEN_EMBEDDINGS], deadline)[TOKEN_EMBEDDINGS][0]
        vectors = np.stack([hidden[:count][mask].astype(np.float64).mean(0) for mask in selected])
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors.astype(np.float32), chunks, [int(m.sum()) for m in selected], count

    def chunk_tokens(self, pieces, prompt, deadline):
        """(each chunk's own tokens, the tokens a text adds: specials and prompt), counted by the tokenizer model
        chunk by chunk; too_long names the chunk (one over the max length)."""
        own, extra = [], 0
        for first in range(0, len(pieces), COUNT_ROWS):
            rows = pieces[first:first + COUNT_ROWS]
            text_in = pb_utils.Tensor("text", np.array(rows, dtype=np.object_).reshape(-1, 1))
            tokens = call(self.tokenizer_model, [text_in], [NUM_TOKENS, OFFSETS], deadline,
                          {**prompt, "truncate": False}, rename=lambda field, first=first: chunk_field(field, first))
            for row in range(len(rows)):
                count = int(tokens[NUM_TOKENS][row, 0])
                mine = int((tokens[OFFSETS][row, :count, 0] >= 0).sum())
                own.append(mine)
                extra = max(extra, count - mine)
        return own, extra

    def document(self, pieces, prompt, deadline):
        """A document as its chunks (bytes each) -> (vectors, spans in the joined text, tokens per chunk, tokens
        run in all, each chunk's window)."""
        if len(pieces) == 0:
            raise InvalidInput("chunks", "is empty: give the document's chunks, at least one")
        texts = []
        for i, piece in enumerate(pieces):
            try:
                texts.append(piece.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidInput(f"chunks[{i}]", "is not valid UTF-8") from None
        for i, chunk in enumerate(texts):
            if not chunk.strip():
                raise InvalidInput(f"chunks[{i}]", "is empty or only whitespace: a chunk needs a token")
        text, spans = joined(texts)
        own, extra = self.chunk_tokens(pieces, prompt, deadline)
        room = max(1, self.max_length - extra - max(4, self.max_length // 32))  # a margin for joins' merges
        try:
            windows = plan_windows(own, room) if self.max_length else [(0, 0, len(texts), len(texts))]
        except IndexError as error:
            i = error.args[0]
            raise InvalidInput(f"chunks[{i}]", f"holds {own[i]} tokens: over what one window holds ({room} of the "
                                               f"max length {self.max_length})", ErrorKind.TOO_LONG) from None
        vectors, counts, placed, run = [None] * len(texts), [0] * len(texts), [None] * len(texts), 0
        for first, start, end, last in windows:
            while True:
                window_text, local = joined(texts[first:last])
                try:
                    got, _, got_counts, tokens = self.pooled(
                        window_text.encode("utf-8"), local[start - first:end - first], None, prompt, deadline,
                        rename=one_window)
                    break
                except model_common.ModelError as error:  # the joined text came out longer than counted
                    if error.kind != ErrorKind.TOO_LONG or (first == start and last == end):
                        raise
                    if start - first >= last - end:
                        first += 1
                    else:
                        last -= 1
            run += tokens
            window = [int(spans[first, 0]), int(spans[last - 1, 1])]
            for k, i in enumerate(range(start, end)):
                vectors[i], counts[i], placed[i] = got[k], got_counts[k], window
        return np.stack(vectors), spans, counts, run, np.array(placed, dtype=np.int64).reshape(-1, 2)


call = model_common.call  # the library's BLS call: the request's deadline, a step's error in the contract


def one_text(field):
    """The tokenizer's field in this model's terms: its text[0] is this request's only text, `text`."""
    return "text" if model_errors.split_field(field)[0] == "text" else field


def chunk_field(field, first):
    """The tokenizer's text[i] of a call counting chunks from chunk `first`: chunks[first + i]."""
    name, index = model_errors.split_field(field or "")
    return f"chunks[{first + index}]" if name == "text" and index is not None else field


def one_window(field):
    """The tokenizer's text[0] of a window's call: the document's `chunks` (a window is several of them)."""
    return "chunks" if model_errors.split_field(field or "")[0] == "text" else field
