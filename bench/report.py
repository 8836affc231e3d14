"""Turn a run's results (bench/results/<mode>/results.json) into benchmarks.md and two PNG plots."""
import os

LABELS = {
    "ensemble": "ensemble (gRPC, perf_analyzer)",
    "client_tokenization": "client-side tokenization → embedding (gRPC, perf_analyzer)",
    "pytorch_baseline": "Python-backend PyTorch model (gRPC, perf_analyzer)",
    "proxy_http": "HTTP proxy /v1/embeddings (wrk)",
    "kserve_http": "Triton KServe HTTP → ensemble (wrk)",
}
SHORT = {"ensemble": "ensemble", "client_tokenization": "client tokenization", "pytorch_baseline": "PyTorch baseline",
         "proxy_http": "HTTP proxy", "kserve_http": "KServe HTTP"}
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


def targets(run):
    res = run["results"]
    ceiling = run["ceiling"]["texts_per_s"]
    c_e, ens = best(res.get("ensemble", {}))
    _, torch_row = best(res.get("pytorch_baseline", {}))
    _, proxy = best(res.get("proxy_http", {}))
    c32 = res.get("ensemble", {}).get(32) or res.get("ensemble", {}).get(max(res.get("ensemble", {}) or [0]))
    c32_level = 32 if 32 in res.get("ensemble", {}) else max(res.get("ensemble", {}) or [0]) or None
    probe = run.get("probe") or {}
    one_proxy = res.get("proxy_http", {}).get(1)
    one_grpc = res.get("ensemble", {}).get(1)
    added = one_proxy["p50_ms"] - one_grpc["p50_ms"] if one_proxy and one_grpc else None
    rows = [
        ("ensemble throughput / onnxruntime ceiling", "≥ 0.90", _ratio(ens and ens["texts_per_s"], ceiling), 0.90,
         f"{_num(ens and ens['texts_per_s'])} vs {_num(ceiling)} texts/s (ensemble best at c={c_e})"),
        ("ensemble throughput / Python-backend PyTorch model", "≥ 2.5",
         _ratio(ens and ens["texts_per_s"], torch_row and torch_row["texts_per_s"]), 2.5,
         f"{_num(ens and ens['texts_per_s'])} vs {_num(torch_row and torch_row['texts_per_s'])} texts/s (best of each)"),
        (f"encoder mean executed batch at concurrency {c32_level}", "≥ 8",
         c32 and c32["stats"]["embedding"]["mean_batch"], 8.0,
         "Triton statistics of `embedding` (inference_count / execution_count) during the ensemble run"),
        (f"padding efficiency (real / computed tokens) at concurrency {run['settings']['probe_concurrency']}", "≥ 0.8",
         probe.get("padding_efficiency"), 0.8,
         f"{probe.get('real_tokens', 0):,} real / {probe.get('computed_tokens', 0):,} computed tokens (probe)"),
        ("proxy throughput / direct gRPC", "≥ 0.9", _ratio(proxy and proxy["texts_per_s"], ens and ens["texts_per_s"]),
         0.9, f"{_num(proxy and proxy['texts_per_s'])} vs {_num(ens and ens['texts_per_s'])} texts/s (best of each)"),
        ("proxy added p50 latency at concurrency 1 (ms)", "≤ 1 ms", added, -1.0,
         f"p50 {_num(one_proxy and one_proxy['p50_ms'], 2)} ms (wrk, proxy) − "
         f"{_num(one_grpc and one_grpc['p50_ms'], 2)} ms (perf_analyzer, gRPC)"),
    ]
    out = []
    for name, wanted, value, threshold, detail in rows:
        if value is None:
            status = "not measured"
        elif threshold < 0:  # upper bound
            status = "met" if value <= -threshold else "missed"
        else:
            status = "met" if value >= threshold else "missed"
        out.append({"target": name, "wanted": wanted, "value": value, "status": status, "detail": detail})
    return out


