"""A steady background CPU load on the cores the server runs on, for measuring on a machine that is not quiet
(issue 69): N busy processes (default one per core), each a tight pure-Python loop at a niceness (default 10), in a
process group of their own, stopped on leaving the `with` block however it is left (an exception, Ctrl-C), and
killed by the kernel should this process die first (PR_SET_PDEATHSIG). What they ran and the CPU they actually got
(utime + stime from /proc/<pid>/stat against the wall time) is one line for the reports:

    with BackgroundLoad(procs=2, nice=10) as load:
        ...                       # the measurement
    print(load.describe())        # "background load: 2 busy Python processes at nice 10 ... got 0.31 cores ..."

    python -m bench.background_load --seconds 5      # how much a niced load gets on this machine, alone
"""
import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

from local_triton.process_group import die_with_this_process

# The busy loop: a linear congruential generator in pure Python (no import to wait for, no memory to touch). The
# child sets its own niceness, so the parent's stays as it is.
LOOP = ("import os, sys\n"
        "try:\n"
        "    os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))\n"
        "except OSError:\n"
        "    pass\n"
        "x = 1\n"
        "while True:\n"
        "    x = (x * 1103515245 + 12345) & 0xFFFFFFFF\n")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of `pid` (/proc/<pid>/stat, fields 14 and 15), in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # fields[0] is field 3 (state)


def niceness(pid):
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


class BackgroundLoad:
    """`procs` busy processes at niceness `nice` while the block runs. `procs` 0: none (a measurement without the
    load goes through the same code and says so)."""

    def __init__(self, procs=None, nice=10):
        self.procs = os.cpu_count() if procs is None else procs
        self.nice = nice
        self.processes, self.pids, self.niceness = [], [], []
        self.started = self.stopped = None
        self.cpu = []  # CPU seconds each process got, read when it is stopped

    def start(self):
        """Starts the processes (again, after a stop: one object serves every measured stretch)."""
        self.processes, self.pids, self.niceness, self.cpu = [], [], [], []
        self.started, self.stopped = time.monotonic(), None
        group = None
        try:
            for _ in range(self.procs):
                process = subprocess.Popen(
                    [sys.executable, "-S", "-c", LOOP, str(self.nice)], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_this_process(),
                    # a process group of their own (the first one's): a terminal's Ctrl-C is this process's to handle
                    process_group=0 if group is None else group)
                group = process.pid if group is None else group
                self.processes.append(process)
                self.pids.append(process.pid)
        except BaseException:
            self.stop()
            raise
        time.sleep(0.05)  # each has set its niceness (read back for the report)
        self.niceness = [niceness(pid) for pid in self.pids]
        return self

    def usage(self):
        """(cores the load got on average so far, seconds so far): CPU seconds over wall seconds."""
        wall = (self.stopped or time.monotonic()) - self.started if self.started else 0.0
        got = sum(self.cpu) if self.stopped else sum(cpu_seconds(pid) or 0.0 for pid in self.pids)
        return (got / wall if wall > 0 else 0.0), wall

    def stop(self):
        """Read what each process got, then SIGTERM to the group, SIGKILL to any left after 2 s, and reap them all."""
        if self.stopped is not None:
            return
        self.cpu = [cpu_seconds(pid) or 0.0 for pid in self.pids]
        self.stopped = time.monotonic()
        live = [p for p in self.processes if p.poll() is None]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        for process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def report(self):
        """The load as data, for the JSON reports."""
        cores, wall = self.usage()
        return {"procs": self.procs, "nice": self.nice, "niceness_read": self.niceness, "pids": self.pids,
                "seconds": round(wall, 2), "cpu_cores": round(cores, 3),
                "cpu_share": round(cores / (os.cpu_count() or 1), 3),
                "per_process_share": [round(c / wall, 3) if wall > 0 else 0.0 for c in self.cpu] if self.stopped
                else None, "machine_cores": os.cpu_count(), "line": self.describe()}

    def describe_settings(self):
        """What runs, before it has run."""
        return (f"background load: {self.procs} busy Python process{'es' if self.procs != 1 else ''} at nice "
                f"{self.nice} on {os.cpu_count()} cores")

    def describe(self):
        """One line for the reports: what ran, and what it got."""
        if not self.procs:
            return "background load: off"
        cores, wall = self.usage()
        nice = sorted({n for n in self.niceness if n is not None}) or [self.nice]
        return (f"background load: {self.procs} busy Python process{'es' if self.procs != 1 else ''} at nice "
                f"{'/'.join(map(str, nice))} (bench/background_load.py) on {os.cpu_count()} cores; they got "
                f"{cores:.2f} cores over {wall:.1f} s ({cores / (os.cpu_count() or 1):.0%} of the machine, "
                f"{cores / self.procs:.0%} of what they asked)")


# ---------------------------------------------------------------- the benchmarks' flags
def add_arguments(parser):
    parser.add_argument("--background-load", action="store_true", help="run the measurement beside a steady "
                        "background CPU load (bench/background_load.py): busy processes on the same cores, niced; "
                        "what they got is stated in the report")
    parser.add_argument("--background-procs", type=int, default=os.cpu_count(), help="busy processes of the "
                        "background load (default: one per core, %(default)s)")
    parser.add_argument("--background-nice", type=int, default=10, help="their niceness (default %(default)s; 0: "
                        "as greedy as the server)")


def from_args(args):
    """A BackgroundLoad for the flags, or None when --background-load is off."""
    return BackgroundLoad(args.background_procs, args.background_nice) if args.background_load else None


def running(load):
    """`with running(load):` one measured stretch beside `load` (from_args's; None: nothing runs)."""
    return load if load else contextlib.nullcontext()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--procs", type=int, default=os.cpu_count())
    parser.add_argument("--nice", type=int, default=10)
    args = parser.parse_args(argv)
    with BackgroundLoad(args.procs, args.nice) as load:
        time.sleep(args.seconds)
    print(load.describe())


if __name__ == "__main__":
    main()
