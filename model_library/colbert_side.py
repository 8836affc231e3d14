"""A PyLate ColBERT export's token rows (lightonai/GTE-ModernColBERT-v1, answerai-colbert-small-v1, colbertv2.0 as
PyLate loads them): the tokenizer model builds each row as PyLate's ColBERT.tokenize does, from colbert.json beside
tokenizer.json (exporter/families/colbert.py writes it; the export's reference check runs this same code against
PyLate's encoder):

    query     [CLS] text... [SEP] cut at query_length - 1 tokens, the query marker inserted after [CLS], then (query
              expansion) the expansion token (the mask token) repeated up to query_length
    document  [CLS] text... [SEP] cut at document_length - 1 tokens, the document marker inserted after [CLS]

Every token of a row is a real token of the encoder's batch (attention_mask 1): the graph tells a query row by its
marker at position 1, finds the expansion run at its end and keeps it out of attention (attend_to_expansion_tokens
false), and keeps each query position's vector and each document token's but the skiplist's (the graph's
colbert_vectors). A request's side is its Router task (request_rules.task: prompt_name or input_type query /
document); none: the default side, the document (what an index is built from). Plain Python (no Triton import)."""
import json
import os

SIDE_FILE = "colbert.json"
SIDES = ("query", "document")


class Encoding:
    """What the tokenizer model reads of a row (as a tokenizers Encoding): ids, whether the text was cut, each
    token's character span and special flag (the marker and expansion tokens: special, no span)."""
    __slots__ = ("ids", "overflowing", "offsets", "special_tokens_mask")

    def __init__(self, ids, overflowing, offsets, special_tokens_mask):
        self.ids = ids
        self.overflowing = overflowing
        self.offsets = offsets
        self.special_tokens_mask = special_tokens_mask


class ColbertSide:
    """The rows of a ColBERT export, from `folder` (the tokenizer model's version folder) and its tokenizer (the
    export's tokenizer.json: its truncation is replaced by each side's); `load` gives None for other exports."""

    def __init__(self, folder, tokenizer):
        from tokenizers import Tokenizer

        with open(os.path.join(folder, SIDE_FILE), encoding="utf-8") as handle:
            self.settings = json.load(handle)
        self.routes = {side: side for side in SIDES}
        self.default_route = self.settings.get("default_side", "document")
        self.tokenizers = {}
        for side in SIDES:
            own = Tokenizer.from_str(tokenizer.to_str())
            own.no_padding()
            own.enable_truncation(int(self.settings[f"{side}_length"]) - 1)  # room for the marker
            self.tokenizers[side] = own

    @classmethod
    def load(cls, folder, tokenizer):
        return cls(folder, tokenizer) if os.path.exists(os.path.join(folder, SIDE_FILE)) else None

    def side(self, task):
        """The side of a request of Router task `task` (None: none given)."""
        return task if task in SIDES else self.default_route

    def encode(self, texts, side):
        """PyLate's rows of `texts` for `side` (query / document): Encoding objects."""
        settings = self.settings
        marker = settings[f"{side}_prefix_id"]
        expand = side == "query" and settings["do_query_expansion"]
        width = int(settings["query_length"])
        rows = []
        texts = [text.strip() for text in texts]  # as sentence-transformers' Transformer.tokenize does
        for encoding in self.tokenizers[side].encode_batch(texts):
            ids = list(encoding.ids)
            ids = ids[:1] + [marker] + ids[1:]
            offsets = [*encoding.offsets[:1], (0, 0), *encoding.offsets[1:]]
            special = [*encoding.special_tokens_mask[:1], 1, *encoding.special_tokens_mask[1:]]
            if expand:
                more = width - len(ids)
                ids, offsets, special = ids + [settings["expansion_id"]] * more, offsets + [(0, 0)] * more, \
                    special + [1] * more
            rows.append(Encoding(ids, bool(encoding.overflowing), offsets, special))
        return rows
