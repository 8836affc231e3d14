"""An export's reference check in a few figures (issue 70: the check kept its figures in a file nobody saw): what the
served model was compared with (the reference class and its library's version), on how many texts or pairs, under
which prompts, and the worst agreement. /v1/models, TEI's /info and the ensemble's config (KServe:
GET /v2/models/NAME/config, parameter parity_report) carry it; an export with no reference check says so.

Read from export.json's `parity` figures, whatever the family wrote there (families/ in the exporter), so an export
made before the report existed gets one too (without versions, which the export records since)."""

REFERENCE_LIBRARIES = {  # the reference's class -> the package whose version the export recorded
    "SentenceTransformer": "sentence_transformers", "SparseEncoder": "sentence_transformers",
    "CrossEncoder": "sentence_transformers", "FlagReranker": "FlagEmbedding", "open_clip": "open_clip",
    "transformers": "transformers", "ColBERT": "pylate",
}


def _walk(figures, key):
    """Every value of `key` anywhere in the nested figures."""
    if isinstance(figures, dict):
        for name, value in figures.items():
            if name == key and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield float(value)
            else:
                yield from _walk(value, key)


def _worst(values, pick):
    values = list(values)
    return pick(values) if values else None


def parity_report(manifest):
    """The report of one export.json (a dict): {"checked": bool, "reference", "reference_version", "texts" or
    "pairs", "prompts", "worst_cosine", "worst_abs_diff", "graph_vs_pytorch_worst_cosine"} (None where the family
    has no such figure), or {"checked": False, "why": ...}."""
    figures = manifest.get("parity") or {}
    versions = manifest.get("reference_versions") or {}
    kind = manifest.get("kind", "embedding")
    report = {"checked": False, "reference": None, "reference_version": None, "texts": None, "pairs": None,
              "prompts": None, "worst_cosine": None, "worst_abs_diff": None, "graph_vs_pytorch_worst_cosine": None}
    if kind == "cross-encoder":
        card = figures.get("model_card")
        against = "CrossEncoder" if "cross_encoder_max_abs_diff" in figures else (card and "transformers")
        diffs = [figures[k] for k in ("cross_encoder_max_abs_diff", "flag_reranker_max_abs_diff",
                                      "model_card_max_abs_diff") if isinstance(figures.get(k), (int, float))]
        report.update(reference=against, pairs=figures.get("pairs"), worst_abs_diff=_worst(diffs, max),
                      model_card=card)
    elif kind == "clip":
        against = manifest.get("reference") or ("open_clip" if str(manifest.get("model", "")).startswith(
            "open_clip:") else "transformers")
        report.update(reference=against, worst_cosine=_worst(_walk(figures, "min_cosine"), min))
    else:
        checked = figures.get("reference") or {}
        against = checked.get("against")
        by_prompt = checked.get("by_prompt") or {}
        graph = {k: v for k, v in figures.items() if k != "reference"}
        report.update(reference=against, texts=checked.get("texts"), prompts=sorted(by_prompt) or None,
                      worst_cosine=_worst(_walk(by_prompt or checked, "min_cosine"), min),
                      worst_abs_diff=_worst(_walk(checked, "max_abs_diff"), max),
                      graph_vs_pytorch_worst_cosine=_worst(_walk(graph, "min_cosine"), min))
    if not report["reference"]:
        return {**report, "why": "this export was not checked against a reference implementation"}
    library = REFERENCE_LIBRARIES.get(report["reference"])
    report.update(checked=True, reference_version=versions.get(library) if library else None)
    return report
