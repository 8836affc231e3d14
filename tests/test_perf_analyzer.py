"""The README's perf_analyzer command, exactly as written (only the port is this test server's), with no extra
environment: the venv's perf_analyzer runs as it is (make setup set its rpath to libcudart)."""
import os
import re
import subprocess

from conftest import PROJECT


def readme_command():
    text = open(os.path.join(PROJECT, "README.md"), encoding="utf-8").read()
    block = re.search(r"<!-- perf_analyzer command.*?-->\n```bash\n(.*?)```", text, re.S).group(1)
    return block.replace("\\\n", " ")


def test_readme_perf_analyzer_command_runs(server):
    command = readme_command()
    assert ".venv/bin/perf_analyzer -m ensemble -u localhost:8001 -i grpc" in command
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run(command.replace("localhost:8001", server.grpc_url), shell=True, cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    throughputs = re.findall(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec", result.stdout)
    assert [int(c) for c, _ in throughputs] == [1, 5, 9] and all(float(t) > 0 for _, t in throughputs), \
        result.stdout[-3000:] + result.stderr[-2000:]
    assert "Composing models:" in result.stdout and "compute infer" in result.stdout  # the server-side split
