"""Load generators: perf_analyzer (gRPC, KServe) and wrk (HTTP, for the OpenAI-style proxy), plus Triton stats."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

VENV_BIN = os.path.dirname(sys.executable)


# ---------------------------------------------------------------- perf_analyzer
def perf_analyzer_binary():
    path = os.path.join(VENV_BIN, "perf_analyzer")
    if os.path.exists(path):
        return path
    found = shutil.which("perf_analyzer")
    if not found:
        raise SystemExit("bench: perf_analyzer not found (pip install tritonclient==2.48.0 in the venv)")
    return found


def write_ensemble_data(path, corpus):
    """One entry per text; perf_analyzer's -b N sends N consecutive entries as one request of N rows."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"data": [{"text": [c["text"]]} for c in corpus]}, handle)


def write_token_data(path, encodings):
    """Client-side tokenization: one unpadded [1, L] request per text, as a client tokenizing one text sends."""
    data = []
    for ids in encodings:
        data.append({"input_ids": {"content": list(ids), "shape": [len(ids)]},
                     "attention_mask": {"content": [1] * len(ids), "shape": [len(ids)]}})
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"data": data}, handle)


def parse_perf_csv(text):
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError("empty perf_analyzer CSV")
    row = rows[0]
    us = lambda key: float(row[key]) / 1000.0  # noqa: E731 - µs -> ms
    server = {k: float(row[k]) / 1000.0 for k in ("Server Queue", "Server Compute Input", "Server Compute Infer",
                                                    "Server Compute Output") if k in row}
    return {"requests_per_s": float(row["Inferences/Second"]), "p50_ms": us("p50 latency"),
            "p90_ms": us("p90 latency"), "p99_ms": us("p99 latency"),
            "server_ms": server}


def perf_analyzer(model, url, data_path, concurrency, csv_path, window_requests, max_trials, log_path,
                  stability=25, timeout_s=420, batch=1, window_ms=None):
    """One concurrency level over gRPC; returns the parsed row, or None (log says why).

    count_windows: every window holds at least `window_requests` responses, so slow systems at high concurrency
    (latency of seconds) still get full windows; the caller sizes it from the last measured rate.
    window_ms: time windows of that many milliseconds instead, for a smoke run's reading of a fast system: a count
    window lasts a second at least, 3 of them 3 s. A time window that ends with no response fails the run, which
    is then read again in count windows."""
    load = [perf_analyzer_binary(), "-m", model, "-u", url, "-i", "grpc", "--async",
            "--input-data", data_path, "-b", str(batch), "--concurrency-range", str(concurrency)]
    output = ["--percentile", "99", "-f", csv_path]
    count_windows = ["--measurement-mode", "count_windows", "--measurement-request-count", str(window_requests)]
    first = (["--measurement-mode", "time_windows", "--measurement-interval", str(int(window_ms))] if window_ms
             else count_windows)
    # Unstable on a noisy machine (or a time window with no response): the second try takes any measurement in
    # count windows (very loose stability).
    attempts = [[*load, *first, "--stability-percentage", str(stability), "--max-trials", str(max_trials), *output],
                [*load, *count_windows, "--stability-percentage", "1000", "--max-trials", "3", *output]]
    for attempt, command in enumerate(attempts):
        if os.path.exists(csv_path):
            os.remove(csv_path)
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n$ {' '.join(command)}\n")
            log.flush()
            try:
                result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                        timeout=timeout_s)
                code = result.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        if code == 0 and os.path.exists(csv_path):
            with open(csv_path, encoding="utf-8") as handle:
                row = parse_perf_csv(handle.read())
            row["stable"] = attempt == 0
            return row
    return None


