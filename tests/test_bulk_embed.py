"""Bulk embedding (`make embed`, python -m bulk_embed): readers, request planning, retries and rejects, parts and
resuming (unit, with a fake door), then the real command against the real server: killed twice with SIGKILL and
resumed, against a one-shot run; rejects with their ids; both doors on a named export beside others; output types."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tritonclient.grpc as grpcclient

from bulk_embed import corpus, job, store
from bulk_embed.__main__ import bls_model
from bulk_embed.doors import KINDS, Answer, JobError, Limits, Refused, Retry, failure, rows_of
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
    """Vectors from the text's bytes; refuses empty texts (as the tokenizer does) and can fail on cue."""

    def __init__(self, overloaded=0, internal=0, crash_after=None):
        self.overloaded, self.internal, self.crash_after, self.calls = overloaded, internal, crash_after, 0

    def embed(self, texts):
        self.calls += 1
        if self.crash_after is not None and self.calls > self.crash_after:
            raise JobError("the server went away for good")
        if self.overloaded:
            self.overloaded -= 1
            raise Retry("overloaded: queue full", after_s=0.25)
        if self.internal:
            self.internal -= 1
            raise Retry("internal: stub restarting")
        for i, text in enumerate(texts):
            if not text:
                raise Refused(i, "invalid_input", "is empty")
        vectors = [np.frombuffer((t * 8)[:8].ljust(8, b"."), np.uint8).astype(np.float32) for t in texts]
        return Answer({"embedding": vectors}, np.array([len(t) > 50 for t in texts]), sum(map(len, texts)))


def rows_of_texts(texts):
    return [corpus.Row(i, f"id{i}", t) for i, t in enumerate(texts)]


def test_send_rejects_refused_texts_and_sends_the_rest(monkeypatch):
    monkeypatch.setattr(job.time, "sleep", lambda s: None)
    answered, rejects, _ = job.send(FakeDoor(), rows_of_texts([b"a", b"", b"c", b""]), True, 60)
    assert [a[1] for a in answered] == ["id0", "id2"]
    assert [(r["row"], r["id"], r["kind"]) for r in rejects] == [(1, "id1", "invalid_input"),
                                                                 (3, "id3", "invalid_input")]
    answered, rejects, _ = job.send(FakeDoor(), rows_of_texts([b"x" * 60, b"short"]), False, 60)
    assert [a[1] for a in answered] == ["id1"] and rejects[0]["kind"] == "too_long"


def test_send_waits_out_overload_with_retry_after_and_gives_up_on_a_fault(monkeypatch):
    slept = []
    monkeypatch.setattr(job.time, "sleep", slept.append)
    answered, _, _ = job.send(FakeDoor(overloaded=3), rows_of_texts([b"a"]), True, 60)
    assert len(answered) == 1 and slept == [0.25, 0.25, 0.25]
    slept.clear()
    job.send(FakeDoor(internal=2), rows_of_texts([b"a"]), True, 60)
    assert slept == [0.5, 1.0]  # backoff when the server says no Retry-After
    with pytest.raises(JobError, match="gave up"):
        job.send(FakeDoor(internal=job.INTERNAL_RETRIES + 1), rows_of_texts([b"a"]), True, 600)
    with pytest.raises(JobError, match="gave up"):
        job.send(FakeDoor(overloaded=100), rows_of_texts([b"a"]), True, 1.0)


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
    values = {"window": 10, "in_flight": 2, "truncate": True, "max_wait": 5.0, "output_format": "parquet", **changes}
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
        assert set(rejects) == {"empty", 2, "long", "no-text"}  # a line that is not JSON has its row number
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
