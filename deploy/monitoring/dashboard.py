"""Writes the Grafana dashboard deploy/monitoring/triton-embed-dashboard.json (standard library only):

    python deploy/monitoring/dashboard.py            # rewrite the JSON
    python deploy/monitoring/dashboard.py --check    # exit 1 when the JSON is not what this file writes

Why a script and not hand-written JSON: a panel is one line here (title, unit, queries) and the layout, datasource
and legend settings are written once. Why not grafanalib: one more dependency for ~30 lines of dict building.
tests/test_monitoring.py checks the JSON is current and that every panel's query returns series from a real
Prometheus scraping a real server. Only metrics that exist: Triton 24.07's `nv_*` on its metrics port (no latency
summaries or histograms: the launcher does not turn them on, so per-model latency is a mean), and the proxy's
`proxy_*` on its `/metrics` (model_source/proxy/1/metrics.py).
"""
import json
import os
import sys

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton-embed-dashboard.json")
UID = "triton-embed"
# Grafana substitutes these; tests/test_monitoring.py substitutes them too before asking Prometheus.
RATE = "$__rate_interval"
SCOPE = 'namespace=~"$namespace"'
API = f'{SCOPE}, route!~"/health|/health/live|/metrics"'  # API traffic: the probes and scrapes left out
REFUSED = 'status=~"429|503"'  # overloaded (429); not ready, restarting, shutting down (503): errors.KINDS
# Server-side failures: 5xx but the refusals, and TEI's 424 (its status for inference_failed and internal)
FAILED = 'status=~"5..|424", status!="503"'


def per_request(counter, by="model"):
    """A cumulative-microseconds counter as seconds per successful request, per `by`."""
    return (f"sum by ({by}) (rate({counter}{{{SCOPE}}}[{RATE}])) / "
            f"sum by ({by}) (rate(nv_inference_request_success{{{SCOPE}}}[{RATE}])) / 1e6")


def quantile(q, metric, by):
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{API}}}[{RATE}])))"


