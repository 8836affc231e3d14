"""Deterministic text workloads with realistic lengths, built offline from real English prose.

Source: the Python Language Reference topics that every CPython ships in `pydoc_data.topics` (the text `help()`
shows: about 465k characters of prose and grammar). Prose paragraphs are kept (indented code and grammar blocks,
headings and rules are dropped), then, with a seeded RNG:
  - queries: single sentences (or their first clause) within the workload's query token range;
  - passages: consecutive paragraphs joined and cut at a word boundary to a random target in its passage range.
Token counts include the special tokens ([CLS]/[SEP]) of the served tokenizer and never exceed its max length.
The same Python version + seed + tokenizer gives the same texts (their SHA-256 is recorded in the report).

`multilingual()` builds the other kind from bench/data/multilingual.tsv: sentences in 26 languages and scripts, with
mixed-script lines and a text that is a lone combining mark (its tokens are all special in an English vocabulary).
`mixed_lengths()` draws from both sources with lengths spread as far as they go (issue 69: a corpus the admission
gate was not tuned on): one-word queries to passages at the max length, passages that mix scripts.
"""
import hashlib
import json
import math
import os
import random
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    query_share: float  # share of queries; the rest are passages
    query_tokens: tuple
    passage_tokens: tuple
    texts_per_request: int
    texts: int  # corpus size (full run)
    concurrency: tuple  # requests in flight, per level (full run)


WORKLOADS = {
    "queries": Workload("queries", "search queries, 5-30 tokens, one text per request", 1.0, (5, 30), (0, 0), 1,
                        1000, (1, 4, 16, 64, 128)),
    "passages": Workload("passages", "passages, 100-500 tokens (capped at the model's max length), one text per "
                         "request", 0.0, (0, 0), (100, 500), 1, 600, (1, 4, 16, 32)),
    "mixed": Workload("mixed", "half queries of 5-20 tokens, half passages of 100-250 tokens, shuffled, one text "
                      "per request", 0.5, (5, 20), (100, 250), 1, 1000, (1, 4, 16, 32, 64)),
    "client-batched": Workload("client-batched", "the mixed texts, 32 per request (a client batching its own "
                               "texts)", 0.5, (5, 20), (100, 250), 32, 1024, (1, 2, 4, 8)),
}


def _paragraphs():
    import pydoc_data.topics

    paragraphs = []
    for key in sorted(pydoc_data.topics.topics):
        for block in re.split(r"\n\s*\n", pydoc_data.topics.topics[key]):
            lines = block.split("\n")
            if any(line.startswith((" ", "\t")) for line in lines):
                continue  # code, grammar, tables
            text = " ".join(line.strip() for line in lines).strip()
            if len(text) < 40 or set(text) <= set("*=-~^ ") or text.startswith(("*", "=", "-")):
                continue
            text = re.sub(r"[-*=~^]{3,}", " ", text)  # heading underlines joined into the text
            paragraphs.append(re.sub(r"\s+", " ", text).strip())
    return paragraphs


def _count(tokenizer, text):
    return len(tokenizer.encode(text).ids)


