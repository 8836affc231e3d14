"""The bench's other scripts run end to end and produce numbers, each on its own export and server: bench/gpu.py's
pipeline on CPU, the storage study, the overload, fairness and tail scripts, CLIP images and the model families.
Apart from tests/test_bench.py (make bench's own run) so that pytest-xdist's workers run the two halves side by side.

No timing assertions: this machine is shared and slow; the tests only check that every stage measured something.
"""
import json
import os
import subprocess
import sys

from conftest import PROJECT, pbtxt


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
    """bench/studies/storage.py end to end on 25 queries and 150 passages (from two packages' docstrings) at two
    widths: the
    export with a Matryoshka width, the server, every output, recall and bytes per option, the serving-cost rounds,
    the table and the plot."""
    work, output = tmp_path / "work", tmp_path / "out"
    packages = ("sentence_transformers", "datasets")  # two of the PACKAGES: quick to read
    result = subprocess.run(
        [sys.executable, "-m", "bench.studies.storage", "--queries", "25", "--passages", "150", "--widths", "384,64",
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


def test_overload_script_measures_every_route(minilm_repository, tmp_path):
    """bench/overload.py with 2 and 7 clients for 4 seconds each on 100 queries and 50 passages of the corpus the gate
    was not tuned on (issue 69: mixed-lengths), every route (the heavy /similarity and large rerank too, 12 passages
    each), the /v1/embeddings requests through the OpenAI SDK, each level beside a background load of one niced busy
    process: every light route answered and a heavy one at least, vectors and scores checked, the load's share and
    the table and the targets printed. One --edit proves the bounds can be changed on the scratch copy."""
    routes = ("proxy_queries", "proxy_passages", "proxy_rerank", "kserve_query", "kserve_batch", "proxy_similarity",
              "proxy_rerank_large")
    result = subprocess.run(
        [sys.executable, "-m", "bench.overload", "--repository", str(minilm_repository), "--clients", "2,7",
         "--seconds", "4", "--queries", "100", "--passages", "50", "--short", "--output", str(tmp_path), "--edit",
         "ensemble_bls:dynamic_batching { default_queue_policy { max_queue_size: 200 } }", "--corpus",
         "mixed-lengths", "--routes", ",".join(routes), "--heavy-texts", "12", "--client", "openai",
         "--background-load", "--background-procs", "1"],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert pbtxt.max_queue_size(pbtxt.read(tmp_path / "repository" / "ensemble_bls" / "config.pbtxt")) == 200
    rows = json.loads((tmp_path / "overload.json").read_text())
    assert [row["clients"] for row in rows] == [2, 7]
    for row in rows:
        assert row["goodput_texts_s"] > 0 and row["misrouted"] == 0 and not row["errors"], row
        assert not row["declined"], row  # nothing this small is declined up front
        assert row["rss_mb"][0] > 100 and row["shm_mb"][0] > 0, row  # the server's own footprint was read
        load = row["background"]  # what the busy process got, and it is gone
        assert load["procs"] == 1 and load["niceness_read"] == [10] and load["cpu_cores"] > 0, load
        assert not any(os.path.exists(f"/proc/{pid}") for pid in load["pids"]), load
    assert list(rows[-1]["per_route_p99_ms"]) == list(routes)
    # 7 clients, one per route: every light route answered. The two heavy routes' clients compete for heavy work, run
    # one request at a time until its rate is measured (issue 69): one may be refused (429) throughout a short level
    # while the other loops, so one of them at least is answered, and the other refused, never failed.
    last = rows[-1]
    heavy = ("proxy_similarity", "proxy_rerank_large")
    assert all(p99 > 0 for route, p99 in last["per_route_p99_ms"].items() if route not in heavy), last
    assert any(last["per_route_p99_ms"][route] > 0 for route in heavy), last
    assert all(last["per_route_p99_ms"][route] > 0 or last["per_route_refused"][route][0] > 0 for route in heavy), last
    assert rows[0]["setup"]["corpus"] == "mixed-lengths" and "OpenAI SDK" in rows[0]["setup"]["client"]
    assert "0 misrouted" in result.stdout and "| clients |" in result.stdout
    assert "background load: 1 busy Python process at nice 10" in result.stdout


def test_fairness_script_counts_light_and_heavy_answers(minilm_repository, tmp_path):
    """bench/fairness.py (issue 69) on a tiny scale: two clients looping a /similarity of 20 sentences of 10 words
    beside a 1-text /v1/embeddings every 0.5 s for 3 s: every answer counted by status, the heavy scores checked, the
    table and the three targets printed."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.fairness", "--repository", str(minilm_repository), "--seconds", "3",
         "--heavy-clients", "2", "--heavy-sentences", "20", "--heavy-words", "10", "--light-every", "0.5",
         "--warmup-s", "1", "--heavy-lead-s", "0.5", "--short", "--output", str(tmp_path)],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads((tmp_path / "fairness.json").read_text())
    light, heavy = run["light"], run["heavy"]
    assert light["requests"] >= 4 and light["served"] + light["refused"] == light["requests"], light
    assert not light["errors"] and not light["client_timeouts"] and not light["timeouts_504"], light
    assert heavy["served"] >= 1 and heavy["bad_answers"] == 0 and not heavy["errors"], heavy
    assert heavy["served"] + heavy["refused_up_front"] + heavy["timeouts_504"] == heavy["requests"], heavy
    assert len(heavy["served_per_client"]) == 2 and run["setup"]["background"] is None
    assert set(run["checks"]) == {"light >= 95 % served", "light p95 <= 3 s",
                                  "heavy: 0 HTTP 504 and no client timeout (each served or refused up front)"}
    assert "| light: 1-text `/v1/embeddings` every 0.5 s |" in result.stdout
    assert "| heavy: 2 × `/similarity` of 20 × 10 words |" in result.stdout and "light p95 <= 3 s" in result.stdout


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
    and the section put into a benchmarks.md once however often it runs; beside them inference-free SPLADE's query
    path (no encoder run) against its document path, and MUVERA on a ColBERT export against exact MaxSim, same
    run."""
    work = tmp_path / "work"
    result = subprocess.run([sys.executable, "-m", "bench.families", "--short", "--work-dir", str(work)],
                            cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for model in ("qwen3", "static", "neural-sparse", "colbert"):  # every export in the one repository served
        assert (work / "repository" / f"{model}_bls" / "config.pbtxt").exists()
    run = json.loads((work / "results.json").read_text())
    assert {(r["model"], r["workload"]) for r in run["rows"]} == {
        (model, workload) for model in ("qwen3", "static") for workload in ("queries", "passages")}
    for row in run["rows"]:
        assert row["ceiling"]["texts_per_s"] > 0 and row["texts_per_s"] > 0, row
        assert row["ratio"] == row["texts_per_s"] / row["ceiling"]["texts_per_s"]
        assert row["texts_per_s"] == max(level["texts_per_s"] for level in row["levels"].values())
    assert "families: qwen3 passages: served" in result.stdout and "| model | workload |" in result.stdout
    sides = run["sparse"]["sides"]
    assert sides["query"]["encoder_runs"] == 0 < sides["document"]["encoder_runs"], sides
    assert sides["query"]["texts_per_s"] > 0 and sides["document"]["texts_per_s"] > 0
    assert "families: neural-sparse queries: query path" in result.stdout
    muvera = run["muvera"]  # issue 70: MUVERA's quality against exact MaxSim, and its cost, on the ColBERT export
    assert 0 <= muvera["recall_at_10"] <= muvera["recall_at_top"] <= 1 and muvera["width"] == 10240, muvera
    assert muvera["maxsim_ms_per_query"] > 0 and muvera["muvera_ms_per_query"] > 0 and muvera["served_ratio"] > 0
    assert "families: MUVERA on colbert" in result.stdout

    from bench import families

    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\n## CLIP images\n\nrows\n\n## onnxruntime ceiling sweeps\n\nsweeps\n")
    families.update_docs(run, str(report))
    families.update_docs(run, str(report))  # a second run replaces the section, never adds one
    text = report.read_text()
    heading = "## Model families: a decoder embedder and a static embedder"
    assert text.count(heading) == 1 and text.index("## CLIP images") < text.index(heading) < text.index(
        "## onnxruntime ceiling sweeps")
