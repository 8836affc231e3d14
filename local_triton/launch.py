"""Start tritonserver 2.48.0 (= nvcr.io/nvidia/tritonserver:24.07-py3) on the model repository, with the project's
flags, and stop it cleanly on Ctrl-C / SIGTERM.

    python -m local_triton.launch --model-repository model_repository          # what `make serve` runs
    python -m local_triton.launch --model-repository /models                   # the image's CMD

Two places, one set of flags: in the tritonserver container it runs the image's own server and backends; on a
machine without Docker it runs the server from the nvidia-pytriton==0.5.10 wheel, with a backend directory
assembled outside model_repository/: the wheel's Python backend, and for `backend: "onnxruntime"` either Triton's
own C++ backend (ONNXRUNTIME_BACKEND: a folder holding libtriton_onnxruntime.so, as `make onnxruntime-backend`
builds it) or, since the wheel has none, the stand-in in local_triton/onnxruntime/.

Settings (environment variables; docs/reference.md's "Security" and "Deploying" sections explain them):
  TRITON_ADDRESS          address of Triton's HTTP/gRPC ports (default 127.0.0.1: closed to other hosts)
  TRITON_METRICS_ADDRESS  address of the metrics port (default: TRITON_ADDRESS)
  ADMIN_API_KEY(_FILE)    key for Triton's restricted APIs (repository, shared memory, trace, logging); unset: a
                          random key, so nobody can call them
  API_KEY, ADMIN_API_KEY  plain values reach tritonserver (and its stubs) only as *_FILE files: keys_to_files
  MODEL_CONTROL           explicit (default: models load and unload at run time) or none
  LOAD_MODELS             models to load at start in explicit mode, comma-separated (default *: all, but the
                          default export's folders while they hold no export: every_model); an export's
                          ensemble brings its BLS and rerank models
  RATE_LIMIT              on (default; see model_repository/tokenizer/config.pbtxt) or off
  MODEL_CONFIG_NAME       Triton's --model-config-name: models with configs/<name>.pbtxt load it (e.g. gpu)
  EXIT_TIMEOUT_S          the bound of the drain at SIGTERM (see drain()), and of Triton's own wait for
                          in-flight requests after it (default 30)
  ONNXRUNTIME_BACKEND     outside the container: a folder holding Triton's libtriton_onnxruntime.so (and the
                          libonnxruntime it links, beside it); unset: the stand-in (onnxruntime_backend())
  MALLOC                  jemalloc (default: preloaded where the encoders run in tritonserver's process and it is
                          installed; preload_allocator) or system

Dead Python stubs are the supervisor model's (model_repository/supervisor, which works the same without the
launcher). The launcher restarts tritonserver when the supervisor asks (SIGUSR1, to the pid in the server's
TRITON_LAUNCHER_PID: it kills the server at once, where a SIGTERM would wait the exit timeout for calls a dead stub
never answers) and when tritonserver exits on its own (--no-restart: exit instead); a restart that fails is tried
again with backoff, for ever (the first start's failure is a configuration error: it exits). A server with a dead
stub would only stop at its exit timeout (Server.has_dead_stub): a stop gives it DEAD_STUB_GRACE_S for the requests
in flight, then kills it.

tritonserver never outlives the launcher: it dies with it (die_with_this_process: PR_SET_PDEATHSIG), and the
Watchdog kills its whole process group (its stubs, the proxy's port) when the launcher ends without stopping it
(kill -9, the OOM killer). SIGTERM / Ctrl-C still drain. A first start whose ports are taken (server_ports) starts
nothing: one line names each port, its role and its holder (local_triton/ports.py), and the launcher exits 1.
"""
import argparse
import atexit
import ctypes
import filecmp
import glob
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

from model_library.triton_server import TritonHttp, process_table

from . import ports
from .watchdog import members as group_members

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)
BACKEND_DIR = os.path.join(PROJECT, ".triton", "backends")
CONTAINER_SERVER = "/opt/tritonserver/bin/tritonserver"
SHM_PREFIX = "/dev/shm/triton_"
RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"
# Triton 24.07's Python backend starts each stub through `bash -c` with the model path unquoted: a repository path
# with spaces or shell characters fails every Python model's load with a bash syntax error.
PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./+:@%=,-]+$")
RESTART_GRACE_S = 1.0  # a restart the supervisor asked for: time for the proxy's 503 answers to go out first
RETRY_MAX_S = 30.0  # a failed restart is tried again after 2, 4, 8... s, at most this long
DEAD_STUB_GRACE_S = 10.0  # stopping a server with a dead stub: time for the requests in flight, then it is killed
STUB_EXIT_GRACE_S = 5.0  # stubs left by a tritonserver that exited: time to leave on their own, then they are killed
PR_SET_PDEATHSIG = 1  # prctl(2)


