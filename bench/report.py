"""Turn a run (bench/results/<mode>/results.json) into benchmarks.md, plots, and the targets table on stdout."""
import os

LABELS = {
    "ensemble": "ensemble (gRPC, perf_analyzer)",
    "ensemble_bls": "ensemble_bls: length groups inside Triton (gRPC, perf_analyzer)",
    "proxy_http": "HTTP proxy /v1/embeddings (wrk)",
    "kserve_http": "Triton KServe HTTP → ensemble (wrk)",
    "client_tokenization": "client-side tokenization → embedding (gRPC, perf_analyzer)",
    "pytorch_baseline": "Python-backend PyTorch model (gRPC, perf_analyzer)",
}
TARGETS = {"queries": 0.75, "passages": 0.9, "mixed": 0.9, "client-batched": 0.95}  # issue 8, × ceiling
TUNING_NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "TUNING.md")


def best(rows):
    """(concurrency, row) with the highest throughput, or (None, None)."""
    if not rows:
        return None, None
    concurrency = max(rows, key=lambda c: rows[c]["texts_per_s"])
    return concurrency, rows[concurrency]


def _num(value, digits=1):
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(a, b):
    return a / b if a and b else None


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _warmup(settings):
    """The wrk warm-up before each reading, as the report words it (a smoke run has none)."""
    seconds = settings.get("wrk_warmup_s", 1.0)  # runs from before the setting was recorded had 1 s
    return f"after a {seconds:g} s warm-up" if seconds else "with no warm-up"


def _time_windows(settings):
    """A short run's time windows, as the report words them (none in a full run)."""
    seconds = settings.get("time_windows_s")
    return f" or, where a request takes a tenth of one at most, time windows of {seconds:g} s" if seconds else ""


def _levels(rows):
    return {int(c): row for c, row in (rows or {}).items()}


