"""PyLate's own encoder on a ColBERT folder, run as a script in a process of its own: PyLate 1.6 pins
sentence-transformers 5.3 and transformers <= 5.3, older than the venv's, so requirements-pylate.txt is installed
with --no-deps into a folder off the venv's path (PYLATE_SITE, default .venv/pylate-site) that only this process has
first on its path: families/colbert.py starts it with that folder first on PYTHONPATH. Never imported by the
exporter.

    PYTHONPATH=SITE python exporter/pylate_reference.py FOLDER TEXTS_JSON OUT_JSON

OUT_JSON: PyLate's settings as it resolved them (prefix ids, lengths, skiplist ids, the expansion token), and per
side (query: encode(is_query=True), document: is_query=False) each text's kept token ids and their unit vectors, as
ColBERT.encode keeps them (output_value=None: the ids, the vectors and the mask it filters them with), and the
documents' vectors pooled with pool_factor 2 (document_pooled)."""
import json
import sys

import torch
from pylate import __version__, models

folder, texts_path, out_path = sys.argv[1:4]

torch.set_num_threads(1)  # a server may run beside it
with open(texts_path, encoding="utf-8") as handle:
    texts = json.load(handle)
model = models.ColBERT(model_name_or_path=folder, device="cpu")
model.eval()
tokenizer = model.tokenizer
embeddings = model[0].auto_model.get_input_embeddings().num_embeddings
result = {
    "pylate": __version__,
    "query_prefix": model.query_prefix, "document_prefix": model.document_prefix,
    "query_prefix_id": model.query_prefix_id, "document_prefix_id": model.document_prefix_id,
    "query_length": model.query_length, "document_length": model.document_length,
    "do_query_expansion": model.do_query_expansion, "attend_to_expansion_tokens": model.attend_to_expansion_tokens,
    "skiplist": sorted({int(t) for t in model.skiplist}), "expansion_id": tokenizer.pad_token_id,
    "tokenizer_size": len(tokenizer), "embedding_rows": embeddings,
    "modules": [type(module).__name__ for module in model],
}
for side, is_query in (("query", True), ("document", False)):
    out = model.encode(texts, is_query=is_query, output_value=None, batch_size=len(texts),
                       convert_to_numpy=True)
    rows = []
    for vectors, ids, mask in zip(out["token_embeddings"], out["input_ids"], out["masks"]):
        keep = torch.as_tensor(mask).bool()
        rows.append({"ids": torch.as_tensor(ids)[keep].tolist(),
                     "vectors": torch.as_tensor(vectors)[keep].float().tolist()})
    result[side] = rows
# token pooling (documents only, as PyLate pools them): pool_factor 2, [CLS]'s vector protected
pooled = model.encode(texts, is_query=False, pool_factor=2, batch_size=len(texts), convert_to_numpy=True)
result["document_pooled"] = [torch.as_tensor(vectors).float().tolist() for vectors in pooled]
with open(out_path, "w", encoding="utf-8") as handle:
    json.dump(result, handle)