def setting(name, default, env=None):
    value = (os.environ if env is None else env).get(name, "")
    return value if value != "" else default


def secret(name, env=None):
    """NAME, else the contents of the file NAME_FILE, else ''."""
    env = os.environ if env is None else env
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE")
    if path:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    return ""


def _pytriton_root():
    """The folder of the wheel that carries tritonserver. Found, not imported: `import pytriton` loads its client,
    whose dependencies (gevent, tritonclient...) a `pip install --no-deps` of the wheel lacks (bench/gpu.py's
    machines), and only the binaries are needed."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nvidia-pytriton==0.5.10 is not installed (it carries tritonserver)")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def in_container():
    return os.path.exists(CONTAINER_SERVER)


def python_version(python):
    if python == sys.executable:
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = subprocess.run([python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def onnxruntime_backend(env=None):
    """The folder of Triton's C++ onnxruntime backend (ONNXRUNTIME_BACKEND), or None: the stand-in. In the container
    the image's own backend serves, whatever the setting."""
    folder = setting("ONNXRUNTIME_BACKEND", "", env)
    if not folder or in_container():
        return None
    folder = os.path.abspath(folder)
    if not os.path.isfile(os.path.join(folder, "libtriton_onnxruntime.so")):
        raise SystemExit(f"launch: ONNXRUNTIME_BACKEND={folder} holds no libtriton_onnxruntime.so (build it with "
                         f"`make onnxruntime-backend`, or unset it for the stand-in)")
    return folder


# jemalloc, where the C++ onnxruntime backend runs the encoders inside tritonserver's own process: with glibc's
# malloc that process kept ~35 MiB per load/unload cycle of an export (3 cycles of a tiny XLM-R beside MiniLM: RSS
# 720 -> 826 MiB unloaded, 1,702 -> 1,773 MiB loaded); with jemalloc 709 -> 722 and 1,777 -> 1,779 (flat).
JEMALLOC = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2")


def preload_allocator(env):
    """MALLOC=jemalloc (default) | system: LD_PRELOAD jemalloc for tritonserver (and its stubs) when the encoders run
    in its process (the container, ONNXRUNTIME_BACKEND) and jemalloc is installed (Debian/Ubuntu libjemalloc2)."""
    if setting("MALLOC", "jemalloc", env) != "jemalloc" or not (in_container() or onnxruntime_backend(env)):
        return
    found = next((path for path in JEMALLOC if os.path.exists(path)), None)
    if found is None:
        print("launch: jemalloc is not installed (libjemalloc2): tritonserver's memory may grow with each model "
              "load and unload (MALLOC=system hides this line)", flush=True)
        return
    preloaded = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if found not in preloaded:
        env["LD_PRELOAD"] = ":".join([found, *preloaded])


def describe_onnxruntime_backend(env=None):
    """Which code serves `backend: "onnxruntime"` models, in words (the startup line, the proxy's /v1/models)."""
    if in_container():
        return "triton: the container's libtriton_onnxruntime.so"
    folder = onnxruntime_backend(env)
    return f"triton: {os.path.join(folder, 'libtriton_onnxruntime.so')}" if folder else \
        "stand-in: local_triton/onnxruntime/model.py (Python, onnxruntime in a stub)"


def server_library_link(backend_dir):
    """<backend_dir>/lib/libtritonserver.so -> the wheel's renamed server library: the C++ backend asks for that
    name, and the loader resolves it to the library already loaded (one copy in the process). Returns the folder."""
    lib_dir = os.path.join(backend_dir, "lib")
    os.makedirs(lib_dir, exist_ok=True)
    found = sorted(glob.glob(os.path.join(os.path.dirname(_pytriton_root()), "nvidia_pytriton.libs",
                                          "libtritonserver*.so")))
    if not found:
        raise SystemExit("launch: the wheel's libtritonserver is missing: is nvidia-pytriton==0.5.10 installed?")
    relink(found[0], os.path.join(lib_dir, "libtritonserver.so"))
    return lib_dir


def relink(target, link):
    if os.path.islink(link) and os.readlink(link) == target:
        return
    if os.path.islink(link) or os.path.isfile(link):
        os.remove(link)
    elif os.path.isdir(link):
        shutil.rmtree(link)
    os.symlink(target, link)


def backend_dir_for(python, real_onnxruntime, backend_dir=BACKEND_DIR):
    """The backends folder prepare_backends lays out for `python` and the onnxruntime backend chosen."""
    version = python_version(python)
    own = version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    return (backend_dir if own else f"{backend_dir}-py{version}") + ("-ort" if real_onnxruntime else "")


