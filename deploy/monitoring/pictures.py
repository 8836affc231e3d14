"""The pictures in docs/deploying.md, drawn from real data with matplotlib (the project's venv has it):

- dashboard(): the Grafana dashboard's panels (triton-embed-dashboard.json) as Grafana would lay them out, each
  query asked of a real Prometheus over a time range (query_range) and drawn as its time series;
- waterfall(): one trace's spans (as an OTLP receiver decoded them) as a waterfall, parents above their children.

tests/test_monitoring.py and tests/test_tracing.py call these on what their real Prometheus and real OTLP receiver
got; with TRITON_EMBED_PICTURES=docs/images they also write the docs' copies (the pictures are not redrawn by CI).
"""
import json
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

UNITS = {"s": "seconds", "reqps": "requests/s", "bytes": "bytes", "percentunit": "fraction", "short": ""}


def _query_range(prometheus, expr, start, end, step):
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{query}", timeout=30) as response:
        answer = json.load(response)
    if answer["status"] != "success":
        raise RuntimeError(f"{expr}: {answer}")
    return answer["data"]["result"]


def _legend(template, labels):
    text = template
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text.replace("{{", "").replace("}}", "").strip() or "value"


def dashboard(prometheus, dashboard_json, start, end, path, fill=lambda expr: expr, skip=(), step=None):
    """Every panel of `dashboard_json` but those titled in `skip`, its queries (after fill(expr): Grafana's
    variables) asked of `prometheus` from `start` to `end` (unix seconds), drawn in a grid of two panels a row.
    Returns {panel title: number of series drawn}."""
    with open(dashboard_json, encoding="utf-8") as handle:
        panels = [p for p in json.load(handle)["panels"] if p["type"] != "row" and p["title"] not in skip]
    step = step or max(1, int((end - start) / 200))
    rows = (len(panels) + 1) // 2
    figure, axes = plt.subplots(rows, 2, figsize=(14, 3.0 * rows), squeeze=False, layout="constrained")
    drawn = {}
    for index, panel in enumerate(panels):
        axis = axes[index // 2][index % 2]
        drawn[panel["title"]] = 0
        for target in panel["targets"]:
            for series in _query_range(prometheus, fill(target["expr"]), start, end, step):
                times = [float(t) - start for t, _ in series["values"]]
                values = [float(v) for _, v in series["values"]]
                drawn[panel["title"]] += 1
                # a series that stayed at 0 or undefined (a failure reason that never happened, a model never
                # called) is counted, not drawn: here it would only crowd the legend, unless the panel has no other
                if any(v for v in values if v == v) or (not axis.lines and drawn[panel["title"]] == 1):
                    axis.plot(times, values, label=_legend(target.get("legendFormat", ""), series["metric"])[:40])
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        axis.set_title(panel["title"], fontsize=9)
        axis.set_ylabel(UNITS.get(unit, unit), fontsize=7)
        axis.tick_params(labelsize=7)
        if axis.lines:
            axis.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    for index in range(len(panels), rows * 2):
        axes[index // 2][index % 2].axis("off")
    figure.supxlabel("seconds since the start of the load", fontsize=8)
    figure.savefig(path, dpi=70)
    plt.close(figure)
    return drawn


def _depths(spans):
    by_id = {span["span_id"]: span for span in spans}
    depths = {}

    def depth(span):
        if span["span_id"] not in depths:
            parent = by_id.get(span["parent_span_id"])
            depths[span["span_id"]] = 0 if parent is None else depth(parent) + 1
        return depths[span["span_id"]]

    for span in spans:
        depth(span)
    return depths


def _order(spans):
    """Depth-first from the roots, children by start time: each span right under its parent."""
    children = {}
    ids = {span["span_id"] for span in spans}
    for span in sorted(spans, key=lambda s: s["start_ns"]):
        parent = span["parent_span_id"] if span["parent_span_id"] in ids else None
        children.setdefault(parent, []).append(span)
    ordered, todo = [], list(reversed(children.get(None, [])))
    while todo:
        span = todo.pop()
        ordered.append(span)
        todo += reversed(children.get(span["span_id"], []))
    return ordered


def waterfall(spans, path, title="one request"):
    """One trace's spans (dicts: name, span_id, parent_span_id, start_ns, end_ns, service) as a waterfall, one bar
    per span from its start to its end, indented by depth, coloured by `service` (the caller's grouping: the
    service that sent it, or the span's kind)."""
    ordered, depths = _order(spans), _depths(spans)
    origin = min(span["start_ns"] for span in spans)
    services = sorted({span["service"] for span in spans})
    colours = {service: plt.cm.tab10(i % 10) for i, service in enumerate(services)}
    figure, axis = plt.subplots(figsize=(12, 0.45 * len(ordered) + 1.2))
    for row, span in enumerate(ordered):
        start, width = (span["start_ns"] - origin) / 1e6, (span["end_ns"] - span["start_ns"]) / 1e6
        axis.barh(row, max(width, 0.02), left=start, color=colours[span["service"]], height=0.6)
        axis.text(start + max(width, 0.02), row, f"  {width:.2f} ms", va="center", fontsize=7)
    axis.set_yticks(range(len(ordered)),
                    ["  " * depths[span["span_id"]] + span["name"] for span in ordered], fontsize=8, family="monospace")
    for label in axis.get_yticklabels():  # left-aligned, so that the indent shows each span under its parent
        label.set_horizontalalignment("left")
    axis.tick_params(axis="y", pad=7 * max(len(label.get_text()) for label in axis.get_yticklabels()))
    axis.invert_yaxis()
    axis.set_xlabel("ms since the trace's first span")
    axis.set_title(title, fontsize=10)
    axis.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[s]) for s in services], labels=services,
                fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return [span["name"] for span in ordered]
