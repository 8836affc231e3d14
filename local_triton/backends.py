"""The backends tritonserver runs with, and where its binaries come from. In the tritonserver container: the image's
own server and backends. Elsewhere: the server from the nvidia-pytriton==0.5.10 wheel, with a backends folder laid
out outside model_repository/ (prepare_backends): the wheel's Python backend with the stub for the models' Python,
and for `backend: "onnxruntime"` either Triton's own C++ backend (ONNXRUNTIME_BACKEND, as `make
onnxruntime-backend` builds it; linked, with the wheel's libtritonserver beside it: relink) or the stand-in in
local_triton/onnxruntime/. Also the environment such a server needs (server_env) and the allocator it preloads."""
import filecmp
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

from .settings import setting

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)
BACKEND_DIR = os.path.join(PROJECT, ".triton", "backends")
CONTAINER_SERVER = "/opt/tritonserver/bin/tritonserver"

def pytriton_root():
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
    found = sorted(glob.glob(os.path.join(os.path.dirname(pytriton_root()), "nvidia_pytriton.libs",
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
    root = pytriton_root()
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
    libs = [os.path.join(os.path.dirname(pytriton_root()), "nvidia_pytriton.libs")]
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