def prepare_backends(python=sys.executable, backend_dir=BACKEND_DIR, ort_folder=None):
    """Lay out <backend_dir>/python (the wheel's backend + the stub for `python`'s version) and onnxruntime/: a link
    to ort_folder (Triton's C++ backend; its own backend dir, `-ort` beside the stand-in's) or the stand-in."""
    root = _pytriton_root()
    version = python_version(python)
    backend_dir = backend_dir_for(python, bool(ort_folder), backend_dir)
    python_dir = os.path.join(backend_dir, "python")
    os.makedirs(python_dir, exist_ok=True)
    sources = {
        "libtriton_python.so": os.path.join(root, "tritonserver", "backends", "python", "libtriton_python.so"),
        "triton_python_backend_utils.py": os.path.join(
            root, "tritonserver", "backends", "python", "triton_python_backend_utils.py"),
        "triton_python_backend_stub": os.path.join(
            root, "tritonserver", "python_backend_stubs", version, "triton_python_backend_stub"),
    }
    for name, source in sources.items():
        if not os.path.exists(source):
            raise SystemExit(f"{source} is missing: is nvidia-pytriton==0.5.10 installed, with a stub for {version}?")
        target = os.path.join(python_dir, name)
        # by content: a stub left by another Python of the same wheel has the same mtime (and would not load)
        if not os.path.exists(target) or not filecmp.cmp(source, target, shallow=False):
            shutil.copy2(source, target)
    ort_dir = os.path.join(backend_dir, "onnxruntime")
    if ort_folder:  # the folder itself: the backend finds libonnxruntime beside it (RUNPATH $ORIGIN)
        relink(ort_folder, ort_dir)
        server_library_link(backend_dir)
        return backend_dir
    os.makedirs(ort_dir, exist_ok=True)
    shutil.copy2(os.path.join(HERE, "onnxruntime", "model.py"), os.path.join(ort_dir, "model.py"))
    return backend_dir


