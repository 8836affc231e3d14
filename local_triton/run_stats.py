"""What a run of the test suite spent on exports and servers (its closing lines, tests/suite_stats.py): where
TRITON_EMBED_RUN_STATS names a file, each export (build/export.py) and each tritonserver start (server.start, and
wait_ready once it is ready) appends one JSON line to it. One write per line to a file opened for appending, so the
many processes of a run need no lock. Unset (a user's run), nothing is written."""
import json
import os
import time

ENVIRONMENT = "TRITON_EMBED_RUN_STATS"


def record(event, **fields):
    path = os.environ.get(ENVIRONMENT)
    if not path:
        return
    line = json.dumps({"event": event, "at": time.time(), **fields}) + "\n"
    try:
        handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(handle, line.encode())
        finally:
            os.close(handle)
    except OSError:  # a count is never worth failing an export or a start
        pass
