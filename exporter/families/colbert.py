"""The ColBERT family in PyLate's layout (lightonai/GTE-ModernColBERT-v1, answerai-colbert-small-v1, colbertv2.0 as
PyLate saves it): modules.json Transformer → pylate.models.Dense.Dense (a Linear on every token vector), and
config_sentence_transformers.json's query / document markers, query_length, document_length, query expansion and
the document skiplist. Served through the ColBERT outputs bge-m3's export has (colbert_vectors, colbert_length:
KServe, /v1/encode, compact ColBERT, MaxSim rerank), checked against PyLate's own encoder (pylate_reference.py, in a
process of its own: PyLate pins older sentence-transformers and transformers than the venv's).

Where the work is: the tokenizer model builds PyLate's rows (model_library/colbert_side.py: the marker after [CLS],
each side's length, the query's expansion tokens); the graph (build_late_interaction) runs the encoder with the
expansion tokens kept out of attention (attend_to_expansion_tokens false), projects and L2-normalizes every token
vector, and keeps what PyLate's encode keeps (a query: every position; a document: its tokens but the skiplist's),
moved to the front of the row: colbert_vectors, colbert_length. The request's side is its Router task (prompt_name /
input_type query or document; none: document), as for inference-free SPLADE."""
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

from .. import fail, read_json
from ..parity import PARITY_TEXTS
from ..reference import check_ids

TITLE = "Transformer → pylate Dense (ColBERT)"  # the pipeline, as refusals name it
KIND = "colbert"  # export.json's `pipeline`
MODULES = ("Transformer", "Dense")
REFERENCE = "ColBERT"  # PyLate's class (config_sentence_transformers.json's model_type)
SPARSE_WIDTH = "tokens"
COLBERT_WIDTH = "tokens"  # up to a vector per token (a query's every position): the BLS model's config
# PyLate 1.6's defaults for a key its config_sentence_transformers.json lacks (ColBERT.__init__)
DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
            "do_query_expansion": True, "attend_to_expansion_tokens": False,
            "skiplist_words": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")}
IDENTITY = "torch.nn.modules.linear.Identity"
# Where requirements-pylate.txt is installed (make setup), off the venv's path: only the reference's process reads it
PYLATE_SITE = os.environ.get("PYLATE_SITE") or os.path.join(sys.prefix, "pylate-site")
MIN_COSINE = 0.9999


def states_it(folder, model_type):
    """Whether a folder is PyLate's: its modules.json names a pylate module, or its model_type is ColBERT."""
    modules = read_json(folder, "modules.json") or []
    return model_type == REFERENCE or any(str(m.get("type", "")).startswith("pylate.") for m in modules)


def settings(folder, tokenizer):
    """colbert.json for the tokenizer model (model_library/colbert_side.py): PyLate's settings as its ColBERT
    resolves them from config_sentence_transformers.json, the markers and the skiplist as token ids; one line for
    what would be served otherwise."""
    config = read_json(folder, "config_sentence_transformers.json") or {}
    values = {key: config.get(key, default) if config.get(key) is not None else default
              for key, default in DEFAULTS.items()}
    prompts = {name: text for name, text in (config.get("prompts") or {}).items() if text}
    if prompts or config.get("default_prompt_name"):
        fail(f"config_sentence_transformers.json: prompts {prompts} with a ColBERT's markers are not built; this "
             "export serves the markers alone")
    vocabulary = tokenizer.get_vocab()
    ids = {}
    for side in ("query", "document"):
        marker = values[f"{side}_prefix"]
        if not marker:
            fail(f"config_sentence_transformers.json: {side}_prefix is empty; the graph tells queries from documents "
                 "by their markers")
        if marker not in vocabulary:
            fail(f"{side}_prefix {marker!r} is not a token of the checkpoint's tokenizer: PyLate would add it with an "
                 "untrained embedding")
        ids[side] = vocabulary[marker]
    if ids["query"] == ids["document"]:
        fail(f"query_prefix and document_prefix are the same token ({values['query_prefix']!r}); the graph tells "
             "queries from documents by it")
    expansion = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
    if expansion is None:
        fail("the tokenizer has no mask or EOS token, which PyLate pads queries with")
    for key in ("query_length", "document_length"):
        if not isinstance(values[key], int) or values[key] < 3:
            fail(f"config_sentence_transformers.json: {key} {values[key]!r} is not a length this export serves")
    if (read_json(folder, "sentence_bert_config.json") or {}).get("do_lower_case"):
        fail("sentence_bert_config.json: do_lower_case changes the text before the model; not built")
    return {"query_prefix_id": ids["query"], "document_prefix_id": ids["document"],
            "query_length": values["query_length"], "document_length": values["document_length"],
            "do_query_expansion": bool(values["do_query_expansion"]),
            # PyLate attends to no expansion token without expansion
            "attend_to_expansion_tokens": bool(values["attend_to_expansion_tokens"] and values["do_query_expansion"]),
            "expansion_id": int(expansion), "default_side": "document",
            "skiplist": sorted({int(tokenizer.convert_tokens_to_ids(word)) for word in values["skiplist_words"]})}


