"""Tokenizer step of the ensemble: `text` (one string per row) -> input_ids, attention_mask, num_tokens,
truncated.

Truncation: a text over max_length is cut to it and `truncated` says so; with the request parameter `truncate`
false (request_rules.truncate) the request is refused instead, `too_long` naming its first such row (`text[i]`, or
a pair's `query`), before any encoder run. The BLS and rerank models pass the parameter on; late chunking
always sends it false.

Pairs (cross-encoders): with a `query` per row (input `query`), or one query for every row (request parameter
`query`, so a caller with one query and many documents sends it once), each row is the pair (query, text), cut with
FlagReranker's rule: the query alone to query_max_length, then the text so the pair fits max_length. `truncated`
says the pair was cut, `query_truncated` (when asked for) that its query was. A decoder reranker exported with its
chat template (pair_template.json beside tokenizer.json, the template rendered at export into fixed text) gets
CrossEncoder's rule instead: prefix + query + between + text + suffix tokenized as one text without special tokens,
cut at max_length, and a cut row's last tokens overwritten with the template's tail (suffix_ids). A yes/no reranker
whose prompt is its reference code's (pair_template.json's `pieces`: mxbai-rerank-v2, bge-reranker-v2-gemma) gets
that code's rule: its fixed ids around the query and the document tokenized apart, each cut as the code cuts it.

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

Cleaning (text_cleaning.json beside tokenizer.json, written for open_clip exports): "open_clip" cleans each text as
open_clip's tokenizer does before tokenizing (ftfy, HTML unescaping, whitespace, lower case), so the ids are
open_clip's own.

Two more tasks, TEI's /tokenize and /decode, each answered alone (not grouped): a request that asks for the output
`token_text` (and not `attention_mask`, which only the embedding task gives) gets every token of its texts (not
truncated; add_special_tokens, prompts as above; an inference-free export's query side: the query's own tokens) with
its text, its special flag and its bytes; a request with the input `token_ids` gets its rows decoded (`decoded`).

A PyLate ColBERT export (colbert.json beside tokenizer.json): each request's rows are built as PyLate's ColBERT.tokenize
builds them (model_library/colbert_side.py: the query or document marker after [CLS], each side's length, a query's
expansion tokens), its side the request's Router task as below (none: document).

Inference-free SPLADE (an export of a SparseEncoder with a Router: query_side.json beside tokenizer.json): the
request's Router task (request_rules.task: prompt_name `query` / `document`, or what its input_type stands for;
none: the default route, the document side) picks the side. The query side is a token-weight lookup answered here
(model_library/query_lookup.py: the query's own tokenizer, no special tokens, each token's weight), alone, with the
sparse outputs the BLS model asks for: no encoder runs. A query-side request that asks for the encoder's inputs
without the sparse outputs (the ensemble's step) is refused naming its field: the ensemble runs the document side.
"""
import html
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from grouping import ATTENTION_WIDTH, fits, pad_width, plan_groups, round_up
from model_library import (
    colbert_side,
    model_common,
    piece_pairs,
    query_lookup,
    request_rules,
)
from model_library.model_errors import ErrorKind
from model_library.model_outputs import (
    ATTENTION_MASK,
    BYTE_OFFSETS,
    DECODED,
    INPUT_IDS,
    LENGTH_GROUP,
    NUM_TOKENS,
    OFFSETS,
    QUERY_TRUNCATED,
    SPARSE_COUNT,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TOKEN_SPECIAL,
    TOKEN_TEXT,
    TRUNCATED,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
InvalidInput = model_common.InvalidInput  # a request's error about one field (model_errors.py's contract)


class TemplatePair:
    """A chat-template pair's token ids (the encoding with its tail written back): what send() reads of a pair."""
    __slots__ = ("ids",)

    def __init__(self, ids):
        self.ids = ids


def _parameter(config, key):
    return config["parameters"][key]["string_value"]


class TritonPythonModel:
    lookup = None  # inference-free SPLADE's query side (query_lookup.QueryLookup); None: no Router
    colbert = None  # a PyLate ColBERT export's rows (colbert_side.ColbertSide); None: other exports
    routes = ()  # its Router's tasks (or the ColBERT's sides)

    def initialize(self, args):
        config, here = model_common.start_model(args)
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
        self.whole = None  # the same tokenizer without truncation, made by the first tokenize request
        self.vocabulary = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.pair_special_tokens = self.tokenizer.num_special_tokens_to_add(True)
        self.query_max_length = int(_parameter(config, "query_max_length") or self.max_length * 3 // 4)
        if not 0 < self.query_max_length <= self.max_length - self.pair_special_tokens - 1:
            raise pb_utils.TritonModelException(f"query_max_length {self.query_max_length} must leave room for a "
                                                f"passage in max_length {self.max_length}")
        prompts = {}
        if os.path.exists(os.path.join(here, "prompts.json")):
            with open(os.path.join(here, "prompts.json"), encoding="utf-8") as handle:
                prompts = json.load(handle)
        self.prompts = prompts.get("prompts") or {}
        self.default_prompt = prompts.get("default_prompt_name")
        self.lookup = query_lookup.QueryLookup.load(here)  # inference-free SPLADE's query side; None: no Router
        self.routes = tuple(self.lookup.routes) if self.lookup else ()
        self.colbert = colbert_side.ColbertSide.load(here, self.tokenizer)  # PyLate's rows; None: other exports
        if self.colbert is not None:
            self.routes = tuple(self.colbert.routes)
        self.clean = None
        if os.path.exists(os.path.join(here, "text_cleaning.json")):
            with open(os.path.join(here, "text_cleaning.json"), encoding="utf-8") as handle:
                cleaning = json.load(handle).get("clean")
            if cleaning != "open_clip":
                raise pb_utils.TritonModelException(f"text_cleaning.json: unknown cleaning {cleaning!r}")
            import ftfy  # only open_clip exports need it

            def clean_like_open_clip(text):  # open_clip.tokenizer's _clean_lower
                text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
                return " ".join(text.split()).strip().lower()

            self.clean = clean_like_open_clip
        self.template = None
        if os.path.exists(os.path.join(here, "pair_template.json")):
            with open(os.path.join(here, "pair_template.json"), encoding="utf-8") as handle:
                self.template = json.load(handle)
            if "pieces" not in self.template and len(self.template["suffix_ids"]) >= self.max_length:
                raise pb_utils.TritonModelException(f"max_length {self.max_length} leaves no room before the "
                                                    f"chat template's tail of {len(self.template['suffix_ids'])} "
                                                    f"tokens")
        self.multiple = max(1, int(_parameter(config, "pad_to_multiple_of")))
        self.overhead = float(_parameter(config, "batch_overhead_tokens"))
        self.split_overhead = float(_parameter(config, "split_overhead_tokens"))
        self.min_efficiency = float(_parameter(config, "min_padding_efficiency"))
        self.max_batch_tokens = int(_parameter(config, "max_batch_tokens"))
        self.max_text_bytes = int(_parameter(config, "max_text_bytes"))
        self.max_request_bytes = int(_parameter(config, "max_request_bytes"))
        power_of_two = _parameter(config, "pad_to_power_of_two").strip().lower()
        if power_of_two not in ("true", "false"):
            raise pb_utils.TritonModelException(f"pad_to_power_of_two must be true or false, not {power_of_two!r}")
        self.power_of_two = power_of_two == "true"
        self.max_width = round_up(self.max_length, self.multiple)  # no padded width is wider
        if self.max_batch_tokens < self.max_width:
            raise pb_utils.TritonModelException(f"max_batch_tokens {self.max_batch_tokens} must hold one text of "
                                                f"max_length {self.max_length} padded to {self.multiple}")

    def width(self, tokens):
        """The padded width of rows of up to `tokens` tokens (config: pad_to_multiple_of, pad_to_power_of_two)."""
        return pad_width(tokens, self.multiple, self.power_of_two, self.max_width)

    def prompt(self, parameters):
        """The prompt name the request's parameters pick (or the default; None: no prompt), or InvalidInput."""
        return request_rules.prompt(self.prompts, self.default_prompt, parameters.get("prompt_name"),
                                    parameters.get("input_type"), InvalidInput, self.routes)

    def looks_up(self, parameters):
        """Whether the request's Router task is answered by the query side's weights (query_lookup.py)."""
        task = request_rules.task(self.routes, parameters.get("prompt_name"), parameters.get("input_type"))
        return self.lookup.looks_up(task)

    def decode(self, request, parameters):
        """(texts, queries, shared): the request's texts, per row its query (None: single texts), and whether one
        query (the parameter) serves every row; or InvalidInput naming the first bad row. Messages never echo the
        text."""
        raw = model_common.read_bytes(request, "text", rank=2)
        queries = model_common.read_bytes(request, "query", rank=2, optional=True)
        shared = parameters.get("query")
        if shared is not None:
            queries = np.array([shared.encode() if isinstance(shared, str) else shared], dtype=np.object_)
        total = sum(len(item) for item in raw) + (0 if queries is None else sum(len(item) for item in queries))
        if total > self.max_request_bytes:
            raise InvalidInput("text", f"holds {total} bytes in this request, over the limit of "
                                       f"{self.max_request_bytes} (tokenizer parameter max_request_bytes)",
                               ErrorKind.TOO_LONG)
        texts = [self.decode_row(item, f"text[{row}]") for row, item in enumerate(raw)]
        if queries is None:
            return texts, None, False
        if shared is not None:
            return texts, [self.decode_row(queries[0], "query")] * len(texts), True
        return texts, [self.decode_row(item, f"query[{row}]") for row, item in enumerate(queries)], False

    def decode_row(self, item, label):
        item = item if isinstance(item, bytes) else str(item).encode()
        if len(item) > self.max_text_bytes:
            raise InvalidInput(label, f"is {len(item)} bytes, over the limit of {self.max_text_bytes} "
                                      f"(tokenizer parameter max_text_bytes)", ErrorKind.TOO_LONG)
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInput(label, f"is not valid UTF-8 (byte {error.start})") from None
        request_rules.text(text, label, InvalidInput)
        return self.clean(text) if self.clean else text

    def pairs(self, queries, passages):
        """(query, passage) rows -> (pair encodings, (query cut, pair cut) per row), FlagReranker's rule (or the
        chat template's), or InvalidInput."""
        if self.template is not None:
            if "pieces" in self.template:
                return self.piece_pairs(queries, passages)
            return self.template_pairs(queries, passages)
        encoded = {}
        for query in queries:
            if query not in encoded:
                encoding = self.tokenizer.encode(query, add_special_tokens=False)
                cut = len(encoding.ids) > self.query_max_length or bool(encoding.overflowing)
                if len(encoding.ids) > self.query_max_length:
                    encoding.truncate(self.query_max_length)
                encoded[query] = (encoding, cut)
        parts = self.tokenizer.encode_batch(passages, add_special_tokens=False)
        encodings, query_cut = [], []
        for query, passage in zip(queries, parts):
            query_encoding, cut = encoded[query]
            room = self.max_length - len(query_encoding.ids) - self.pair_special_tokens
            passage_cut = len(passage.ids) > room or bool(passage.overflowing)
            if len(passage.ids) > room:
                passage.truncate(room)
            pair = self.tokenizer.post_process(query_encoding, passage, add_special_tokens=True)
            encodings.append(pair)
            query_cut.append((cut, cut or passage_cut))
        return encodings, query_cut

    def template_pairs(self, queries, passages):
        """CrossEncoder's rule for a chat template (exporter/families/cross_encoder.py, pair_ids): the rendered text
        cut at max_length, and when cut its tail written back over the last tokens, so the classifier still reads
        the template's last token. A query is cut when the kept tokens end inside it."""
        prefix, between, suffix, tail = (self.template[k] for k in ("prefix", "between", "suffix", "suffix_ids"))
        texts = [prefix + query + between + passage + suffix for query, passage in zip(queries, passages)]
        encodings, flags = [], []
        for query, encoding in zip(queries, self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            ids, cut = encoding.ids, bool(encoding.overflowing)
            kept, keep = len(ids), min(len(tail), len(ids))
            if len(ids) >= self.max_length and keep:  # CrossEncoder restores it on every row that reaches max_length
                kept = len(ids) - keep
                ids = ids[:kept] + tail[len(tail) - keep:]
            query_cut = cut and (kept == 0 or encoding.offsets[kept - 1][1] < len(prefix) + len(query))
            encodings.append(TemplatePair(ids))
            flags.append((query_cut, cut))
        return encodings, flags

    def piece_pairs(self, queries, passages):
        """A yes/no reranker whose prompt is its reference code's (exporter/families/yes_no_reranker.py, PieceCard):
        each pair by model_library/piece_pairs.py's rule, which the export checks against the reference too."""
        pieces = self.template["pieces"]
        encoder = self.tokenizer  # cut at the served length, past every piece's own cut: the same first ids
        texts = [pieces["query"].format(query=query) for query in queries]
        documents = [pieces["document"].format(document=passage) for passage in passages]
        encodings, flags = [], []
        for q, d in zip(encoder.encode_batch(texts, add_special_tokens=False),
                        encoder.encode_batch(documents, add_special_tokens=False)):
            ids, query_cut, cut = piece_pairs.pair_ids(pieces, q.ids, d.ids)
            encodings.append(TemplatePair(ids))
            flags.append((query_cut, cut))
        return encodings, flags

    def decode_with_prompt(self, request, parameters):
        """decode()'s (texts, queries, shared) with the request's prompt prepended to single texts, and the prompt's
        name (None: none): (texts, queries, shared, name). parameters: the request's, parsed once by its caller."""
        name = self.prompt(parameters)
        texts, queries, shared = self.decode(request, parameters)
        if queries is not None and name is not None:
            raise InvalidInput("prompt_name", f"{json.dumps(name)}: prompts apply to single texts, not to pairs",
                               ErrorKind.INVALID_VALUE)
        if name is None:
            return texts, queries, shared, None
        return [self.prompts[name] + text for text in texts], None, False, name

    def refuse_cut(self, encodings, flags, shared):
        """truncate false (request_rules.truncate): the request's first row the max length cut is its error, before
        any encoder run; a pair's query cut names the query (`query`: the one for every row)."""
        if flags:
            row = next((row for row, (query_cut, _) in enumerate(flags) if query_cut), None)
            if row is not None:
                raise request_rules.cut_refused("query" if shared else f"query[{row}]", self.max_length, InvalidInput)
            cut = [pair_cut for _, pair_cut in flags]
        else:
            cut = [bool(e.overflowing) for e in encodings]
        if any(cut):
            raise request_rules.cut_refused(f"text[{cut.index(True)}]", self.max_length, InvalidInput)

    def check(self, encodings, split):
        """The per-request check that needs the tokens: the padded size against the token budget (unless the caller
        splits the request into runs itself)."""
        if split:
            return
        width = self.width(max(len(e.ids) for e in encodings))
        padded = len(encodings) * width
        if padded > self.max_batch_tokens:
            raise InvalidInput("text", f"pads to {padded} tokens in this request, over the limit of "
                                       f"{self.max_batch_tokens} (tokenizer parameter max_batch_tokens): send fewer "
                                       f"texts per request", ErrorKind.TOO_LONG)
        if not fits(len(encodings), width, self.max_batch_tokens):  # one run: its attention's memory (issue 71)
            most = max(1, self.max_batch_tokens * ATTENTION_WIDTH // (width * width))
            raise InvalidInput("text", f"pads to {len(encodings)} texts of {width} tokens in this request: one encoder "
                                       f"run holds at most {most} that long (attention's memory: max_batch_tokens "
                                       f"{self.max_batch_tokens} x {ATTENTION_WIDTH} token pairs): send the long "
                                       f"texts in separate requests", ErrorKind.TOO_LONG)

    @staticmethod
    def reject(request, error):
        """That request's own error: the contract's (InvalidInput), or any other ValueError as its text's."""
        if not isinstance(error, InvalidInput):
            error = InvalidInput("text", f"could not be read: {error}")
        request.get_response_sender().send(pb_utils.InferenceResponse(error=error.triton_error), flags=FINAL)

    @model_common.tracing.per_request  # a request traced by parameter: its own span (off: execute itself)
    def execute(self, requests):
        # single texts of all requests; per good request (index, first text, count, pairs, its requested outputs:
        # read once, each call crosses into the stub's C++)
        texts, spans = [], []
        for i, request in enumerate(requests):
            try:
                if pb_utils.get_input_tensor_by_name(request, "token_ids") is not None:
                    self.detokenize(request)
                    continue
                wanted = request.requested_output_names()
                # (a request naming no outputs is given all of them: it is an embedding step's, as before)
                if TOKEN_TEXT in wanted and ATTENTION_MASK not in wanted:
                    self.tokenize(request)
                    continue
                parameters = json.loads(request.parameters() or "{}")  # parsed once: every rule below reads it
                keep = request_rules.truncate(parameters, InvalidInput)
                decoded, queries, shared, prompt = self.decode_with_prompt(request, parameters)
                if self.lookup is not None and queries is None and self.looks_up(parameters):
                    self.answer_query(request, wanted, decoded, keep, parameters)
                    continue
                if self.colbert is not None:  # PyLate's rows (markers, expansion), built per request's side
                    if queries is not None:
                        raise InvalidInput("query", "is not taken by a ColBERT model: it embeds single texts",
                                           ErrorKind.INVALID_VALUE)
                    task = request_rules.task(self.routes, parameters.get("prompt_name"), parameters.get("input_type"))
                    pairs = (self.colbert.encode(decoded, self.colbert.side(task)), None)
                else:
                    pairs = None if queries is None else self.pairs(queries, decoded)
            except ValueError as error:
                self.reject(request, error)
                continue
            spans.append((i, len(texts), len(decoded), pairs, wanted, keep, shared, prompt))
            if pairs is None:
                texts.extend(decoded)
        # encode() avoids encode_batch's thread-pool hand-off for the common single-text execute.
        encodings = self.tokenizer.encode_batch(texts) if len(texts) > 1 else [self.tokenizer.encode(t) for t in texts]
        accepted = []
        for i, start, count, pairs, wanted, keep, shared, prompt in spans:
            split = LENGTH_GROUP in wanted
            mine, flags = pairs if pairs else (encodings[start:start + count], None)
            try:
                if not keep:
                    self.refuse_cut(mine, flags, shared)
                self.check(mine, split)
            except ValueError as error:
                self.reject(requests[i], error)
                continue
            if split:  # goes out at once: its caller, not the encoder's batcher, groups its rows
                self.send_split(requests[i], wanted, mine, flags, prompt)
                continue
            accepted.append((i, wanted, mine, flags, prompt))
        lengths = [[len(e.ids) for e in request_encodings] for _, _, request_encodings, _, _ in accepted]
        for group, width in plan_groups(lengths, self.multiple, self.overhead, self.min_efficiency,
                                        self.max_batch_tokens, self.power_of_two, self.max_width):
            for k in group:
                i, wanted, request_encodings, flags, prompt = accepted[k]
                self.send(requests[i], wanted, request_encodings, flags, lengths[k], width, prompt=prompt)
        return None

    def send_split(self, request, wanted, encodings, flags, prompt):
        lengths = [len(e.ids) for e in encodings]
        groups = np.zeros((len(lengths), 2), dtype=np.int32)  # per row: (group index, the group's padded width)
        plan = plan_groups([[n] for n in lengths], self.multiple, self.split_overhead, self.min_efficiency,
                           self.max_batch_tokens, self.power_of_two, self.max_width)
        for index, (rows, width) in enumerate(plan):
            groups[rows] = (index, width)
        self.send(request, wanted, encodings, flags, lengths, self.width(max(lengths)),
                  [pb_utils.Tensor(LENGTH_GROUP, groups)], prompt)

    def send(self, request, wanted, encodings, flags, lengths, width, extra=(), prompt=None):
        """wanted: the request's requested outputs; flags: per pair row (query cut, pair cut); None for single
        texts; prompt: the name of the prompt put before its texts (None: none)."""
        rows = len(encodings)
        input_ids = np.full((rows, width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((rows, width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, :lengths[row]] = encoding.ids
            attention_mask[row, :lengths[row]] = 1
        truncated = [f[1] for f in flags] if flags else [bool(e.overflowing) for e in encodings]
        outputs = [
            pb_utils.Tensor(INPUT_IDS, input_ids),
            pb_utils.Tensor(ATTENTION_MASK, attention_mask),
            pb_utils.Tensor(NUM_TOKENS, np.array(lengths, dtype=np.int32).reshape(rows, 1)),
            pb_utils.Tensor(TRUNCATED, np.array(truncated, dtype=bool).reshape(rows, 1)),
            *extra,
        ]
        if OFFSETS in wanted:
            outputs.append(pb_utils.Tensor(OFFSETS, self.offsets(encodings, width, prompt)))
        if QUERY_TRUNCATED in wanted:
            query_cut = [f[0] for f in flags] if flags else [False] * rows
            outputs.append(pb_utils.Tensor(QUERY_TRUNCATED, np.array(query_cut, dtype=bool).reshape(rows, 1)))
        request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL)

    def offsets(self, encodings, width, prompt):
        """Per token, its (start, end) characters in the row's own text (the prompt's length taken off), or (-1, -1)
        for a token not from the text: special tokens, the prompt's, padding. The late chunking model pools chunks
        by these."""
        shift = len(self.prompts[prompt]) if prompt is not None else 0
        result = np.full((len(encodings), width, 2), -1, dtype=np.int64)
        for row, encoding in enumerate(encodings):
            spans = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) - shift
            text = (np.asarray(encoding.special_tokens_mask) == 0) & (spans[:, 1] > 0) & (spans[:, 1] > spans[:, 0])
            result[row, :len(spans)][text] = np.maximum(spans[text], 0)
        return result

    # ---------------------------------------------------------------- inference-free SPLADE's query side
    def answer_query(self, request, wanted, texts, keep, parameters):
        """A query-side request (texts: the prompt prepended), answered alone from the weights: the sparse outputs
        (asked for by the BLS model), num_tokens and truncated (the query's own tokens: no special tokens, cut at the
        query tokenizer's max length), and the ids as one piece when asked for (one length group)."""
        if SPARSE_COUNT not in wanted and ATTENTION_MASK in wanted:
            field = "prompt_name" if parameters.get("prompt_name") is not None else "input_type"
            raise InvalidInput(field, f"{json.dumps(parameters.get(field))} picks the query side, a token-weight "
                                      f"lookup that the BLS model answers (the sparse outputs): the ensemble's "
                                      f"encoder step is the document side only", ErrorKind.NOT_SERVED)
        encodings = self.lookup.encode(texts)
        cut = [bool(e.overflowing) for e in encodings]
        if not keep and any(cut):
            raise request_rules.cut_refused(f"text[{cut.index(True)}]", self.lookup.max_length, InvalidInput)
        rows = len(encodings)
        lengths = [len(e.ids) for e in encodings]
        outputs = [pb_utils.Tensor(NUM_TOKENS, np.array(lengths, dtype=np.int32).reshape(rows, 1)),
                   pb_utils.Tensor(TRUNCATED, np.array(cut, dtype=bool).reshape(rows, 1))]
        if SPARSE_COUNT in wanted or SPARSE_INDICES in wanted or SPARSE_VALUES in wanted:
            indices, values, counts = self.lookup.sparse([e.ids for e in encodings])
            outputs += [pb_utils.Tensor(SPARSE_INDICES, indices), pb_utils.Tensor(SPARSE_VALUES, values),
                        pb_utils.Tensor(SPARSE_COUNT, counts)]
        if INPUT_IDS in wanted or ATTENTION_MASK in wanted or LENGTH_GROUP in wanted:
            width = max(1, *lengths)
            ids, mask = np.zeros((rows, width), dtype=np.int64), np.zeros((rows, width), dtype=np.int64)
            for row, encoding in enumerate(encodings):
                ids[row, :lengths[row]], mask[row, :lengths[row]] = encoding.ids, 1
            groups = np.zeros((rows, 2), dtype=np.int32)
            groups[:, 1] = width
            outputs += [pb_utils.Tensor(INPUT_IDS, ids), pb_utils.Tensor(ATTENTION_MASK, mask),
                        pb_utils.Tensor(LENGTH_GROUP, groups)]
        request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL)

    # ---------------------------------------------------------------- TEI's /tokenize and /decode
    @staticmethod
    def flag(parameters, name, default):
        value = parameters.get(name, default)
        if not isinstance(value, bool):
            raise InvalidInput(name, f"must be true or false, not {json.dumps(value)[:40]}", ErrorKind.INVALID_VALUE)
        return value

    def tokenize(self, request):
        """Every token of each text, as TEI's /tokenize lists them: not truncated (a user asking how many tokens a
        text has wants them all; max_text_bytes bounds the work), the prompt's tokens included."""
        parameters = json.loads(request.parameters() or "{}")
        special = self.flag(parameters, "add_special_tokens", True)
        texts, queries, _, _ = self.decode_with_prompt(request, parameters)
        if queries is not None:
            raise InvalidInput("query", "is not taken by tokenize: it lists the tokens of single texts",
                               ErrorKind.INVALID_VALUE)
        if self.lookup is not None and self.looks_up(parameters):  # a query's own tokens: no special ones
            encodings = self.lookup.untruncated().encode_batch(texts, add_special_tokens=False)
        else:
            if self.whole is None:
                self.whole = Tokenizer.from_str(self.tokenizer.to_str())
                self.whole.no_truncation()
            encodings = self.whole.encode_batch(texts, add_special_tokens=special)
        rows, width = len(texts), max(1, max(len(e.ids) for e in encodings))
        ids = np.full((rows, width), -1, dtype=np.int64)
        words = np.full((rows, width), b"", dtype=np.object_)
        specials = np.zeros((rows, width), dtype=bool)
        spans = np.full((rows, width, 2), -1, dtype=np.int64)
        for row, (text, encoding) in enumerate(zip(texts, encodings)):
            data = text.encode("utf-8")
            # each character's first byte (and the end): tokenizers' offsets count characters, TEI's bytes
            starts = np.append(np.flatnonzero((np.frombuffer(data, np.uint8) & 0xC0) != 0x80), len(data))
            count = len(encoding.ids)
            ids[row, :count] = encoding.ids
            for k, (token, (start, stop), mask) in enumerate(zip(encoding.tokens, encoding.offsets,
                                                                 encoding.special_tokens_mask)):
                if mask:
                    words[row, k], specials[row, k] = token.encode("utf-8"), True
                else:
                    first, last = int(starts[start]), int(starts[stop])
                    words[row, k], spans[row, k] = data[first:last], (first, last)
        outputs = [pb_utils.Tensor(INPUT_IDS, ids), pb_utils.Tensor(TOKEN_TEXT, words),
                   pb_utils.Tensor(TOKEN_SPECIAL, specials), pb_utils.Tensor(BYTE_OFFSETS, spans),
                   pb_utils.Tensor(NUM_TOKENS, np.array([len(e.ids) for e in encodings], np.int32).reshape(rows, 1)),
                   pb_utils.Tensor(TRUNCATED, np.zeros((rows, 1), dtype=bool))]
        request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL)

    def detokenize(self, request):
        """Each row of token_ids back to text (TEI's /decode); -1 pads a row, any other id outside the vocabulary is
        refused naming its row."""
        if pb_utils.get_input_tensor_by_name(request, "text") is not None:
            raise InvalidInput("token_ids", "comes with text: a request either decodes token_ids or tokenizes text",
                               ErrorKind.INVALID_VALUE)
        skip = self.flag(json.loads(request.parameters() or "{}"), "skip_special_tokens", True)
        array = pb_utils.get_input_tensor_by_name(request, "token_ids").as_numpy()
        if array.ndim != 2:
            raise InvalidInput("token_ids", f"arrived with shape {list(array.shape)}, not [rows, ids]")
        decoded = []
        for row, ids in enumerate(array):
            ids = ids[ids != -1]
            bad = (ids < 0) | (ids >= self.vocabulary)
            if bad.any():
                raise InvalidInput(f"token_ids[{row}]", f"holds {int(ids[bad][0])}, not a token id of this model "
                                                        f"(0 to {self.vocabulary - 1}; -1 pads a row)",
                                   ErrorKind.INVALID_VALUE)
            decoded.append(self.tokenizer.decode(ids.tolist(), skip_special_tokens=skip).encode("utf-8"))
        out = np.array(decoded + [b""], dtype=np.object_)[:-1].reshape(-1, 1)  # (+ b"": keep an object array)
        request.get_response_sender().send(
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(DECODED, out)]), flags=FINAL)
