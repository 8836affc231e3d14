"""The decoder reranker family: sequence-classification decoders (Qwen3-Reranker-seq-cls; the Qwen2, Llama,
Mistral and Gemma families of families.CROSS_ENCODERS), which transformers classifies at the last token that is not
config.pad_token_id (GenericForSequenceClassification), exported the cross-encoder way (cross_encoder.export, with
DECODER); the dense ones the TorchScript exporter traces as Qwen3 does.

A decoder reranker whose folder has a chat template (Qwen3-Reranker) is fed by CrossEncoder (sentence-transformers
>= 5.4) the template rendered over the roles query and document, tokenized as one text without special tokens, cut
at max_length from the right, and then, when cut, the template's tail token ids written back over the last tokens
(Transformer._restore_chat_template_suffix). The tokenizer model has no jinja2: the template is rendered here once
with markers into fixed text (prefix, between, suffix; pair_template.json beside tokenizer.json) and the tokenizer
model builds prefix + query + between + document + suffix itself, with the same cut and tail. (Any cross-encoder
folder whose CrossEncoder renders pairs through a template goes this way: pair_template() reads the reference.)"""
import json
import os

from .. import fail

DECODER = True  # its head reads the last token that is not the pad id
PAIR_TEMPLATE = "pair_template.json"  # beside tokenizer.json in NAME_tokenizer/1
# Markers a template renders in place of the texts (private-use characters: no real text holds them), and texts it
# must carry through unchanged (spaces at the ends, case, markup, braces, quotes) to be served as fixed text.
QUERY_MARK, DOCUMENT_MARK = "\ue000query\ue001", "\ue000document\ue001"
TEMPLATE_PROBES = [("  What is <b>X</b>?  ", "\n Doc {{ x }} & 'single' \"double\"\t"), ("UPPER lower", "ünï 日本 🚀")]


def check_config(config, architecture):
    """A decoder is served only where transformers (and CrossEncoder) find its last token as the graph does."""
    if getattr(config, "pad_token_id", None) is None:
        fail(f"{architecture} has no pad_token_id in its config: transformers (and CrossEncoder) "
             f"cannot find a decoder's last token in a padded batch without it")
    if getattr(config, "use_bidirectional_attention", False):
        fail(f"{architecture} with use_bidirectional_attention is not a decoder reranker this export "
             f"traces")


def _render(reference, tokenizer, query, document):
    """The text CrossEncoder renders for one pair: its own messages (the input formatter's roles and content
    shape) through the folder's chat template, as apply_chat_template renders them before tokenizing."""
    module = reference[0]
    _, inputs = module.input_formatter.batch_to_message("text", {"text": [(query, document)]})
    return tokenizer.apply_chat_template(inputs["message"][0], tokenize=False)


def pair_template(reference, tokenizer):
    """None when CrossEncoder tokenizes pairs as pairs; for a folder whose pairs go through its chat template, the
    template as fixed text {prefix, between, suffix} around the query and the document, with suffix_ids (the tail
    CrossEncoder writes back over a cut row). A template that is not fixed text around the two texts unchanged
    (it transforms, escapes or reorders them, or depends on them) stops the export: the tokenizer model could not
    reproduce it."""
    module = reference[0]
    if "message" not in (getattr(module, "modality_config", None) or {}):
        return None
    why = None
    try:
        text = _render(reference, tokenizer, QUERY_MARK, DOCUMENT_MARK)
    except Exception as error:  # noqa: BLE001 - any template failure gets the one-line answer
        text, why = "", f"it fails to render: {type(error).__name__}: {error}"
    if why is None and (text.count(QUERY_MARK) != 1 or text.count(DOCUMENT_MARK) != 1):
        why = "it does not render the query and the document once each"
    elif why is None and text.index(QUERY_MARK) > text.index(DOCUMENT_MARK):
        why = "it renders the document before the query"
    if why is None:
        prefix, rest = text.split(QUERY_MARK)
        between, suffix = rest.split(DOCUMENT_MARK)
        for query, document in TEMPLATE_PROBES:
            if _render(reference, tokenizer, query, document) != prefix + query + between + document + suffix:
                why = "it changes the texts or the text around them"
                break
    if why is not None:
        fail(f"the chat template does not render a (query, document) pair as fixed text around the two texts "
             f"({why}); the tokenizer model serves prefix + query + between + document + suffix only")
    template = {"prefix": prefix, "between": between, "suffix": suffix}
    template["suffix_ids"] = _suffix_ids(tokenizer.backend_tokenizer, template)
    return template


def _suffix_ids(backend, template):
    """The tail CrossEncoder restores on a cut row: the token ids two renders with different texts ("0" and
    "1 2 3 4") share at their end, so none of the texts' own; none when they never differ."""
    renders = [backend.encode(template["prefix"] + filler + template["between"] + filler + template["suffix"],
                              add_special_tokens=False).ids for filler in ("0", "1 2 3 4")]
    count = 0
    for left, right in zip(reversed(renders[0]), reversed(renders[1])):
        if left != right:
            break
        count += 1
    return renders[0][len(renders[0]) - count:] if 0 < count < min(map(len, renders)) else []


def write_pair_template(tokenizer_dir, template):
    if template is not None:
        with open(os.path.join(tokenizer_dir, PAIR_TEMPLATE), "w", encoding="utf-8") as handle:
            json.dump(template, handle, indent=2, ensure_ascii=False)