# (row title, [(panel title, unit, description, [(query, legend)])]); every panel is a time series.
ROWS = [
    ("Traffic and latency", [
        ("HTTP requests/s by route and model", "reqps", "The proxy's answers, every status.", [
            (f"sum by (route, model) (rate(proxy_requests_total{{{API}}}[{RATE}]))", "{{route}} {{model}}")]),
        ("Model requests/s (Triton)", "reqps", "Successful requests per Triton model: KServe and the proxy's calls.", [
            (f"sum by (model) (rate(nv_inference_request_success{{{SCOPE}}}[{RATE}]))", "{{model}}")]),
        ("HTTP latency p50 / p99 by route", "s", "The proxy's request duration, received to answered.", [
            (quantile(0.5, "proxy_request_duration_seconds", "route"), "p50 {{route}}"),
            (quantile(0.99, "proxy_request_duration_seconds", "route"), "p99 {{route}}")]),
        ("Model latency, mean per request (Triton)", "s",
         "Triton keeps no percentiles here (its latency summaries are off): the mean per successful request.", [
            (per_request("nv_inference_request_duration_us"), "{{model}}")]),
    ]),
    ("Where the time goes", [
        ("Queue against compute per request", "s",
         "Queue time growing past compute time: the model is saturated (the autoscaling signal).", [
            (per_request("nv_inference_queue_duration_us"), "queue {{model}}"),
            (per_request("nv_inference_compute_infer_duration_us"), "compute {{model}}")]),
        ("Rows per encoder run", "short",
         "nv_inference_count / nv_inference_exec_count: how well the batcher fills the encoder's runs.", [
            (f'sum by (model) (rate(nv_inference_count{{{SCOPE}, model=~".*embedding"}}[{RATE}])) / '
             f'sum by (model) (rate(nv_inference_exec_count{{{SCOPE}, model=~".*embedding"}}[{RATE}]))',
             "{{model}}")]),
        ("Requests waiting per model", "short", "Triton's pending requests (queued, not yet executing).", [
            (f"sum by (model) (nv_inference_pending_request_count{{{SCOPE}}})", "{{model}}"),
            (f"sum (proxy_requests_in_flight{{{SCOPE}}})", "HTTP in flight")]),
    ]),
    ("Refusals and errors", [
        ("HTTP refusals/s (429, 503) by route", "reqps",
         "429: admission or a full queue refused the request; 503: a model not ready, restarting or stopping.", [
            (f"sum by (route, status) (rate(proxy_requests_total{{{API}, {REFUSED}}}[{RATE}]))",
             "{{status}} {{route}}")]),
        ("HTTP errors/s by status and route", "reqps", "Client errors (4xx) and server errors (5xx, TEI's 424).", [
            (f'sum by (route, status) (rate(proxy_requests_total{{{API}, status=~"4..|5..", status!~"429|503"}}'
             f"[{RATE}]))", "{{status}} {{route}}")]),
        ("Triton failures/s by model and reason", "reqps",
         "REJECTED: a full queue; CANCELED; BACKEND, OTHER: errors, a client's bad input included (an ensemble "
         "counts its step's error as OTHER).", [
            (f"sum by (model, reason) (rate(nv_inference_request_failure{{{SCOPE}}}[{RATE}]))",
             "{{reason}} {{model}}")]),
    ]),
    ("Tokens", [
        ("Tokens/s by model (HTTP front)", "short", "Tokens embedded through the proxy (KServe's not counted).", [
            (f"sum by (model) (rate(proxy_tokens_total{{{SCOPE}}}[{RATE}]))", "{{model}}")]),
        ("Texts per HTTP request p50 / p99", "short", "Texts per successful embedding request.", [
            (f"histogram_quantile(0.5, sum by (model, le) (rate(proxy_request_inputs_bucket{{{SCOPE}}}[{RATE}])))",
             "p50 {{model}}"),
            (f"histogram_quantile(0.99, sum by (model, le) (rate(proxy_request_inputs_bucket{{{SCOPE}}}[{RATE}])))",
             "p99 {{model}}")]),
        ("Truncated texts/s", "short", "Texts cut to the model's max length (truncate true).", [
            (f"sum by (model) (rate(proxy_truncated_inputs_total{{{SCOPE}}}[{RATE}]))", "{{model}}")]),
    ]),
    ("Resources", [
        ("GPU utilization", "percentunit", "Triton's nv_gpu_* exist only where it sees a GPU.", [
            (f"avg by (instance, gpu_uuid) (nv_gpu_utilization{{{SCOPE}}})", "{{instance}} {{gpu_uuid}}")]),
        ("GPU memory used", "bytes", "Against the GPU's total.", [
            (f"sum by (instance, gpu_uuid) (nv_gpu_memory_used_bytes{{{SCOPE}}})", "used {{instance}} {{gpu_uuid}}"),
            (f"sum by (instance, gpu_uuid) (nv_gpu_memory_total_bytes{{{SCOPE}}})",
             "total {{instance}} {{gpu_uuid}}")]),
        ("CPU utilization (Triton's view)", "percentunit", "--allow-cpu-metrics: the node's CPU as Triton reads it.", [
            (f"avg by (instance) (nv_cpu_utilization{{{SCOPE}}})", "{{instance}}")]),
        ("Memory used (Triton's view)", "bytes", "The node's RAM as Triton reads it.", [
            (f"sum by (instance) (nv_cpu_memory_used_bytes{{{SCOPE}}})", "{{instance}}")]),
    ]),
]


def panel(panel_id, title, unit, description, queries, x, y):
    return {
        "id": panel_id, "type": "timeseries", "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"fillOpacity": 0}}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "range": True,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(queries)],
    }


def dashboard():
    panels, y, next_id = [], 0, 1
    for row_title, row_panels in ROWS:
        panels.append({"id": next_id, "type": "row", "title": row_title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id, y = next_id + 1, y + 1
        for i, (title, unit, description, queries) in enumerate(row_panels):
            panels.append(panel(next_id, title, unit, description, queries, 12 * (i % 2), y + 8 * (i // 2)))
            next_id += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        {"name": "namespace", "label": "Namespace", "type": "query",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": "label_values(nv_inference_count, namespace)", "refId": "namespaces"},
         "definition": "label_values(nv_inference_count, namespace)",
         # All = any namespace, and series without one (a Prometheus outside Kubernetes)
         "includeAll": True, "allValue": ".*", "multi": True, "current": {"text": "All", "value": "$__all"},
         "refresh": 2, "hide": 0, "sort": 1},
    ]
    return {
        "uid": UID, "title": "triton-embed", "tags": ["triton-embed", "triton"], "timezone": "browser",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "description": "Throughput, latency, queueing, batching, refusals, errors, tokens and resources of "
                       "triton-embed (deploy/monitoring/, docs/deploying.md \"Monitoring\").",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": variables},
        "panels": panels,
    }


def render():
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        with open(PATH, encoding="utf-8") as handle:
            current = handle.read() == render()
        sys.exit(0 if current else f"{PATH} is stale: run python {sys.argv[0]}")
    with open(PATH, "w", encoding="utf-8") as handle:
        handle.write(render())
    print(PATH)
