"""tritonserver as a process group the launcher owns: started in a session of its own (its Python stubs join it),
killed by the kernel should the launcher die without stopping it (die_with_this_process: PR_SET_PDEATHSIG), and by
the Watchdog's process (local_triton/watchdog.py) with its whole group; stopped with SIGTERM, then SIGKILL (stop);
once reaped, the rest of its group, its stubs' /dev/shm regions and its key files go (Server.cleanup)."""
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from model_library.triton_server import TritonHttp, process_table

from .watchdog import members as group_members

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `-m local_triton.watchdog` runs
SHM_PREFIX = "/dev/shm/triton_"
DEAD_STUB_GRACE_S = 10.0  # stopping a server with a dead stub: time for the requests in flight, then it is killed
STUB_EXIT_GRACE_S = 5.0  # stubs left by a tritonserver that exited: time to leave on their own, then they are killed
PR_SET_PDEATHSIG = 1  # prctl(2)


def children(pid):
    """{child pid: (state, argv)} of process `pid` (a zombie's argv is empty)."""
    return {child: (info.state, info.argv) for child, info in process_table(lambda info: info.ppid == pid).items()}


class Server:
    """A running tritonserver and the shared-memory regions of its Python stubs (removed after it exits: a stub
    that died leaves its region behind)."""

    def __init__(self, process, admin_key=None, http_port=None, address="127.0.0.1", keys_dir=None):
        self.process, self.regions, self.noted = process, set(), 0.0
        self.started = time.monotonic()  # for the time to ready (run_stats)
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


class Watchdog:
    """local_triton/watchdog.py, in a session of its own (Ctrl-C does not reach it): it kills the armed server's
    whole process group, tritonserver and its stubs, when this process ends without disarming it (kill -9, the
    OOM killer...). End of its input (our end of the pipe closes with this process, however it ends) is the
    signal: nothing to poll, and no pid that could be reused."""

    def __init__(self):
        read, self.pipe = os.pipe()  # (not inheritable: tritonserver must not hold our end)
        try:
            # a module of this package, run from the folder holding it (the checkout, or /opt/triton-embed in the
            # image: nothing is installed there), so that it imports model_library as the launcher does
            self.process = subprocess.Popen([sys.executable, "-m", "local_triton.watchdog"], stdin=read, cwd=PROJECT,
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