def targets(run):
    out = []
    for name, wanted in TARGETS.items():
        workload = run["workloads"].get(name)
        if not workload:
            continue
        c, row = best(_levels(workload["results"].get("ensemble")))
        ceiling = workload["ceiling"]
        value = _ratio(row and row["texts_per_s"], ceiling["texts_per_s"])
        out.append({"target": f"{name}: ensemble / onnxruntime ceiling (best level)", "wanted": f"≥ {wanted}",
                    "value": value, "ok": value is not None and value >= wanted,
                    "detail": f"{_num(row and row['texts_per_s'])} texts/s at c={c} vs {_num(ceiling['texts_per_s'])} "
                              f"(batch {ceiling['batch_size']})"})
    batched = run["workloads"].get("client-batched")
    if batched:  # issue 15: many-text KServe requests through the BLS model
        c, row = best(_levels(batched["results"].get("ensemble_bls")))
        ceiling = batched["ceiling"]
        value = _ratio(row and row["texts_per_s"], ceiling["texts_per_s"])
        grouped = batched.get("grouped")  # what is left: one request's own groups, without the server
        split = "" if not grouped else (
            f"; in-process on the same requests, each in its own length groups ({grouped['rows_per_run']:.1f} rows "
            f"per run): {_num(grouped['texts_per_s'])}, ensemble_bls "
            f"{_num(_ratio(row and row['texts_per_s'], grouped['texts_per_s']), 2)}× that")
        out.append({"target": "client-batched: ensemble_bls / onnxruntime ceiling (best level)", "wanted": "≥ 0.8",
                    "value": value, "ok": value is not None and value >= 0.8,
                    "detail": f"{_num(row and row['texts_per_s'])} texts/s at c={c} vs {_num(ceiling['texts_per_s'])} "
                              f"(batch {ceiling['batch_size']}){split}"})
    queries = run["workloads"].get("queries")
    if queries:
        ensemble, proxy = _levels(queries["results"].get("ensemble")), _levels(queries["results"].get("proxy_http"))
        _, e_best = best(ensemble)
        c_p, p_best = best(proxy)
        value = _ratio(p_best and p_best["texts_per_s"], e_best and e_best["texts_per_s"])
        out.append({"target": "queries: proxy / direct gRPC (best of each)", "wanted": "≥ 0.9", "value": value,
                    "ok": value is not None and value >= 0.9,
                    "detail": f"{_num(p_best and p_best['texts_per_s'])} vs {_num(e_best and e_best['texts_per_s'])} "
                              f"texts/s"})
        # Interleaved rounds where the run has them (run.one_in_flight_rounds), else the levels' single readings.
        rounds = run.get("one_in_flight") or {}
        one_p, one_e = rounds.get("proxy_http") or proxy.get(1), rounds.get("ensemble") or ensemble.get(1)
        one_k = rounds.get("kserve_http") or _levels(queries["results"].get("kserve_http")).get(1)
        added = one_p["p50_ms"] - one_e["p50_ms"] if one_p and one_e else None
        count = len(rounds["proxy_http"]["rounds"]) if "proxy_http" in rounds else 0
        how = f"median of {count} interleaved rounds" if count > 1 else "one interleaved round" if count else \
            "one reading each"
        same_client = "" if not (one_p and one_k) else (
            f"; against Triton's KServe HTTP with the same client ({_num(one_k['p50_ms'], 2)} ms): "
            f"{one_p['p50_ms'] - one_k['p50_ms']:+.2f} ms")
        out.append({"target": "queries: proxy's added p50 at concurrency 1 (ms)", "wanted": "≤ 1", "value": added,
                    "ok": added is not None and added <= 1.0,
                    "detail": f"p50 {_num(one_p and one_p['p50_ms'], 2)} ms (wrk, proxy) − "
                              f"{_num(one_e and one_e['p50_ms'], 2)} ms (perf_analyzer, gRPC), {how}{same_client}"})
    floor = run.get("overhead")
    if floor:  # issue 15: what the tokenizer and the encoder's glue cost when the model costs nearly nothing
        rows = [floor.get(m) or {} for m in ("ensemble", "echo_ensemble")]
        out.append({"target": f"serving floor: tiny-model ensemble / echo ensemble (c={floor['concurrency']})",
                    "wanted": "≥ 0.7", "value": floor["ratio"], "ok": (floor["ratio"] or 0) >= 0.7,
                    "detail": f"{_num(rows[0].get('requests_per_s'))} vs {_num(rows[1].get('requests_per_s'))} "
                              f"single-text requests/s ({floor.get('model', '2-layer 64-wide XLM-R')}; best of "
                              f"{floor['rounds']} rounds; RATE_LIMIT={floor.get('rate_limit', 'on')})"})
    bulk = run.get("bulk")
    if bulk:  # issue 39: the bulk command, fed like the ceiling, and its memory
        out.append({"target": f"bulk: make embed / onnxruntime ceiling ({bulk['texts']} mixed texts)",
                    "wanted": f"≥ {bulk['target']}", "value": bulk["ratio"], "ok": bulk["ratio"] >= bulk["target"],
                    "detail": f"{_num(bulk['bulk_texts_per_s'])} vs {_num(bulk['ceiling_texts_per_s'])} texts/s "
                              f"(batch {bulk['ceiling_batch_size']}, full pass)"})
        small, large = sorted(bulk["memory"], key=int)
        out.append({"target": f"bulk: peak RSS at {large} / {small} rows", "wanted": f"≤ {bulk['memory_limit']}",
                    "value": bulk["memory_ratio"], "ok": bulk["memory_ratio"] <= bulk["memory_limit"],
                    "detail": f"{_num(bulk['memory'][large]['peak_rss_mib'])} vs "
                              f"{_num(bulk['memory'][small]['peak_rss_mib'])} MiB"})
    tail = run.get("tail")
    if tail and tail.get("met") is not None:  # issue 37: direct KServe HTTP's tail with other exports loaded
        kserve = [r for rows in tail["rounds"] for r in rows if r["door"] == "kserve_http"]
        worst = max(kserve, key=lambda r: r["ratio"])
        out.append({"target": "queries: KServe HTTP p99 / p50, several exports loaded, every reading",
                    "wanted": f"≤ {tail['target']:g}", "value": worst["ratio"], "ok": tail["met"],
                    "detail": f"worst of {len(kserve)}: round {worst['round']}, c={worst['level']}, p50 "
                              f"{_num(worst['p50_ms'])} ms, p99 {_num(worst['p99_ms'])} ms "
                              f"({', '.join(tail['extras'])} loaded)"})
    for target in out:
        target["status"] = "not measured" if target["value"] is None else "met" if target["ok"] else "missed"
    return out