def _cut(tokenizer, words, target, joiner=" "):
    """The longest prefix of `words` within `target` tokens (at least one word), by binary search."""
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _count(tokenizer, joiner.join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return joiner.join(words[:lo])


def _queries(rng, tokenizer, sentences, wanted, token_range, seen, budget):
    lo, hi = token_range
    found, tries = [], 0
    while len(found) < wanted and tries < budget:
        tries += 1
        sentence = rng.choice(sentences)
        words = sentence.split()
        if len(words) > 4 and rng.random() < 0.5:  # the opening clause, as a searcher would type it
            sentence = " ".join(words[:rng.randint(3, min(len(words), 24))])
        n = _count(tokenizer, sentence)
        if lo <= n <= hi and sentence not in seen:
            seen.add(sentence)
            found.append({"text": sentence, "tokens": n, "kind": "query"})
    return found


def _passages(rng, tokenizer, paragraphs, wanted, token_range, max_length, seen, budget):
    hi = min(token_range[1], max_length)
    lo = min(token_range[0], hi)
    found, tries = [], 0
    while len(found) < wanted and tries < budget:
        tries += 1
        target = rng.randint(lo, hi)
        start = rng.randrange(len(paragraphs))
        words = []
        for paragraph in paragraphs[start:start + 30]:
            words.extend(paragraph.split())
            if len(words) > target:  # ~1.3 tokens per word: enough words to cut from
                break
        text = _cut(tokenizer, words, target)
        n = _count(tokenizer, text)
        if lo <= n <= hi and text not in seen:
            seen.add(text)
            found.append({"text": text, "tokens": n, "kind": "passage"})
    return found


def build(tokenizer, workload, size, seed=0, max_length=512):
    """`size` texts of `workload` (a Workload), shuffled. Returns [{"text", "tokens", "kind"}]."""
    rng = random.Random(f"{workload.name}:{seed}")
    paragraphs = _paragraphs()
    sentences = [s.strip() for p in paragraphs for s in re.split(r"(?<=[.?!])\s+", p)]
    seen = set()
    wanted_queries = round(size * workload.query_share)
    corpus = _queries(rng, tokenizer, sentences, wanted_queries, workload.query_tokens, seen, 200 * size)
    corpus += _passages(rng, tokenizer, paragraphs, size - len(corpus), workload.passage_tokens, max_length, seen,
                        200 * size)
    if len(corpus) < size:
        raise RuntimeError(f"could only build {len(corpus)} of {size} {workload.name} texts")
    rng.shuffle(corpus)
    return corpus


MULTILINGUAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "multilingual.tsv")
UNSPACED = ("zh", "ja", "th")  # scripts written without spaces between words: cut by characters


def _multilingual_sentences():
    sentences = []
    with open(MULTILINGUAL, encoding="utf-8") as handle:
        for line in handle:
            if line.strip() and not line.startswith("#"):
                language, sentence = line.rstrip("\n").split("\t")
                sentences.append((language, sentence))
    return sentences


def multilingual(tokenizer, queries, passages, seed=0, max_length=512):
    """`queries` texts: every sentence of the file whole (2 to ~90 tokens in MiniLM's vocabulary), then their opening
    words or characters (up to 60 tokens); and `passages` of 60 tokens to the max length (sentences of one language,
    then of others, cut at a word), shuffled apart.
    Returns (queries, passages), each [{"text", "tokens", "kind"}]."""
    rng = random.Random(f"multilingual:{seed}")
    sentences = _multilingual_sentences()
    seen, found_queries = set(), [{"text": s, "tokens": _count(tokenizer, s), "kind": "query"} for _, s in sentences]
    seen.update(s for _, s in sentences)
    for _ in range(200 * queries):
        if len(found_queries) >= queries:
            break
        language, sentence = rng.choice(sentences)
        pieces = list(sentence) if language in UNSPACED else sentence.split()
        if len(pieces) < 3:
            continue
        text = ("" if language in UNSPACED else " ").join(pieces[:rng.randint(2, len(pieces) - 1)])
        n = _count(tokenizer, text)
        if n <= 60 and text not in seen:
            seen.add(text)
            found_queries.append({"text": text, "tokens": n, "kind": "query"})
    found_passages = []
    for _ in range(200 * passages):
        if len(found_passages) >= passages:
            break
        target = rng.randint(60, max_length)
        language = rng.choice(sentences)[0]
        own = [s for lang, s in sentences if lang == language]
        rng.shuffle(own)
        words = " ".join(own).split()
        while _count(tokenizer, " ".join(words)) < target:
            words += rng.choice(sentences)[1].split()
        text = _cut(tokenizer, words, target)
        if text not in seen:
            seen.add(text)
            found_passages.append({"text": text, "tokens": _count(tokenizer, text), "kind": "passage"})
    if len(found_queries) < queries or len(found_passages) < passages:
        raise RuntimeError(f"could only build {len(found_queries)} queries and {len(found_passages)} passages")
    found_queries = found_queries[:queries]
    rng.shuffle(found_queries)
    rng.shuffle(found_passages)
    return found_queries, found_passages


QUERY_PUNCTUATION = " ,.;:!?()[]\"'«»“”„¿¡。、，！？"


def _pieces(language, sentence):
    """A sentence's words, or its characters for a script written without spaces, and how to join them again."""
    return (list(sentence), "") if language in UNSPACED else (sentence.split(), " ")


