"""build/export.py for the suite's fixtures without its imports each time (issue 66): a process started once per
test process (tests/conftest.py's `export`) imports what every export imports (torch, transformers,
sentence-transformers, onnx, onnxruntime: ~8 s of CPU a run, ~40 exports a suite), then forks itself once per export.
The fork runs build/export.py as `python build/export.py ARGS` would (as __main__, its folder first on sys.path), with
the caller's environment and working folder, its output into the files the request names; the exit code comes back.

Requests and answers are JSON lines on stdin and stdout:
  {"argv": [...], "env": {...}, "cwd": ..., "stdout": <file>, "stderr": <file>}  ->  {"code": <exit code>}
No threads are started before a fork: the imports start none, and this loop makes no other work.
"""
import atexit
import json
import os
import runpy
import sys
import traceback


def run_export(script, request):
    """In the fork: build/export.py's run as its own process would make it; never returns."""
    code = 1
    try:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [script, *request["argv"]]
        sys.stdin = open(os.devnull)  # nothing to read: export never asks on a terminal
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exit_:  # what the interpreter does with sys.exit(value)
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - an uncaught error: its traceback on stderr, exit code 1
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main():
    script = sys.argv[1]
    import numpy  # noqa: F401 - the imports a fork then has for free
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import sentence_transformers  # noqa: F401
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import torch.onnx  # noqa: F401
    import transformers  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_export(script, request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
