"""Issue 37: tritonserver never outlives the launcher (kill -9 included), and a start that finds its ports taken
says so in one line, naming the port and who holds it, and stops. The servers here serve a two-model repository
(the proxy and a trivial Python model) so they start in seconds."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import MODEL_PYTHON, PROJECT, free_port, install_proxy, port_is_free
from local_triton import launch, ports

pytestmark = pytest.mark.serial  # `make test` runs it alone: stops and restarts within their bounds

GONE_S = 10.0  # the bound: after kill -9 of the launcher, nothing of the server within this


@pytest.fixture(scope="module")
def tiny_repository(tmp_path_factory):
    """The proxy model (no export: it serves its HTTP port and answers no model) and `echo`, a plain Python model."""
    repository = tmp_path_factory.mktemp("tiny_repository")
    install_proxy(repository)
    (repository / "echo" / "1").mkdir(parents=True)
    (repository / "echo" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'instance_group [ { kind: KIND_CPU count: 1 } ]\n')
    (repository / "echo" / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor(\n"
        "            'y', pb_utils.get_input_tensor_by_name(r, 'x').as_numpy())]) for r in requests]\n")
    return repository


def listening(port, host="127.0.0.1"):
    """A socket listening on `port`, as another process's server would hold it."""
    holder = socket.socket()
    holder.bind((host, port))
    holder.listen()
    return holder


def running(pid):
    """Alive and not a zombie (a killed process nobody reaped yet holds no port and runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_launcher(repository, log_path, ports_):
    http_port, grpc_port, metrics_port, proxy_port = ports_
    log = open(log_path, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "local_triton.launch", "--model-repository", str(repository),
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
         "--model-python", MODEL_PYTHON, "--no-restart"],
        cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PROXY_PORT": str(proxy_port), "PROXY_HOST": "127.0.0.1"})


def serving_launcher(repository, tmp_path):
    """A launcher whose tritonserver is ready and whose proxy listens -> (launcher, ports, tritonserver pid,
    {stub pid: argv}, watchdog pid)."""
    ports_ = [free_port() for _ in range(4)]
    log_path = tmp_path / "launch.log"
    process = start_launcher(repository, log_path, ports_)
    deadline = time.monotonic() + 180
    while "tritonserver ready" not in log_path.read_text() or port_is_free(ports_[3]):
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the launcher never got ready:\n" + log_path.read_text()[-3000:]
        time.sleep(0.2)
    children = launch.children(process.pid)
    [triton] = [pid for pid, (_, args) in children.items() if b"tritonserver" in args[0]]
    [watchdog] = [pid for pid, (_, args) in children.items() if b"local_triton.watchdog" in args]
    stubs = {pid: args for pid, (_, args) in launch.children(triton).items()
             if b"triton_python_backend_stub" in args[0]}
    assert len(stubs) == 2, stubs  # proxy, echo
    return process, ports_, triton, stubs, watchdog


def wait_gone(pids, ports_, bound_s=GONE_S):
    """Polls until none of `pids` runs and every port can be bound; returns the seconds it took (or the bound)."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if not any(running(pid) for pid in pids) and all(port_is_free(port) for port in ports_):
            break
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.serving
def test_kill_9_of_the_launcher_takes_tritonserver_its_stubs_and_ports_with_it(tiny_repository, tmp_path):
    """What no signal handler sees (kill -9, the OOM killer): tritonserver dies with the launcher
    (PR_SET_PDEATHSIG), the watchdog kills its process group (the stubs, the proxy's port) and removes the stubs'
    shared memory, within seconds."""
    process, ports_, triton, stubs, watchdog = serving_launcher(tiny_repository, tmp_path)
    regions = [args[2].decode() for args in stubs.values()]
    try:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        took = wait_gone([triton, *stubs, watchdog], ports_)
    finally:
        for pid in (triton, *stubs):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    log = (tmp_path / "launch.log").read_text()
    assert not [pid for pid in (triton, *stubs, watchdog) if running(pid)], log[-3000:]
    assert all(port_is_free(port) for port in ports_), f"ports still taken after {took:.1f} s"
    assert took < GONE_S
    assert not [region for region in regions if os.path.exists(os.path.join("/dev/shm", region))]
    assert "ended without stopping tritonserver" in log