def mixed_lengths(tokenizer, queries, passages, seed=0, max_length=512):
    """The corpus the admission gate was not tuned on (issue 69): lengths spread as far as they go, in English prose
    (the Python reference, as build() reads it) and the 26 languages of bench/data/multilingual.tsv, half each.
    `queries`: a quarter one word (one or two characters of an unspaced script), a quarter 2-4 words, the rest a
    sentence's opening (5 words to the whole sentence), up to 60 tokens;
    `passages`: a third within 16 tokens of the max length, the rest log-uniform from 8 tokens to it; each from one
    source: English prose, one language's sentences, or sentences of every language in turn (scripts mixed in one
    text). Returns (queries, passages), each [{"text", "tokens", "kind"}], shuffled."""
    rng = random.Random(f"mixed-lengths:{seed}")
    paragraphs = _paragraphs()
    english = [s.strip() for p in paragraphs for s in re.split(r"(?<=[.?!])\s+", p) if len(s.split()) >= 3]
    lines = _multilingual_sentences()
    by_language = {}
    for language, sentence in lines:
        by_language.setdefault(language, []).append(sentence)

    def a_sentence():
        return ("en", rng.choice(english)) if rng.random() < 0.5 else rng.choice(lines)

    seen, found_queries = set(), []
    for _ in range(200 * queries):
        if len(found_queries) >= queries:
            break
        language, sentence = a_sentence()
        pieces, joiner = _pieces(language, sentence)
        draw = rng.random()
        if draw < 0.5:  # a word or a few, from anywhere in the sentence
            n = (rng.randint(1, 2) if joiner == "" else 1) if draw < 0.25 else (
                rng.randint(3, 8) if joiner == "" else rng.randint(2, 4))
            start = rng.randrange(max(1, len(pieces) - n + 1))
            text = joiner.join(pieces[start:start + n]).strip(QUERY_PUNCTUATION)
        else:  # its opening, as a searcher types it, or all of it
            text = joiner.join(pieces[:rng.randint(min(5, len(pieces)), len(pieces))])
        if not text.strip() or text in seen:
            continue
        n = _count(tokenizer, text)
        if n <= min(60, max_length):
            seen.add(text)
            found_queries.append({"text": text, "tokens": n, "kind": "query"})
    found_passages = []
    for _ in range(200 * passages):
        if len(found_passages) >= passages:
            break
        if rng.random() < 1 / 3:
            target = rng.randint(max(8, max_length - 16), max_length)
        else:
            target = round(math.exp(rng.uniform(math.log(8), math.log(max_length))))
        source = rng.choice(("english", "language", "mixed"))
        joiner = " "
        if source == "english":  # consecutive paragraphs, as build() cuts its passages
            start = rng.randrange(len(paragraphs))
            words = []
            while len(words) <= target:  # a token or more per word: enough words to cut from
                words += paragraphs[start % len(paragraphs)].split()
                start += 1
        elif source == "language":  # one language's sentences, shuffled, again until long enough
            language = rng.choice(sorted(by_language))
            words = []
            while len(words) <= target:
                own = list(by_language[language])
                rng.shuffle(own)
                for sentence in own:
                    pieces, joiner = _pieces(language, sentence)
                    words += pieces
        else:  # a sentence of every kind in turn: scripts mixed within one text
            words = []
            while len(words) <= target:
                language, sentence = a_sentence()
                words += sentence.split()
        text = _cut(tokenizer, words, target, joiner)
        n = _count(tokenizer, text)
        if text.strip() and n <= max_length and text not in seen:
            seen.add(text)
            found_passages.append({"text": text, "tokens": n, "kind": "passage"})
    if len(found_queries) < queries or len(found_passages) < passages:
        raise RuntimeError(f"could only build {len(found_queries)} queries and {len(found_passages)} passages")
    rng.shuffle(found_queries)
    rng.shuffle(found_passages)
    return found_queries, found_passages


def digest(corpus):
    return hashlib.sha256(json.dumps([c["text"] for c in corpus]).encode()).hexdigest()


def load_tokenizer(tokenizer_json, max_length=None):
    """The served tokenizer.json (export wrote the model's max length as its truncation), without padding."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.no_padding()
    if max_length:
        tokenizer.enable_truncation(max_length)
    return tokenizer
