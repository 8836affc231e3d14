"""Talking to a tritonserver from outside its models' inference, in one place: its HTTP API (TritonHttp), the flags
on its command line (server_flags), its processes and their Python stubs (process_table, from /proc), and the keys
it is served with (secret: API_KEY, ADMIN_API_KEY, or their *_FILE). Used by
the proxy (readiness, configs, load and unload), the supervisor (stubs, the repository index, reloads, metrics) and
the launcher and its watchdog (readiness, drain at shutdown, the server's process group). Plain Python:
build/export.py installs it beside the proxy's and the supervisor's model.py; the launcher imports it from
model_library.

The repository API is restricted: the launcher puts its key on tritonserver's command line
(--http-restricted-api=model-repository,...:admin-key=<key>) and hands it to the proxy; the supervisor reads it
from that command line. `headers` carries it.

Not pb_utils' is_model_ready / load_model / unload_model: in python_backend r24.07 those model-loader messages
corrupt the stub's shared-memory allocator now and then (fixed upstream in python_backend b49d9e2): polled every
second, tritonserver aborted at shutdown, and a second failed load killed the proxy's stub.
"""
import glob
import http.client
import json
import os
from typing import NamedTuple
from urllib.parse import quote

LOAD_TIMEOUT_S = 900.0  # a load answers once the model is loaded (bge-m3: minutes)
ANY_ADDRESS = ("0.0.0.0", "", "::", "[::]")  # a server bound to every address is called on loopback


def secret(name, env=None):
    """A key: the variable NAME of `env` (default: os.environ), else the contents of the file NAME_FILE, else ''.
    Keys come from the environment or a file, never from a config Triton serves back (GET .../config): the launcher
    reads them so (and hands plain values to tritonserver as files), the proxy reads them so in its stub."""
    env = os.environ if env is None else env
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE")
    if path:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    return ""


class TritonHttp:
    def __init__(self, host, port, headers=None):
        self.host = "127.0.0.1" if host in ANY_ADDRESS else host
        self.port, self.headers = int(port), dict(headers or {})

    def call(self, method, path, body=None, headers=None, timeout=5.0, port=None):
        """(status, body), or None when nothing answers (not up yet, or stopping). `port`: another of the server's
        ports (metrics, the proxy's). A connection per call, closed after it: at shutdown Triton waits for the HTTP
        connections open to it before it unloads the models."""
        connection = http.client.HTTPConnection(self.host, port or self.port, timeout=timeout)
        try:
            connection.request(method, path, body, {**self.headers, **(headers or {}), "Connection": "close"})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def ready(self, model):
        """True / False; None when Triton does not answer."""
        answer = self.call("GET", f"/v2/models/{quote(model, safe='')}/ready")
        return None if answer is None else answer[0] == 200

    def server_ready(self, timeout=5.0):
        answer = self.call("GET", "/v2/health/ready", timeout=timeout)
        return answer is not None and answer[0] == 200

    def config(self, model):
        answer = self.call("GET", f"/v2/models/{quote(model, safe='')}/config")
        return json.loads(answer[1]) if answer is not None and answer[0] == 200 else None

    def repository(self, path, body=b"{}", timeout=5.0):
        return self.call("POST", f"/v2/repository{path}", body, {"Content-Type": "application/json"}, timeout)

    def control(self, action, model, unload_dependents=False, timeout=LOAD_TIMEOUT_S):
        """Load (answers once loaded) or unload (answers at once); RuntimeError with Triton's reason."""
        body = json.dumps({"parameters": {"unload_dependents": True}} if unload_dependents else {}).encode()
        answer = self.repository(f"/models/{quote(model, safe='')}/{action}", body, timeout)
        if answer is None or answer[0] != 200:
            try:
                message = json.loads(answer[1])["error"]
            except (TypeError, ValueError, KeyError):
                message = "Triton's repository API did not answer" if answer is None else \
                    answer[1].decode(errors="replace")
            raise RuntimeError(message)

    def states(self):
        """{model: set of its versions' states} from the repository index; None when not available."""
        answer = self.repository("/index")
        if answer is None or answer[0] != 200:
            return None
        states = {}
        for entry in json.loads(answer[1]):
            states.setdefault(entry["name"], set()).add(entry.get("state", ""))
        return states


# ---------------------------------------------------------------- the server's command line and processes
def server_flags(pid, proc="/proc"):
    """tritonserver's `--name=value` / `--name value` flags, from its command line."""
    with open(f"{proc}/{pid}/cmdline", "rb") as handle:
        argv = handle.read().decode(errors="replace").split("\0")
    flags = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            key, equals, value = arg[2:].partition("=")
            flags[key] = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
    return flags


class ProcessInfo(NamedTuple):
    state: str  # R, S, T (stopped), Z (zombie: exited, not reaped)...
    ppid: int
    pgrp: int
    exit_code: int  # a zombie's wait status (0 while it lives)
    argv: list | None  # [bytes]; empty for a zombie; None when not read
    cpu_s: float = 0.0  # CPU time used (user + system), its own threads'


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_info(pid, proc="/proc"):
    """ProcessInfo of `pid` without its argv (/proc/<pid>/stat fields 3, 4, 5, 14, 15 and 52); OSError when it is
    gone."""
    with open(f"{proc}/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
    try:
        return ProcessInfo(fields[0].decode(), int(fields[1]), int(fields[2]),
                           int(fields[49]) if len(fields) > 49 else 0, None,
                           (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    except (ValueError, IndexError):
        raise OSError(f"unreadable {proc}/{pid}/stat") from None


def process_table(keep=lambda info: True, argv=True, proc="/proc"):
    """{pid: ProcessInfo} of the processes `keep(info)` accepts (info.argv is None while keep runs), with their
    argv read when `argv`. Processes that go while it reads are left out."""
    found = {}
    for entry in glob.glob(f"{proc}/[0-9]*"):
        pid = int(entry.rsplit("/", 1)[1])
        try:
            info = process_info(pid, proc)
            if not keep(info):
                continue
            if argv:
                with open(f"{entry}/cmdline", "rb") as handle:
                    info = info._replace(argv=handle.read().split(b"\0"))
        except OSError:
            continue
        found[pid] = info
    return found