@pytest.mark.serving
def test_tritonserver_dies_with_the_launcher_even_without_the_watchdog(tiny_repository, tmp_path):
    """The launcher and its watchdog killed at once (kill -9 of both): the kernel's PR_SET_PDEATHSIG still kills
    tritonserver and frees Triton's ports; its stubs end on their own once it is reaped (they poll their parent)."""
    process, ports_, triton, stubs, watchdog = serving_launcher(tiny_repository, tmp_path)
    try:
        os.kill(watchdog, signal.SIGKILL)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        wait_gone([triton], ports_[:3])
        assert not running(triton) and all(port_is_free(port) for port in ports_[:3])
        if not os.path.exists(f"/proc/{triton}"):  # reaped (by init or a subreaper): the stubs follow it
            wait_gone(stubs, ports_[3:])
            assert not [pid for pid in stubs if running(pid)] and port_is_free(ports_[3])
    finally:
        for pid in (triton, *stubs):
            if running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("role, index", [("HTTP", 0), ("gRPC", 1), ("metrics", 2), ("proxy", 3)])
def test_a_taken_port_stops_the_launcher_with_one_line_naming_it(tiny_repository, tmp_path, role, index):
    """No tritonserver is started at all: one line names the port, its role and the process holding it."""
    ports_ = [free_port() for _ in range(4)]
    with listening(ports_[index]):
        process = start_launcher(tiny_repository, tmp_path / "launch.log", ports_)
        try:
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    output = (tmp_path / "launch.log").read_text()
    assert code != 0
    [line] = output.strip().splitlines()  # that line only: no server output, no retry
    assert f"port {ports_[index]} ({role}): in use by pid {os.getpid()} (" in line, line
    assert line.startswith("launch: ") and "not starting tritonserver" in line


@pytest.mark.serving
def test_a_port_taken_after_the_check_ends_the_first_start_once_naming_it(tiny_repository, monkeypatch, capfd):
    """Between the check and tritonserver's bind another process takes the gRPC port: Triton fails on it
    ("already in use") and the launcher exits with the one line naming the port, without starting it again."""
    http_port, grpc_port, metrics_port, proxy_port = (free_port() for _ in range(4))
    checks = []
    real_taken = ports.taken

    def taken(listed, *args):  # the first check (before the start) sees every port free
        checks.append(listed)
        return [] if len(checks) == 1 else real_taken(listed, *args)

    monkeypatch.setattr(ports, "taken", taken)
    monkeypatch.setenv("PROXY_PORT", str(proxy_port))
    monkeypatch.setenv("PROXY_HOST", "127.0.0.1")
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        with listening(grpc_port), pytest.raises(SystemExit) as stopped:
            launch.main(["--model-repository", str(tiny_repository), "--http-port", str(http_port),
                         "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
                         "--model-python", MODEL_PYTHON])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    output = "".join(capfd.readouterr())
    assert "already in use" in output, output[-3000:]  # Triton's own words: it did fail on the port
    assert len(checks) == 2 and output.count("server_version") == 1  # one start, no restart
    assert f"port {grpc_port} (gRPC): in use by pid {os.getpid()} (" in str(stopped.value.code)
    assert [port for port in (http_port, grpc_port, metrics_port, proxy_port) if not port_is_free(port)] == [], \
        (http_port, grpc_port, metrics_port, proxy_port, os.popen("ss -ltnp").read())


# ---------------------------------------------------------------- the /proc lookup, no server
def test_port_owner_names_the_process_listening_on_a_port():
    with listening(free_port()) as mine:
        port = mine.getsockname()[1]
        assert ports.listening_inodes(port)
        owner = ports.port_owner(port)
        assert owner is not None and owner[0] == os.getpid() and "python" in owner[1]
    assert ports.port_owner(port) is None and ports.listening_inodes(port) == set()  # closed: nobody


