"""Step 13 of `make bench`: the encoder on Triton's own C++ onnxruntime backend against the Python stand-in, in one
run (issue 50).

The container serves `embedding` with libtriton_onnxruntime.so; a machine without it uses the stand-in
(local_triton/onnxruntime/model.py: onnxruntime in a Python stub). Both serve the step-1 scratch repository, each in
its own server, in alternating rounds (stand-in, real, stand-in, real...), with the same perf_analyzer load as step 4:
- queries, one per request to `ensemble`, at QUERIES_IN_FLIGHT;
- client-batched, 32 mixed texts per request to `ensemble_bls`, at BATCHED_IN_FLIGHT;
and, around every reading, the CPU the server's processes used (tritonserver and its stubs, from /proc): CPU
milliseconds per text. Ratios are to the step-3 ceiling of the same workload (onnxruntime in-process).

Without a real backend (ONNXRUNTIME_BACKEND unset, or --onnxruntime-backend naming no folder) the step is left out.
"""
import os

from bench import common, loadgen

QUERIES_IN_FLIGHT = 32
BATCHED_IN_FLIGHT = 8
READINGS = (("queries", "ensemble", QUERIES_IN_FLIGHT), ("client-batched", "ensemble_bls", BATCHED_IN_FLIGHT))
# --short: {workload: (requests in flight, perf_analyzer's time window in ms)}; requests of 32 texts take a second or
# more each, read in count windows (None) of one answer per request in flight
SHORT_READINGS = {"queries": (8, 300), "client-batched": (2, None)}


def cpu_seconds(pid):
    """utime + stime of `pid` and every process under it (the stubs), in seconds; the stand-in's encoder is a stub."""
    ticks = os.sysconf("SC_CLK_TCK")
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append((int(entry), int(fields[11]) + int(fields[12])))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [pid]
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    while todo:
        for child, used in children.get(todo.pop(), []):
            total += used
            todo.append(child)
    return total / ticks


def arms(real_backend):
    """(name, ONNXRUNTIME_BACKEND) of each arm, in the order of a round."""
    return (("stand-in", ""), ("triton", real_backend))


def arm_of(server_env, real_backend):
    """The arm a server started with `server_env` runs (the launcher's environment: this process's, `server_env`
    over it), or None: another backend than either arm's."""
    folder = common.launch.onnxruntime_backend({**os.environ, **server_env})
    if folder is None:
        return "stand-in"
    return "triton" if folder == os.path.abspath(real_backend) else None


def read_arm(arm, round_index, server_pid, ports, workloads, work_dir, settings, progress):
    """One arm's readings on a running server of the scratch repository: a row per workload of READINGS.
    settings: {window_requests, max_trials, stability, short}: perf_analyzer's windows (short: SHORT_READINGS)."""
    os.makedirs(work_dir, exist_ok=True)
    log_path, short, rows = os.path.join(work_dir, "loadgen.log"), settings["short"], []
    http = f"127.0.0.1:{ports['http']}"
    for name, model, concurrency in READINGS:
        if name not in workloads:
            continue
        concurrency, window_ms = SHORT_READINGS[name] if short else (concurrency, None)
        in_flight = concurrency if short else 2 * concurrency
        per_request = workloads[name]["spec"].texts_per_request
        csv_path = os.path.join(work_dir, f"{arm}-{round_index}-{name}.csv")
        before, encoded = cpu_seconds(server_pid), loadgen.model_stats(http, "embedding")
        row = loadgen.perf_analyzer(model, f"127.0.0.1:{ports['grpc']}", workloads[name]["perf_data"],
                                    concurrency, csv_path, max(settings["window_requests"], in_flight),
                                    settings["max_trials"], log_path, stability=settings["stability"],
                                    batch=per_request, window_ms=window_ms)
        loadgen.drain(http, f"127.0.0.1:{ports['metrics']}", quiet_s=0.5 if short else 1.0)
        used = cpu_seconds(server_pid) - before
        # every text the encoder ran over the reading (perf_analyzer's trial windows included)
        texts = loadgen.stats_delta(encoded, loadgen.model_stats(http, "embedding"))["inference_count"]
        if row is None:
            progress(f"backends: {arm} {name}: no measurement (see {log_path})")
            continue
        ceiling = workloads[name]["ceiling"]["texts_per_s"]
        rows.append({"backend": arm, "round": round_index, "workload": name, "model": model,
                     "concurrency": concurrency, "texts_per_s": row["requests_per_s"],
                     "ratio": row["requests_per_s"] / ceiling, "p50_ms": row["p50_ms"],
                     "p99_ms": row["p99_ms"], "cpu_ms_per_text": 1000 * used / texts if texts else None})
        progress(f"backends: round {round_index} {arm:8s} {name:14s} c={concurrency:<3d} "
                 f"{row['requests_per_s']:7.1f} texts/s ({rows[-1]['ratio']:.2f} of the ceiling), "
                 f"p50 {row['p50_ms']:.1f} ms, CPU {rows[-1]['cpu_ms_per_text'] or 0:.2f} ms per text")
    return rows


