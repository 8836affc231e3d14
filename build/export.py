"""Export a Hugging Face encoder into the Triton model repository.

    python build/export.py --model BAAI/bge-m3                       # dense + sparse + ColBERT (bge-m3's heads)
    python build/export.py --model sentence-transformers/all-MiniLM-L6-v2   # offline: pip package copy
    python build/export.py --model ./my-model --pooling mean --max-length 512 --repository /tmp/repo
    python build/export.py --model ./e5-small --name e5-small       # a second model beside the first
    python build/export.py --model BAAI/bge-reranker-v2-m3 --name reranker   # a cross-encoder (kind from config)

One export is five Triton models: a tokenizer (Python), an encoder (ONNX), the ensemble that clients call, its BLS
twin for many-text requests (length groups as concurrent encoder runs) and the rerank model; an embedding export
also has a late chunking model (`late_chunking`, or NAME_chunks: one vector per chunk of a text, pooled from the
encoder's `token_embeddings`). Without --name they are
the design card's `tokenizer`, `embedding`, `ensemble`, plus `ensemble_bls` and `rerank`; with --name NAME they are
`NAME_tokenizer`, `NAME_embedding`, `NAME`, `NAME_bls` and `NAME_rerank`. Export writes a serving repository
(default model_repository/, ignored by git as one folder; model_source/ holds the code and templates and is never
written):
  <encoder>/1/model.onnx          input_ids + attention_mask in; `embedding` (pooled, L2-normalized) out, plus
                                  bge-m3's sparse and ColBERT outputs when the folder has its heads, and
                                  `embedding_unnormalized` (the pooled vector before its L2 step)
  <encoder>/config.pbtxt          rendered from model_source/embedding/config.pbtxt.template
  <encoder>/warmup/*              model_warmup samples (a short and a long text)
  <encoder>/batchstrategy.so      token_budget.c compiled: encoder batches bounded by max_batch_tokens
  <encoder>/configs/gpu.pbtxt     the encoder on a GPU with the CUDA execution provider; configs/gpu-trt.pbtxt with
                                  TensorRT (Triton --model-config-name, launcher MODEL_CONFIG_NAME; docs/deploying.md),
                                  rendered from model_source/embedding/{gpu,gpu-trt}.pbtxt.template
  <tokenizer>/1/tokenizer.json    with the model's max length as its truncation
  <tokenizer>/1/prompts.json      the model's prompts (config_sentence_transformers.json), prepended on request
  <bls>/1/vectors.json            the widths served (Matryoshka) and the int8/uint8 ranges calibrated per width
                                  on exporter/calibration/corpus.txt (its README.md: provenance)
  <ensemble>/config.pbtxt         rendered from model_source/ensemble/config.pbtxt.template
  <ensemble>/1/export.json        what was exported (the proxy discovers models by this file)
  <bls>/config.pbtxt, <rerank>/config.pbtxt   rendered from model_source/{ensemble_bls,rerank}/config.pbtxt.template
Every export also copies its Python models' code from model_source/ (MODEL_CODE), with the library beside it, and
the proxy's and supervisor's. Everything is
built in a temporary folder and checked against PyTorch (every output) before it replaces anything in the
repository.

The kind comes from the model's config: a sequence-classification model (XLM-R, RoBERTa or BERT family) is a
cross-encoder, exported with --name as the same five models over (query, passage) pairs: NAME (pairs in, `logits`
and `scores` out), NAME_tokenizer (pair tokenization), NAME_embedding (the classifier), NAME_bls (pairs in length
groups) and NAME_rerank (query + documents), checked against sentence-transformers' CrossEncoder and
FlagEmbedding's FlagReranker (exporter/families/cross_encoder.py). A causal LM published as a yes/no reranker
(Qwen3-Reranker) is exported the same way when --yes-no-reranker says so (exporter/families/yes_no_reranker.py).
Other heads are refused, not exported without them. A folder that maps its classes to its own code (`auto_map`) is
refused in one line naming that code unless --trust-remote-code says to run it (then the reference check runs it
too).

The work is done by the package exporter/ (exporter/run.py the order of the steps; a module per model family in
exporter/families/, registered in one table); this file is the command: its flags.
"""

import argparse
import os
import sys