def plots(run, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for metric, filename, ylabel in (("texts_per_s", "bench_throughput.png", "throughput (texts/s)"),
                                     ("p99_ms", "bench_p99_latency.png", "p99 latency (ms)")):
        figure, axis = plt.subplots(figsize=(8, 5))
        for system, rows in run["results"].items():
            if not rows:
                continue
            levels = sorted(rows)
            axis.plot(levels, [rows[c][metric] for c in levels], marker="o", label=SHORT[system])
        if metric == "texts_per_s":
            axis.axhline(run["ceiling"]["texts_per_s"], color="black", linestyle="--",
                         label=f"onnxruntime ceiling (in-process, batch {run['ceiling']['batch_size']})")
            axis.set_ylim(bottom=0)
        else:
            axis.set_yscale("log")
        axis.set_xscale("log", base=2)
        levels = sorted({c for rows in run["results"].values() for c in rows})
        if levels:
            axis.set_xticks(levels, [str(c) for c in levels])
            axis.minorticks_off()
        axis.set_xlabel("concurrency (requests in flight, 1 text each)")
        axis.set_ylabel(ylabel)
        axis.set_title(f"{run['manifest']['model']}: {ylabel} vs concurrency ({run['mode']} run, {run['device']})")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
        figure.tight_layout()
        path = os.path.join(output, filename)
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(run, plot_names):
    res = run["results"]
    mean_tokens = run["corpus"]["mean_tokens"]
    ceiling = run["ceiling"]
    c_e, ens = best(res.get("ensemble", {}))
    m = run["manifest"]
    out = [f"# Benchmarks: {m['model']} on Triton ({run['mode']} run, {run['device']})", ""]
    if run.get("title"):
        out += [run["title"], ""]
    out += [
        f"Generated by `{run['command']}` (`make bench`) on {run['date']} in {run['elapsed_s'] / 60:.1f} min. "
        "Everything below is measured in that one run, on the same texts; the raw numbers are in "
        f"`bench/results/{run['mode']}/results.json`.", "",
        "## Targets", "",
        _table(["target", "wanted", "measured", "status", "how"],
               [[t["target"], t["wanted"], _num(t["value"], 2), f"**{t['status']}**", t["detail"]]
                for t in targets(run)]), "",
        "## Best throughput of each system (concurrency ≤ 64)", "",
        f"tokens/s = texts/s × {mean_tokens:.1f} (the corpus' mean tokens per text, special tokens included). "
        "Latency in ms, client side.", "",
    ]
    rows = [["onnxruntime ceiling (in-process, no serving)",
             f"batch {ceiling['batch_size']}, {ceiling.get('threads') or 'all'} thr.",
             _num(ceiling["texts_per_s"]), _num(ceiling["tokens_per_s"], 0), "—", "—", "—", "1.00",
             _num(_ratio(ens and ens["texts_per_s"], ceiling["texts_per_s"]), 2)]]
    for system, label in LABELS.items():
        c, row = best(res.get(system, {}))
        if row is None:
            continue
        rows.append([label, f"c={c}", _num(row["texts_per_s"]), _num(row["texts_per_s"] * mean_tokens, 0),
                     _num(row["p50_ms"]), _num(row["p90_ms"]), _num(row["p99_ms"]),
                     _num(_ratio(row["texts_per_s"], ceiling["texts_per_s"]), 2),
                     _num(_ratio(ens and ens["texts_per_s"], row["texts_per_s"]), 2)])
    out += [_table(["system", "at", "texts/s", "tokens/s", "p50", "p90", "p99", "× ceiling", "ensemble ÷ this"],
                   rows), ""]
    out += [f"![throughput vs concurrency]({plot_names[0]})", "", f"![p99 latency vs concurrency]({plot_names[1]})",
            ""]
    out += ["## Every concurrency level", "",
            "`mean batch` is the encoder's mean executed batch (Triton statistics of `embedding`, or of "
            "`pytorch_baseline` for that row) over the run at that level.", ""]
    for system, label in LABELS.items():
        rows_by_c = res.get(system)
        if not rows_by_c:
            continue
        out += [f"### {label}", ""]
        rows = []
        for c in sorted(rows_by_c):
            row = rows_by_c[c]
            model = "pytorch_baseline" if system == "pytorch_baseline" else "embedding"
            rows.append([c, _num(row["texts_per_s"]), _num(row["texts_per_s"] * mean_tokens, 0), _num(row["p50_ms"]),
                         _num(row["p90_ms"]), _num(row["p99_ms"]), _num(row["stats"][model]["mean_batch"], 2),
                         _num(_ratio(row["texts_per_s"], ceiling["texts_per_s"]), 2),
                         _num(_ratio(res.get("ensemble", {}).get(c, {}).get("texts_per_s"), row["texts_per_s"]), 2)])
        out += [_table(["concurrency", "texts/s", "tokens/s", "p50 ms", "p90 ms", "p99 ms", "mean batch",
                        "× ceiling", "ensemble ÷ this (same c)"], rows), ""]
    # where the time goes
    level = 32 if 32 in res.get("ensemble", {}) else (max(res["ensemble"]) if res.get("ensemble") else None)
    if level:
        stats = res["ensemble"][level]["stats"]
        out += [f"## Where the time goes (ensemble at concurrency {level}, Triton per-step statistics)", "",
                "Per request, averaged over the run (ms). `infer` of the tokenizer is its whole execute (tokenize, "
                "group, pad, send responses); `queue` is time waiting for the dynamic batcher and a free instance.",
                ""]
        rows = []
        for model in ("tokenizer", "embedding"):
            s = stats[model]
            rows.append([model, _num(s["mean_batch"], 2), _num(s["queue_ms_per_request"], 2),
                         _num(s["compute_input_ms_per_request"], 2), _num(s["compute_infer_ms_per_request"], 2),
                         _num(s["compute_output_ms_per_request"], 2),
                         ", ".join(f"{b}×{n}" for b, n in sorted(s["batch_stats"].items(), key=lambda kv: int(kv[0])))])
        out += [_table(["step", "mean batch", "queue", "input", "infer", "output", "batch sizes run (size×count)"],
                       rows), ""]
        server = res["ensemble"][level].get("server_ms") or {}
        if server:
            out += ["perf_analyzer's server-side split for the ensemble at that level (ms per request): " +
                    ", ".join(f"{k.replace('Server ', '').lower()} {v:.2f}" for k, v in server.items()) + ".", ""]
    probe = run.get("probe")
    if probe:
        out += ["## Padding efficiency of the batches the encoder ran", "",
                f"{probe['texts']} corpus texts sent at concurrency {run['settings']['probe_concurrency']} through "
                "`ensemble_probe` (bench-only copy of `ensemble` that also returns the padded `attention_mask`). "
                "The encoder's dynamic batcher only merges requests of one shape, so each row it computes is as wide "
                "as the tokenizer padded it: computed tokens = Σ padded widths, real tokens = Σ `num_tokens`.", "",
                f"real tokens {probe['real_tokens']:,}, computed tokens {probe['computed_tokens']:,}: "
                f"**padding efficiency {probe['padding_efficiency']:.3f}**; encoder mean executed batch during the probe "
                f"{probe['embedding']['mean_batch']:.2f}. (The ceiling's sorted batches reach "
                f"{ceiling['padding_efficiency']:.3f}.)", ""]
    out += ["## onnxruntime ceiling sweep", "",
            f"`onnxruntime.InferenceSession` in the bench process on the served `model.onnx` ({run['device']}; "
            + ("intra_op threads = all cores, like the encoder's `intra_op_thread_count` 0"
               if not run["encoder_threads"] else
               f"intra_op threads: the encoder's `intra_op_thread_count` {run['encoder_threads']} and all cores; the "
               "best counts") + "), texts pre-tokenized, sorted by length and cut into batches padded to "
            "their own longest text, batches run in a stratified order (bit-reversed over the sorted batches) for "
            f"{run['settings']['ceiling_seconds']:g} s or the whole corpus; measured before the server starts, so "
            "nothing else of the harness competes for the CPU.", "",
            _table(["threads", "batch size", "texts/s", "tokens/s", "padding efficiency", "texts run"],
                   [[r.get("threads") or "all", r["batch_size"], _num(r["texts_per_s"]), _num(r["tokens_per_s"], 0),
                     _num(r["padding_efficiency"], 3), r["texts"]] for r in run["ceiling_sweep"]]), ""]
    corpus = run["corpus"]
    out += ["## Method", "",
            f"- **Corpus** (generated, not shipped): {corpus['size']} texts, seed {corpus['seed']}, sha256 "
            f"`{corpus['sha256'][:16]}…` — {corpus['queries']} queries of 5-20 tokens and {corpus['passages']} "
            f"passages of 100-250 tokens, shuffled; mean {corpus['mean_tokens']:.1f}, median "
            f"{corpus['median_tokens']:.0f}, min {corpus['min_tokens']}, max {corpus['max_tokens']} tokens. Real "
            f"English prose from the Python Language Reference that CPython ships in `pydoc_data.topics` "
            f"(Python {corpus['python']}); see `bench/corpus.py`.",
            "- **Requests**: one text per request everywhere (typical embedding traffic); a closed loop of N "
            "requests in flight = concurrency N. Every system cycles through the same corpus.",
            f"- **ensemble / client tokenization / PyTorch baseline**: `perf_analyzer` (tritonclient "
            f"{run['versions'].get('tritonclient', '?')}) `-i grpc --async --input-data <json> -b 1 "
            f"--concurrency-range N --measurement-mode count_windows --measurement-request-count W "
            f"--max-trials {run['settings']['max_trials']}`, W = max({run['settings']['min_window_requests']}, 2N, "
            f"{run['settings']['window_s']:g} s × the system's rate at the previous level): perf_analyzer reports the "
            "mean of 3 stable windows; a level that does not stabilize within 25 % is re-run once with no stability "
            "limit (marked in results.json). After every run the harness waits until Triton has nothing queued or "
            "running, so leftovers never leak into the next measurement.",
            "- **client-side tokenization**: the texts are tokenized by the client beforehand, each on its own and "
            "unpadded (what a client sending one text does), and sent as `[1, L]` `input_ids` + `attention_mask` "
            "straight to `embedding`; the client's tokenization cost is not in the load generator's numbers: it is "
            f"{run['client_tokenize_us']:.0f} µs per text measured in this run.",
            "- **Python-backend PyTorch model** (`bench/models/pytorch_baseline/`, added to the scratch repository "
            "only): the same Hugging Face folder loaded with `transformers` AutoTokenizer + AutoModel (what "
            "`pipeline('feature-extraction')` wraps), given its best case: every execute tokenizes its whole dynamic "
            "batch at once, pads to the batch's longest text, one forward pass, the same pooling + normalization; "
            "same `max_batch_size` and queue delay as the encoder, torch threads = the encoder's ORT threads.",
            "- **HTTP proxy**: `wrk` (C, one event-loop thread, N keep-alive connections = N requests in flight) "
            "with a Lua script cycling the corpus as `{\"input\": [text], \"model\": ...}` bodies on "
            "`POST /v1/embeddings`. Why wrk: on a 2-core machine the load generator competes with the server for "
            "CPU, and a Python client (aiohttp/httpx) costs several times more CPU per request than the proxy "
            "itself, which would measure the client. wrk's closed loop matches perf_analyzer's concurrency mode. "
            "The issue's comparison is proxy (wrk) vs direct gRPC (perf_analyzer); since that mixes two load "
            "generators and two protocols, the same wrk is also run against Triton's own KServe HTTP endpoint "
            "(`POST /v2/models/ensemble/infer`, JSON): proxy vs KServe HTTP isolates the proxy's own cost.",
            "- **Triton statistics**: `/v2/models/<model>/stats` read before and after every run; the difference "
            "gives executions, inferences (rows) and per-step times of the runs at that level.",
            "- **CPU sharing**: on this machine the load generator, the Triton server, the tokenizer's Python stub, "
            "and the encoder all share the same cores; the ceiling is measured with the machine to itself. Timings "
            "are noisy when other work runs on the machine.", ""]
    machine = run["machine"]
    out += ["## Machine, versions, settings", "",
            f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} RAM, GPU: {machine['gpu']}; "
            f"{machine['os']}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in run["versions"].items()),
            f"- model: {m['model']} ({m.get('pooling')} pooling, max length {m['max_length']}, dim "
            f"{m['embedding_size']}, max batch {m['max_batch_size']}), exported by `build/export.py` into "
            f"`{run['repository']}`" + (" (bench-owned export: configs and model code taken from "
                                        "`model_repository/`)" if run["bench_owned_export"] else ""),
            "- tritonserver started by `local_triton.launch` with flags: "
            f"`{' '.join(run.get('server_args') or []) or 'none'}`",
            f"- command: `{run['command']}`; wrk {run['settings']['wrk_seconds']} s per level (after a 1 s warm-up); "
            f"ceiling {run['settings']['ceiling_seconds']} s per batch size", "",
            "Tuning values in the measured repository:", ""]
    for model, lines in run["tuning"].items():
        out.append(f"- `{model}`: " + "; ".join(f"`{line}`" for line in lines))
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
    run["results"] = {system: {int(c): row for c, row in rows.items()} for system, rows in run["results"].items()}
    for path in write(run, argv[1]):
        print(path)


if __name__ == "__main__":
    main()
