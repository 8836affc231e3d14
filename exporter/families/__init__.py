"""Every model family export builds, registered in one table: pipeline.py reads EMBEDDERS (which modules a folder
computes, the reference class it is checked against: reference.py loads it), the command (run.py) reads all three
(which export a folder gets), and the refusals name what they hold. One module per kind:

    encoder.py           Transformer → Pooling → Dense... → Normalize, or a transformers folder with --pooling;
                         encoders and decoder embedders (last-token pooling; Gemma3's bidirectional masks), bge-m3's
                         sparse and ColBERT heads
    splade.py            MLMTransformer → SpladePooling (SparseEncoder)
    colbert.py           PyLate's ColBERT (Transformer → pylate Dense, query/document markers, query expansion, the
                         document skiplist): the ColBERT outputs bge-m3's export has, checked against PyLate
    inference_free.py    Router: SPLADE documents, a token-weight lookup for queries (the tokenizer model's; no
                         encoder run): opensearch-neural-sparse-encoding-doc-v2/v3
    static.py            StaticEmbedding [→ Normalize] (sentence-transformers' and model2vec's static embeddings)
    cross_encoder.py     sequence-classification models: the graph over (query, passage) pairs, the export, the
                         parity check against CrossEncoder (and FlagReranker)
    decoder_reranker.py  sequence-classification decoders (the last non-pad token), their chat template as fixed
                         text around the pair
    yes_no_reranker.py   causal LMs published as rerankers (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma):
                         P(yes) against "no" (or the yes logit alone) at the last token after their prompt, from two
                         rows (or one) of the LM head; said by --yes-no-reranker or the folder's modules.json
                         (Transformer → LogitScore)
    clip.py              CLIP (open_clip, or a Hugging Face folder): a text tower and an image tower

A family of a kind already built is a row here (and its tiny checkpoint in tiny_checkpoints/); a new kind is a module
beside these. ARCHITECTURE.md, "Add a model family", names the files."""
from .. import fail
from . import clip, colbert, cross_encoder, decoder_reranker, encoder, inference_free, splade, static, yes_no_reranker

# Embedding pipelines, by the first module of a sentence-transformers folder's modules.json (a folder without one:
# a transformers encoder, `encoder`)
EMBEDDERS = {"Transformer": encoder, "MLMTransformer": splade, "StaticEmbedding": static, "Router": inference_free}
# Late-interaction folders, by the class that loads them (config_sentence_transformers.json's model_type, or a pylate
# module in modules.json): their first module is a Transformer too, but not the encoder family's pipeline
LATE_INTERACTION = {"ColBERT": colbert}
# Sequence-classification models (architectures *ForSequenceClassification), by config.model_type: the module whose
# rules serve them (a decoder's head reads its last non-pad token: decoder_reranker)
CROSS_ENCODERS = {
    "xlm-roberta": cross_encoder,  # <s> A </s></s> B </s>, no token types (bge-reranker-v2-m3)
    "roberta": cross_encoder,
    "bert": cross_encoder,  # [CLS] A [SEP] B [SEP], token types (ms-marco-MiniLM-L-6-v2)
    "electra": cross_encoder,  # BERT's layout (cross-encoder/ms-marco-electra-base)
    "modernbert": cross_encoder,  # [CLS] A [SEP] B [SEP], no token types (gte-reranker-modernbert-base)
    "deberta-v2": cross_encoder,  # BERT's layout; relative positions (mxbai-rerank-base-v1)
    # decoders the TorchScript exporter traces as Qwen3 does (Qwen3-Reranker-seq-cls)
    **dict.fromkeys(("qwen3", "qwen2", "llama", "mistral", "ministral", "gemma", "gemma2", "gemma3_text"),
                    decoder_reranker),
}
# Causal LMs published as yes/no rerankers, by config.model_type: the module that serves them, checked against the
# model card its MODEL_CARDS names (only when said: --yes-no-reranker, or modules.json Transformer → LogitScore)
YES_NO_RERANKERS = {
    "qwen3": yes_no_reranker,  # Qwen/Qwen3-Reranker-0.6B/4B/8B (Qwen3ForCausalLM): P("yes") against "no"
    # mixedbread-ai/mxbai-rerank-base-v2 / large-v2 (Qwen2ForCausalLM): logit("1") - logit("0") after mxbai-rerank's
    # prompt (its code's pieces, not the folder's chat template); `scores` its sigmoid
    "qwen2": yes_no_reranker,
    # BAAI/bge-reranker-v2-gemma (GemmaForCausalLM): FlagLLMReranker's logit("Yes") after its prompt; `scores` its
    # sigmoid (compute_score(normalize=True))
    "gemma": yes_no_reranker,
}
# Text and image models, by config.model_type (open_clip's architectures: --open-clip)
MULTIMODAL = {"clip": clip}
# Heads whose output an embedding export would silently drop: refused instead of served wrongly.
DROPPED_HEADS = ("ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice", "ForCausalLM",
                 "ForConditionalGeneration", "ForMaskedLM")


def cross_encoder_of(config, sentence_transformers_folder=False):
    """The CROSS_ENCODERS module of a sequence-classification model of a supported family, None for an embedder;
    anything else stops the export with one line (it would be served as something it is not). A sentence-
    transformers folder is an embedder whatever head its config names (Qwen3-Embedding's says Qwen3ForCausalLM,
    all-mpnet-base-v2's MPNetForMaskedLM): sentence-transformers loads its base model, and so does the export."""
    architectures = list(getattr(config, "architectures", None) or [])
    for architecture in architectures:
        if architecture.endswith("ForSequenceClassification"):
            family = CROSS_ENCODERS.get(config.model_type)
            if family is None:
                fail(f"{architecture} is a cross-encoder of a family this export does not check "
                     f"({config.model_type}); supported: {', '.join(CROSS_ENCODERS)}")
            family.check_config(config, architecture)
            return family
        if architecture.endswith(DROPPED_HEADS) and not sentence_transformers_folder:
            hint = (f"; a causal LM published as a yes/no reranker ({', '.join(YES_NO_RERANKERS)}) exports with "
                    f"{yes_no_reranker.FLAG}") if architecture.endswith("ForCausalLM") else ""
            fail(f"{architecture} has a head that an embedding export would drop; this export serves encoders "
                 f"(embeddings) and sequence-classification cross-encoders only{hint}")
    return None


def yes_no_reranker_of(config, modules, flag):
    """The YES_NO_RERANKERS module when the user (--yes-no-reranker) or the folder (modules.json: Transformer →
    LogitScore) says the causal LM is a yes/no reranker, None otherwise (never guessed from a config or a name);
    one line when it is said of a model this export does not serve so."""
    if not (flag or yes_no_reranker.states_it(modules)):
        return None
    architectures = list(getattr(config, "architectures", None) or []) if config is not None else []
    architecture = architectures[0] if architectures else "a folder without architectures"
    yes_no_reranker.check_config(config, architecture)
    family = YES_NO_RERANKERS.get(config.model_type)
    if family is None:
        fail(f"{architecture} is a yes/no reranker of a family this export does not check ({config.model_type}); "
             f"supported: {', '.join(YES_NO_RERANKERS)}")
    return family
