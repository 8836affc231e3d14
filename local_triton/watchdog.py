"""The launcher's dead man's switch (local_triton/launch.py starts it as `python -m local_triton.watchdog`, in a
session of its own): tritonserver never outlives the launcher, whatever ends it (kill -9, the OOM killer, a process
manager's SIGKILL).

The launcher writes a JSON line per server to this process's stdin: {"pgid": <server's process group>, "keys_dir":
...} when one starts, {"pgid": 0} once it stopped it. End of input while a server is armed means the launcher died
without stopping it: SIGKILL to the server's process group, i.e. tritonserver and every Python stub (the proxy and
its port included), then what the launcher would have removed (the stubs' /dev/shm regions, the key files).

The server's PR_SET_PDEATHSIG (server.start) kills tritonserver alone; its stubs leave only once tritonserver is
reaped (they poll kill(parent, 0)), which is up to whoever adopts it. This process does not wait for that. Ctrl-C,
SIGHUP and SIGTERM are ignored: the launcher drains on those, and this process ends with the launcher's pipe.
"""
import json
import os
import shutil
import signal
import sys
import tempfile
import time

from model_library.triton_server import process_table

SHM_PREFIX = "/dev/shm/triton_"
KEYS_PREFIX = "triton-embed-keys-"  # settings.keys_to_files()'s directories
GONE_S = 10.0


def members(pgid):
    """{pid: argv} of the live (not zombie) processes of process group `pgid`."""
    return {pid: info.argv for pid, info in
            process_table(lambda info: info.pgrp == pgid and info.state != "Z").items()}


def kill_group(pgid, keys_dir=None):
    """SIGKILL to the group, wait (bounded) until it is gone, then remove its stubs' regions and the key files.
    Returns the number of processes it had."""
    found = members(pgid)
    regions = {args[2].decode(errors="replace") for args in found.values()
               if len(args) > 2 and args[2].startswith(b"triton_") and b"_shm_region_" in args[2]}
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # already gone
        pass
    deadline = time.monotonic() + GONE_S
    while members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    for region in regions:
        path = os.path.join("/dev/shm", region.lstrip("/"))
        if path.startswith(SHM_PREFIX) and "/" not in path[len("/dev/shm/"):]:
            try:
                os.remove(path)
            except OSError:
                pass
    if keys_dir and os.path.basename(keys_dir).startswith(KEYS_PREFIX) and \
            os.path.dirname(os.path.abspath(keys_dir)) == os.path.abspath(tempfile.gettempdir()):
        shutil.rmtree(keys_dir, ignore_errors=True)
    return len(found)


def main():
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    launcher, armed = os.getppid(), {"pgid": 0}
    for line in sys.stdin:
        try:
            armed = json.loads(line)
        except ValueError:
            continue
    if armed.get("pgid"):
        count = kill_group(int(armed["pgid"]), armed.get("keys_dir"))
        print(f"launch: the launcher (pid {launcher}) ended without stopping tritonserver (pid {armed['pgid']}): "
              f"killed what was left of its process group ({count} processes)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
