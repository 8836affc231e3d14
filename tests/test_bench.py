"""The benchmark harnesses run end to end and produce numbers: `python -m bench.run --short` (make bench's CI mode)
on two workloads, including a client-batched one and the breakdown, and the GPU script's pipeline on CPU.

No timing assertions: this machine is shared and slow; the tests only check that every stage measured something.
"""
import json
import subprocess
import sys

from conftest import PROJECT


def test_short_benchmark_produces_report(minilm_repository, tmp_path):
    output, work = tmp_path / "out", tmp_path / "work"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--short", "--repository", str(minilm_repository),
         "--workloads", "queries,client-batched", "--concurrency", "1,2", "--min-window-requests", "4",
         "--output", str(output), "--work-dir", str(work)],
        cwd=PROJECT, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Targets (issues 8 and 15)" in result.stdout  # make bench prints the ratios
    assert "serving floor: tiny-model ensemble / echo ensemble" in result.stdout

    report = (output / "benchmarks.md").read_text()
    for heading in ("## Targets", "## Workloads", "## Where one short request's time goes", "## Every level",
                    "## onnxruntime ceiling sweeps", "## Method, machine, settings"):
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
    breakdown = run["breakdown"]
    assert breakdown["requests"] > 10 and all(v >= 0 for v in breakdown["traced"].values())
    assert breakdown["micro"]["onnxruntime"] > 0 and breakdown["micro"]["encode"] > 0
    floor = run["overhead"]  # the serving floor's pair, measured in its own server
    assert floor["ensemble"]["requests_per_s"] > 0 and floor["echo_ensemble"]["requests_per_s"] > 0
    assert floor["ratio"] == floor["ensemble"]["requests_per_s"] / floor["echo_ensemble"]["requests_per_s"]


def test_gpu_script_pipeline_runs_on_cpu(tmp_path):
    """bench/gpu.py (for a lent GPU) with a tiny encoder on CPU: its repository, server, load and report work."""
    result = subprocess.run([sys.executable, "-m", "bench.gpu", "--device", "cpu", "--tiny", "--short",
                             "--seconds", "2", "--work-dir", str(tmp_path)],
                            cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["workload"] for r in rows} == {"queries", "passages"}
    assert all(r["texts_per_s"] > 0 and r["errors"] == 0 for r in rows)
    assert "| queries | on | 1 | 16384 |" in (tmp_path / "benchmarks-gpu.md").read_text()


def test_overload_script_measures_every_route(minilm_repository, tmp_path):
    """bench/overload.py with 2 and 6 clients for a few seconds: every route answered, its vectors checked, the
    table and the targets printed. One --edit proves the bounds can be changed on the scratch copy."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.overload", "--repository", str(minilm_repository), "--clients", "2,6",
         "--seconds", "4", "--output", str(tmp_path), "--edit",
         "ensemble_bls:max_queue_size: 256=>max_queue_size: 200"],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "max_queue_size: 200" in (tmp_path / "repository" / "ensemble_bls" / "config.pbtxt").read_text()
    rows = json.loads((tmp_path / "overload.json").read_text())
    assert [row["clients"] for row in rows] == [2, 6]
    for row in rows:
        assert row["goodput_texts_s"] > 0 and row["misrouted"] == 0 and not row["errors"], row
        assert row["rss_mb"][0] > 100 and row["shm_mb"][0] > 0, row  # the server's own footprint was read
    assert all(p99 > 0 for p99 in rows[-1]["per_route_p99_ms"].values()), rows[-1]  # 6 clients: every route
    assert "0 misrouted" in result.stdout and "| clients |" in result.stdout
