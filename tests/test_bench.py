"""The benchmark harness runs end to end and produces numbers: `python -m bench.run --short` (make bench's CI mode)
on two workloads, including a client-batched one and the breakdown; the bench's corpora, its app comparison and its
refusal of a stale export. The other scripts (GPU, storage, overload, tail, images, families): test_bench_scripts.py.

No timing assertions: this machine is shared and slow; the tests only check that every stage measured something.
"""
import json
import subprocess
import sys

import pytest

from conftest import PROJECT


def test_short_benchmark_produces_report(minilm_repository, xlmr_repository, tmp_path):
    output, work = tmp_path / "out", tmp_path / "work"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--short", "--repository", str(minilm_repository),
         "--workloads", "queries,client-batched", "--corpus-size", "64", "--concurrency", "1,2",
         # 64 texts: client-batched is 2 requests of 32, each taking a second or more here; windows of one wave of
         # answers measure each stage
         "--min-window-requests", "1",
         "--floor-export", str(xlmr_repository),  # step 7 on the suite's tiny XLM-R export, not one of its own
         "--no-tail",  # step 12: test_tail_script_measures_every_door_with_another_export_loaded
         "--no-families",  # step 14: test_families_benchmark_smoke
         "--no-images", "--output", str(output), "--work-dir", str(work)],  # step 9: test_images_benchmark_smoke
        cwd=PROJECT, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Targets (issues 8 and 15)" in result.stdout  # make bench prints the ratios
    assert "serving floor: tiny-model ensemble / echo ensemble" in result.stdout
    assert "bulk: make embed / onnxruntime ceiling (200 mixed texts)" in result.stdout  # step 11, the bulk command
    assert "bulk: peak RSS at 2400 / 600 rows" in result.stdout

    report = (output / "benchmarks.md").read_text()
    for heading in ("## Targets", "## Workloads", "## Where one short request's time goes", "## Every level",
                    "## onnxruntime ceiling sweeps", "## Method, machine, settings",
                    "## Bulk embedding (`make embed`)"):
        assert heading in report, heading
    assert "stand-in's share" in report
    for png in ("bench_throughput.png", "bench_p99_latency.png"):
        data = (output / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    run = json.loads((work / "results.json").read_text())
    assert set(run["workloads"]) == {"queries", "client-batched"}
    for name, workload in run["workloads"].items():
        assert workload["ceiling"]["texts_per_s"] > 0, name
        rows = workload["results"]["ensemble"]
        assert set(rows) == {"1", "2"}, (name, rows.keys())
        for row in rows.values():
            assert row["texts_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    batched = run["workloads"]["client-batched"]["results"]["ensemble"]["1"]["stats"]["embedding"]
    assert batched["inference_count"] >= 32 * batched["execution_count"] // 2  # 32 texts per request
    assert run["workloads"]["queries"]["results"]["proxy_http"]["1"]["texts_per_s"] > 0
    # the missed targets' breakdowns: ensemble_bls against one request's own groups in-process, and the proxy's
    # added p50 from interleaved rounds against gRPC and against Triton's KServe HTTP with the same client
    grouped = run["workloads"]["client-batched"]["grouped"]
    assert grouped["texts_per_s"] > 0 and 1 <= grouped["rows_per_run"] <= 32 and 0 < grouped["padding_efficiency"] <= 1
    rounds = run["one_in_flight"]
    assert set(rounds) == {"ensemble", "kserve_http", "proxy_http"}
    assert all(r["p50_ms"] > 0 and len(r["rounds"]) == 1 for r in rounds.values())
    assert "in-process on the same requests, each in its own length groups" in result.stdout
    assert "one interleaved round; against Triton's KServe HTTP with the same client" in result.stdout
    breakdown = run["breakdown"]
    assert breakdown["requests"] > 10 and all(v >= 0 for v in breakdown["traced"].values())
    assert breakdown["micro"]["onnxruntime"] > 0 and breakdown["micro"]["encode"] > 0
    floor = run["overhead"]  # the serving floor's pair, measured in its own server
    assert str(xlmr_repository) in floor["model"]
    assert floor["ensemble"]["requests_per_s"] > 0 and floor["echo_ensemble"]["requests_per_s"] > 0
    assert floor["ratio"] == floor["ensemble"]["requests_per_s"] / floor["echo_ensemble"]["requests_per_s"]
    # step 13: with Triton's C++ onnxruntime backend at hand (CI's ONNXRUNTIME_BACKEND), it against the stand-in
    from local_triton import launch

    assert run["onnxruntime_backend"] == launch.describe_onnxruntime_backend()
    if launch.onnxruntime_backend():
        rows = run["backends"]["rows"]
        assert {(r["backend"], r["workload"]) for r in rows} == {
            (backend, workload) for backend in ("stand-in", "triton") for workload in ("queries", "client-batched")}
        assert all(r["texts_per_s"] > 0 and r["cpu_ms_per_text"] > 0 for r in rows), rows
        assert "## The encoder on Triton's C++ onnxruntime backend and on the stand-in" in report
    else:
        assert run["backends"] is None


def test_storage_corpus_and_scores():
    """The storage corpus is deterministic, distinct, and queries and passages never share a text; Hamming scores
    equal bit counts."""
    import numpy as np

    from bench.studies import storage

    packages = ("sentence_transformers", "datasets")  # two of the PACKAGES: quick
    first, again = storage.build_corpus(20, 100, packages=packages), storage.build_corpus(20, 100, packages=packages)
    assert first == again and set(first["sources"]) == set(packages)
    texts = first["queries"] + first["passages"]
    assert len(set(texts)) == len(texts) == 120
    assert all(4 <= len(q.split()) <= 16 for q in first["queries"])
    assert all(5 <= len(p.split()) <= 120 for p in first["passages"])
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, (3, 8), dtype=np.uint8), rng.integers(0, 256, (5, 8), dtype=np.uint8)
    bits = np.array([[bin(int.from_bytes((x ^ y).tobytes(), "big")).count("1") for y in b] for x in a])
    assert np.array_equal(storage.hamming_scores(a, b), -bits)
    assert np.array_equal(storage.hamming_scores((a.astype(np.int16) - 128).astype(np.int8),
                                                 (b.astype(np.int16) - 128).astype(np.int8)), -bits)


def test_multilingual_corpus_is_deterministic_and_mixed(minilm_repository):
    """bench.overload's default corpus: the same texts twice, queries and passages apart, passages within their
    token range, many scripts, and the lone combining mark whose tokens are all special (issue 59: it is embedded)."""
    import os
    import unicodedata

    from bench import corpus

    tokenizer = corpus.load_tokenizer(os.path.join(minilm_repository, "tokenizer", "1", "tokenizer.json"))
    queries, passages = corpus.multilingual(tokenizer, 120, 30, max_length=256)
    assert (queries, passages) == corpus.multilingual(tokenizer, 120, 30, max_length=256)
    assert len(queries) == 120 and len(passages) == 30
    assert not {q["text"] for q in queries} & {p["text"] for p in passages}
    assert all(60 <= p["tokens"] <= 256 for p in passages), [p["tokens"] for p in passages]
    scripts = {unicodedata.name(char).split()[0] for q in queries for char in q["text"] if char.isalpha()}
    assert {"LATIN", "CYRILLIC", "GREEK", "ARABIC", "HEBREW", "DEVANAGARI", "CJK", "HIRAGANA", "HANGUL",
            "THAI"} <= scripts, scripts
    assert "\u064d" in {q["text"] for q in queries}
    assert tokenizer.encode("\u064d").tokens == ["[CLS]", "[SEP]"]  # all special: the case the front once refused


def test_proxy_app_benchmark_measures_both_apps():
    """bench/studies/proxy_app.py: every workload answered as expected by both apps (it exits otherwise) and a ratio
    each,
    with an idle gap before each request."""
    result = subprocess.run([sys.executable, "-m", "bench.studies.proxy_app", "--requests", "20", "--rounds", "1",
                             "--gap-ms", "1"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {line[:26].strip(): line[26:].split() for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {"one query", "8 texts", "rerank, 8 documents", "refused (unknown model)",
                         "seed API, one query", "TEI /, one query"}
    for name, (direct, fastapi, ratio) in rows.items():
        assert float(direct) > 0 and float(fastapi) > 0, name
        assert abs(float(ratio) - float(fastapi) / float(direct)) < 0.05 * float(ratio) + 0.01, name


def test_the_bench_refuses_an_export_made_from_other_templates(tmp_path):
    """`make bench` measures an existing export as it is: one rendered from other config templates or another
    token_budget.c than the checkout's would be measured as if it were today's code (found: a stale
    batchstrategy.so measured after token_budget.c had changed). export.json's digest says which it is."""
    from bench import common

    manifest = tmp_path / "ensemble" / "1" / "export.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"model": "m", "templates": common.templates_digest()}))
    assert common.find_export(str(tmp_path)) == (str(tmp_path), False)
    manifest.write_text(json.dumps({"model": "m", "templates": "0" * 64}))
    with pytest.raises(SystemExit, match="another token_budget.c than this checkout's: export again"):
        common.find_export(str(tmp_path))