# The checkout this script is in first on the path: its exporter/ and local_triton/ (export may run from a copy of
# the checkout, and writes that checkout's serving repository by default; the image's export stage has no install).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exporter import run  # noqa: E402 - after the path above
from exporter.pipeline import POOLING_MODES  # noqa: E402
from exporter.repository import PROJECT  # noqa: E402
from exporter.vectors import CALIBRATION_CORPUS  # noqa: E402
from local_triton.settings import serving_repository  # noqa: E402


def parse_args(argv):
    return build_parser().parse_args(argv)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"hub id or local folder (default {run.DEFAULT_MODEL})")
    parser.add_argument("--name", help="serve it as its own models NAME, NAME_tokenizer, NAME_embedding, NAME_bls, "
                        "NAME_rerank beside the others (default: the design card's ensemble/tokenizer/embedding)")
    parser.add_argument("--outputs", help="comma-separated subset of dense,sparse,colbert (default: all the model "
                        "has: sparse and colbert need bge-m3's sparse_linear.pt / colbert_linear.pt)")
    parser.add_argument("--pooling", choices=POOLING_MODES, help="a folder without sentence-transformers files: "
                        "how its token vectors become one (default cls); a sentence-transformers folder's own "
                        "Pooling module decides for it")
    parser.add_argument("--max-length", type=int, help="tokens per text; longer texts are truncated "
                        "(default: the model's own limit, sentence-transformers' max_seq_length where the folder "
                        "states one)")
    parser.add_argument("--matryoshka-dims", help="comma-separated widths the model was trained to be truncated to "
                        "(default: its config's matryoshka_dimensions; none: only its full size)")
    parser.add_argument("--muvera", default="k_sim=5,dim_proj=16,r_reps=20,seed=42", help="MUVERA's encoding of the "
                        "ColBERT vectors (exports with ColBERT outputs): its parameters, fixed here (default "
                        "fastembed's: 2^5 partitions x 16 dimensions x 20 repetitions = 10,240 values, seed 42)")
    parser.add_argument("--calibration-corpus", default=CALIBRATION_CORPUS, help="texts, one per line, whose "
                        "embeddings give the int8/uint8 ranges (default: exporter/calibration/corpus.txt)")
    parser.add_argument("--served-name", action="append", default=[], dest="served_names", metavar="NAME",
                        help="another name clients may call this export by (repeatable; e.g. text-embedding-3-small "
                             "for OpenAI tools with a fixed model name); another export's id always wins")
    parser.add_argument("--repository", default=serving_repository(PROJECT),
                        help="the serving repository to write (default %(default)s)")
    parser.add_argument("--fp16", action="store_true", help="store weights in fp16 (GPU serving)")
    parser.add_argument("--external-data", action="store_true",
                        help="weights in one external data file (automatic above 2 GB)")
    parser.add_argument("--open-clip", metavar="ARCHITECTURE", help="export an open_clip CLIP model (e.g. ViT-B-32): "
                        "text and image towers; needs --name")
    parser.add_argument("--pretrained", help="with --open-clip: a pretrained tag (downloaded from the hub) or a "
                        "checkpoint file, as open_clip takes it; 'none' = random weights (tests)")
    parser.add_argument("--yes-no-reranker", action="store_true",
                        help="the model is a causal LM published as a reranker (Qwen/Qwen3-Reranker-*): serve the "
                             "probability of \"yes\" against \"no\" after its chat template, as its model card "
                             "scores it (needs --name; its config alone says a chat model as much as a reranker)")
    parser.add_argument("--ragged-batch", action="store_true",
                        help="an encoder that takes ragged batches (Triton's allow_ragged_batch): one encoder run "
                             "holds texts of any widths, padded in the graph to the widest (text embeddings only; "
                             "measured against width groups in bench/TUNING.md)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run the checkpoint's own code (its auto_map: configuration_*.py, modeling_*.py...), as "
                             "transformers' trust_remote_code: the graph and the reference check (sentence-"
                             "transformers under the same flag) both load it. Without it, a folder that maps its "
                             "classes to its own code is refused, never exported as transformers' native class")
    parser.add_argument("--skip-if-exported", action="store_true",
                        help="do nothing when the repository holds an export of --model under this name "
                             "(or any, if no --model)")
    return parser


def main(argv=None):
    return run.main(parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