def targets_text(run):
    rows = targets(run)
    width = max(len(t["target"]) for t in rows) if rows else 10
    lines = ["", "Targets (issues 8 and 15): " + run["manifest"]["model"]]
    for t in rows:
        lines.append(f"  {t['target']:<{width}}  {_num(t['value'], 2):>7}  ({t['wanted']})  {t['status']:<8}  "
                     f"{t['detail']}")
    return "\n".join(lines)


def plots(run, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(run["workloads"])
    paths = []
    for metric, filename, ylabel in (("texts_per_s", "bench_throughput.png", "texts/s"),
                                     ("p99_ms", "bench_p99_latency.png", "p99 latency (ms)")):
        figure, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4), squeeze=False)
        for axis, name in zip(axes[0], names):
            workload = run["workloads"][name]
            for system, rows in workload["results"].items():
                rows = _levels(rows)
                if rows:
                    levels = sorted(rows)
                    axis.plot(levels, [rows[c][metric] for c in levels], marker="o", label=system)
            if metric == "texts_per_s":
                axis.axhline(workload["ceiling"]["texts_per_s"], color="black", linestyle="--",
                             label=f"ceiling (batch {workload['ceiling']['batch_size']})")
                axis.set_ylim(bottom=0)
            else:
                axis.set_yscale("log")
            axis.set_xscale("log", base=2)
            axis.set_title(name, fontsize=10)
            axis.set_xlabel("requests in flight")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=7)
        axes[0][0].set_ylabel(ylabel)
        figure.suptitle(f"{run['manifest']['model']} ({run['mode']} run, {run['device']})", fontsize=10)
        figure.tight_layout()
        path = os.path.join(output, filename)
        figure.savefig(path, dpi=100)
        plt.close(figure)
        paths.append(path)
    return paths


