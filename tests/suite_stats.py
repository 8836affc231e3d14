"""The suite's closing lines (issue 66): what a run spent on exports and tritonserver starts, from the lines each
export and each start append to the file TRITON_EMBED_RUN_STATS names (local_triton/run_stats.py), in this process
and in every subprocess (exports, the launcher, the bench)."""
import json
import os
import tempfile

from local_triton.run_stats import ENVIRONMENT, record


def start():
    """A fresh stats file for this run (a caller's own TRITON_EMBED_RUN_STATS is kept: it reads it itself)."""
    if not os.environ.get(ENVIRONMENT):
        handle, path = tempfile.mkstemp(prefix="triton-embed-run-stats-", suffix=".jsonl")
        os.close(handle)
        os.environ[ENVIRONMENT] = path


def report(lines):
    """A table a test prints for the run's reader (parity figures, the hostile-input summary...): kept in the stats
    file and printed at the end by the process that reports (pytest-xdist's workers print nowhere)."""
    record("report", text="\n".join(lines))


def reports():
    return [event["text"] for event in _events() if event["event"] == "report"]


def _events():
    path = os.environ.get(ENVIRONMENT)
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summary():
    """The closing lines: exports by how each ended, servers started and their time to ready."""
    events = _events()
    if not events:
        return []
    exports = {}
    for event in (e for e in events if e["event"] == "export"):
        count, seconds = exports.get(event["outcome"], (0, 0.0))
        exports[event["outcome"]] = (count + 1, seconds + event["seconds"])
    starts = sum(1 for e in events if e["event"] == "server_start")
    ready = [e["seconds"] for e in events if e["event"] == "server_ready"]
    made = [f"{exports.get(outcome, (0, 0))[0]} {words} ({exports.get(outcome, (0, 0.0))[1]:.0f} s)"
            for outcome, words in (("full", "made in full"), ("cached", "copied from the export cache"),
                                   ("skipped", "skipped (--skip-if-exported)"), ("refused", "refused"))]
    return [f"exports: {', '.join(made)}",
            f"tritonserver: {starts} started, {len(ready)} ready after {sum(ready):.0f} s in all "
            f"({sum(ready) / max(len(ready), 1):.1f} s each)"]
