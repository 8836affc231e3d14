"""`python -m local_triton.launch` (what `make serve` runs): ready on the given ports, clean stop on SIGTERM."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import MODEL_PYTHON, PROJECT, free_port, port_is_free, wait_for_launched_proxy

pytestmark = pytest.mark.serial  # `make test` runs it alone: SIGTERM drains within their bounds


def launcher_until_ready(repository, tmp_path, *extra_args, env=None):
    """`python -m local_triton.launch` as `make serve` runs it, logging to tmp_path/launch.log, once it says ready.
    Returns (process, (http, grpc, metrics, proxy) ports)."""
    ports = tuple(free_port() for _ in range(4))
    log = open(tmp_path / "launch.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "local_triton.launch", "--model-repository", str(repository),
         "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), *extra_args],
        cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PROXY_PORT": str(ports[3]),
                                                                **(env or {})})
    deadline = time.monotonic() + 180
    while "tritonserver ready" not in (tmp_path / "launch.log").read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("launcher never reported ready:\n" + (tmp_path / "launch.log").read_text()[-3000:])
        time.sleep(0.5)
    return process, ports


def test_launcher_serves_and_stops_cleanly_on_sigterm(minilm_repository, tmp_path):
    process, (http_port, grpc_port, metrics_port, proxy_port) = launcher_until_ready(minilm_repository, tmp_path)
    try:
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
    from local_triton import server

    for folder in (*server.DEFAULT_EXPORT_FOLDERS, "proxy", "supervisor", "clip", "clip_image", "clip_tokenizer"):
        (tmp_path / folder / "1").mkdir(parents=True)
    (tmp_path / "clip" / "1" / "export.json").write_text('{"name": "clip", "image_model": "clip_image"}')
    command = server.server_command(str(tmp_path), 1, 2, 3, env={})
    loaded = {arg.split("=", 1)[1] for arg in command if arg.startswith("--load-model=")}
    assert loaded == {"clip", "clip_image", "clip_tokenizer", "proxy", "supervisor"}
    (tmp_path / "tokenizer" / "1" / "tokenizer.json").write_text("{}")  # an exported tokenizer alone loads
    command = server.server_command(str(tmp_path), 1, 2, 3, env={})
    assert "--load-model=tokenizer" in command and "--load-model=embedding" not in command
    for folder in server.DEFAULT_EXPORT_FOLDERS[1:]:  # the default export: generated configs everywhere
        (tmp_path / folder / "config.pbtxt").write_text("")
    command = server.server_command(str(tmp_path), 1, 2, 3, env={})
    loaded = {arg.split("=", 1)[1] for arg in command if arg.startswith("--load-model=")}
    assert set(server.DEFAULT_EXPORT_FOLDERS) <= loaded
    assert "--load-model=*" in server.server_command(str(tmp_path / "missing"), env={})


def test_keys_to_files_moves_plain_keys_into_private_files(tmp_path):
    """Issue 16: every Python stub inherits tritonserver's environment, so the launcher hands it the keys as files
    (0600 in a 0700 directory) instead of values; *_FILE settings pass through; the server's cleanup removes them."""
    from local_triton import settings
    from local_triton.process_group import Server
    from model_library.triton_server import secret  # the one reading of the keys: the launcher's and the proxy's

    env = {"API_KEY": "user-key", "ADMIN_API_KEY": "admin-key", "PATH": "/bin"}
    directory = settings.keys_to_files(env)
    try:
        assert set(env) == {"API_KEY_FILE", "ADMIN_API_KEY_FILE", "PATH"} and env["PATH"] == "/bin"
        assert os.stat(directory).st_mode & 0o777 == 0o700
        for name, value in (("API_KEY", "user-key"), ("ADMIN_API_KEY", "admin-key")):
            assert os.path.dirname(env[f"{name}_FILE"]) == directory
            assert os.stat(env[f"{name}_FILE"]).st_mode & 0o777 == 0o600
            assert secret(name, env) == value  # as the proxy reads it
        assert settings.admin_key_for(env) == "admin-key"
    finally:
        Server(None, keys_dir=directory).cleanup()
    assert not os.path.exists(directory)

    mounted = tmp_path / "admin"
    mounted.write_text("from-a-secret\n")
    env = {"ADMIN_API_KEY_FILE": str(mounted), "API_KEY": ""}  # a file already: untouched; empty: unset
    assert settings.keys_to_files(env) is None
    assert env == {"ADMIN_API_KEY_FILE": str(mounted)}
    env = {"API_KEY": "plain wins", "API_KEY_FILE": str(mounted)}  # secret()'s order: the plain value first
    directory = settings.keys_to_files(env)
    try:
        assert set(env) == {"API_KEY_FILE"} and secret("API_KEY", env) == "plain wins"
    finally:
        Server(None, keys_dir=directory).cleanup()


def environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return dict(entry.split(b"=", 1) for entry in handle.read().split(b"\0") if b"=" in entry)


def test_launcher_keeps_the_keys_out_of_the_python_stubs_environment(minilm_repository, tmp_path):
    """Issue 16: API_KEY and ADMIN_API_KEY reach neither tritonserver's environment nor any stub's (the tokenizer's
    included); the proxy reads them from the files and still enforces the key, the launcher's drain still opens
    Triton's restricted repository API, and the files go when the launcher stops."""
    from local_triton import launch

    user_key, admin_key = "stub-leak-user-key", "stub-leak-admin-key"
    http_port, grpc_port, metrics_port, proxy_port = (free_port() for _ in range(4))
    log = open(tmp_path / "launch.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "local_triton.launch", "--model-repository", str(minilm_repository),
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
         "--model-python", MODEL_PYTHON, "--no-restart"],
        cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PROXY_PORT": str(proxy_port), "API_KEY": user_key, "ADMIN_API_KEY": admin_key})
    try:
        wait_for_launched_proxy(process, proxy_port, tmp_path / "launch.log")

        [triton] = [pid for pid, (_, args) in launch.children(process.pid).items() if b"tritonserver" in args[0]]
        stubs = {pid: args[1].decode(errors="replace").split("/")[-3]  # argv[1]: <repository>/<model>/1/model.py
                 for pid, (_, args) in launch.children(triton).items()
                 if any(b"triton_python_backend_stub" in arg for arg in args)}
        assert {"tokenizer", "proxy"} <= set(stubs.values()), stubs
        for pid, who in ((triton, "tritonserver"), *stubs.items()):
            values = environ(pid)
            assert not {b"API_KEY", b"ADMIN_API_KEY"} & set(values), who
            assert not [name for name, value in values.items()
                        if user_key.encode() in value or admin_key.encode() in value], who
        server_env = environ(triton)
        key_files = [server_env[b"API_KEY_FILE"].decode(), server_env[b"ADMIN_API_KEY_FILE"].decode()]
        assert all(os.stat(path).st_mode & 0o777 == 0o600 for path in key_files)
        assert os.stat(os.path.dirname(key_files[0])).st_mode & 0o777 == 0o700

        body = json.dumps({"input": ["hello"]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/v1/embeddings", body,
                                         {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401
        request.add_header("Authorization", f"Bearer {user_key}")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200 and len(json.load(response)["data"][0]["embedding"]) == 384

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0, (tmp_path / "launch.log").read_text()[-3000:]  # 0: the drain ran
    finally:
        if process.poll() is None:
            process.kill()
    assert not os.path.exists(os.path.dirname(key_files[0]))


def test_sigterm_stops_a_rerank_that_would_outlast_the_drain(minilm_repository, tmp_path):
    """Issue 49: a heavy rerank (abandoned, or longer than the exit timeout) kept the models busy past the drain;
    tritonserver then exited with its stubs running (`Fatal Python error: PyThreadState_Get`) and the launcher
    said "not clean". Past half its bound the drain tells the models to start no next piece: the rerank request
    fails ("the server is stopping"), every model unloads, and the launcher exits 0 within the exit timeout."""
    import threading

    import numpy as np
    import tritonclient.grpc as grpcclient

    process, ports = launcher_until_ready(minilm_repository, tmp_path, "--model-python", MODEL_PYTHON,
                                          env={"EXIT_TIMEOUT_S": "30"})
    grpc_port, outcome = ports[1], []
    try:
        words = ["a", "panda", "eats", "bamboo", "in", "the", "quiet", "forest", "while", "the", "fox", "jumps",
                 "over", "the", "lazy", "dog"]
        documents = np.array([" ".join(words[(i + k) % len(words)] for k in range(100)).encode()
                              for i in range(2048)], dtype=np.object_)

        def heavy_rerank():  # no timeout: only the drain can stop it
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            inputs = [grpcclient.InferInput("query", [1], "BYTES"), grpcclient.InferInput("documents", [2048], "BYTES")]
            inputs[0].set_data_from_numpy(np.array([b"a panda"], dtype=np.object_))
            inputs[1].set_data_from_numpy(documents)
            try:
                client.infer("rerank", inputs, client_timeout=120)
                outcome.append("answered")
            except Exception as error:  # noqa: BLE001 - what it says is checked below
                outcome.append(str(error))
            client.close()
        thread = threading.Thread(target=heavy_rerank)
        thread.start()
        time.sleep(2.0)  # its first pieces run
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        stopped_after = time.monotonic() - signalled
        thread.join(30)
    finally:
        if process.poll() is None:
            process.kill()
    output = (tmp_path / "launch.log").read_text()
    print(f"\nstopped after {stopped_after:.1f} s (exit timeout 30 s), code {code}; the rerank: {outcome}")
    assert code == 0 and "launch: stopped\n" in output, output[-3000:]
    assert "start no next piece" in output and "Fatal Python error" not in output, output[-3000:]
    assert outcome and "stopping" in outcome[0], outcome
    assert stopped_after < 30 + 5, output[-3000:]


def test_a_real_onnxruntime_backend_folder_is_laid_out_with_the_server_library_it_needs(tmp_path):
    """ONNXRUNTIME_BACKEND: the backends folder's onnxruntime/ is that folder (the backend finds libonnxruntime
    beside itself), in a backends folder of its own beside the stand-in's, with lib/libtritonserver.so pointing at the
    wheel's renamed server library; a folder without the backend is one line, not a server that fails later."""
    from local_triton import backends as launcher_backends

    folder = tmp_path / "ort"
    folder.mkdir()
    (folder / "libtriton_onnxruntime.so").write_bytes(b"")
    backends = launcher_backends.prepare_backends(backend_dir=str(tmp_path / "backends"), ort_folder=str(folder))
    assert backends.endswith("-ort") and os.path.realpath(os.path.join(backends, "onnxruntime")) == str(folder)
    library = os.path.join(backends, "lib", "libtritonserver.so")
    assert os.path.islink(library) and "nvidia_pytriton.libs/libtritonserver" in os.readlink(library)
    assert os.path.isfile(os.path.join(backends, "python", "libtriton_python.so"))
    stand_in = launcher_backends.prepare_backends(backend_dir=str(tmp_path / "backends"))
    assert os.path.isfile(os.path.join(stand_in, "onnxruntime", "model.py"))  # the stand-in's, untouched
    assert launcher_backends.onnxruntime_backend({"ONNXRUNTIME_BACKEND": str(folder)}) == str(folder)
    assert launcher_backends.onnxruntime_backend({}) is None
    with pytest.raises(SystemExit, match="holds no libtriton_onnxruntime.so"):
        launcher_backends.onnxruntime_backend({"ONNXRUNTIME_BACKEND": str(tmp_path)})


def test_the_onnxruntime_models_are_served_by_the_backend_the_launcher_names(server):
    """With ONNXRUNTIME_BACKEND (CI sets it to Triton's C++ backend when the machine has it) tritonserver maps
    libtriton_onnxruntime.so and no Python stub serves `embedding`; without it the stand-in's stub does. The proxy's
    /v1/models names the one serving, and the ensemble answers. (The shared server: started as any test server.)"""
    import json

    from local_triton import launch
    from triton_clients import infer

    vectors = infer("grpc", server.grpc_url, ["a panda eats bamboo"])["embedding"]
    assert vectors.shape == (1, 384)
    with urllib.request.urlopen(server.proxy_url + "/v1/models") as response:
        named = json.load(response)["onnxruntime_backend"]
    with open(f"/proc/{server.process.pid}/maps") as handle:
        mapped = "libtriton_onnxruntime.so" in handle.read()
    server.process.note_regions()
    stubs = set(server.process.stubs.values())
    real = launch.onnxruntime_backend()
    print(f"\nonnxruntime models served by: {named}")
    assert named == launch.describe_onnxruntime_backend()
    if real:
        assert mapped and named.startswith("triton: ") and "embedding" not in stubs, (named, stubs)
    else:
        assert not mapped and named.startswith("stand-in") and "embedding" in stubs, (named, stubs)


def test_jemalloc_is_preloaded_where_the_encoders_run_in_tritonservers_process(tmp_path, monkeypatch):
    """With glibc's malloc, tritonserver kept ~35 MiB per load/unload cycle once the C++ onnxruntime backend ran the
    encoders in its process (tests/test_models.py's cycles: +14.7 %); with jemalloc +1.8 %. The launcher preloads it
    there (MALLOC=system: not), never for the stand-in, and keeps what LD_PRELOAD already held."""
    from local_triton import backends

    folder = tmp_path / "ort"
    folder.mkdir()
    (folder / "libtriton_onnxruntime.so").write_bytes(b"")
    library = tmp_path / "libjemalloc.so.2"
    library.write_bytes(b"")
    monkeypatch.setattr(backends, "JEMALLOC", (str(library),))
    env = {"ONNXRUNTIME_BACKEND": str(folder), "LD_PRELOAD": "/other.so"}
    backends.preload_allocator(env)
    assert env["LD_PRELOAD"] == f"{library}:/other.so"
    backends.preload_allocator(env)  # once
    assert env["LD_PRELOAD"] == f"{library}:/other.so"
    for unchanged in ({}, {"ONNXRUNTIME_BACKEND": str(folder), "MALLOC": "system"}):
        backends.preload_allocator(unchanged)
        assert "LD_PRELOAD" not in unchanged