def breakdown_section(run):
    times = run.get("breakdown")
    if not times:
        return []
    traced, micro = times["traced"], times["micro"]
    python_work = micro["decode"] + micro["encode"] + micro["grouping"] + micro["response"]
    rows = []
    for key, label, paid in times["segments"]:
        ms = traced[key]
        if key == "tokenizer_to_encoder":
            rows += [[f"  tokenizer execute(): decode {micro['decode']:.3f}, encode {micro['encode']:.3f}, grouping "
                      f"{micro['grouping']:.3f}, numpy + tensors {micro['response']:.3f}", _num(python_work, 3),
                      "micro-benchmark", "yes"],
                     ["  tokenizer stub: request loading, response send (one IPC round trip), ensemble → encoder",
                      _num(ms - python_work, 3), "trace − micro", "yes"]]
            label = label + " (sum of the two rows above)"
        if key == "encoder_to_response":
            rows += [["  onnxruntime run, [1, L]", _num(micro["onnxruntime"], 3), "micro-benchmark", "yes"],
                     ["  stand-in stub: request loading, Python, response IPC", _num(ms - micro["onnxruntime"], 3),
                      "trace − micro", "**stand-in only**"]]
            label = label + " (sum of the two rows above)"
        rows.append([label, _num(ms, 3), "trace", paid])
    total = sum(traced.values())
    stand_in = traced["encoder_input"] + traced["encoder_to_response"] - micro["onnxruntime"]
    rows.append(["**sum of the traced steps**", f"**{total:.3f}**", "trace", ""])
    rows.append(["client p50 (gRPC, one request in flight)", _num(times["client_p50_ms"], 3), "client", ""])
    rows.append(["**stand-in's share** (inputs to its stub, its Python and IPC: the container's C++ backend runs the "
                 "same ONNX in-process)", f"**{stand_in:.3f}**", "trace − micro", "no"])
    out = ["## Where one short request's time goes", "",
           f"{times['requests']} queries sent one at a time over gRPC to `ensemble`, traced by Triton (trace API, "
           "level TIMESTAMPS); medians in ms. Work inside the stubs is split by micro-benchmarks of the same code on "
           "the same texts (bench/breakdown.py). The last column says whether the tritonserver container pays the "
           "row: the encoder stand-in is this machine's Python replacement for the C++ onnxruntime backend.", "",
           _table(["step", "ms", "measured by", "in the container"], rows), ""]
    if times.get("py_spy"):
        out += ["Under load (queries at concurrency 64), py-spy's samples of each stub (innermost frame of the "
                "model's own code; \"waiting\" = no Python running, e.g. blocked in the backend's IPC):", ""]
        for model, entries in times["py_spy"].items():
            out.append(f"- `{model}`: " + "; ".join(f"{share:.0%} {label}" for share, label in entries))
        out.append("")
    return out


def workload_sections(run):
    out = []
    for name, workload in run["workloads"].items():
        info, ceiling = workload["info"], workload["ceiling"]
        out += [f"### {name}: {info['description']}", "",
                f"{info['size']} texts (seed {info['seed']}, sha256 `{info['sha256'][:12]}…`), mean "
                f"{info['mean_tokens']:.1f} tokens (median {info['median_tokens']:.0f}, {info['min_tokens']}-"
                f"{info['max_tokens']}), {info['texts_per_request']} per request. Ceiling: "
                f"{_num(ceiling['texts_per_s'])} texts/s at batch {ceiling['batch_size']}.", ""]
        for system, rows in workload["results"].items():
            rows = _levels(rows)
            if not rows:
                continue
            model = "pytorch_baseline" if system == "pytorch_baseline" else "embedding"
            # wrk times every answer, refusals (the proxy's 429s) included: such a row's percentiles are starred.
            star = {c: "*" if r.get("errors") else "" for c, r in rows.items()}
            table = [[c, _num(r["texts_per_s"]), _num(r["p50_ms"]) + star[c], _num(r["p90_ms"]) + star[c],
                      _num(r["p99_ms"]) + star[c], f"{r['errors']:,} of {r['requests']:,}" if r.get("errors") else "0",
                      _num(r["stats"][model]["mean_batch"], 2), _num(r["stats"]["tokenizer"]["mean_batch"], 2),
                      _num(_ratio(r["texts_per_s"], ceiling["texts_per_s"]), 2)] for c, r in sorted(rows.items())]
            out += [f"**{LABELS[system]}**", "",
                    _table(["in flight", "texts/s", "p50 ms", "p90 ms", "p99 ms", "refused or failed", "encoder batch",
                            "tokenizer batch", "× ceiling"], table), ""]
            if any(star.values()):
                out += ["\\* These percentiles include the refused answers (wrk times every answer; a refused client "
                        "sends again at once); texts/s counts answered texts only.", ""]
        c, row = best(_levels(workload["results"].get("ensemble")))
        if row:
            steps = []
            for model in ("tokenizer", "embedding"):
                s = row["stats"][model]
                steps.append([model, _num(s["mean_batch"], 2), _num(s["queue_ms_per_request"], 2),
                              _num(s["compute_input_ms_per_request"], 2), _num(s["compute_infer_ms_per_request"], 2),
                              _num(s["compute_output_ms_per_request"], 2)])
            out += [f"Triton's per-step statistics at the ensemble's best level (c={c}), ms per request:", "",
                    _table(["step", "mean batch", "queue", "input", "infer", "output"], steps), ""]
    return out