def load_projections(folder, modules):
    """The Dense modules after the Transformer as torch Linear layers (PyLate's Dense: no activation, no residual)."""
    import torch

    layers = []
    for module in modules[1:]:
        path = module.get("path", "")
        config = read_json(folder, path, "config.json") or {}
        if config.get("activation_function", IDENTITY) != IDENTITY or config.get("use_residual"):
            fail(f"{path}/config.json: activation {config.get('activation_function')}, use_residual "
                 f"{config.get('use_residual')}; this export builds PyLate's Dense as a plain Linear only")
        weights = os.path.join(folder, path, "model.safetensors")
        if os.path.exists(weights):
            from safetensors.torch import load_file

            state = load_file(weights)
        else:
            state = torch.load(os.path.join(folder, path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        layer = torch.nn.Linear(config["in_features"], config["out_features"], bias="linear.bias" in state)
        layer.load_state_dict({key.removeprefix("linear."): value for key, value in state.items()})
        layers.append(layer.eval())
    return layers


def build(args, folder, config, pipeline):
    """The graph (the encoder, the projections, the keep rule), the tokenizer and colbert.json."""
    from transformers import AutoModel, AutoTokenizer

    if args.outputs not in (None, "colbert"):
        fail(f"--outputs {args.outputs}: a PyLate ColBERT model has the colbert output only")
    if args.max_length:
        fail("--max-length: a ColBERT's lengths are its config_sentence_transformers.json's query_length and "
             "document_length; leave --max-length out")
    require_pylate()  # before the graph's work: the export cannot finish without its reference
    tokenizer = AutoTokenizer.from_pretrained(folder)
    side = settings(folder, tokenizer)
    projections = load_projections(folder, read_json(folder, "modules.json"))
    model = AutoModel.from_pretrained(folder).eval()
    encoder = build_late_interaction(model, projections, side)
    max_length = max(side["document_length"], side["query_length"])  # the widest row either side gives

    def tokenizer_files(directory):
        with open(os.path.join(directory, "colbert.json"), "w", encoding="utf-8") as handle:
            json.dump(side, handle, indent=2)

    return types.SimpleNamespace(encoder=encoder, tokenizer=tokenizer, outputs=["colbert"], max_length=max_length,
                                 reference=types.SimpleNamespace(folder=folder, settings=side), special_ids=[],
                                 sizes={"H": config.hidden_size, "C": projections[-1].out_features},
                                 model_type=config.model_type, tokenizer_files=tokenizer_files,
                                 manifest={"routes": {"query": "query", "document": "document"},
                                           "default_route": "document", "colbert": side,
                                           "colbert_score": "sum"})  # PyLate's MaxSim: the sum over query vectors


def build_late_interaction(model, projections, side):
    """input_ids, attention_mask (rows as colbert_side.py builds them, right-padded) -> colbert_vectors (each row's
    kept unit vectors first, zeros after), colbert_length, token_embeddings. A query row: its marker at position 1;
    its expansion tokens: the run of the expansion id at the end of its tokens, attended to only with
    attend_to_expansion_tokens; kept: all its positions (PyLate keeps them). A document row: its tokens but the
    skiplist's."""
    import inspect

    import torch

    takes_token_type_ids = "token_type_ids" in inspect.signature(model.forward).parameters
    skiplist = torch.tensor(side["skiplist"] or [-1], dtype=torch.long)

    class LateInteraction(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.projections = torch.nn.ModuleList(projections)

        def forward(self, input_ids, attention_mask):
            real = attention_mask > 0
            query = input_ids[:, 1:2] == side["query_prefix_id"]
            attend = real
            if side["do_query_expansion"] and not side["attend_to_expansion_tokens"]:
                other = real & (input_ids != side["expansion_id"])  # a token that ends no expansion run
                # positions after the row's last other token: counted from the end
                later = other.flip(1).to(torch.int64).cumsum(1).flip(1)
                attend = real & ~(query & (later == 0))
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if takes_token_type_ids else {}
            hidden = self.model(input_ids=input_ids, attention_mask=attend.to(attention_mask.dtype), **extra)[0]
            vectors = hidden
            for projection in self.projections:
                vectors = projection(vectors)
            vectors = torch.nn.functional.normalize(vectors, p=2.0, dim=-1)
            skipped = (input_ids.unsqueeze(-1) == skiplist).any(-1)
            keep = real & (query | ~skipped)
            width = input_ids.shape[1]
            positions = torch.arange(width, dtype=torch.int64).unsqueeze(0)
            order = torch.sort((~keep).to(torch.int64) * width + positions, dim=1)[1]  # kept first, in order
            kept = torch.gather(keep, 1, order).unsqueeze(-1).to(vectors.dtype)
            vectors = torch.gather(vectors, 1, order.unsqueeze(-1).expand(-1, -1, vectors.shape[-1])) * kept
            return vectors, keep.sum(1, keepdim=True).to(torch.int32), hidden

    return LateInteraction().eval()


def check(reference, pipeline, onnx_path, tokenizer_json, prompts, min_cosine, ragged):
    """The export against PyLate's ColBERT.encode (is_query True and False) on the parity texts: PyLate's settings
    as colbert.json holds them, each row's ids as the tokenizer model builds them (colbert_side.py) equal to
    PyLate's, the graph's kept vectors as many and in the same order as PyLate's, cosine >= min_cosine each."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from model_library.colbert_side import ColbertSide

    from ..graph import ragged_feeds

    theirs = run_pylate(reference.folder, PARITY_TEXTS)
    ours = reference.settings
    for key in ("query_prefix_id", "document_prefix_id", "query_length", "document_length", "do_query_expansion",
                "attend_to_expansion_tokens", "expansion_id", "skiplist"):
        if ours[key] != theirs[key]:
            fail(f"reference check failed: {key} is {ours[key]} here, {theirs[key]} in PyLate {theirs['pylate']}")
    if theirs["tokenizer_size"] > theirs["embedding_rows"]:
        fail(f"PyLate grows the embeddings to {theirs['tokenizer_size']} rows (the markers it adds), untrained")
    directory = os.path.dirname(tokenizer_json)
    side_rows = ColbertSide(directory, Tokenizer.from_file(tokenizer_json))
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    figures = {"against": f"pylate {theirs['pylate']} ColBERT"}
    for side in ("query", "document"):
        rows = [encoding.ids for encoding in side_rows.encode(PARITY_TEXTS, side)]
        width = max(len(row) for row in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)  # the pad id is never attended to
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, row in enumerate(rows):
            ids[r, :len(row)], mask[r, :len(row)] = row, 1
        feeds = ragged_feeds(ids, mask) if ragged else {"input_ids": ids, "attention_mask": mask}
        vectors, lengths = session.run(["colbert_vectors", "colbert_length"], feeds)
        worst = 1.0
        for r, want in enumerate(theirs[side]):
            count = int(lengths[r, 0])
            kept = [t for t in rows[r] if side == "query" or t not in set(ours["skiplist"])]
            check_ids([kept], [want["ids"]], side)
            if count != len(want["vectors"]):
                fail(f"reference check failed ({side}): text {r} ({PARITY_TEXTS[r][:40]!r}): {count} vectors, "
                     f"PyLate's {len(want['vectors'])}")
            got, expected = vectors[r, :count].astype(np.float64), np.asarray(want["vectors"], np.float64)
            cos = (got * expected).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
            worst = min(worst, float(cos.min()))
            if cos.min() < min_cosine:
                fail(f"reference check failed ({side}): text {r} ({PARITY_TEXTS[r][:40]!r}): token "
                     f"{int(cos.argmin())}'s vector has cosine {cos.min():.6f} with PyLate's (< {min_cosine})")
        figures[side] = {"min_cosine": worst, "vectors": [int(n) for n in lengths[:, 0]]}
    print(f"export: reference check vs PyLate {theirs['pylate']} ColBERT on {len(PARITY_TEXTS)} texts: "
          f"{json.dumps(figures)}")
    return figures


def require_pylate():
    if not os.path.isdir(os.path.join(PYLATE_SITE, "pylate")):
        fail(f"PyLate is not installed in {PYLATE_SITE}: run `make setup` (requirements-pylate.txt), or set "
             "PYLATE_SITE to where it is")


def run_pylate(folder, texts):
    """pylate_reference.py's answer for `texts` (PyLate from PYLATE_SITE, in its own process)."""
    require_pylate()
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylate_reference.py")
    with tempfile.TemporaryDirectory() as work:
        texts_path, out_path = os.path.join(work, "texts.json"), os.path.join(work, "out.json")
        with open(texts_path, "w", encoding="utf-8") as handle:
            json.dump(list(texts), handle)
        path = os.pathsep.join(filter(None, (PYLATE_SITE, os.environ.get("PYTHONPATH"))))  # PyLate's pins first
        done = subprocess.run([sys.executable, script, folder, texts_path, out_path], capture_output=True, text=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path})
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            fail(f"the reference (PyLate's encoder, {PYLATE_SITE}) failed: {last}")
        with open(out_path, encoding="utf-8") as handle:
            return json.load(handle)
