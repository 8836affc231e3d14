"""`python -m local_triton.launch` (what `make serve` runs): ready on the given ports, clean stop on SIGTERM."""
import os
import signal
import subprocess
import sys
import time
import urllib.request

from conftest import PROJECT, free_port, port_is_free


def test_launcher_serves_and_stops_cleanly_on_sigterm(minilm_repository, tmp_path):
    http_port, grpc_port, metrics_port, proxy_port = (free_port() for _ in range(4))
    log = open(tmp_path / "launch.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "local_triton.launch", "--model-repository", str(minilm_repository),
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)],
        cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PROXY_PORT": str(proxy_port)})
    try:
        deadline = time.monotonic() + 180
        while "tritonserver ready" not in (tmp_path / "launch.log").read_text():
            assert process.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "launcher never reported ready"
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/ensemble/ready") as response:
            assert response.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            assert b"nv_inference_count" in response.read()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    output = (tmp_path / "launch.log").read_text()
    assert "draining (new work refused, admitted work finishes)" in output and "launch: stopped\n" in output
    # Every port is released, the proxy's included (no stray server thread or child process).
    assert all(port_is_free(p) for p in (http_port, grpc_port, metrics_port, proxy_port)), output[-3000:]