def test_port_owner_finds_another_process_masks_keys_and_reads_ipv6(tmp_path):
    script = tmp_path / "holder.py"  # (a file: the command line stays short enough to show the key argument)
    script.write_text("import socket, sys, time\n"
                      "s = socket.socket(socket.AF_INET6 if sys.argv[1] == '6' else socket.AF_INET)\n"
                      "s.bind(('::1' if sys.argv[1] == '6' else '127.0.0.1', 0)); s.listen()\n"
                      "print(s.getsockname()[1], flush=True); time.sleep(60)\n")
    for family in ("4", "6"):
        if family == "6" and not socket.has_ipv6:
            continue
        child = subprocess.Popen([sys.executable, str(script), family, "--admin-key=s3cret"], stdout=subprocess.PIPE,
                                 text=True)
        try:
            port = int(child.stdout.readline())
            pid, command = ports.port_owner(port)
            assert pid == child.pid
            assert "--admin-key=***" in command and "s3cret" not in command and "\n" not in command
            [(role, _, found_port, why)] = ports.taken([("HTTP", "::" if family == "6" else "127.0.0.1", port)])
            assert (role, found_port) == ("HTTP", port) and why.startswith(f"in use by pid {child.pid} (")
        finally:
            child.kill()
            child.wait()


def test_taken_and_describe_one_line_per_owner():
    free = free_port()
    with listening(free_port()) as holder:
        port = holder.getsockname()[1]
        found = ports.taken([("HTTP", "127.0.0.1", port), ("gRPC", "0.0.0.0", port), ("metrics", "127.0.0.1", free)])
        line = ports.describe(found)
    assert [entry[0] for entry in found] == ["HTTP", "gRPC"]  # a free port is not listed
    assert line.startswith(f"port {port} (HTTP), port {port} (gRPC): in use by pid {os.getpid()} (")
    assert "\n" not in line


def test_server_ports_lists_the_proxys_port_only_when_it_loads(tiny_repository):
    env = {"PROXY_PORT": "9999", "TRITON_ADDRESS": "127.0.0.1"}
    listed = launch.server_ports(str(tiny_repository), 1, 2, 3, env=env)
    assert listed == [("HTTP", "127.0.0.1", 1), ("gRPC", "127.0.0.1", 2), ("metrics", "127.0.0.1", 3),
                      ("proxy", "0.0.0.0", 9999)]
    assert launch.server_ports(str(tiny_repository), 1, 2, 3, env={})[-1] == ("proxy", "0.0.0.0", 8080)  # config's
    assert [role for role, *_ in launch.server_ports(str(tiny_repository), 1, 2, 3, env={"LOAD_MODELS": "echo"})] \
        == ["HTTP", "gRPC", "metrics"]
    assert "metrics" not in [role for role, *_ in launch.server_ports(
        str(tiny_repository), 1, 2, 3, extra_args=["--allow-metrics=false"], env=env)]


def test_the_proxy_reads_readiness_only_from_its_own_servers_port():
    """readiness.answers_as: the proxy trusts Triton's HTTP port only when it answers as its own tritonserver (the
    --id the launcher gives each start, TRITON_SERVER_ID), never an orphan server's; without an id (a plain
    tritonserver) the port is trusted. Every served test's /health 200 proves it against the real server."""
    from types import SimpleNamespace

    from model_library.in_process import model_module

    readiness = model_module("proxy", "http_front.readiness")

    def triton(answer):
        return SimpleNamespace(call=lambda method, path: answer if (method, path) == ("GET", "/v2") else None)
    ours = (200, json.dumps({"name": "triton-embed-abc", "version": "2.48.0"}).encode())
    orphan = (200, json.dumps({"name": "triton-embed-old", "version": "2.48.0"}).encode())
    assert readiness.answers_as(triton(ours), "triton-embed-abc") is True
    assert readiness.answers_as(triton(orphan), "triton-embed-abc") is False
    assert readiness.answers_as(triton(None), "triton-embed-abc") is False  # nothing answers
    assert readiness.answers_as(triton((200, b"not json")), "triton-embed-abc") is False
    assert readiness.answers_as(triton(orphan), "") is True  # no launcher: trusted, as before
