"""`python -m bench.run --short` (the CI mode of the benchmark harness) runs end to end and produces numbers.

No timing assertions: this machine is shared and slow; the test only checks that every stage measured something.
"""
import json
import os
import subprocess
import sys

from conftest import PROJECT


def test_short_benchmark_produces_report(minilm_repository, tmp_path):
    output, work = tmp_path / "out", tmp_path / "work"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--short", "--repository", str(minilm_repository),
         "--output", str(output), "--work-dir", str(work)],
        cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    report = (output / "benchmarks.md").read_text()
    for heading in ("## Targets", "## Best throughput of each system", "## Every concurrency level",
                    "## Padding efficiency", "## onnxruntime ceiling sweep", "## Machine, versions, settings"):
        assert heading in report
    for png in ("bench_throughput.png", "bench_p99_latency.png"):
        data = (output / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    run = json.loads((work / "results.json").read_text())
    assert run["ceiling"]["texts_per_s"] > 0 and run["ceiling"]["tokens_per_s"] > 0
    assert run["corpus"]["queries"] > 0 and run["corpus"]["passages"] > 0
    systems = {"ensemble", "client_tokenization", "pytorch_baseline"}
    if os.path.exists(os.path.join(str(minilm_repository), "proxy", "config.pbtxt")):
        systems.add("proxy_http")
    for system in systems:
        rows = run["results"][system]
        assert set(rows) == {"1", "8"}, (system, rows.keys())
        for row in rows.values():
            assert row["texts_per_s"] > 0
            assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
    ensemble = run["results"]["ensemble"]["8"]["stats"]["embedding"]
    assert ensemble["execution_count"] > 0 and ensemble["mean_batch"] >= 1
    assert 0 < run["probe"]["padding_efficiency"] <= 1