def measure(work_dir, scratch, workloads, real_backend, rounds, settings, progress, read=None):
    """{"backends": [...], "rows": [{backend, round, workload, model, concurrency, texts_per_s, ratio, p50_ms, p99_ms,
    cpu_ms_per_text}], "ceilings": {workload: texts/s}}; None when there is no real backend to compare.
    settings: read_arm's; short: also each server killed once read.
    read: {arm: rows} of round 0 read already, on a server that was running anyway (bench/run.py's short run reads
    the arm its step-4 server runs there: one server fewer); that arm gets no server of its own in round 0."""
    if not real_backend:
        progress("backends: no Triton C++ onnxruntime backend (ONNXRUNTIME_BACKEND): step 13 left out")
        return None
    os.makedirs(work_dir, exist_ok=True)
    if not read:
        open(os.path.join(work_dir, "loadgen.log"), "w").close()
    ceilings = {name: workloads[name]["ceiling"]["texts_per_s"] for name, _, _ in READINGS if name in workloads}
    rows = [row for arm_rows in (read or {}).values() for row in arm_rows]
    for round_index in range(rounds):
        for arm, folder in arms(real_backend):
            if round_index == 0 and arm in (read or {}):
                continue
            ports = common.free_ports()
            server = common.start_server(scratch, ports, os.path.join(work_dir, f"tritonserver-{arm}.log"),
                                         {"ONNXRUNTIME_BACKEND": folder, "PROXY_HOST": "127.0.0.1"})
            try:
                rows += read_arm(arm, round_index, server.pid, ports, workloads, work_dir, settings, progress)
            finally:
                common.stop_server(server, drain=not settings["short"])
    return {"backends": [arm for arm, _ in arms(real_backend)],
            "real_backend": os.path.join(real_backend, "libtriton_onnxruntime.so"),
            "rows": rows, "ceilings": ceilings, "rounds": rounds}


def table(result):
    """Markdown: per workload and backend, every round's reading (texts/s, ratio, p50, CPU per text)."""
    def cells(rows, key, digits):
        return ", ".join("–" if r[key] is None else f"{r[key]:.{digits}f}" for r in rows)
    lines = ["| workload | in flight | backend | texts/s (each round) | of the ceiling | p50 ms | CPU ms per text |",
             "|---|---|---|---|---|---|---|"]
    for name, _, _ in READINGS:
        for arm in result["backends"]:
            rows = [r for r in result["rows"] if r["workload"] == name and r["backend"] == arm]
            if rows:
                lines.append(f"| {name} | {rows[0]['concurrency']} | {arm} | {cells(rows, 'texts_per_s', 1)} | "
                             f"{cells(rows, 'ratio', 2)} | {cells(rows, 'p50_ms', 1)} | "
                             f"{cells(rows, 'cpu_ms_per_text', 2)} |")
    return "\n".join(lines)
