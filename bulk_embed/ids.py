"""Repeated ids: which rows of a corpus repeat an id an earlier row has, in corpus order, over millions of rows.

An id's first row keeps it, whatever becomes of that row afterwards (embedded, or rejected: no text, refused by the
server); every later row with the same id is a duplicate: with `--duplicates keep-first` (the default) it goes to the
rejects file as `duplicate_id`, naming the first row, and the job goes on; with `--duplicates fail` the job is refused
(`first_duplicate`, a pass over the ids before any work; and again wherever a window shows one). Ids keep their JSON
type: the integer 6 and the string "6" are two ids. Rows without an id of their own (a line that is not JSON, an id
that is missing or not a string or an integer) take part in nothing; neither do corpora whose ids are row numbers
(plain text, `--id-field ''`), which cannot repeat.

Memory: the ids seen are not kept, only an 8-byte hash of each (blake2b of its type and value) and the row that had it
first, in sorted numpy runs: 16 bytes an id (10 million ids: 160 MB; a Python set of the ids themselves would take
about 100 bytes an id). Two distinct ids share a hash with odds of about n^2 / 2^65 over n ids (1 in 370,000 for 10
million): such a row would be reported as a duplicate of the row named in its rejects line, where its id shows it is
not one.
"""
import hashlib
import json

import numpy as np

DUPLICATE = "duplicate_id"  # the rejects file's kind
MODES = ("keep-first", "fail")


class DuplicateId(Exception):
    """A repeated id under --duplicates fail."""


def key(value):
    """The id's hash, by type and value: 6 and "6" differ."""
    if isinstance(value, int):
        data = b"i" + str(value).encode()
    else:
        data = b"s" + value.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def shown(value):
    """An id as it is written in a message: its JSON (6, "6")."""
    return json.dumps(value, ensure_ascii=False)


def where(format, ordinal):
    """A row as a user finds it: its row number (the rejects file's `row`, from 0), and its line in a JSONL file."""
    return f"row {ordinal} (line {ordinal + 1})" if format == "jsonl" else f"row {ordinal}"


def problem(row_id, first_row, format):
    return f"id {shown(row_id)} repeats {where(format, first_row)}: its first row is kept"


def refusal(row_id, row, first_row, format):
    """--duplicates fail's one line."""
    return (f"duplicate id {shown(row_id)}: {where(format, row)} repeats {where(format, first_row)}; the job is "
            f"refused (--duplicates keep-first keeps each id's first row and lists the others in the rejects file)")


class SeenIds:
    """The ids of the rows read so far: sorted runs of (8-byte hash, first row), merged as they double (so a lookup
    is a binary search in a few runs, and adding n ids costs O(n log n) in all)."""

    def __init__(self):
        self.runs = []  # [(sorted uint64 hashes, int64 first rows)], largest first

    def __len__(self):
        return sum(len(keys) for keys, _ in self.runs)

    def first_rows(self, ids, rows):
        """For rows (ids, their row numbers, in corpus order): the row that had each id first, -1 where that is the row
        itself (a row seen again, say on resuming, is never its own duplicate). The new ids are remembered."""
        if not len(ids):
            return np.zeros(0, np.int64)
        keys = np.fromiter((key(i) for i in ids), np.uint64, len(ids))
        rows = np.asarray(rows, np.int64)
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        owner = rows[first]  # each hash's first row in this batch, unless an earlier batch had it
        known = np.zeros(len(unique), bool)
        for run_keys, run_rows in self.runs:
            at = np.minimum(np.searchsorted(run_keys, unique), len(run_keys) - 1)
            hit = run_keys[at] == unique
            owner[hit] = run_rows[at[hit]]
            known |= hit
        if not known.all():
            self._add(unique[~known], owner[~known])
        result = owner[inverse.reshape(-1)]
        result[result == rows] = -1
        return result

    def _add(self, keys, rows):
        self.runs.append((keys, rows))
        while len(self.runs) > 1 and len(self.runs[-1][0]) * 2 > len(self.runs[-2][0]):
            (a_keys, a_rows), (b_keys, b_rows) = self.runs.pop(), self.runs.pop()
            keys, rows = np.concatenate([b_keys, a_keys]), np.concatenate([b_rows, a_rows])
            order = np.argsort(keys, kind="stable")
            self.runs.append((keys[order], rows[order]))


def duplicates(seen, rows):
    """[(row, the row that had its id first)] of `rows` (corpus.Row, in corpus order) that repeat an id; rows without
    an id of their own are passed over."""
    with_ids = [row for row in rows if row.id is not None]
    firsts = seen.first_rows([row.id for row in with_ids], [row.ordinal for row in with_ids])
    return [(row, int(first)) for row, first in zip(with_ids, firsts) if first >= 0]


def first_duplicate(rows, batch=4096):
    """The first (row, first row) that repeats an id in `rows` (corpus.Row), or None: --duplicates fail's pass before
    any work (the ids are read and hashed, nothing is sent)."""
    seen, buffer = SeenIds(), []
    for row in rows:
        buffer.append(row)
        if len(buffer) >= batch:
            found = duplicates(seen, buffer)
            if found:
                return found[0]
            buffer = []
    found = duplicates(seen, buffer)
    return found[0] if found else None
