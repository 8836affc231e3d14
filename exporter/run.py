"""The export build/export.py's command line asks for, in order: the repository checked, --skip-if-exported, the
export cache, then the family of the model (families/) deciding which export it gets: CLIP (clip.export), a
yes/no reranker (yes_no_reranker.export), a cross-encoder (cross_encoder.export), or an embedding model
(embedding.export)."""
import os
import sys
import time

from local_triton.run_stats import record
from local_triton.settings import serving_repository

from . import cache, embedding, fail, progress, read_json, weights
from .families import EMBEDDERS, MULTIMODAL, clip, cross_encoder, cross_encoder_of, yes_no_reranker_of
from .install import CACHING, install_cached
from .pipeline import module_list
from .repository import MODEL_SOURCE, PROJECT, check_name, model_names, refresh_code, templates_digest
from .source import check_own_code, resolve_model

DEFAULT_MODEL = "BAAI/bge-m3"
TRUSTED_PIPELINES = ("Transformer",)  # the embedders whose model --trust-remote-code loads from the folder's code


def main(parse_args, argv=None):
    """The export `parse_args(argv)` asks for, counted for the test suite's closing lines (local_triton/run_stats.py)
    by how it ended."""
    started, outcome = time.monotonic(), "refused"
    try:
        outcome = export(parse_args(argv))
        return 0
    finally:
        progress.end()
        record("export", outcome=outcome, seconds=time.monotonic() - started)


def already_exported(repository, name, model):
    """Whether --skip-if-exported skips: an export of `model` (any when None) rendered from today's templates."""
    manifest = read_json(repository, model_names(name)[0], "1", "export.json")
    if manifest is None or model not in (None, manifest.get("model")):
        return False
    if manifest.get("templates") != templates_digest():  # other templates, token_budget.c, library or graph: redone
        print("export: the config templates, the batching strategy, the models' library or the graph "
              "(exporter/graph.py, exporter/families/) changed since this export: exporting again")
        return False
    return True


def export(args):
    """The export `args` asks for; returns how it was made: "full", "cached" or "skipped"."""
    repository = os.path.abspath(args.repository)
    if repository == MODEL_SOURCE:
        fail(f"--repository {args.repository}: that is the models' source (tracked); export writes a serving "
             f"repository (default {os.path.relpath(serving_repository(PROJECT))})")
    if args.skip_if_exported and already_exported(repository, args.name, args.model):
        print(f"export: {repository} already holds an export{f' of {args.model}' if args.model else ''}; skipped")
        refresh_code(repository)  # the served code follows model_source/ and model_library/ (file copies)
        return "skipped"
    check_name(repository, args.name)
    started = time.monotonic()
    if args.ragged_batch and args.open_clip:
        fail("--ragged-batch: text embedding exports only (not --open-clip)")
    if not args.open_clip:
        args.model = args.model or DEFAULT_MODEL
    if cache.folder():
        CACHING.key = cache.key(args, args.pretrained if args.open_clip else resolve_model(args.model))
        CACHING.lock = CACHING.key and cache.hold(CACHING.key)
        hit = cache.lookup(CACHING.key)
        if hit:
            install_cached(*hit, args, repository, started)
            return "cached"
        if CACHING.key:
            CACHING.printout = sys.stdout = cache.Printout(sys.stdout)
    progress.begin(started)  # a copy from the cache prints the stages of the export it copies, not its own
    try:
        make_export(args, repository, started)
    finally:
        if CACHING.printout:
            sys.stdout = CACHING.printout.stream
    return "full"


def read_config(args, folder):
    """transformers' config of the folder, its own code run only with --trust-remote-code (never asked on a
    terminal: the answer is given), or one line saying why it cannot be read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=args.trust_remote_code)
    except (ValueError, KeyError, OSError, ImportError) as error:
        fail(f"{args.model}: transformers cannot read its config.json ({type(error).__name__}: "
             f"{' '.join(str(error).split())[:300]})")


def make_export(args, repository, started):
    """The export made by the exporter: the model's family (families/) decides how."""
    weights.record()  # every model's loading report, for the check that no weight the graph reads is random
    if args.open_clip:
        if args.trust_remote_code:
            fail("--trust-remote-code: open_clip models are built from open_clip's own classes")
        return clip.export(args, repository, started)
    folder = resolve_model(args.model)
    # before transformers reads anything: a folder's own code runs only when the flag says so, and is named if not
    own_code = check_own_code(args.model, folder, args.trust_remote_code)
    modules = module_list(folder) or []
    if own_code and modules[:1] and modules[0][0] not in TRUSTED_PIPELINES:
        fail(f"--trust-remote-code: {args.model} is a {modules[0][0]} pipeline; this export runs a checkpoint's own "
             f"code in {' and '.join(TRUSTED_PIPELINES)} pipelines and cross-encoders only")
    # a static embedding folder has no transformers config (model2vec's config.json names no model_type); a Router's
    # is its encoder route's (families/inference_free.py)
    first = modules[0][0] if modules else None
    config = None if first == "StaticEmbedding" else read_config(args, (
        EMBEDDERS[first].config_folder(folder) if first in EMBEDDERS and hasattr(EMBEDDERS[first], "config_folder")
        else folder))
    if config is not None and config.model_type in MULTIMODAL:
        if own_code:
            fail(f"--trust-remote-code: {args.model} is a {config.model_type} model, which this export builds from "
                 "transformers' own classes only")
        if args.ragged_batch:
            fail("--ragged-batch: text embedding exports only (not CLIP)")
        return MULTIMODAL[config.model_type].export(args, repository, started, folder)
    yes_no = yes_no_reranker_of(config, modules, args.yes_no_reranker)
    if yes_no:
        if args.ragged_batch:
            fail("--ragged-batch: text embedding exports only (not a yes/no reranker)")
        cross_encoder.check_arguments(args)
        return yes_no.export(args, folder, config, repository, started)
    family = cross_encoder_of(config, sentence_transformers_folder=bool(modules)) if config else None
    if args.ragged_batch and family:
        fail("--ragged-batch: text embedding exports only (not a cross-encoder)")
    mapped = (getattr(config, "auto_map", None) or {}) if own_code and config is not None else {}
    needed = "AutoModelForSequenceClassification" if family else "AutoModel"  # the class the export loads
    if mapped and needed not in mapped:
        fail(f"--trust-remote-code: {args.model}'s config.json auto_map maps {', '.join(mapped)} but not {needed}: "
             f"transformers would load its native {config.model_type} class for it, not the checkpoint's code")
    if family:
        cross_encoder.check_arguments(args)
        return cross_encoder.export(args, folder, config, repository, started, decoder=family.DECODER)
    return embedding.export(args, folder, config, repository, started)
