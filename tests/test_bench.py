"""The benchmark harnesses run end to end and produce numbers: `python -m bench.run --short` (make bench's CI mode)
on two workloads, including a client-batched one and the breakdown, and the GPU script's pipeline on CPU.

No timing assertions: this machine is shared and slow; the tests only check that every stage measured something.
"""
import json
import subprocess
import sys

import pytest

from conftest import PROJECT, pbtxt


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


def test_gpu_script_pipeline_runs_on_cpu(tmp_path):
    """bench/gpu.py (for a lent GPU) with a tiny encoder on CPU: its repository (ensemble_bls included), server,
    load (one text and 32 texts per request) and report work, for both arms: the encoder's batches of equal widths
    and ragged batching (bench/gpu_encoders.py's ragged Python-backend encoder)."""
    result = subprocess.run([sys.executable, "-m", "bench.gpu", "--device", "cpu", "--tiny", "--short",
                             "--seconds", "1", "--arms", "widths,ragged", "--work-dir", str(tmp_path)],
                            cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads((tmp_path / "results.json").read_text())
    rows = run["rows"]
    assert run["arms"] == ["widths", "ragged"]
    assert {(r["workload"], r["model"], r["arm"]) for r in rows} == {
        (workload, model, arm) for arm in ("widths", "ragged") for workload, model in (
            ("queries", "ensemble"), ("passages", "ensemble"), ("client-batched", "ensemble_bls"),
            ("client-batched", "ensemble"))}
    assert all(r["texts_per_s"] > 0 and r["errors"] == 0 for r in rows)
    report = (tmp_path / "benchmarks-gpu.md").read_text()
    assert "| queries | ensemble | widths | on | 1 | 16384 |" in report
    assert "| client-batched | ensemble_bls | ragged | on | 1 | 16384 |" in report


def test_storage_benchmark_on_a_slice(tmp_path):
    """bench/storage.py end to end on 25 queries and 150 passages (from two packages' docstrings) at two widths: the
    export with a Matryoshka width, the server, every output, recall and bytes per option, the serving-cost rounds,
    the table and the plot."""
    work, output = tmp_path / "work", tmp_path / "out"
    packages = ("sentence_transformers", "datasets")  # two of the PACKAGES: quick to read
    result = subprocess.run(
        [sys.executable, "-m", "bench.storage", "--queries", "25", "--passages", "150", "--widths", "384,64",
         "--packages", ",".join(packages), "--cost-texts", "32", "--cost-rounds", "1", "--short",
         "--work-dir", str(work), "--output", str(output)],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads((work / "results.json").read_text())
    assert (run["queries"], run["passages"], run["widths"]) == (25, 150, [384, 64])
    assert set(run["sources"]) == set(packages)
    rows = {(r["type"], r["width"], r["similarity"].split()[0]): r for r in run["recall"]}
    assert rows[("float32", 384, "dot")]["recall"] == 1.0  # the reference against itself
    assert all(0 < r["recall"] <= 1 for r in run["recall"])
    for width in (384, 64):
        assert rows[("float32", width, "dot")]["bytes"] == 4 * width
        assert rows[("int8", width, "dot")]["bytes"] == rows[("uint8", width, "dot")]["bytes"] == width
        assert rows[("binary", width, "Hamming")]["bytes"] == width // 8
        # binary is ubinary minus 128: the same bits, the same Hamming distances
        assert rows[("binary", width, "Hamming")]["recall"] == rows[("ubinary", width, "Hamming")]["recall"]
    assert set(run["cost"]) == {"float32@384", "int8@384", "uint8@384", "binary@384", "ubinary@384", "float32@64"}
    assert run["cost"]["float32@384"]["ratio"] == 1.0
    assert all(c["texts_per_s"] > 0 for c in run["cost"].values())
    assert set(run["postprocess_us"]) == set(run["cost"]) and all(t > 0 for t in run["postprocess_us"].values())
    assert "| binary + rescore | 64 | 8 |" in (output / "storage.md").read_text()
    assert "| binary + rescore | 64 | 8 |" in result.stdout
    png = (output / "storage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_storage_corpus_and_scores():
    """The storage corpus is deterministic, distinct, and queries and passages never share a text; Hamming scores
    equal bit counts."""
    import numpy as np

    from bench import storage

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


def test_overload_script_measures_every_route(minilm_repository, tmp_path):
    """bench/overload.py with 2 and 6 clients for 2 seconds each on 100 queries and 50 passages: every route
    answered, its vectors checked, the table and the targets printed. One --edit proves the bounds can be changed on
    the scratch copy."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.overload", "--repository", str(minilm_repository), "--clients", "2,6",
         "--seconds", "2", "--queries", "100", "--passages", "50", "--short", "--output", str(tmp_path), "--edit",
         "ensemble_bls:dynamic_batching { default_queue_policy { max_queue_size: 200 } }"],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert pbtxt.max_queue_size(pbtxt.read(tmp_path / "repository" / "ensemble_bls" / "config.pbtxt")) == 200
    rows = json.loads((tmp_path / "overload.json").read_text())
    assert [row["clients"] for row in rows] == [2, 6]
    for row in rows:
        assert row["goodput_texts_s"] > 0 and row["misrouted"] == 0 and not row["errors"], row
        assert row["rss_mb"][0] > 100 and row["shm_mb"][0] > 0, row  # the server's own footprint was read
    assert all(p99 > 0 for p99 in rows[-1]["per_route_p99_ms"].values()), rows[-1]  # 6 clients: every route
    assert "0 misrouted" in result.stdout and "| clients |" in result.stdout


def test_tail_script_measures_every_door_with_another_export_loaded(minilm_repository, tiny_xlmr_dir, tmp_path):
    """bench/tail.py (make bench's step 12) with a tiny XLM-R exported beside MiniLM and loaded: each door read at
    two levels, every reading's p99/p50, the table and the target's verdict printed."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.tail", "--repository", str(minilm_repository), "--extra", f"m3={tiny_xlmr_dir}",
         "--rounds", "1", "--seconds", "1", "--levels", "2,4", "--short", "--work-dir", str(tmp_path)],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "repository" / "m3" / "config.pbtxt").exists()  # exported beside the default export
    run = json.loads((tmp_path / "results.json").read_text())
    assert run["extras"] == ["m3"] and len(run["rounds"]) == 1
    rows = run["rounds"][0]
    assert sorted((r["door"], r["level"]) for r in rows) == sorted(
        (door, level) for door in ("kserve_http", "grpc", "proxy_http") for level in (2, 4))
    assert all(r["requests_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows), rows
    assert all(r["ratio"] == r["p99_ms"] / r["p50_ms"] for r in rows)
    assert run["met"] == all(r["ratio"] <= 3 for r in rows if r["door"] == "kserve_http")
    assert "| Round | Connections |" in result.stdout
    assert "tail: KServe HTTP p99/p50 at most" in result.stdout and "with m3 loaded" in result.stdout


def test_images_benchmark_smoke(tmp_path):
    """bench/images.py --short on open_clip ViT-S-32 (the smaller tower): the export, the in-process preprocessing
    and ceiling, the served image ensemble at every level, the retrieval sanity against open_clip, the table, and
    the section put into a benchmarks.md. No timing thresholds: ratios and shares are positive numbers."""
    work = tmp_path / "work"
    result = subprocess.run([sys.executable, "-m", "bench.images", "--short", "--architecture", "ViT-S-32",
                             "--work-dir", str(work)], cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads((work / "results.json").read_text())
    ceiling = run["ceiling"]
    assert ceiling["images_per_s"] > 0 and ceiling["best_batch"] in (1, 2, 4, 8, 16)
    assert set(run["served"]) == {"1x1", "1x4", "8x1", "8x4"}
    for row in run["served"].values():
        assert row["images_per_s"] > 0 and row["ratio"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"], row
    assert set(run["preprocess"]) == {"256", "1024"}
    for size in run["preprocess"].values():
        assert size["preprocess_ms"] > 0 and 0 < size["share"] < 1, size
    sanity = run["retrieval"]
    assert sanity["texts"] == 8 and sanity["identical"] and sanity["max_abs_score_difference"] < 1e-3, sanity
    assert "| Images per request | In flight |" in result.stdout and "8/8 identical rankings" in result.stdout

    from bench import images

    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\n## Cross-encoder reranking\n\nrows\n\n## onnxruntime ceiling sweeps\n\nsweeps\n")
    images.update_docs(run, str(report))
    images.update_docs(run, str(report))  # a second run replaces the section, never adds one
    text = report.read_text()
    assert text.count("## CLIP images") == 1 and text.index("## CLIP images") < text.index("## onnxruntime ceiling")
    assert "identical rank order" in text and "## Cross-encoder reranking\n\nrows" in text


def test_families_benchmark_smoke(tmp_path):
    """bench/families.py --short (make bench's step 14): the builder's tiny decoder and the 1024-wide static embedder
    exported by name into one repository, a ceiling and a served reading per model and workload, the ratios printed,
    and the section put into a benchmarks.md once however often it runs."""
    work = tmp_path / "work"
    result = subprocess.run([sys.executable, "-m", "bench.families", "--short", "--work-dir", str(work)],
                            cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for model in ("qwen3", "static"):  # both exports in the one repository that was served
        assert (work / "repository" / f"{model}_bls" / "config.pbtxt").exists()
    run = json.loads((work / "results.json").read_text())
    assert {(r["model"], r["workload"]) for r in run["rows"]} == {
        (model, workload) for model in ("qwen3", "static") for workload in ("queries", "passages")}
    for row in run["rows"]:
        assert row["ceiling"]["texts_per_s"] > 0 and row["texts_per_s"] > 0, row
        assert row["ratio"] == row["texts_per_s"] / row["ceiling"]["texts_per_s"]
        assert row["texts_per_s"] == max(level["texts_per_s"] for level in row["levels"].values())
    assert "families: qwen3 passages: served" in result.stdout and "| model | workload |" in result.stdout

    from bench import families

    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\n## CLIP images\n\nrows\n\n## onnxruntime ceiling sweeps\n\nsweeps\n")
    families.update_docs(run, str(report))
    families.update_docs(run, str(report))  # a second run replaces the section, never adds one
    text = report.read_text()
    heading = "## Model families: a decoder embedder and a static embedder"
    assert text.count(heading) == 1 and text.index("## CLIP images") < text.index(heading) < text.index(
        "## onnxruntime ceiling sweeps")


def test_proxy_app_benchmark_measures_both_apps():
    """bench/proxy_app.py: every workload answered as expected by both apps (it exits otherwise) and a ratio each,
    with an idle gap before each request."""
    result = subprocess.run([sys.executable, "-m", "bench.proxy_app", "--requests", "20", "--rounds", "1",
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
