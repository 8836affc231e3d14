"""Where an export is. Each stage (load, calibrate, trace, onnx, parity, reference, install) is announced with the
export's elapsed time when it starts, a line every HEARTBEAT_S says which one is still running, and the closing
line (install_export) lists their times. A full-size bge-m3 takes 16 minutes on 2 cores (issue 71), which a few
log lines left a user to guess at.

Stages are marks in one sequence: a stage runs until the next one starts (what an export does between two marked
steps, writing files, counts in the earlier one), so a family's module marks only the steps it has.

Progress lines go to the terminal, not into the export cache's printout (cache.Printout): a copy from the cache
prints what the export it copies printed, whose timings are not the copy's."""
import functools
import os
import sys
import threading
import time

HEARTBEAT_S = float(os.environ.get("EXPORT_PROGRESS_INTERVAL_S", 60))
STATE = {"started": time.monotonic(), "stage": None, "since": 0.0, "times": {}, "stop": None}
LOCK = threading.Lock()


def say(text):
    stream = getattr(sys.stdout, "stream", sys.stdout)  # around the cache's printout (the module docstring)
    print(f"export: [{time.monotonic() - STATE['started']:7.1f} s] {text}", file=stream, flush=True)


def begin(started):
    """A new export, started at `started` (time.monotonic()): stage "load" runs, and the heartbeat."""
    end()
    stop = threading.Event()
    STATE.update(started=started, stage=None, times={}, stop=stop)
    mark("load")

    def heartbeat():  # every HEARTBEAT_S of one stage
        said = {}
        while not stop.wait(min(HEARTBEAT_S, 1.0)):
            with LOCK:
                name, since = STATE["stage"], STATE["since"]
            now = time.monotonic()
            if name and now - max(since, said.get((name, since), since)) >= HEARTBEAT_S:
                said[(name, since)] = now
                say(f"{name}: still running ({now - since:.0f} s so far)")

    threading.Thread(target=heartbeat, name="export progress", daemon=True).start()


def mark(name):
    """Stage `name` starts; the one running ends."""
    now = time.monotonic()
    with LOCK:
        if STATE["stage"] == name:
            return
        close(now)
        STATE.update(stage=name, since=now)
    say(f"{name}...")


def close(now):
    if STATE["stage"]:
        STATE["times"][STATE["stage"]] = STATE["times"].get(STATE["stage"], 0.0) + now - STATE["since"]
    STATE["stage"] = None


def end():
    """The export is over (done or refused): the running stage ends, the heartbeat stops."""
    with LOCK:
        close(time.monotonic())
        if STATE["stop"] is not None:
            STATE["stop"].set()
            STATE["stop"] = None


def staged(name):
    """A decorated step starts stage `name` (the stage goes on after it returns, until the next mark)."""
    def wrap(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            mark(name)
            return function(*args, **kwargs)
        return run
    return wrap


def summary():
    """'load 12.1 s, trace 3.0 s, ...': the stages this export ran, in their order (after end())."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in STATE["times"].items())
