"""A deterministic text corpus with a realistic mix of lengths, built offline from real English prose.

Source: the Python Language Reference topics that every CPython ships in `pydoc_data.topics` (the text `help()`
shows: about 465k characters of prose and grammar). Prose paragraphs are kept (indented code and grammar blocks,
headings and rules are dropped), then, with a seeded RNG:
  - queries: single sentences (or their first clause) of 5-20 tokens;
  - passages: consecutive paragraphs joined and cut at a word boundary to a random target of 100-250 tokens.
Token counts include the special tokens ([CLS]/[SEP]) of the served tokenizer and never exceed its max length.
The same Python version + seed + tokenizer gives the same corpus (its SHA-256 is recorded in the report).
"""
import hashlib
import json
import random
import re

QUERY_TOKENS = (5, 20)
PASSAGE_TOKENS = (100, 250)


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


def build(tokenizer, size, seed=0, query_share=0.5, max_length=512):
    """`size` texts, `query_share` of them queries, the rest passages, shuffled. Returns [{"text", "tokens"}]."""
    rng = random.Random(seed)
    paragraphs = _paragraphs()
    sentences = [s.strip() for p in paragraphs for s in re.split(r"(?<=[.?!])\s+", p)]
    lo_q, hi_q = QUERY_TOKENS
    hi_p = min(PASSAGE_TOKENS[1], max_length)
    lo_p = min(PASSAGE_TOKENS[0], hi_p)
    queries_wanted = round(size * query_share)
    corpus, seen = [], set()
    tries = 0
    while len(corpus) < queries_wanted and tries < 100 * size:
        tries += 1
        sentence = rng.choice(sentences)
        words = sentence.split()
        if len(words) > 14:  # use the opening clause of long sentences, as a searcher would type it
            sentence = " ".join(words[:rng.randint(4, 12)])
        n = _count(tokenizer, sentence)
        if lo_q <= n <= hi_q and sentence not in seen:
            seen.add(sentence)
            corpus.append({"text": sentence, "tokens": n, "kind": "query"})
    while len(corpus) < size and tries < 200 * size:
        tries += 1
        target = rng.randint(lo_p, hi_p)
        start = rng.randrange(len(paragraphs))
        words = []
        for paragraph in paragraphs[start:start + 12]:
            words.extend(paragraph.split())
            if len(words) > target:  # ~1.3 tokens per word: enough words to cut from
                break
        # binary search for the longest word prefix within the target
        lo, hi = 1, len(words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _count(tokenizer, " ".join(words[:mid])) <= target:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(words[:lo])
        n = _count(tokenizer, text)
        if lo_p <= n <= hi_p and text not in seen:
            seen.add(text)
            corpus.append({"text": text, "tokens": n, "kind": "passage"})
    if len(corpus) < size:
        raise RuntimeError(f"could only build {len(corpus)} of {size} corpus texts")
    rng.shuffle(corpus)
    return corpus


def digest(corpus):
    return hashlib.sha256(json.dumps([c["text"] for c in corpus]).encode()).hexdigest()


def load_tokenizer(tokenizer_json, max_length):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer
