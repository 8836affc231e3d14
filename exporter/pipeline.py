"""What a model folder computes, as its sentence-transformers files say (modules.json), read once here: the family
of the folder (families.EMBEDDERS, by its first module) builds that pipeline into the graph, and the reference check
(reference.py) compares the export with the sentence-transformers class the family names.

    Transformer → Pooling (any mode sentence-transformers defines, or several, concatenated) → Dense ... → Normalize
                                                                   (families/encoder.py)
    MLMTransformer → SpladePooling                                 (SparseEncoder: SPLADE, families/splade.py)
    Transformer → Dense... (pylate's; model_type ColBERT)          (PyLate's ColBERT, families/colbert.py)
    StaticEmbedding [→ Normalize]                                  (static embeddings, families/static.py)
    Router (query: SparseStaticEmbedding, document: MLMTransformer → SpladePooling)
                                                                   (inference-free SPLADE, families/inference_free.py)

A module this export does not build is refused in one line naming it: left out of the graph, it would give vectors
that are not the model's (a Dense module after pooling once was, silently). A folder without sentence-transformers
files is a transformers encoder (families/encoder.py) with the pooling --pooling states (CLS when none)."""
from dataclasses import dataclass, field

from . import fail, read_json
from .families import EMBEDDERS, LATE_INTERACTION

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# sentence-transformers < 5 wrote one boolean per mode; the order is its order of concatenation
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
SENTENCE_EMBEDDING = "sentence_embedding"  # the feature Dense and Normalize act on after pooling


@dataclass
class Pipeline:
    kind: str  # "dense" (transformer + pooling), "splade" (SparseEncoder), "static" (StaticEmbedding) or
    # "inference_free" (a SparseEncoder's Router: SPLADE documents, looked-up queries)
    reference: str | None  # the sentence-transformers class of the folder; None: no sentence-transformers files
    modules: list = field(default_factory=list)  # the modules' class names, in order (export.json records them)
    pooling: tuple = ("cls",)
    include_prompt: bool = True
    dense_modules: list = field(default_factory=list)  # indexes of the Dense modules after pooling, in order
    normalized: bool = False  # a Normalize module ends it: sentence-transformers' vectors are unit length

    @property
    def family(self):
        """The family module that builds it (families.EMBEDDERS)."""
        return next(family for family in (*EMBEDDERS.values(), *LATE_INTERACTION.values()) if self.kind == family.KIND)

    @property
    def projects(self):
        """Whether modules after pooling change the vector (its token vectors are not in the embedding's space)."""
        return bool(self.dense_modules)


def module_list(folder):
    """[(class name, path)] from modules.json, or None for a folder without one."""
    modules = read_json(folder, "modules.json")
    if modules is None:
        return None
    return [(str(m.get("type", "")).rsplit(".", 1)[-1], m.get("path", "")) for m in modules]


def pooling_modes(config):
    """The modes of a Pooling module's config.json, in sentence-transformers' order (both of its formats)."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in LEGACY_POOLING_KEYS.items() if config.get(key))
        return modes or ("mean",)  # sentence-transformers' default when no key is set
    return (mode,) if isinstance(mode, str) else tuple(mode)


def read_pipeline(folder, pooling_flag=None):
    """The folder's pipeline (Pipeline), or a one-line refusal naming what this export does not build."""
    modules = module_list(folder)
    if modules is None:
        architectures = (read_json(folder, "config.json") or {}).get("architectures") or []
        if read_json(folder, "artifact.metadata") is not None or "HF_ColBERT" in architectures:
            # Stanford's colbert-ai layout (colbertv2.0): PyLate converts it on load; as a transformers folder it
            # would be served as one pooled vector, which is not what the checkpoint computes
            fail("a ColBERT checkpoint in colbert-ai's layout (artifact.metadata / HF_ColBERT); save it with PyLate "
                 "(models.ColBERT(path).save(folder)) and export that folder")
        return Pipeline(kind="dense", reference=None, pooling=(pooling_flag or "cls",))
    model_type = (read_json(folder, "config_sentence_transformers.json") or {}).get("model_type",
                                                                                     "SentenceTransformer")
    names = [name for name, _ in modules]
    first = names[0] if names else None
    family = EMBEDDERS.get(first)
    late = next((f for f in LATE_INTERACTION.values() if f.states_it(folder, model_type)), None)
    if late is not None:  # PyLate's ColBERT: Transformer → pylate Dense (families/colbert.py)
        if pooling_flag:
            fail(f"--pooling: this folder is a {late.REFERENCE} ({' → '.join(names)}), which keeps every token vector")
        if names[:1] != ["Transformer"] or any(name != "Dense" for name in names[1:]) or len(names) < 2:
            fail(f"modules.json: {' → '.join(names)}; this export builds {late.TITLE} (Dense modules after it)")
        return Pipeline(kind=late.KIND, reference=late.REFERENCE, modules=names, pooling=())
    if family is None:
        titles = [module.TITLE for module in EMBEDDERS.values()]
        fail(f"modules.json: the first module is {first or 'missing'}; this export builds {', '.join(titles[:-1])} "
             f"and {titles[-1]} pipelines")
    for name, path in modules:
        if name not in family.MODULES:
            fail(f"modules.json: module {name} ({path or '.'}) is not one this export builds into the graph "
                 f"(after {first}: {', '.join(family.MODULES[1:])}); exporting without it would serve other vectors")
    kind = family.KIND
    if kind != "dense":
        if pooling_flag:
            fail(f"--pooling: this folder is a {model_type} ({' → '.join(names)}), which has no pooling to choose")
        required = [name for name in family.MODULES if name != "Normalize"]  # Normalize: optional, last
        expected = required + ["Normalize"] * ("Normalize" in family.MODULES and len(names) > len(required))
        if names != expected:
            fail(f"modules.json: {' → '.join(names)}; this export builds {' → '.join(expected)}")
        reference = family.REFERENCE
        if model_type != reference:
            fail(f"modules.json: {' → '.join(names)} is a {reference}, but config_sentence_transformers.json says "
                 f"{model_type}")
        return Pipeline(kind=kind, reference=reference, modules=names, pooling=(), normalized=names[-1] == "Normalize")
    if model_type != "SentenceTransformer":
        fail(f"config_sentence_transformers.json: model_type {model_type} with a Transformer → Pooling pipeline; "
             "this export serves SentenceTransformer, SparseEncoder (SPLADE) and cross-encoder folders")
    if names[1:2] != ["Pooling"]:
        fail(f"modules.json: {' → '.join(names)}; a Transformer pipeline needs Pooling right after it")
    pooling_config = read_json(folder, modules[1][1], "config.json") or {}
    modes = pooling_modes(pooling_config)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        fail(f"{modules[1][1]}/config.json: pooling mode {', '.join(unknown)} is not one sentence-transformers "
             f"defines ({', '.join(POOLING_MODES)})")
    if pooling_flag and (pooling_flag,) != modes:
        fail(f"--pooling {pooling_flag}: this folder's {modules[1][1]}/config.json says {'+'.join(modes)}, which is "
             "what sentence-transformers computes for it; leave --pooling out")
    tail = names[2:]
    normalized = bool(tail) and tail[-1] == "Normalize"
    for index, (name, path) in enumerate(modules[2:], start=2):
        config = read_json(folder, path, "config.json") or {}
        for key in ("module_input_name", "module_output_name"):
            if config.get(key) not in (None, SENTENCE_EMBEDDING):
                fail(f"modules.json: module {name} ({path}) acts on {config[key]!r}; this export builds modules "
                     f"that act on the pooled {SENTENCE_EMBEDDING} only")
        if name == "Normalize" and index != len(modules) - 1:
            fail(f"modules.json: Normalize ({path}) before other modules; this export builds it last only")
    return Pipeline(kind="dense", reference=family.REFERENCE, modules=names, pooling=modes,
                    include_prompt=bool(pooling_config.get("include_prompt", True)),
                    dense_modules=[i for i, name in enumerate(names) if name == "Dense"], normalized=normalized)