def markdown(run, plot_names):
    m = run["manifest"]
    out = [f"# Benchmarks: {m['model']} on Triton ({run['mode']} run, {run['device']})", ""]
    if run.get("title"):
        out += [run["title"], ""]
    out += [f"Generated by `{run['command']}` (`make bench`) on {run['date']} in {run['elapsed_s'] / 60:.1f} min. "
            "Everything below is measured in that one run; the raw numbers are in "
            f"`bench/results/{run['mode']}/results.json`. Repeat runs on this shared 2-core machine vary by about "
            "±10-15 %.", "", "## Targets", "",
            "Each workload's ceiling is onnxruntime in-process on the served `model.onnx`, on the same texts sorted "
            "by length (no padding to speak of), at its best batch size of 1-64.", "",
            _table(["target", "wanted", "measured", "status", "how"],
                   [[t["target"], t["wanted"], _num(t["value"], 2), f"**{t['status']}**", t["detail"]]
                    for t in targets(run)]), "", "## Workloads", ""]
    rows = []
    for name, workload in run["workloads"].items():
        ceiling = workload["ceiling"]
        for system in workload["results"]:
            c, row = best(_levels(workload["results"][system]))
            if row:
                rows.append([name, LABELS[system], f"c={c}", _num(row["texts_per_s"]), _num(row["p50_ms"]),
                             _num(row["p99_ms"]), _num(_ratio(row["texts_per_s"], ceiling["texts_per_s"]), 2),
                             f"{_num(ceiling['texts_per_s'])} (batch {ceiling['batch_size']})"])
    out += [_table(["workload", "system", "at", "texts/s", "p50 ms", "p99 ms", "× ceiling", "ceiling texts/s"], rows),
            "", f"![throughput]({plot_names[0]})", "", f"![p99 latency]({plot_names[1]})", ""]
    out += breakdown_section(run)
    out += ["## Every level", ""] + workload_sections(run)
    probe = run.get("probe")
    if probe:
        out += ["## Padding efficiency of the batches the encoder ran", "",
                f"{probe['texts']} mixed texts at concurrency {probe['concurrency']} through `ensemble_probe` "
                "(bench-only copy of `ensemble` that also returns the padded `attention_mask`): real tokens "
                f"{probe['real_tokens']:,}, computed {probe['computed_tokens']:,}, **padding efficiency "
                f"{probe['padding_efficiency']:.3f}**; encoder mean batch {probe['embedding']['mean_batch']:.2f}.", ""]
    if run.get("rerank"):
        from bench.rerank import table

        out += ["## Cross-encoder reranking", "",
                "One query against documents of the mixed corpus per request, sequentially (bench/rerank.py): the "
                "export's `<name>_rerank` model over KServe gRPC and the proxy's `/v1/rerank`, against onnxruntime "
                "in-process on the same pairs (same tokenization, sorted by length) at its best batch size. Random "
                "weights, max length 512.", "", table(run["rerank"]), ""]
    if run.get("bulk"):
        from bench.bulk import section as bulk_section

        out += bulk_section(run["bulk"])
    if run.get("tail"):
        from bench.tail import table as tail_table

        out += ["## The tail with several exports", "",
                "Single queries to the default export, one text per request, through Triton's KServe HTTP (wrk), "
                "KServe gRPC (perf_analyzer) and the HTTP front (`/v1/embeddings`, wrk), with "
                f"{', '.join(run['tail']['extras'])} exported beside it and loaded (bench/tail.py), in interleaved "
                f"rounds of {run['tail']['seconds']:g} s readings. Each cell: p50 / p99 ms (p99/p50); every reading, "
                "not an average: a stall comes in some rounds only.", "", tail_table(run["tail"]), ""]
    if run.get("backends"):
        from bench.backends import table as backends_table

        out += ["## The encoder on Triton's C++ onnxruntime backend and on the stand-in", "",
                "The same scratch repository served twice in alternating rounds (bench/backends.py): `embedding` on "
                f"Triton's own backend (`{run['backends']['real_backend']}`, r24.07, CPU, the container's code) and "
                "on the Python stand-in (`local_triton/onnxruntime/model.py`, what a machine without that backend "
                "runs). perf_analyzer over gRPC as in the tables above; the ratio is to the workload's onnxruntime "
                "ceiling in-process; CPU per text is the server's processes' CPU time (tritonserver and every stub) "
                "over the texts the encoder ran, perf_analyzer's trial windows included.", "",
                backends_table(run["backends"]), ""]
    if run.get("images"):
        from bench.images import section

        out += section(run["images"])
    if run.get("families"):
        from bench.families import section as families_section

        out += families_section(run["families"])
    out += ["## onnxruntime ceiling sweeps", "",
            "In the bench process, before the server starts; texts pre-tokenized, sorted by length, cut into batches "
            "padded to their own longest text, run in a stratified order (bit-reversed) for "
            f"{run['settings']['ceiling_seconds']:g} s or the whole corpus.", ""]
    for name, workload in run["workloads"].items():
        out += [f"**{name}**: " + ", ".join(f"batch {r['batch_size']}: {r['texts_per_s']:.1f}"
                                            for r in workload["ceiling_sweep"]) + " texts/s", ""]
    machine = run["machine"]
    out += ["## Method, machine, settings", "",
            "- Load: a closed loop of N requests in flight. `perf_analyzer` (gRPC, `--async`, count windows"
            f"{_time_windows(run['settings'])}, the "
            f"mean of 3 stable windows; up to {run['settings']['max_trials']} tries) for the ensemble and the other "
            f"gRPC systems; `wrk` ({run['settings']['wrk_seconds']} s per level {_warmup(run['settings'])}; a C load "
            "generator, so the client does not eat the 2 cores) for HTTP. After every run the harness waits until "
            "Triton has nothing queued or running.",
            "- The client-side tokenization baseline sends pre-tokenized `[1, L]` requests straight to `embedding`; "
            f"its tokenization (measured here: {run['client_tokenize_us']:.0f} µs per text) is not counted. The "
            "PyTorch baseline is the same Hugging Face model in a plain Python-backend model (bench/models/).",
            f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} RAM, GPU: {machine['gpu']}; "
            f"{machine['os']}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in run["versions"].items()),
            f"- model: {m['model']} ({m.get('pooling')} pooling, max length {m['max_length']}, dim "
            f"{m['embedding_size']}), exported into `{run['repository']}`",
            f"- tritonserver flags: `{' '.join(run.get('server_args') or [])}`",
            "- tuning values of the measured repository:"]
    for model, lines in run["tuning"].items():
        out.append(f"  - `{model}`: " + "; ".join(f"`{line}`" for line in lines))
    out.append("")
    if os.path.exists(TUNING_NOTES):
        with open(TUNING_NOTES, encoding="utf-8") as handle:
            out += [handle.read().strip(), ""]
    return "\n".join(out)


def write(run, output):
    os.makedirs(output, exist_ok=True)
    paths = plots(run, output)
    path = os.path.join(output, "benchmarks.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(markdown(run, [os.path.basename(p) for p in paths]))
    return [path, *paths]


def main(argv=None):
    """Re-render a report from a saved run: python -m bench.report bench/results/full/results.json docs"""
    import json
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit("usage: python -m bench.report RESULTS_JSON OUTPUT_DIR")
    with open(argv[0], encoding="utf-8") as handle:
        run = json.load(handle)
    for path in write(run, argv[1]):
        print(path)
    print(targets_text(run))


if __name__ == "__main__":
    main()