# ---------------------------------------------------------------- wrk
WRK_SCRIPT = r"""
-- Cycles through request bodies (one JSON body per line of BODIES); reports percentiles as JSON in done().
local bodies = {}
for line in io.lines("%(bodies)s") do bodies[#bodies + 1] = line end
local counter = 0
wrk.method = "POST"
wrk.path = "%(path)s"
wrk.headers["Content-Type"] = "application/json"

function init(args)
  counter = math.random(#bodies) - 1
end

function request()
  counter = counter %% #bodies + 1
  return wrk.format(nil, nil, nil, bodies[counter])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "mean_us": %%f, ' ..
    '"errors": %%d, "non2xx": %%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def write_wrk_script(path, bodies, url_path):
    bodies_path = path + ".bodies"
    with open(bodies_path, "w", encoding="utf-8") as handle:
        for body in bodies:
            handle.write(json.dumps(body, ensure_ascii=False) + "\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(WRK_SCRIPT % {"bodies": bodies_path, "path": url_path})
    return path


def wrk(url, script, concurrency, duration_s, log_path, warmup_s=1.0):
    binary = shutil.which("wrk")
    if not binary:
        raise SystemExit("bench: wrk not found (Debian package wrk; `make setup` installs it)")
    base = [binary, "-t", "1", "--timeout", "30s", "--latency", "-s", script]
    with open(log_path, "a", encoding="utf-8") as log:
        if warmup_s:
            subprocess.run([*base, "-c", str(concurrency), "-d", f"{warmup_s:g}s", url], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=warmup_s + 60)
        command = [*base, "-c", str(concurrency), "-d", f"{duration_s}s", url]
        log.write(f"\n$ {' '.join(command)}\n")
        result = subprocess.run(command, capture_output=True, text=True, timeout=duration_s + 90)
        log.write(result.stdout + result.stderr)
    for line in result.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            data = json.loads(line[len("WRK_JSON "):])
            ok = data["requests"] - data["errors"] - data["non2xx"]
            if data["requests"] == 0 or ok <= 0:
                return None
            return {"requests_per_s": ok / (data["duration_us"] / 1e6), "p50_ms": data["p50_us"] / 1000.0,
                    "p90_ms": data["p90_us"] / 1000.0, "p99_ms": data["p99_us"] / 1000.0,
                    "avg_ms": data["mean_us"] / 1000.0, "errors": data["errors"] + data["non2xx"],
                    "requests": data["requests"]}
    return None


# ---------------------------------------------------------------- Triton statistics
def pending_requests(metrics_url):
    """Requests queued in Triton (all models), from the `nv_inference_pending_request_count` gauge."""
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nv_inference_pending_request_count"))


def drain(http_url, metrics_url, models=("ensemble", "embedding"), timeout_s=120, quiet_s=1.0):
    """Wait until the server has finished what a load generator left in flight (wrk stops without waiting for
    outstanding responses), so it does not leak into the next measurement: nothing queued, and no request
    completed for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        current = [model_stats(http_url, m)["success_count"] if m else 0 for m in models]
        if current == last and pending_requests(metrics_url) == 0:
            return True
        last = current
        time.sleep(quiet_s)
    return False


def model_stats(http_url, model):
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=30) as response:
        stats = json.load(response)["model_stats"][0]
    inference = stats["inference_stats"]
    return {
        "inference_count": int(stats.get("inference_count", 0)),
        "execution_count": int(stats.get("execution_count", 0)),
        **{f"{k}_ns": int(inference[k]["ns"]) for k in ("queue", "compute_input", "compute_infer", "compute_output",
                                                        "success")},
        "success_count": int(inference["success"]["count"]),
        "batch_stats": {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])},
    }


def stats_delta(before, after):
    delta = {k: after[k] - before[k] for k in after if k != "batch_stats"}
    delta["batch_stats"] = {b: n - before["batch_stats"].get(b, 0) for b, n in after["batch_stats"].items()
                            if n - before["batch_stats"].get(b, 0) > 0}
    executions = delta["execution_count"]
    delta["mean_batch"] = delta["inference_count"] / executions if executions else 0.0
    requests = delta["success_count"]
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        delta[f"{k}_ms_per_request"] = delta[f"{k}_ns"] / requests / 1e6 if requests else 0.0
    return delta
