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


def test_load_models_star_skips_the_default_exports_unexported_folders(tmp_path):
    """LOAD_MODELS=* (the default): a repository with only named exports (a CLIP one, say) serves them; the default
    export's folders, templates and code until something is exported into them, are not asked for. Once the default
    export is there, they are."""
    from local_triton import launch

    for folder in (*launch.DEFAULT_EXPORT_FOLDERS, "proxy", "supervisor", "clip", "clip_image", "clip_tokenizer"):
        (tmp_path / folder / "1").mkdir(parents=True)
    (tmp_path / "clip" / "1" / "export.json").write_text('{"name": "clip", "image_model": "clip_image"}')
    command = launch.server_command(str(tmp_path), 1, 2, 3, env={})
    loaded = {arg.split("=", 1)[1] for arg in command if arg.startswith("--load-model=")}
    assert loaded == {"clip", "clip_image", "clip_tokenizer", "proxy", "supervisor"}
    (tmp_path / "tokenizer" / "1" / "tokenizer.json").write_text("{}")  # an exported tokenizer alone loads
    command = launch.server_command(str(tmp_path), 1, 2, 3, env={})
    assert "--load-model=tokenizer" in command and "--load-model=embedding" not in command
    for folder in launch.DEFAULT_EXPORT_FOLDERS[1:]:  # the default export: generated configs everywhere
        (tmp_path / folder / "config.pbtxt").write_text("")
    command = launch.server_command(str(tmp_path), 1, 2, 3, env={})
    loaded = {arg.split("=", 1)[1] for arg in command if arg.startswith("--load-model=")}
    assert set(launch.DEFAULT_EXPORT_FOLDERS) <= loaded
    assert "--load-model=*" in launch.server_command(str(tmp_path / "missing"), env={})
