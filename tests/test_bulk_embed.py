"""Bulk embedding (`make embed`, python -m bulk_embed): readers, request planning, retries and rejects, parts and
resuming (unit, with a fake door); blank lines, repeated ids (kept first or refused, across windows and resuming) and
ids that keep their JSON type (6 is not "6"); then the real command against the real server: killed twice with
SIGKILL and resumed, against a one-shot run; rejects with their ids; both doors on a named export beside others;
output types; blank lines, repeated and mixed ids end to end."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tritonclient.grpc as grpcclient

from bulk_embed import corpus, ids, job, store
from bulk_embed.__main__ import bls_model, check_output
from bulk_embed.doors import KINDS, Answer, JobError, Limits, Refused, Retry, failure, rows_of
from bulk_embed.lock import OutputLock
from conftest import PROJECT
from triton_clients import VARIED_TEXTS

LIMITS = Limits(max_texts=8, max_request_bytes=1 << 20, max_length=64, max_batch_tokens=512, in_flight=2)


# ---------------------------------------------------------------- readers
def test_jsonl_rows_keep_ids_and_report_unreadable_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": 7, "text": "seven"}\n{"id": "b", "text": "bee"}\nnot json\n{"id": "x"}\n'
                     b'{"text": "no id"}\n{"id": "u", "text": "\\ud800 lone"}\n')
    rows = list(corpus.rows(str(path), "jsonl"))
    assert [(r.ordinal, r.id, r.text) for r in rows[:2]] == [(0, 7, b"seven"), (1, "b", b"bee")]
    assert rows[2].problem.startswith("line 3 is not a JSON object")
    assert "'text' is missing" in rows[3].problem and rows[3].id == "x"
    assert "no usable 'id'" in rows[4].problem
    assert rows[5].text == "\ud800 lone".encode("utf-8", "surrogatepass")  # sent: the tokenizer refuses it
    assert corpus.count(str(path), "jsonl") == 6
    assert [r.ordinal for r in corpus.rows(str(path), "jsonl", skip=4)] == [4, 5]


def test_parquet_csv_and_text_rows(tmp_path):
    pq.write_table(pa.table({"doc": ["a", "b", "c"], "body": ["one", "two", "three"]}), tmp_path / "c.parquet",
                   row_group_size=2)
    rows = list(corpus.rows(str(tmp_path / "c.parquet"), "parquet", "doc", "body", skip=1))
    assert [(r.ordinal, r.id, r.text) for r in rows] == [(1, "b", b"two"), (2, "c", b"three")]
    assert corpus.count(str(tmp_path / "c.parquet"), "parquet") == 3
    (tmp_path / "c.csv").write_bytes(b'id,text\n1,"a, quoted\nnewline"\n2,\xff bad utf-8\n')
    rows = list(corpus.rows(str(tmp_path / "c.csv"), "csv"))
    assert [(r.id, r.text) for r in rows] == [("1", b"a, quoted\nnewline"), ("2", b"\xff bad utf-8")]
    (tmp_path / "c.txt").write_bytes(b"first\r\nsecond\nthird")
    assert [(r.id, r.text) for r in corpus.rows(str(tmp_path / "c.txt"), "text")] == \
        [(0, b"first"), (1, b"second"), (2, b"third")]
    assert corpus.count(str(tmp_path / "c.txt"), "text") == 3
    with pytest.raises(SystemExit, match="no column body"):
        list(corpus.rows(str(tmp_path / "c.csv"), "csv", "id", "body"))


def test_blank_lines_are_skipped_not_rows_nor_rejects(tmp_path):
    (tmp_path / "c.jsonl").write_bytes(b'{"id": "a", "text": "one"}\n\n   \r\n\t\n{"id": "b", "text": "two"}\n \n')
    rows = list(corpus.rows(str(tmp_path / "c.jsonl"), "jsonl"))
    assert [(r.ordinal, r.id, r.problem) for r in rows] == [(0, "a", None), (4, "b", None)]
    assert corpus.count(str(tmp_path / "c.jsonl"), "jsonl") == 2
    assert [r.id for r in corpus.rows(str(tmp_path / "c.jsonl"), "jsonl", skip=1)] == ["b"]
    (tmp_path / "c.txt").write_bytes(b"first\n\n  \r\nsecond\r\n\n")
    rows = list(corpus.rows(str(tmp_path / "c.txt"), "text"))
    assert [(r.id, r.text) for r in rows] == [(0, b"first"), (3, b"second")]  # ids stay line numbers
    assert corpus.count(str(tmp_path / "c.txt"), "text") == 2


def test_ids_that_cannot_be_written_are_rejects_without_an_id(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"id": "\\ud800", "text": "a"}\n{"id": 18446744073709551616, "text": "b"}\n'
                                      '{"id": 9223372036854775807, "text": "c"}\n')
    rows = list(corpus.rows(str(tmp_path / "c.jsonl"), "jsonl"))
    assert rows[0].id is None and "not valid UTF-8" in rows[0].problem
    assert rows[1].id is None and "beyond 64 bits" in rows[1].problem
    assert rows[2].id == 2 ** 63 - 1 and rows[2].problem is None


# ---------------------------------------------------------------- planning
def test_plan_sorts_by_length_and_keeps_every_limit():
    rows = [corpus.Row(i, i, b"w" * n) for i, n in enumerate([300, 5, 40, 5, 120, 9, 60, 200] * 5)]
    requests = job.plan(rows, LIMITS)
    assert sorted(r.ordinal for request in requests for r in request) == list(range(len(rows)))
    lengths = [len(r.text) for request in requests for r in request]
    assert lengths == sorted(lengths)
    for request in requests:
        assert len(request) <= LIMITS.max_texts
        longest = job.estimate_tokens(max(len(r.text) for r in request), LIMITS.max_length)
        assert len(request) == 1 or len(request) * longest <= 4 * LIMITS.max_batch_tokens


# ---------------------------------------------------------------- retries and rejects
class FakeDoor:
    """Vectors from the text's bytes; refuses empty texts (as the tokenizer does), and with truncate false texts
    over 50 bytes (as the tokenizer does texts over its max length), and can fail on cue."""

    def __init__(self, overloaded=0, internal=0, crash_after=None, truncate=True):
        self.overloaded, self.internal, self.crash_after, self.calls = overloaded, internal, crash_after, 0
        self.truncate = truncate

    def embed(self, texts):
        self.calls += 1
        if self.crash_after is not None and self.calls > self.crash_after:
            raise JobError("the server went away for good")
        if self.overloaded:
            self.overloaded -= 1
            raise Retry("overloaded: queue full", after_s=0.25, kind="overloaded")
        if self.internal:
            self.internal -= 1
            raise Retry("internal: stub restarting", kind="internal")
        for i, text in enumerate(texts):
            if not text:
                raise Refused(i, "invalid_input", "is empty")
            if len(text) > 50 and not self.truncate:
                raise Refused(i, "too_long", "is longer than the model's maximum of 16 tokens (truncate is false)")
        vectors = [np.frombuffer((t * 8)[:8].ljust(8, b"."), np.uint8).astype(np.float32) for t in texts]
        return Answer({"embedding": vectors}, np.array([len(t) > 50 for t in texts]), sum(map(len, texts)))


def rows_of_texts(texts):
    return [corpus.Row(i, f"id{i}", t) for i, t in enumerate(texts)]


def test_send_rejects_refused_texts_and_sends_the_rest(monkeypatch):
    monkeypatch.setattr(job.time, "sleep", lambda s: None)
    answered, rejects, _ = job.send(FakeDoor(), rows_of_texts([b"a", b"", b"c", b""]), 60)
    assert [a[1] for a in answered] == ["id0", "id2"]
    assert [(r["row"], r["id"], r["kind"]) for r in rejects] == [(1, "id1", "invalid_input"),
                                                                 (3, "id3", "invalid_input")]
    answered, rejects, _ = job.send(FakeDoor(truncate=False), rows_of_texts([b"x" * 60, b"short"]), 60)
    assert [a[1] for a in answered] == ["id1"] and rejects[0]["kind"] == "too_long"


def test_send_waits_out_overload_with_retry_after_and_gives_up_on_a_fault(monkeypatch):
    slept = []
    monkeypatch.setattr(job.time, "sleep", slept.append)
    answered, _, _ = job.send(FakeDoor(overloaded=3), rows_of_texts([b"a"]), 60)
    assert len(answered) == 1 and slept == [0.25, 0.25, 0.25]
    slept.clear()
    job.send(FakeDoor(internal=2), rows_of_texts([b"a"]), 60)
    assert slept == [0.5, 1.0]  # backoff when the server says no Retry-After
    with pytest.raises(JobError, match="gave up"):
        job.send(FakeDoor(internal=job.INTERNAL_RETRIES + 1), rows_of_texts([b"a"]), 600)
    with pytest.raises(JobError, match="gave up"):
        job.send(FakeDoor(overloaded=100), rows_of_texts([b"a"]), 1.0)


def test_kserve_errors_map_by_kind_and_field():
    refused = failure("in ensemble 'x', text[3] is empty [invalid_input text[3]]")
    assert isinstance(refused, Refused) and refused.index == 3 and refused.kind == "invalid_input"
    assert isinstance(failure("Exceeds maximum queue size"), Retry)
    assert isinstance(failure("failed to connect to all addresses; last error: UNAVAILABLE"), Retry)
    assert isinstance(failure("dimensions 77 is not served [not_served dimensions]"), JobError)


def test_sparse_and_colbert_rows_lose_their_padding():
    tensors = {"sparse_indices": np.array([[5, 9, -1], [2, -1, -1]]),
               "sparse_values": np.array([[.5, .2, 0], [.9, 0, 0]]), "sparse_count": np.array([[2], [1]]),
               "colbert_vectors": np.ones((2, 3, 4), np.float32), "colbert_length": np.array([[3], [1]])}
    sparse = rows_of("sparse", tensors)
    assert [list(r) for r in sparse["sparse_indices"]] == [[5, 9], [2]]
    assert [len(r) for r in rows_of("colbert", tensors)["colbert"]] == [3, 1]
    table = store.part_table([(0, "a", False, {"colbert": rows_of("colbert", tensors)["colbert"][0]}),
                              (1, "b", False, {"colbert": rows_of("colbert", tensors)["colbert"][1]})])
    assert [len(v) for v in table.column("colbert").to_pylist()] == [3, 1]
    assert set(KINDS) >= {"float", "int8", "ubinary", "sparse", "colbert_int8"}


# ---------------------------------------------------------------- parts, resuming, the output
def options(tmp_path, **changes):
    values = {"window": 10, "in_flight": 2, "truncate": True, "max_wait": 5.0, "output_format": "parquet",
              "duplicates": "keep-first", **changes}
    return type("Options", (), values)


def source_of(path):
    return type("Source", (), {"path": str(path), "format": "jsonl", "id_field": "id", "text_field": "text"})


def write_corpus(path, texts):
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))


def test_a_stopped_job_resumes_and_writes_every_row_once_in_order(tmp_path):
    texts = [f"text number {i} " + "x" * (i % 13) for i in range(95)] + [""] * 3 + ["last"]
    write_corpus(tmp_path / "c.jsonl", texts)
    output = str(tmp_path / "out.parquet")
    settings = {"input": "c", "window": 10}
    with pytest.raises(JobError):  # the server goes away after 5 requests: the finished windows stay
        job.run(FakeDoor(crash_after=5), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, settings),
                options(tmp_path))
    kept = store.Job(output, settings).done_windows()
    assert 0 < len(kept) < 10 and not os.path.exists(output)
    with pytest.raises(SystemExit, match="other settings"):
        store.Job(output, {**settings, "window": 20})
    summary = job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, settings),
                      options(tmp_path))
    table = pq.read_table(output)
    assert table.column("id").to_pylist() == [f"d{i}" for i in range(len(texts)) if texts[i]]
    assert summary["embedded"] == 96 and summary["rejected"] == 3
    rejects = [json.loads(line) for line in open(tmp_path / "out.rejects.jsonl")]
    assert [r["id"] for r in rejects] == ["d95", "d96", "d97"]
    assert not os.path.exists(output + ".parts")
    one_shot = str(tmp_path / "one.parquet")
    job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(one_shot, settings), options(tmp_path))
    assert pq.read_table(one_shot).equals(table)


def test_a_window_with_every_row_refused_leaves_the_columns_whole(tmp_path):
    write_corpus(tmp_path / "c.jsonl", [""] * 10 + [f"t{i}" for i in range(15)])
    output = str(tmp_path / "out.parquet")
    summary = job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, {}), options(tmp_path))
    table = pq.read_table(output)
    assert table.column_names == ["id", "embedding", "truncated"] and table.num_rows == 15
    assert summary["rejected"] == 10


def test_npy_output_and_its_ids(tmp_path):
    write_corpus(tmp_path / "c.jsonl", [f"t{i}" for i in range(25)])
    output = str(tmp_path / "v.npy")
    job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, {}),
            options(tmp_path, output_format="npy"))
    matrix = np.load(output)
    assert matrix.shape == (25, 8) and matrix.dtype == np.float32
    assert [json.loads(line) for line in open(tmp_path / "v.ids.jsonl")] == [f"d{i}" for i in range(25)]
    assert bytes(matrix[12].astype(np.uint8)).startswith(b"t12")


def test_blank_lines_in_a_job_are_not_counted(tmp_path):
    """A window of nothing but blank lines still gets its (empty) part, so a resumed job starts after it."""
    lines = [json.dumps({"id": f"d{i}", "text": f"text {i}"}) for i in range(5)] + [""] * 25 + \
        [json.dumps({"id": f"d{i}", "text": f"text {i}"}) for i in range(5, 12)] + ["  ", ""]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    output = str(tmp_path / "out.parquet")
    with pytest.raises(JobError):
        job.run(FakeDoor(crash_after=1), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, {}),
                options(tmp_path, in_flight=1))
    assert set(store.Job(output, {}).done_windows()) == {0, 1, 2}  # window 0 answered; 1 and 2 are blank
    summary = job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, {}), options(tmp_path))
    assert summary["embedded"] == 12 and summary["rejected"] == 0 and summary["duplicates"] == 0
    assert pq.read_table(output).column("id").to_pylist() == [f"d{i}" for i in range(12)]
    assert not os.path.exists(tmp_path / "out.rejects.jsonl")


# ---------------------------------------------------------------- repeated ids, typed ids
def test_seen_ids_tell_types_apart_and_remember_rows_compactly():
    seen = ids.SeenIds()
    assert list(seen.first_rows([6, "6", "a", 6, "a"], [0, 1, 2, 3, 4])) == [-1, -1, -1, 0, 2]
    assert list(seen.first_rows(["6", 6, "b", 7], [5, 6, 7, 8])) == [1, 0, -1, -1]
    assert list(seen.first_rows([6, "b"], [0, 7])) == [-1, -1]  # a row read again is not its own duplicate
    assert ids.key(6) != ids.key("6") and ids.key(-1) != ids.key("-1")
    rng = np.random.default_rng(0)  # many batches (the runs merge) against a dict
    values = [int(v) if v % 3 else f"s{v}" for v in rng.integers(0, 30000, 60000)]
    seen, first, expected, got = ids.SeenIds(), {}, [], []
    for start in range(0, len(values), 4096):
        batch = values[start:start + 4096]
        got += list(seen.first_rows(batch, range(start, start + len(batch))))
    for row, value in enumerate(values):
        expected.append(first.get((type(value), value), -1))
        first.setdefault((type(value), value), row)
    assert got == expected
    assert len(seen) == len(first) and len(seen.runs) <= 8
    assert sum(k.nbytes + r.nbytes for k, r in seen.runs) == 16 * len(first)  # 16 bytes an id


def corpus_lines(path, records, blank_after=()):
    path.write_text("".join(json.dumps(r) + "\n" + ("\n" if i in blank_after else "") for i, r in enumerate(records)))


def test_repeated_ids_keep_the_first_across_windows_and_resuming(tmp_path):
    """The first row of an id keeps it; later ones are rejects naming it, in whichever window, resumed or not; 6 and
    "6" are two ids, never duplicates of each other."""
    records = [{"id": f"d{i}", "text": f"text {i}"} for i in range(60)]
    records[3] = {"id": 6, "text": "the integer six"}
    records[4] = {"id": "6", "text": "the string six"}
    records[14] = {"id": "d1", "text": "again d1, next window"}  # window 1 repeats window 0
    records[15] = {"id": "d15"}  # no text: rejected, yet its id is taken
    records[17] = {"id": "d15", "text": "d15 has a text now"}
    records[35] = {"id": 6, "text": "the integer again"}
    records[36] = {"id": "6", "text": "the string again"}
    records[37] = {"id": "d36", "text": "row 36 is \"6\": d36 is free"}
    records[58] = {"id": "d37", "text": "row 37 is d36: d37 is free"}
    records[45] = {"id": "d25", "text": "window 4 repeats window 2, finished before the stop"}
    records[59] = {"id": "d14", "text": "row 14 is d1: d14 is free"}
    corpus_lines(tmp_path / "c.jsonl", records, blank_after=(20, 21))
    ordinal = {i: i + (i > 20) + (i > 21) for i in range(60)}  # line numbers: two blank lines after row 20
    output, settings = str(tmp_path / "out.parquet"), {"window": 10}
    with pytest.raises(JobError):
        job.run(FakeDoor(crash_after=6), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, settings),
                options(tmp_path, in_flight=1))
    done = store.Job(output, settings).done_windows()
    assert {0, 1, 2} <= set(done) and 5 not in done
    for path in (tmp_path / "out.parquet.parts").glob("part-000001.*"):  # as if window 1 had been slower than 2
        path.unlink()
    summary = job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, settings),
                      options(tmp_path))
    rejects = [json.loads(line) for line in open(tmp_path / "out.rejects.jsonl")]
    assert [(r["row"], r["id"], r["kind"]) for r in rejects] == [
        (ordinal[14], "d1", "duplicate_id"), (ordinal[15], "d15", "invalid_input"),
        (ordinal[17], "d15", "duplicate_id"), (ordinal[35], 6, "duplicate_id"), (ordinal[36], "6", "duplicate_id"),
        (ordinal[45], "d25", "duplicate_id")]
    assert rejects[0]["problem"] == 'id "d1" repeats row 1 (line 2): its first row is kept'
    assert rejects[3]["problem"].startswith("id 6 repeats row 3 ") and \
        rejects[4]["problem"].startswith('id "6" repeats row 4 ')
    assert summary["duplicates"] == 5 and summary["rejected"] == 6 and summary["embedded"] == 54
    table = pq.read_table(output)
    kept = [r["id"] for i, r in enumerate(records) if i not in (14, 15, 17, 35, 36, 45)]
    assert store.ids_of(table) == kept and len(set(map(json.dumps, kept))) == len(kept)
    one_shot = str(tmp_path / "one.parquet")  # the same as a run never stopped
    job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(one_shot, settings), options(tmp_path))
    assert pq.read_table(one_shot).equals(table)
    assert open(tmp_path / "one.rejects.jsonl").read() == open(tmp_path / "out.rejects.jsonl").read()


def test_duplicates_fail_stops_the_job_where_it_sees_one(tmp_path):
    records = [{"id": f"d{i}", "text": f"text {i}"} for i in range(30)]
    records[25] = {"id": "d3", "text": "again"}
    corpus_lines(tmp_path / "c.jsonl", records)
    output = str(tmp_path / "out.parquet")
    with pytest.raises(ids.DuplicateId, match=r'duplicate id "d3": row 25 \(line 26\) repeats row 3 \(line 4\)'):
        job.run(FakeDoor(), LIMITS, source_of(tmp_path / "c.jsonl"), store.Job(output, {}),
                options(tmp_path, duplicates="fail"))
    assert 2 not in store.Job(output, {}).done_windows()  # the window with the duplicate is not written


def test_duplicates_fail_refuses_the_job_before_any_work(tmp_path):
    """--duplicates fail: one line naming the id and its rows, before the server is asked anything (none runs here),
    no job folder; 6 and "6" are no duplicates."""
    corpus_lines(tmp_path / "c.jsonl", [{"id": 6, "text": "a"}, {"id": "6", "text": "b"}, {"id": "x", "text": "c"},
                                        {"id": "x", "text": "d"}], blank_after=(0,))
    base = [sys.executable, "-m", "bulk_embed", str(tmp_path / "c.jsonl"), str(tmp_path / "o.parquet"),
            "--grpc-url", "127.0.0.1:1", "--repository", str(tmp_path)]
    result = subprocess.run(base + ["--duplicates", "fail"], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith('embed: duplicate id "x": row 4 (line 5) repeats row 3 (line 4); the job is '
                                    'refused'), result.stderr
    assert not (tmp_path / "o.parquet.parts").exists()
    corpus_lines(tmp_path / "c.jsonl", [{"id": 6, "text": "a"}, {"id": "6", "text": "b"}])
    result = subprocess.run(base + ["--duplicates", "fail"], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "failed to connect" in result.stderr  # no duplicate: on to the server


def test_ids_keep_their_json_type_in_every_output(tmp_path):
    """All integers: an int64 column; all strings: a string column; mixed: each id's JSON text, the field saying so;
    .ids.jsonl and the rejects file: JSON, each id with its type."""
    for name, values, kind in (("ints", [1, 6, -3], pa.int64()), ("strs", ["1", "6", "x"], pa.string())):
        corpus_lines(tmp_path / f"{name}.jsonl", [{"id": v, "text": f"t{v}"} for v in values])
        job.run(FakeDoor(), LIMITS, source_of(tmp_path / f"{name}.jsonl"), store.Job(str(tmp_path / f"{name}.parquet"),
                {}), options(tmp_path, window=2))
        table = pq.read_table(tmp_path / f"{name}.parquet")
        assert table.schema.field("id").type == kind and table.schema.field("id").metadata is None
        assert table.column("id").to_pylist() == values
    # mixed, in one window and across windows (a window of integers, then one of strings)
    mixed = [6, 7, "6", "x", 8, "7"]
    corpus_lines(tmp_path / "m.jsonl", [{"id": v, "text": f"t{v}"} for v in mixed] + [{"id": "e", "text": ""}])
    for window in (2, 3, 100):
        output = tmp_path / f"m{window}.parquet"
        summary = job.run(FakeDoor(), LIMITS, source_of(tmp_path / "m.jsonl"), store.Job(str(output), {}),
                          options(tmp_path, window=window))
        table = pq.read_table(output)
        assert summary["id_kind"] == "json" and summary["duplicates"] == 0
        assert table.schema.field("id").type == pa.string()
        assert table.schema.field("id").metadata == {b"encoding": b"json"}
        assert table.column("id").to_pylist() == ["6", "7", '"6"', '"x"', "8", '"7"']
        assert store.ids_of(table) == mixed
    job.run(FakeDoor(), LIMITS, source_of(tmp_path / "m.jsonl"), store.Job(str(tmp_path / "m.npy"), {}),
            options(tmp_path, window=3, output_format="npy"))
    assert [json.loads(line) for line in open(tmp_path / "m.ids.jsonl")] == mixed
    assert [json.loads(line)["id"] for line in open(tmp_path / "m.rejects.jsonl")] == ["e"]


# ---------------------------------------------------------------- the command line
def test_bls_model_found_by_id_name_or_served_name(tmp_path):
    for name, served, kind in (("a_reranker", [], "cross-encoder"), ("emb", ["text-embedding-3-small"], "embedding")):
        folder = tmp_path / name / "1"
        folder.mkdir(parents=True)
        (folder / "export.json").write_text(json.dumps({"id": f"org/{name}", "name": name, "served_names": served,
                                                        "bls_model": f"{name}_bls", "max_length": 128, "kind": kind}))
    assert bls_model(str(tmp_path), None) == ("emb_bls", 128)  # no `ensemble`: the first that embeds texts
    (tmp_path / "ensemble" / "1").mkdir(parents=True)
    (tmp_path / "ensemble" / "1" / "export.json").write_text(json.dumps({"id": "org/m", "name": "ensemble",
                                                                         "bls_model": "ensemble_bls"}))
    assert bls_model(str(tmp_path), None) == ("ensemble_bls", None)
    assert bls_model(str(tmp_path), "org/emb") == bls_model(str(tmp_path), "text-embedding-3-small") == ("emb_bls", 128)
    assert bls_model(str(tmp_path / "nowhere"), "other") == ("other_bls", None)


def test_no_server_is_one_line_and_a_failure(tmp_path):
    write_corpus(tmp_path / "c.jsonl", ["a text"])
    result = subprocess.run([sys.executable, "-m", "bulk_embed", str(tmp_path / "c.jsonl"), str(tmp_path / "o.parquet"),
                             "--grpc-url", "127.0.0.1:1", "--repository", str(tmp_path)], cwd=PROJECT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("embed: model ensemble_bls: failed to connect")
    assert not (tmp_path / "o.parquet.parts").exists()  # nothing was started


# ---------------------------------------------------------------- the real command, the real server
def command(corpus_path, output, server, *extra):
    return [sys.executable, "-m", "bulk_embed", str(corpus_path), str(output), "--grpc-url", server.grpc_url,
            "--repository", str(server.repository), *extra]


def run_command(*args, **kwargs):
    result = subprocess.run(command(*args, **kwargs), cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stderr


def distinct_texts(n):
    return [f"{VARIED_TEXTS[i % len(VARIED_TEXTS)]} ({i})" for i in range(n)]


def test_killed_twice_the_command_resumes_to_the_one_shot_output(server, tmp_path):
    texts = distinct_texts(2400)
    write_corpus(tmp_path / "c.jsonl", texts)
    output, parts = tmp_path / "killed.parquet", tmp_path / "killed.parquet.parts"
    kills = 0
    for wanted_parts in (2, 8):  # kill -9 once a few windows are written, twice
        process = subprocess.Popen(command(tmp_path / "c.jsonl", output, server, "--window", "100"), cwd=PROJECT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if len([p for p in os.listdir(parts) if p.endswith(".parquet")] if parts.exists() else []) >= wanted_parts:
                process.send_signal(signal.SIGKILL)
                kills += 1
                break
            time.sleep(0.05)
        process.wait()
    assert kills == 2, "the job ended before it could be killed twice"
    assert not output.exists()
    run_command(tmp_path / "c.jsonl", output, server, "--window", "100")
    run_command(tmp_path / "c.jsonl", tmp_path / "once.parquet", server)  # default window: other request cuts
    killed, once = pq.read_table(output), pq.read_table(tmp_path / "once.parquet")
    ids = killed.column("id").to_pylist()
    assert ids == once.column("id").to_pylist() == [f"d{i}" for i in range(len(texts))]  # each once, in order
    a, b = (np.array(t.column("embedding").to_pylist(), np.float32) for t in (killed, once))
    assert a.shape == (len(texts), 384)
    np.testing.assert_allclose(a, b, atol=2e-5)
    # and what a direct KServe call of one text through the ensemble gives
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for i in (0, 777, 2399):
        text = grpcclient.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[texts[i].encode()]], dtype=object))
        direct = client.infer("ensemble", [text]).as_numpy("embedding")[0]
        assert float(np.dot(direct, a[i])) > 0.99999


def test_rejects_by_id_through_both_doors_on_a_named_export(ce_server, tmp_path):
    """`emb` (named, by its served name) beside two cross-encoders: the KServe door and the HTTP front give the same
    vectors and refuse the same rows, each with its id."""
    long_text = " ".join(["word"] * 400)  # over emb's 128 tokens
    lines = [json.dumps({"id": "ok-1", "text": "Bulk embedding through the server"}),
             json.dumps({"id": "empty", "text": ""}), "{broken json", json.dumps({"id": "long", "text": long_text}),
             json.dumps({"id": "no-text"}),
             json.dumps({"id": "ok-2", "text": "Another text, in another language: voilà"})]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    outputs = {}
    for door, extra in (("grpc", ()), ("http", ("--http", ce_server.proxy_url))):
        output = tmp_path / f"{door}.parquet"
        log = run_command(tmp_path / "c.jsonl", output, ce_server, "--model", "text-embedding-3-small",
                          "--no-truncate", *extra)
        assert "2 rows" in log and "4 rejected" in log, log
        rejects = {r["id"]: r for r in map(json.loads, open(tmp_path / f"{door}.rejects.jsonl"))}
        assert set(rejects) == {"empty", None, "long", "no-text"}  # a line that is not JSON has no id, only its row
        assert rejects[None]["row"] == 2
        assert rejects["empty"]["kind"] == "invalid_input" and "empty" in rejects["empty"]["problem"]
        assert rejects["long"]["kind"] == "too_long"
        table = pq.read_table(output)
        assert table.column("id").to_pylist() == ["ok-1", "ok-2"]
        outputs[door] = np.array(table.column("embedding").to_pylist(), np.float32)
    np.testing.assert_allclose(outputs["grpc"], outputs["http"], atol=1e-6)
    # truncation on (the default): the long text is embedded and flagged
    run_command(tmp_path / "c.jsonl", tmp_path / "t.parquet", ce_server, "--model", "emb")
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column("id").to_pylist() == ["ok-1", "long", "ok-2"]
    assert table.column("truncated").to_pylist() == [False, True, False]


def test_output_types_match_the_bls_model_and_npy(server, tmp_path):
    texts = distinct_texts(30)
    (tmp_path / "c.txt").write_bytes("\n".join(texts).encode() + b"\n\xff\xfe not utf-8\n")
    run_command(tmp_path / "c.txt", tmp_path / "q.parquet", server, "--outputs", "float,int8,ubinary")
    table = pq.read_table(tmp_path / "q.parquet")
    assert table.num_rows == 30 and table.column("id").to_pylist() == list(range(30))
    reject = json.loads(open(tmp_path / "q.rejects.jsonl").read())
    assert reject["id"] == 30 and reject["kind"] == "invalid_input"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("text", [30, 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    direct = client.infer("ensemble_bls", [text], outputs=[grpcclient.InferRequestedOutput(n) for n in
                                                          ("embedding_int8", "embedding_ubinary")])
    assert np.array_equal(np.array(table.column("embedding_int8").to_pylist()), direct.as_numpy("embedding_int8"))
    assert np.array_equal(np.array(table.column("embedding_ubinary").to_pylist()),
                          direct.as_numpy("embedding_ubinary"))
    run_command(tmp_path / "c.txt", tmp_path / "v.npy", server, "--outputs", "ubinary")
    assert np.array_equal(np.load(tmp_path / "v.npy"), direct.as_numpy("embedding_ubinary"))
    assert len(open(tmp_path / "v.ids.jsonl").read().splitlines()) == 30


def test_blank_lines_repeated_and_mixed_ids_through_the_server(server, tmp_path):
    """Blank lines skipped, a repeated id listed once as a reject naming its first row, 6 and "6" both embedded and
    apart in the id column (JSON text), the summary counting the duplicates; --duplicates fail refuses the job."""
    texts = distinct_texts(5)
    records = [{"id": 6, "text": texts[0]}, {"id": "6", "text": texts[1]}, {"id": "a", "text": texts[2]},
               {"id": "a", "text": texts[3]}, {"id": 7, "text": texts[4]}]
    corpus_lines(tmp_path / "c.jsonl", records, blank_after=(1,))
    log = run_command(tmp_path / "c.jsonl", tmp_path / "o.parquet", server, "--window", "3")
    assert "embed: done: 4 rows in" in log and "1 rejected (1 duplicate ids; listed in" in log, log
    assert "ids mix integers and strings" in log
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column("id").to_pylist() == ["6", '"6"', '"a"', "7"] and store.ids_of(table) == [6, "6", "a", 7]
    vectors = np.array(table.column("embedding").to_pylist(), np.float32)
    assert float(np.dot(vectors[0], vectors[1])) < 0.999  # two texts, not one written twice
    (reject,) = map(json.loads, open(tmp_path / "o.rejects.jsonl"))
    assert reject == {"row": 4, "id": "a", "kind": "duplicate_id",
                      "problem": 'id "a" repeats row 3 (line 4): its first row is kept'}
    result = subprocess.run(command(tmp_path / "c.jsonl", tmp_path / "f.parquet", server, "--duplicates", "fail"),
                            cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.startswith('embed: duplicate id "a": row 4 (line 5)'), \
        result.stderr
    assert not (tmp_path / "f.parquet").exists() and not (tmp_path / "f.parquet.parts").exists()


def test_a_flag_the_export_does_not_serve_stops_the_job_with_one_line(server, tmp_path):
    write_corpus(tmp_path / "c.jsonl", ["a text"])
    result = subprocess.run(command(tmp_path / "c.jsonl", tmp_path / "o.parquet", server, "--outputs", "sparse"),
                            cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "has no output sparse_indices" in result.stderr
    result = subprocess.run(command(tmp_path / "c.jsonl", tmp_path / "o.parquet", server, "--dimensions", "77"),
                            cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "dimensions 77 is not served" in result.stderr


def test_make_embed_as_the_readme_runs_it(server, tmp_path):
    write_corpus(tmp_path / "passages.jsonl", distinct_texts(40))
    result = subprocess.run(["make", "-s", "embed", f"INPUT={tmp_path / 'passages.jsonl'}",
                             f"OUTPUT={tmp_path / 'vectors.parquet'}", f"REPOSITORY={server.repository}",
                             f"GRPC_PORT={server.grpc_port}"], cwd=PROJECT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "embed: done: 40 rows" in result.stderr
    table = pq.read_table(tmp_path / "vectors.parquet")
    assert table.column("id").to_pylist() == [f"d{i}" for i in range(40)] and table.num_rows == 40


# ---------------------------------------------------------------- one writer per output, and the file read back
def test_an_output_is_locked_by_its_living_job_and_freed_by_its_death(tmp_path):
    """OUTPUT.lock: a second lock on the same output refuses naming the holder's PID; once the holder is gone
    (released, or its process killed: the kernel drops the lock) the next one takes it."""
    output = str(tmp_path / "out.parquet")
    first = OutputLock(output).acquire()
    with pytest.raises(SystemExit, match=rf"being written by another embed job \(PID {os.getpid()}\)"):
        OutputLock(output).acquire()
    first.release()
    assert not os.path.exists(output + ".lock")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from bulk_embed.lock import OutputLock; "
                               f"OutputLock({output!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              cwd=PROJECT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match=rf"\(PID {holder.pid}\)"):
            OutputLock(output).acquire()
    finally:
        holder.kill()
        holder.wait()
    OutputLock(output).acquire().release()  # the killed holder's lock died with it


def test_an_output_that_does_not_account_for_the_corpus_fails_the_job(tmp_path):
    """The finished files are read back: rows + rejects must be the corpus's rows, each row's id distinct; a file
    missing rows (what another writer's rename left in the issue) or repeating an id exits 1 with the figures."""
    import argparse

    write_corpus(tmp_path / "c.jsonl", [f"text {i}" for i in range(10)])
    args = argparse.Namespace(output=str(tmp_path / "out.parquet"), output_format="parquet",
                              input=str(tmp_path / "c.jsonl"), format="jsonl", id_field="id", text_field="text")
    work = argparse.Namespace(rejects_path=str(tmp_path / "out.rejects.jsonl"))
    table = pa.table({"id": [f"d{i}" for i in range(10)], "embedding": [[0.5, 0.5]] * 10})
    pq.write_table(table, args.output)
    assert check_output(args, work).startswith("10 rows in")
    pq.write_table(table.slice(4), args.output)
    with pytest.raises(SystemExit, match="does not account for the corpus: 6 rows in .* = 6, the corpus holds 10"):
        check_output(args, work)
    (tmp_path / "out.rejects.jsonl").write_text("".join(json.dumps({"row": i}) + "\n" for i in range(4)))
    assert check_output(args, work).startswith("6 rows in")  # the 4 missing rows are rejects: it adds up
    pq.write_table(pa.table({"id": ["d0"] * 6, "embedding": [[0.5, 0.5]] * 6}), args.output)
    with pytest.raises(SystemExit, match="1 distinct ids over 6 rows"):
        check_output(args, work)


def test_two_make_embed_on_one_output_the_second_refuses_and_the_file_holds_every_id(server, tmp_path):
    """The issue's case: `make embed` started, its make killed (not the job), then the same command again: the
    second refuses in one line naming the running job's PID and exits non-zero, writing nothing; the first
    finishes with every id, checked by reading its file back."""
    texts = distinct_texts(1200)
    write_corpus(tmp_path / "c.jsonl", texts)
    output, parts = tmp_path / "vectors.parquet", tmp_path / "vectors.parquet.parts"
    make = ["make", "-s", "embed", f"INPUT={tmp_path / 'c.jsonl'}", f"OUTPUT={output}",
            f"REPOSITORY={server.repository}", f"GRPC_PORT={server.grpc_port}", "EMBED_ARGS=--window 50"]
    first = subprocess.Popen(make, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (parts.exists() and any(p.endswith(".parquet")
                                                                      for p in os.listdir(parts))):
        time.sleep(0.05)
    with open(f"{output}.lock", encoding="utf-8") as handle:
        job_pid = int(handle.read())
    assert job_pid != first.pid  # the job, make's child, holds it
    first.kill()  # make alone: its job goes on
    first.wait()
    second = subprocess.run(make, cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert second.returncode != 0
    assert f"being written by another embed job (PID {job_pid})" in second.stderr.strip().splitlines()[-2]
    while os.path.exists(f"/proc/{job_pid}") and time.monotonic() < deadline + 300:
        time.sleep(0.1)
    table = pq.read_table(output)
    assert table.column("id").to_pylist() == [f"d{i}" for i in range(len(texts))]
    assert not parts.exists() and not os.path.exists(f"{output}.lock")


# ---------------------------------------------------------------- OpenAI's batch files (issue 70 item 3)
def batch_line(custom_id, url, body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_a_batch_file_naming_a_custom_id_twice_is_refused_before_any_request(tmp_path):
    (tmp_path / "b.jsonl").write_text("\n".join([batch_line("a", "/v1/embeddings", {"input": "x"}),
                                                 batch_line("b", "/v1/embeddings", {"input": "y"}),
                                                 batch_line("a", "/v1/embeddings", {"input": "z"})]) + "\n")
    result = subprocess.run([sys.executable, "-m", "bulk_embed", str(tmp_path / "b.jsonl"), str(tmp_path / "o.jsonl"),
                             "--http", "http://127.0.0.1:1"], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr == "embed: custom_id 'a' on line 3 repeats line 1: a batch file " \
                                                       "names each request once\n", result.stderr
    assert os.listdir(tmp_path) == ["b.jsonl"]  # no lock, no partial answers: nothing was started


def test_openai_batch_files_through_the_http_front_killed_and_resumed(ce_server, tmp_path):
    """OpenAI's batch input (custom_id, method, url, body) for /v1/embeddings and /v1/rerank on named exports beside
    the default: one output line per request in input order, the server's own answers (a refused request keeps its
    400 and error body), lines that are no request as BatchError objects, read back with the openai SDK's types;
    killed with SIGKILL mid-way, a second job on the same output refused while the first runs, and resumed: each
    custom_id answered once, equal to the same requests sent one by one."""
    from openai.types import BatchError, CreateEmbeddingResponse

    texts = distinct_texts(90)
    lines = [batch_line("rerank", "/v1/rerank", {"model": "rerank-v3.5", "query": "capital of France",
                                                 "documents": ["Paris is the capital of France.", "Bananas."]}),
             batch_line("empty", "/v1/embeddings", {"model": "emb", "input": ""}),
             "{not json", "",
             batch_line("chat", "/v1/chat/completions", {"model": "emb", "messages": []}),
             batch_line("b64", "/v1/embeddings", {"input": texts[:3], "encoding_format": "float"})]
    lines += [batch_line(f"e{i}", "/v1/embeddings", {"model": "text-embedding-3-small", "input": text})
              for i, text in enumerate(texts)]
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    output, partial = tmp_path / "answers.jsonl", tmp_path / "answers.jsonl.partial"
    run = [sys.executable, "-m", "bulk_embed", str(tmp_path / "b.jsonl"), str(output), "--http", ce_server.proxy_url,
           "--in-flight", "1"]
    process = subprocess.Popen(run, cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, killed, second = time.monotonic() + 120, False, None
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and partial.read_bytes().count(b"\n") >= 8:
            process.send_signal(signal.SIGSTOP)  # mid-way, holding its output: a second job is refused, then kill -9
            second = subprocess.run(run, cwd=PROJECT, capture_output=True, text=True, timeout=60)
            process.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.02)
    process.wait()
    assert killed, "the batch job ended before it could be killed"
    assert second.returncode == 1 and "being written by another embed job" in second.stderr, second.stderr
    assert not output.exists()
    log = run_command(tmp_path / "b.jsonl", output, ce_server, "--http", ce_server.proxy_url)
    before = int(log.split(" answered before")[0].rsplit(", ", 1)[1])
    assert 8 <= before < len(lines) - 1, log  # the resume sent only what was not answered
    assert f"embed: done: {len(lines) - 1} answers" in log, log

    answers = [json.loads(line) for line in output.read_text().splitlines()]
    assert [a["custom_id"] for a in answers] == ["rerank", "empty", None, "chat", "b64", *(f"e{i}" for i in
                                                                                           range(len(texts)))]
    assert [a["id"] for a in answers] == [f"batch_req_{n}" for n in (1, 2, 3, 5, 6, *range(7, 7 + len(texts)))]
    by_id = {a["custom_id"]: a for a in answers}
    for bad in (answers[2], by_id["chat"]):
        assert bad["response"] is None
        error = BatchError.model_validate(bad["error"])
        assert error.code == "invalid_request" and error.line in (3, 5)
    assert "/v1/chat/completions" in by_id["chat"]["error"]["message"]
    refused = by_id["empty"]["response"]
    assert refused["status_code"] == 400 and by_id["empty"]["error"] is None
    assert refused["body"]["error"]["message"]  # the front's own error answer, kept
    with urllib.request.urlopen(urllib.request.Request(
            ce_server.proxy_url + "/v1/rerank", data=json.dumps({"model": "rerank-v3.5", "query": "capital of France",
                                                                 "documents": ["Paris is the capital of France.",
                                                                               "Bananas."]}).encode(),
            headers={"Content-Type": "application/json"})) as response:
        direct = json.load(response)
    assert by_id["rerank"]["response"]["status_code"] == 200
    assert by_id["rerank"]["response"]["body"]["results"] == direct["results"]
    for i in (0, 45, len(texts) - 1):
        answer = by_id[f"e{i}"]["response"]
        assert answer["status_code"] == 200 and answer["request_id"].startswith("req_")
        got = CreateEmbeddingResponse.model_validate(answer["body"])
        with urllib.request.urlopen(urllib.request.Request(
                ce_server.proxy_url + "/v1/embeddings", data=json.dumps({"model": "text-embedding-3-small",
                                                                         "input": texts[i]}).encode(),
                headers={"Content-Type": "application/json"})) as response:
            want = json.load(response)["data"][0]["embedding"]
        assert got.data[0].embedding == want
    assert len(CreateEmbeddingResponse.model_validate(by_id["b64"]["response"]["body"]).data) == 3
    assert sorted(os.listdir(tmp_path)) == ["answers.jsonl", "b.jsonl"]  # no partial, no lock left