def server_env(python=sys.executable):
    """Environment for a server from the wheel: its bundled libraries; the model Python's own libpython, which the
    stub links (the loader would otherwise pick the system one, whose symbols the venv's extension modules, `_ssl`
    among them, do not all find); and that Python's venv first on PATH (the stub finds its site-packages through
    the `python3` on PATH)."""
    env = dict(os.environ)
    if in_container():
        return env
    libs = [os.path.join(os.path.dirname(_pytriton_root()), "nvidia_pytriton.libs")]
    query = "import sysconfig; print(sysconfig.get_config_var('LIBDIR')); print(sysconfig.get_config_var('INSTSONAME'))"
    if python == sys.executable:
        libdir, libpython = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    else:
        libdir, libpython = subprocess.run([python, "-c", query], capture_output=True, text=True,
                                           check=True).stdout.split()
    if libdir and libpython and os.path.exists(os.path.join(libdir, libpython)):
        libs.append(libdir)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (*libs, env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join((os.path.dirname(python), env.get("PATH", "")))
    return env


KEY_VARIABLES = ("API_KEY", "ADMIN_API_KEY")


def keys_to_files(env):
    """Plain API_KEY / ADMIN_API_KEY in `env` -> API_KEY_FILE / ADMIN_API_KEY_FILE, in place. Every Python stub
    inherits tritonserver's environment (the tokenizer's, the supervisor's...: /proc/<pid>/environ), so the values
    go into files only the owner reads (0600, in a new 0700 directory from mkdtemp) that only the proxy opens. A
    *_FILE setting without its plain variable is kept. Returns the directory (for its owner to remove), or None."""
    plain = {name: env.pop(name) for name in KEY_VARIABLES if name in env}
    plain = {name: value for name, value in plain.items() if value}  # set but empty: unset, as secret() reads it
    if not plain:
        return None
    directory = tempfile.mkdtemp(prefix="triton-embed-keys-")
    for name, value in plain.items():
        path = os.path.join(directory, name.lower())
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
            handle.write(value)
        env[f"{name}_FILE"] = path
    return directory


def admin_key_for(env=None):
    # Without a configured key the restricted APIs still need one: a random key only the launcher knows.
    return secret("ADMIN_API_KEY", env) or secrets.token_hex(16)


def server_command(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(),
                   python=sys.executable, env=None, admin_key=None):
    """The tritonserver command line; settings come from `env` (default: this process's environment)."""
    address = setting("TRITON_ADDRESS", "127.0.0.1", env)
    admin_key = admin_key or admin_key_for(env)
    if not PLAIN_PATH.match(os.path.abspath(model_repository)):
        raise SystemExit(f"launch: the model repository path {os.path.abspath(model_repository)!r} has spaces or "
                         f"shell characters, which Triton 24.07's Python backend cannot start stubs from; use a "
                         f"path of letters, digits and -_./ only")
    if in_container():
        command = [CONTAINER_SERVER]
    else:
        command = [os.path.join(_pytriton_root(), "tritonserver", "bin", "tritonserver"),
                   f"--backend-directory={prepare_backends(python, ort_folder=onnxruntime_backend(env))}"]
    command += [
        f"--model-repository={os.path.abspath(model_repository)}",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
        f"--http-address={address}", f"--grpc-address={address}",
        f"--metrics-address={setting('TRITON_METRICS_ADDRESS', address, env)}",
        f"--http-restricted-api={RESTRICTED_APIS}:admin-key={admin_key}",
        f"--grpc-restricted-protocol={RESTRICTED_APIS}:admin-key={admin_key}",
        "--allow-cpu-metrics=true",
        f"--exit-timeout-secs={int(setting('EXIT_TIMEOUT_S', '30', env))}",
    ]
    if setting("MODEL_CONTROL", "explicit", env) == "explicit":
        # A model an admin failed to load must not take the whole server out of service: with strict readiness
        # (the default) /v2/health/ready stays 400 until that model loads. Start-up failures still stop the server.
        command += ["--model-control-mode=explicit", "--strict-readiness=false"]
        names = [name.strip() for name in setting("LOAD_MODELS", "*", env).split(",")]
        if names == ["*"]:
            names = every_model(model_repository)
        command += [f"--load-model={name}" for name in with_bls_models(model_repository, names)]
    if setting("RATE_LIMIT", "on", env) == "on":
        command.append("--rate-limit=execution_count")  # honour the configs' rate_limiter sections
    if setting("MODEL_CONFIG_NAME", "", env):
        command.append(f"--model-config-name={setting('MODEL_CONFIG_NAME', '', env)}")
    return [*command, *extra_args]


# The default export's folders: until build/export.py exports into them (without --name) they hold only templates
# and code (their config.pbtxt is generated; the tokenizer's is tracked, its tokenizer.json generated), and Triton
# cannot load them.
DEFAULT_EXPORT_FOLDERS = ("tokenizer", "embedding", "ensemble", "ensemble_bls", "rerank", "late_chunking")


def every_model(model_repository):
    """LOAD_MODELS=*: every model of the repository but the default export's folders that nothing was exported into
    (a repository holding only named exports, e.g. a CLIP one, serves them alone)."""
    if not os.path.isdir(model_repository):
        return ["*"]  # Triton says what is wrong with it

    def exported(folder):
        generated = os.path.join("1", "tokenizer.json") if folder == "tokenizer" else "config.pbtxt"
        return folder not in DEFAULT_EXPORT_FOLDERS or \
            os.path.isfile(os.path.join(model_repository, folder, generated))

    return sorted(entry for entry in os.listdir(model_repository) if not entry.startswith(".") and
                  os.path.isdir(os.path.join(model_repository, entry)) and exported(entry))


def with_bls_models(model_repository, names):
    """`names` plus, for each export among them, its BLS, rerank, late chunking and image models (Triton loads an
    ensemble's steps with it, but not the models that call it through BLS, nor a CLIP export's image ensemble: their
    names are in the export's export.json), and the supervisor,
    which always runs when the repository has it."""
    found = list(names)
    if "*" not in found and "supervisor" not in found and \
            os.path.isfile(os.path.join(model_repository, "supervisor", "config.pbtxt")):
        found.append("supervisor")
    for name in names:
        try:
            with open(os.path.join(model_repository, name, "1", "export.json"), encoding="utf-8") as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue
        found += [manifest[key] for key in ("bls_model", "rerank_model", "chunks_model", "image_model")
                  if manifest.get(key) not in (None, *found)]
    return found


def children(pid):
    """{child pid: (state, argv)} of process `pid` (a zombie's argv is empty)."""
    return {child: (info.state, info.argv) for child, info in process_table(lambda info: info.ppid == pid).items()}


class Server:
    """A running tritonserver and the shared-memory regions of its Python stubs (removed after it exits: a stub
    that died leaves its region behind)."""

    def __init__(self, process, admin_key=None, http_port=None, address="127.0.0.1", keys_dir=None):
        self.process, self.regions, self.noted = process, set(), 0.0
        self.keys_dir = keys_dir  # keys_to_files(): lives as long as this server (a reload reads the files again)
        # Triton's HTTP API (the repository API is restricted: this launcher holds its key)
        self.triton = TritonHttp(address, http_port or 8000, {"admin-key": admin_key or ""})
        self.stubs = {}  # pid -> model directory, learnt while each stub lives
        self.run_dir = self.stop_file = None  # start(): the drain's stop file (TRITON_EMBED_STOP_FILE), its folder

    @property
    def pid(self):
        return self.process.pid

    @property
    def returncode(self):
        return self.process.returncode

    def poll(self):
        if time.monotonic() - self.noted > 2.0:  # stubs start at load and reload: a look now and then suffices
            self.note_regions()
        return self.process.poll()

    def note_regions(self):
        """The stubs are the server's children: their first argument is their model's file, the second names their
        /dev/shm region. Returns {pid: state}."""
        self.noted = time.monotonic()
        states = {}
        for pid, (state, args) in children(self.process.pid).items():
            states[pid] = state
            if len(args) > 2 and args[2].startswith(b"triton_") and b"_shm_region_" in args[2]:
                self.regions.add(args[2].decode())
                self.stubs[pid] = os.path.basename(os.path.dirname(os.path.dirname(args[1].decode(errors="replace"))))
        return states

    def has_dead_stub(self):
        """A stub that died stays a zombie: its model instance never finishes unloading (Triton waits for the stub's
        answer for ever, and the other models' unloads queue behind it; or it aborts), so the server
        would only stop at its exit timeout. Its in-flight requests still finish first, and new ones are refused
        (503 at the proxy)."""
        return "Z" in self.note_regions().values()

    def model_states(self):
        """{model: its versions' states} from Triton's repository index; OSError when it does not answer."""
        states = self.triton.states()
        if states is None:
            raise OSError("Triton's repository index did not answer")
        return states

    def kill(self):
        os.killpg(self.pid, signal.SIGKILL)  # the stubs share its process group (start_new_session)
        self.process.wait()

    def end_group(self):
        """Stubs outlive a tritonserver that exited on its own (a failed start, an abort): each leaves once it sees
        its parent reaped (it polls kill(parent, 0)), finalizing its model. Those still there after
        STUB_EXIT_GRACE_S are killed, so that the next start finds the proxy's port (a stub's) free."""
        deadline = time.monotonic() + STUB_EXIT_GRACE_S
        while group_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_members(self.pid):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = time.monotonic() + 5.0
            while group_members(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def cleanup(self):
        """After tritonserver was reaped: the rest of its process group, then what it leaves behind."""
        if self.process is not None and self.process.returncode is not None:
            self.end_group()
        for region in self.regions:
            path = os.path.join("/dev/shm", region.lstrip("/"))
            if path.startswith(SHM_PREFIX) and os.path.exists(path):
                os.remove(path)
        self.remove_keys()
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def remove_keys(self):
        if self.keys_dir:
            shutil.rmtree(self.keys_dir, ignore_errors=True)


def die_with_this_process():
    """A preexec_fn for Popen: the kernel SIGKILLs the child when this process ends, however it ends (kill -9, the
    OOM killer), where start_new_session alone would leave tritonserver holding the ports with parent 1. None where
    that cannot be had: not Linux, or not the main thread (PR_SET_PDEATHSIG fires when the *thread* that forked the
    child exits, and the main thread lives as long as the process)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec():
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # this process died between fork and prctl: nothing will fire the signal
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def start(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(), log_file=None,
          extra_env=None, python=sys.executable):
    """tritonserver in a process group of its own (its stubs join it; our signal handling decides when it stops),
    killed by the kernel should this process end without stopping it (die_with_this_process)."""
    env = server_env(python)
    env.update(extra_env or {})
    if onnxruntime_backend(env):  # the C++ backend's libtritonserver.so link (prepare_backends lays it out)
        env["LD_LIBRARY_PATH"] = os.pathsep.join((os.path.join(backend_dir_for(python, True), "lib"),
                                                  env.get("LD_LIBRARY_PATH", "")))
    # Which code serves the encoder, for the proxy's /v1/models
    env["TRITON_EMBED_ONNXRUNTIME_BACKEND"] = describe_onnxruntime_backend(env)
    preload_allocator(env)
    # The proxy calls Triton's own HTTP frontend (readiness, repository API): where it is, for the models to read.
    env["TRITON_HTTP_PORT"] = str(http_port)
    # Which server that port must answer as (its --id, in its metadata): the proxy never takes another server's
    # readiness for its own (an orphan left on the port). One per start.
    env["TRITON_SERVER_ID"] = f"triton-embed-{secrets.token_hex(6)}"
    # The keys as files, not values: every Python stub inherits this environment (keys_to_files). The admin key is
    # read back from its file, so the launcher and the proxy see the same one.
    keys_dir = keys_to_files(env)
    # The drain's word to the models that feed work piece by piece (model_common.Deadline): once this file exists
    # they start no next piece, so what cannot finish within the exit timeout stops, cleanly (drain()).
    run_dir = tempfile.mkdtemp(prefix="triton-embed-run-")
    env["TRITON_EMBED_STOP_FILE"] = os.path.join(run_dir, "stopping")
    try:
        admin_key = admin_key_for(env)
        command = server_command(model_repository, http_port, grpc_port, metrics_port,
                                 (f"--id={env['TRITON_SERVER_ID']}", *extra_args), python, env, admin_key)
        process = subprocess.Popen(command, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT if log_file else None,
                                   start_new_session=True, preexec_fn=die_with_this_process())
    except BaseException:
        for directory in (keys_dir, run_dir):
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
        raise
    server = Server(process, admin_key, http_port, setting("TRITON_ADDRESS", "127.0.0.1", env), keys_dir)
    server.run_dir, server.stop_file = run_dir, env["TRITON_EMBED_STOP_FILE"]
    return server


def _config_parameter(path, key):
    """A `parameters { key: "<key>" value: { string_value: "..." } }` of a config.pbtxt, or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    found = re.search(r'key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text)
    return found.group(1) if found else None


def server_ports(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(), env=None):
    """[(role, address, port)] of what tritonserver will bind: its HTTP, gRPC and metrics ports (unless extra_args
    turn one off), and the proxy's (PROXY_HOST / PROXY_PORT, else its config.pbtxt's) when the proxy loads."""
    address = setting("TRITON_ADDRESS", "127.0.0.1", env)
    found = [(role, bind, port) for role, bind, port in (
        ("HTTP", address, http_port), ("gRPC", address, grpc_port),
        ("metrics", setting("TRITON_METRICS_ADDRESS", address, env), metrics_port))
        if f"--allow-{role.lower()}=false" not in extra_args]
    config = os.path.join(model_repository, "proxy", "config.pbtxt")
    if os.path.isfile(config):
        names = [name.strip() for name in setting("LOAD_MODELS", "*", env).split(",")]
        if setting("MODEL_CONTROL", "explicit", env) != "explicit" or "proxy" in names or \
                (names == ["*"] and "proxy" in every_model(model_repository)):
            host = setting("PROXY_HOST", _config_parameter(config, "host") or "0.0.0.0", env)
            found.append(("proxy", host, int(setting("PROXY_PORT", _config_parameter(config, "port") or 8080, env))))
    return found


def ports_taken_line(listed):
    """The one line that says which of the server_ports() `listed` are taken and by whom; '' when all are free."""
    found = ports.taken(listed)
    if not found:
        return ""
    return (f"launch: {ports.describe(found)}; not starting tritonserver (free the port or choose another: "
            f"HTTP_PORT, GRPC_PORT, METRICS_PORT, PROXY_PORT)")


class Watchdog:
    """local_triton/watchdog.py, in a session of its own (Ctrl-C does not reach it): it kills the armed server's
    whole process group, tritonserver and its stubs, when this process ends without disarming it (kill -9, the
    OOM killer...). End of its input (our end of the pipe closes with this process, however it ends) is the
    signal: nothing to poll, and no pid that could be reused."""

    def __init__(self):
        read, self.pipe = os.pipe()  # (not inheritable: tritonserver must not hold our end)
        try:
            self.process = subprocess.Popen([sys.executable, os.path.join(HERE, "watchdog.py")], stdin=read,
                                            start_new_session=True)
        finally:
            os.close(read)

    def tell(self, message):
        try:
            os.write(self.pipe, (json.dumps(message) + "\n").encode())
        except OSError as error:  # it died: the server still has its PR_SET_PDEATHSIG
            print(f"launch: watchdog: {error}", flush=True)

    def arm(self, server):
        self.tell({"pgid": server.pid, "keys_dir": server.keys_dir})

    def disarm(self):
        """Once the server is reaped (its group gone with it)."""
        self.tell({"pgid": 0})

    def close(self):
        """Ends it (an armed server goes with it): main() returns, or raised while a server ran."""
        os.close(self.pipe)
        self.process.wait(timeout=30)


def public_tiers(model_repository):
    """The models clients call, in the order a drain stops them: the proxy (HTTP, it calls the rest); each export's
    rerank model (it calls the BLS model); the ensembles and BLS models (they call the steps, which stay until
    tritonserver stops)."""
    tiers = [["proxy"], [], []]
    for path in sorted(glob.glob(os.path.join(model_repository, "*", "1", "export.json"))):
        try:
            with open(path, encoding="utf-8") as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue
        tiers[1].append(manifest.get("rerank_model"))
        tiers[2] += [manifest.get("name"), manifest.get("bls_model"), manifest.get("chunks_model")]
    return [[model for model in tier if model] for tier in tiers]


STOP_FEEDING_AT = 1 / 3  # of the drain's bound: then the models start no next piece (work abandoned by its client
# or longer than the exit timeout: a 2,000-sentence rerank kept 6 models busy past it, and the stubs died at exit);
# the rest of the bound is for the pieces running then (a rerank piece of 256 passages: ~8 s on 2 busy cores)


def stop_feeding(server):
    """Creates the server's stop file (TRITON_EMBED_STOP_FILE); True the first time."""
    if not server.stop_file or os.path.exists(server.stop_file):
        return False
    with open(server.stop_file, "w", encoding="utf-8"):
        pass
    return True


def drain(server, model_repository, bound_s, interrupted=lambda: False):
    """SIGTERM's first phase: stop taking work without cutting any. Triton's own stop refuses every new request at
    once, the calls an admitted request still has to make to its next step included (a BLS model's encoder runs,
    the proxy's calls): those requests failed. So the public models are unloaded first, callers before callees:
    each refuses new requests at once and finishes the admitted ones (the proxy's /health and new requests get 503
    "shutting down" meanwhile), while the steps they call stay loaded. True when all of it finished within bound_s;
    then tritonserver has nothing in flight and stops at once."""
    started = time.monotonic()
    deadline = started + bound_s
    try:
        for tier in public_tiers(model_repository):
            states = server.model_states()
            serving = [model for model in tier if "READY" in states.get(model, ())]
            for model in serving:
                server.triton.control("unload", model, timeout=5.0)
            while any(server.model_states().get(model, set()) & {"READY", "UNLOADING"} for model in serving):
                if time.monotonic() > deadline or interrupted() or server.poll() is not None:
                    return False
                if time.monotonic() > started + bound_s * STOP_FEEDING_AT and stop_feeding(server):
                    print(f"launch: drain: past {bound_s * STOP_FEEDING_AT:.0f} s, requests still running start "
                          f"no next piece (they fail 'the server is stopping')", flush=True)
                time.sleep(0.1)
    except (OSError, ValueError, KeyError, RuntimeError) as error:  # MODEL_CONTROL=none: no unloads; Triton's stop
        print(f"launch: drain: {error}", flush=True)
        return False
    return True


def wait_ready(server, http_port, timeout_s=300.0, address="127.0.0.1"):
    """Block until /v2/health/ready answers 200; raise if the server exits or the time runs out."""
    triton = TritonHttp(address, http_port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {server.process.returncode} before it was ready")
        if triton.server_ready(timeout=2.0):
            server.note_regions()
            return
        time.sleep(0.5)
    raise TimeoutError(f"tritonserver not ready on port {http_port} after {timeout_s:.0f} s")


def stop(server, timeout_s=60.0):
    """SIGTERM (Triton finishes in-flight requests, unloads models, finalizes stubs), SIGKILL if it hangs; then the
    stubs' leftover shared memory goes. A server with a dead stub gets DEAD_STUB_GRACE_S (see has_dead_stub)."""
    if server.poll() is None:
        timeout_s = min(timeout_s, DEAD_STUB_GRACE_S) if server.has_dead_stub() else timeout_s
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            server.kill()
    server.cleanup()
    return server.process.returncode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", default=os.path.join(PROJECT, "model_repository"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("--model-python", default=sys.executable,
                        help="the Python whose venv runs the Python models (default: this one)")
    parser.add_argument("--no-restart", action="store_true",
                        help="exit when tritonserver exits on its own, instead of starting it again")
    parser.add_argument("extra", nargs="*", help="further tritonserver arguments (after --)")
    args = parser.parse_args(argv)
    # Ports first: a tritonserver started on a taken port dies on its bind after loading every model (or, the proxy's
    # port, serves without the proxy), and an orphan server's readiness would answer for ours meanwhile.
    listed = server_ports(args.model_repository, args.http_port, args.grpc_port, args.metrics_port, args.extra)
    taken = ports_taken_line(listed)
    if taken:
        raise SystemExit(taken)
    watchdog = Watchdog()
    try:
        return serve(args, listed, watchdog)
    finally:
        watchdog.close()


def serve(args, listed, watchdog):
    """main()'s loop: start, restart, drain and stop tritonserver; the watchdog is armed while a server runs."""
    stopping = []
    server = None

    def on_signal(signum, _frame):
        # Only note it (or forward it): waiting here deadlocks when the signal interrupts the main thread's wait(),
        # which holds Popen's non-reentrant wait lock. The loop below drains, stops and escalates. Before the server
        # is ready (nothing admitted yet) and at a second signal, tritonserver is stopped at once.
        if server is not None and server.process.poll() is None and (not serving or stopping):
            print(f"\nlaunch: signal {signum}, stopping tritonserver now", flush=True)
            server.process.send_signal(signal.SIGTERM)
        elif not stopping:
            print(f"\nlaunch: signal {signum}: draining (new work refused, admitted work finishes), then stopping",
                  flush=True)
        stopping.append(time.monotonic())

    restart = []

    def on_restart(_signum, _frame):
        # The supervisor model found a dead stub it cannot recover from in place (model_repository/supervisor); a
        # SIGTERM would make Triton wait its whole exit timeout for the calls the dead stub never answers.
        restart.append((time.monotonic(), "the supervisor asked (a dead stub)"))

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_restart)
    # Each server's key files go with it (Server.cleanup); these are the current one's, whatever ends the launcher.
    atexit.register(lambda: server is not None and server.remove_keys())
    exit_timeout_s = int(setting("EXIT_TIMEOUT_S", "30"))
    started, failures, serving = False, 0, []
    while True:
        # The supervisor asks for a restart (SIGUSR1) only when the launcher named itself to the server.
        server = start(args.model_repository, args.http_port, args.grpc_port, args.metrics_port, args.extra,
                       python=args.model_python, extra_env={"TRITON_LAUNCHER_PID": str(os.getpid())})
        watchdog.arm(server)
        try:
            wait_ready(server, args.http_port)
            print(f"launch: tritonserver ready: HTTP {args.http_port}, gRPC {args.grpc_port}, "
                  f"metrics {args.metrics_port} on {setting('TRITON_ADDRESS', '127.0.0.1')}; onnxruntime models "
                  f"served by {describe_onnxruntime_backend()}", flush=True)
            started, failures, serving[:] = True, 0, [True]
        except (RuntimeError, TimeoutError) as error:
            if stopping:
                pass
            elif not started:  # the first start: a configuration to fix, not a fault to outlast
                stop(server)
                watchdog.disarm()
                # A port taken since the check ("Address already in use" in Triton's log): named, with its owner.
                raise SystemExit(ports_taken_line(listed) or f"launch: {error}") from None
            else:  # a restart failed (/dev/shm full, a port still taken...): try again, never give up
                stop(server)
                watchdog.disarm()
                failures += 1
                backoff = min(RETRY_MAX_S, 2.0 ** failures)
                found = ports.taken(listed)
                error = f"{error}; {ports.describe(found)}" if found else error
                print(f"launch: restart failed ({error}); trying again in {backoff:.0f} s", flush=True)
                deadline = time.monotonic() + backoff
                while not stopping and time.monotonic() < deadline:
                    time.sleep(0.2)
                if stopping:
                    return 1
                continue
        checked, dead, drained, terminated = time.monotonic(), False, None, False
        while server.poll() is None:
            now = time.monotonic()
            if stopping and serving and not terminated:
                if len(stopping) == 1 and not dead:  # (a dead stub's calls never finish: no drain)
                    drained = drain(server, args.model_repository, exit_timeout_s, lambda: len(stopping) > 1)
                if server.poll() is None:
                    server.process.send_signal(signal.SIGTERM)
                terminated, stopping[0] = True, time.monotonic()  # the escalation below counts from this SIGTERM
                continue
            # SIGTERM ignored: kill it, as stop() does (after a drain: nothing is left in flight, only unloads); a
            # dead stub: see has_dead_stub; a restart was asked for: the calls on the dead stub never finish
            grace = DEAD_STUB_GRACE_S if dead else 30 if drained else exit_timeout_s + 30
            if (stopping and now - stopping[0] > grace) or \
                    (restart and now - restart[0][0] > RESTART_GRACE_S):
                server.kill()
            elif not stopping and not restart and now - checked > 1.0:  # own clock: poll() refreshes server.noted
                checked = now
                dead = server.has_dead_stub()  # as it was before a stop began
            time.sleep(0.2)
        server.cleanup()
        watchdog.disarm()
        serving.clear()
        if stopping:  # clean: everything admitted finished (the drain) and tritonserver exited 0
            clean = drained is not False and server.returncode == 0
            detail = "" if clean else f" (not clean: admitted work was cut, or tritonserver exited {server.returncode})"
            print(f"launch: stopped{detail}", flush=True)
            return 0 if clean else 1
        if args.no_restart and not restart:
            return server.returncode
        why = restart[0][1] if restart else f"it exited by itself (code {server.returncode})"
        print(f"launch: starting tritonserver again: {why}", flush=True)
        restart.clear()


if __name__ == "__main__":
    sys.exit(main())
