"""The yes/no reranker family: causal language models published as rerankers (Qwen/Qwen3-Reranker-0.6B/4B/8B as Qwen
ships them: Qwen3ForCausalLM), whose model card scores a (query, document) pair as the probability that the next
token after its prompt is "yes" rather than "no": softmax over the two tokens' logits at the last position, P(yes).

How the export knows: a *ForCausalLM config says a chat model as much as a reranker (Qwen3-Reranker's config is a
Qwen3 LLM's), so nothing is guessed from the config or the name: the user says it (--yes-no-reranker), or the folder
does, as sentence-transformers writes such a CrossEncoder (modules.json: Transformer → LogitScore). Without either,
a causal-LM folder is refused in one line (families.cross_encoder_of), never served as an embedder or a reranker.

What is served: the graph keeps two rows of the LM head (the "yes" and "no" token ids, never the vocabulary-wide
head) and reads the decoder's last token (the tokenizer model pads on the right: the last place the attention mask
holds), giving `logits` [n, 1] = logit(yes) - logit(no) and `scores` [n, 1] = sigmoid(logits) = softmax([no,
yes])[yes] = P(yes), the model card's score. That is how every cross-encoder export serves (`logits` the raw score,
TEI's raw_scores; `scores` its sigmoid: /v1/rerank, Cohere's and TEI's /rerank, /predict), and what sentence-
transformers' CrossEncoder returns for this layout (LogitScore's log-odds, then its default Sigmoid).

The prompt comes from the folder's chat template, rendered at export into fixed text around the query and the
document (pair_template.json, which the tokenizer model applies): over the query/document roles, as CrossEncoder
renders a pair (decoder_reranker.pair_template: sentence-transformers' layout for these rerankers), or, where the
template is a chat model's and carries no such roles (Qwen's main branch ships Qwen3's), over the model card's
messages (its system prompt, its `<Instruct>/<Query>/<Document>` user turn, the assistant's turn with thinking off:
card_template), which must render as the card's own text. Any other template is refused in one line.

Checked before anything is installed against the model card's own scoring with transformers (MODEL_CARDS: its
prefix and suffix tokenized apart, its instruction format, AutoModelForCausalLM's yes/no logits at the last
position of a left-padded batch, log_softmax over [no, yes]: the served token ids must be the card's, the scores
within 1e-4) and, where CrossEncoder renders the folder's pairs, against CrossEncoder (token ids and scores,
cross_encoder.parity_check).

Rerankers whose prompt is their reference code's, not the folder's (PieceCard: mxbai-rerank-v2's MxbaiRerankV2,
bge-reranker-v2-gemma's FlagLLMReranker) build it from pieces tokenized apart, each with its own cut, which no fixed
text around the pair reproduces (a piece's last token may merge with the next in one text): pair_template.json then
holds the pieces (their fixed ids, the formats, the cuts) and the tokenizer model builds each pair from them
(piece_ids here, piece_pairs there: the same steps). Their score is the reference's: logit("1") - logit("0")
(mxbai) or logit("Yes") alone (FlagLLMReranker: one row of the LM head) as `logits`, its sigmoid as `scores`; they
are checked against that code's scoring, transcribed step for step with transformers (flag_llm_scores,
mxbai_v2_scores), at the reference's own max length unless --max-length says otherwise."""
from dataclasses import dataclass

from model_library.piece_pairs import pair_ids

from .. import fail, read_json

DECODER = True  # its score is read at the last token
FLAG = "--yes-no-reranker"
# modules.json of a sentence-transformers CrossEncoder over a causal LM: it states that it is a yes/no reranker
ST_MODULES = ["Transformer", "LogitScore"]


@dataclass(frozen=True)
class ModelCard:
    """A published yes/no reranker's scoring as its model card writes it with transformers."""
    checkpoint: str
    system: str  # the system prompt (prefix holds it as the chat template renders it)
    prefix: str
    suffix: str
    instruction: str
    pair: str  # format(instruction=..., query=..., doc=...)
    true_token: str = "yes"
    false_token: str = "no"


QWEN3_RERANKER = ModelCard(
    checkpoint="Qwen/Qwen3-Reranker-0.6B",
    system="Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note "
           "that the answer can only be \"yes\" or \"no\".",
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
           "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
    pair="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}")


@dataclass(frozen=True)
class PieceCard:
    """A yes/no reranker whose reference code builds its prompt from pieces tokenized apart (no chat template of the
    folder: the prompt is the code's own): fixed pieces first (`prefix`: the code's chat turn, or the tokenizer's
    BOS where `bos`), the query piece (`query` formatted, cut to 3/4 of max_length), a separator, the document piece
    (`document` formatted, cut to max_length, then with the separator cut 'only_second' so the pair fits
    `pair_limit(max_length, ...)`), then fixed pieces (`suffix`). Its score: the logit of the first token of
    `true_token` at the last position, less that of `false_token` (none: the logit alone)."""
    checkpoint: str
    reference: str  # the code whose scoring it is (named in the export's report)
    prefix: tuple  # texts tokenized apart, before the query piece
    bos: bool  # the tokenizer's BOS first (FlagLLMReranker: where it has one other than its pad token)
    query: str  # format(query=...)
    separator: str
    document: str  # format(document=...)
    suffix: tuple  # texts tokenized apart, after the pair
    true_token: str
    false_token: str | None
    max_length: int  # the reference's default max_length
    prefix_in_pair: bool  # the prefix counts in the 'only_second' cut (FlagLLMReranker's BOS does)
    pair_extra: bool  # the cut's limit is max_length plus the separator and the suffix (FlagLLMReranker's)
    document_room: bool  # the document is also cut to the positions the query and the fixed pieces leave (mxbai)
    scoring: str  # the function of this module that computes the reference's scores (its code, step for step)


# BAAI/bge-reranker-v2-gemma: FlagEmbedding's FlagLLMReranker (FlagEmbedding 1.4.2, inference/reranker/decoder_only/
# base.py, compute_score_single_gpu): "A: " + query (query_instruction_for_rerank) cut to 3/4 of max_length, BOS
# first; "\n" + "B: " + passage, the passage cut to max_length, the pair cut 'only_second' to max_length + len("\n")
# + len(prompt); then "\n" and its prompt; the score is the raw logit of "Yes" (compute_score's default; its
# normalize=True: the sigmoid, served as `scores`)
BGE_RERANKER_V2_GEMMA = PieceCard(
    checkpoint="BAAI/bge-reranker-v2-gemma", reference="FlagEmbedding FlagLLMReranker", prefix=(), bos=True,
    query="A: {query}", separator="\n", document="B: {document}",
    suffix=("\n", "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
                  "providing a prediction of either 'Yes' or 'No'."),
    true_token="Yes", false_token=None, max_length=512, prefix_in_pair=True, pair_extra=True, document_room=False,
    scoring="flag_llm_scores")
# mixedbread-ai/mxbai-rerank-base-v2 / large-v2: mxbai-rerank's MxbaiRerankV2 (mxbai-rerank 0.1.6,
# mxbai_rerank_v2.py, prepare_inputs and forward): its Qwen chat turn, "query: " + query cut to 3/4 of max_length,
# "\n" + "document: " + document cut to the room left (max_length, and the positions the query and the fixed pieces
# leave), the pair cut 'only_second' to max_length; then "\n", its task prompt and the assistant's turn; the score is
# logit("1") - logit("0") at the last position (predict's default; its sigmoid is P("1") against "0": `scores`)
MXBAI_RERANK_V2 = PieceCard(
    checkpoint="mixedbread-ai/mxbai-rerank-base-v2", reference="mxbai-rerank MxbaiRerankV2",
    prefix=("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n",), bos=False,
    query="query: {query}", separator="\n", document="document: {document}",
    suffix=("\n", "You are a search relevance expert who evaluates how well documents match search queries. For each "
                  "query-document pair, carefully analyze the semantic relationship between them, then provide your "
                  "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:",
            "<|im_end|>\n<|im_start|>assistant\n"),
    true_token="1", false_token="0", max_length=8192, prefix_in_pair=False, pair_extra=False, document_room=True,
    scoring="mxbai_v2_scores")
# By config.model_type: the model card each registered family is checked against (families.YES_NO_RERANKERS)
MODEL_CARDS = {"qwen3": QWEN3_RERANKER, "gemma": BGE_RERANKER_V2_GEMMA, "qwen2": MXBAI_RERANK_V2}


def states_it(modules):
    """Whether a folder's sentence-transformers modules say it is a causal-LM (yes/no) CrossEncoder."""
    return [name for name, _ in modules or []] == ST_MODULES


def check_config(config, architecture):
    """Only a causal LM of a family whose model card this export checks."""
    if not architecture.endswith("ForCausalLM"):
        fail(f"{FLAG}: {architecture} is not a causal language model; a yes/no reranker scores the next token "
             f"(*ForCausalLM)")
    if getattr(config, "final_logit_softcapping", None):
        fail(f"{architecture} caps its logits (final_logit_softcapping), which this yes/no reranker graph does not "
             f"build")


def score_tokens(reference):
    """The (true, false) token ids CrossEncoder scores with: its LogitScore module's (false None: the true token's
    logit alone); anything but Transformer → LogitScore with a sigmoid is refused."""
    from sentence_transformers.cross_encoder.modules import LogitScore

    modules = list(reference)
    if len(modules) != 2 or not isinstance(modules[1], LogitScore) or \
            getattr(modules[0], "transformer_task", None) != "text-generation":
        fail(f"CrossEncoder loads this folder as {' → '.join(type(m).__name__ for m in modules)}; a yes/no reranker "
             f"export builds Transformer (text-generation) → LogitScore")
    import torch

    if not isinstance(reference.activation_fn, torch.nn.Sigmoid):
        fail(f"CrossEncoder's activation for this folder is {type(reference.activation_fn).__name__}; a yes/no "
             f"reranker export serves the sigmoid of the log-odds (P(yes))")
    return modules[1].true_token_id, modules[1].false_token_id


def build_yes_no(model, true_id, false_id):
    """logits [n, 1] = logit(true) - logit(false) (logit(true) alone when false is None) at the last token the
    attention mask holds (right padding), from two rows of the LM head; scores = sigmoid(logits)."""
    import torch

    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        fail("the LM head has a bias, which this yes/no reranker graph does not build")
    ids = [true_id] + ([] if false_id is None else [false_id])
    rows = head.weight[ids].detach().clone().to(torch.float32)  # [1 or 2, hidden]

    class YesNo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = model.base_model
            self.register_buffer("rows", rows)
            self.copied_weights = (head.weight,)  # what rows copies: weights.check asks whether it was loaded

        def forward(self, input_ids, attention_mask):
            hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask,
                                  use_cache=False).last_hidden_state
            last = (attention_mask.sum(1) - 1).view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
            token_logits = hidden.gather(1, last).squeeze(1) @ self.rows.T  # [n, 1 or 2]
            logits = token_logits[:, :1] - token_logits[:, 1:] if false_id is not None else token_logits
            return logits, torch.sigmoid(logits)

    return YesNo().eval()


def card_template(card, tokenizer):
    """The fixed text {prefix, between, suffix, suffix_ids} of the model card's messages rendered by the folder's
    chat template (system: the card's judge prompt; user: its instruction, query and document; the assistant's turn
    opened with thinking off), which must be the card's own text; else one line."""
    from .decoder_reranker import DOCUMENT_MARK, QUERY_MARK, _suffix_ids

    messages = [{"role": "system", "content": card.system},
                {"role": "user", "content": card.pair.format(instruction=card.instruction, query=QUERY_MARK,
                                                             doc=DOCUMENT_MARK)}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
    except Exception as error:  # noqa: BLE001 - any template failure gets the one-line answer
        text = f"{type(error).__name__}: {error}"
    wanted = card.prefix + card.pair.format(instruction=card.instruction, query=QUERY_MARK, doc=DOCUMENT_MARK) + \
        card.suffix
    if text != wanted:
        fail(f"the chat template renders neither a (query, document) pair (the query/document roles "
             f"sentence-transformers gives it) nor {card.checkpoint}'s model card messages as the card writes them: "
             f"this export cannot tell which prompt the model is scored after")
    prefix, rest = text.split(QUERY_MARK)
    between, suffix = rest.split(DOCUMENT_MARK)
    template = {"prefix": prefix, "between": between, "suffix": suffix}
    template["suffix_ids"] = _suffix_ids(tokenizer.backend_tokenizer, template)
    return template


def model_card_scores(card, model, folder, pairs, max_length):
    """The model card's scoring, step for step: its prefix and suffix tokenized apart, the formatted pair cut to
    what is left of max_length, a left-padded batch, AutoModelForCausalLM's logits at the last position, log_softmax
    over [no, yes], exp. Returns (token ids per pair, P(yes))."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    token_false_id = tokenizer.convert_tokens_to_ids(card.false_token)
    token_true_id = tokenizer.convert_tokens_to_ids(card.true_token)
    prefix_tokens = tokenizer.encode(card.prefix, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(card.suffix, add_special_tokens=False)
    texts = [card.pair.format(instruction=card.instruction, query=query, doc=doc) for query, doc in pairs]
    inputs = tokenizer(texts, padding=False, truncation="longest_first", return_attention_mask=False,
                       max_length=max_length - len(prefix_tokens) - len(suffix_tokens))
    rows = [prefix_tokens + ids + suffix_tokens for ids in inputs["input_ids"]]
    batch = tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt", max_length=max_length)
    with torch.no_grad():
        scores = model(**batch).logits[:, -1, :]
        scores = torch.stack([scores[:, token_false_id], scores[:, token_true_id]], dim=1)
        scores = torch.nn.functional.log_softmax(scores, dim=1)[:, 1].exp()
    return rows, scores.numpy()


def model_card_check(card, model, folder, tokenizer, template, max_length):
    """The export's more_checks: the served token ids and scores against the model card's own scoring."""
    import numpy as np
    import onnxruntime as ort

    from .cross_encoder import pair_ids, parity_pairs

    def check(onnx_path, tolerance):
        pairs = parity_pairs(tokenizer, True)
        rows = [pair_ids(tokenizer, q, p, max_length, template) for q, p in pairs]
        card_rows, expected = model_card_scores(card, model, folder, pairs, max_length)
        for i, (row, theirs) in enumerate(zip(rows, card_rows)):
            if row != theirs:
                at = next((k for k, (a, b) in enumerate(zip(row, theirs)) if a != b), min(len(row), len(theirs)))
                fail(f"model card check failed: pair {i} ({pairs[i][0][:40]!r}, {pairs[i][1][:40]!r}) is served as "
                     f"{len(row)} ids, {card.checkpoint}'s model card gives {len(theirs)}, first different at token "
                     f"{at}: the folder's chat template is not the model card's prompt")
        ids = np.full((len(rows), max(map(len, rows))), tokenizer.pad_token_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        (scores,) = session.run(["scores"], {"input_ids": ids, "attention_mask": mask})
        worst = float(np.abs(scores[:, 0] - expected).max())
        figures = {"model_card": card.checkpoint, "model_card_same_token_ids": len(pairs),
                   "model_card_max_abs_diff": worst}
        print(f"export: model card check on {len(pairs)} pairs vs {card.checkpoint}'s scoring with transformers "
              f"(P(yes)): {figures}")
        if worst > tolerance:
            fail(f"model card check failed: P(yes) differs by {worst:.3g} > {tolerance} from {card.checkpoint}'s "
                 f"model card scoring")
        return figures

    return check


def export(args, folder, config, repository, started):
    """A causal-LM yes/no reranker: the cross-encoder's five models over pairs (cross_encoder.install) around the
    two-row graph, checked against CrossEncoder and the model card."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..source import detect_max_length
    from .cross_encoder import Scorer, install, load_reference
    from .decoder_reranker import pair_template

    card = MODEL_CARDS[config.model_type]
    if isinstance(card, PieceCard):
        return export_pieces(args, folder, config, repository, started, card)
    modules = read_json(folder, "modules.json")
    if modules is not None and not states_it([(str(m.get("type", "")).rsplit(".", 1)[-1], "") for m in modules]):
        fail(f"{FLAG}: this folder's modules.json is a sentence-transformers pipeline of other modules; a yes/no "
             f"reranker folder has none, or {' → '.join(ST_MODULES)}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        fail(f"{args.model}: the tokenizer has no pad token, which CrossEncoder (and the tokenizer model) pad with")
    max_length = args.max_length or detect_max_length(folder, config, tokenizer)
    reference = load_reference(folder, max_length)
    true_id, false_id = score_tokens(reference)
    if getattr(reference[0], "modality_config", None) is None or "message" not in reference[0].modality_config:
        fail(f"{args.model} has no chat template: a yes/no reranker is scored after its prompt ({card.checkpoint}'s "
             f"model card), which the folder's chat template renders")
    why_not = reference[0].input_formatter.pair_roles_failure({})
    if why_not is None:  # CrossEncoder renders its pairs: the template over the query/document roles
        template = pair_template(reference, tokenizer)  # refused here if it is not fixed text around the pair
    else:  # a chat model's template: the model card's messages through it; CrossEncoder cannot score the folder
        template, reference = card_template(card, tokenizer), None
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = tokenizer.convert_ids_to_tokens([true_id] + ([] if false_id is None else [false_id]))
    score = f"P({tokens[0]})" if false_id is not None else f"sigmoid(logit {tokens[0]})"
    source = "the query/document roles" if reference is not None else f"{card.checkpoint}'s model card messages"
    return install(args, folder, config, repository, started, Scorer(
        graph=build_yes_no(model, true_id, false_id), tokenizer=tokenizer, max_length=max_length,
        reference=reference, template=template, decoder=True, labels=1, label_names=[tokens[0]],
        title=f"yes/no reranker, {config.model_type}, {score} at the last token, max length {max_length}, pairs "
              f"through its chat template over {source}",
        more_checks=model_card_check(card, model, folder, tokenizer, template, max_length),
        manifest={"yes_no_reranker": {"true_token_id": true_id, "false_token_id": false_id, "score": score,
                                      "template_over": source}}))


# ---------------------------------------------------------------- prompts built from pieces (PieceCard)
def piece_template(card, tokenizer, config, max_length):
    """(pair_template.json's {"pieces": ...}, the served max length, the reference's max_length) for a PieceCard:
    the fixed pieces as token ids, the formats and the cuts, as the tokenizer model (and piece_ids) applies them."""
    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    bos = tokenizer.bos_token_id
    prefix = ([bos] if card.bos and bos is not None and bos != tokenizer.pad_token_id else []) + \
        [i for piece in card.prefix for i in ids(piece)]
    suffix = [i for piece in card.suffix for i in ids(piece)]
    separator = ids(card.separator)
    room = None
    if card.document_room:  # mxbai: the fixed pieces and the pair within the model's positions
        positions = config.max_position_embeddings
        room = positions - len(prefix) - len(suffix)
        max_length = min(max_length, room)  # the reference's own clamp
    pair_max = max_length + (len(suffix) if card.pair_extra else 0)
    pieces = {"prefix_ids": prefix, "query": card.query, "query_max_length": max_length * 3 // 4,
              "separator_ids": separator, "document": card.document, "document_max_length": max_length,
              "document_room": room, "pair_max_length": pair_max, "prefix_in_pair": card.prefix_in_pair,
              "suffix_ids": suffix}
    served = (0 if card.prefix_in_pair else len(prefix)) + pair_max + len(suffix)  # the longest row
    return {"pieces": pieces}, served, max_length


def piece_ids(pieces, backend, query, document):
    """The tokenizer model's rule for a PieceCard (model_library/piece_pairs.py, which the tokenizer model runs):
    (token ids, query cut, pair cut)."""
    return pair_ids(pieces, backend.encode(pieces["query"].format(query=query), add_special_tokens=False).ids,
                    backend.encode(pieces["document"].format(document=document), add_special_tokens=False).ids)


def _only_second(first, second, max_length):
    """transformers 4's prepare_for_model(first, second, truncation='only_second', max_length) on ids, right side
    (FlagEmbedding's prepare_for_model_compat for decoders): the second cut so the pair fits, or left whole when
    that would take all of it."""
    over = len(first) + len(second) - max_length
    return list(second[:-over]) if 0 < over < len(second) else list(second)


def flag_llm_scores(card, model, folder, pairs, max_length):
    """FlagLLMReranker.compute_score_single_gpu (FlagEmbedding 1.4.2), step for step: its instructions ("A: ",
    "B: "), the query cut to 3/4 of max_length, the passage to max_length, BOS first, the pair cut 'only_second'
    to max_length + len(sep) + len(prompt), "\n" and the prompt after it, the batch padded (tokenizer's side, to a
    multiple of 8), the logit of the first token of "Yes" at the last real token (last_logit_pool). Returns (ids per
    pair, raw logits)."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    yes_loc = tokenizer(card.true_token, add_special_tokens=False)["input_ids"][0]
    prompt_inputs = tokenizer(card.suffix[1], return_tensors=None, add_special_tokens=False)["input_ids"]
    sep_inputs = tokenizer(card.separator, return_tensors=None, add_special_tokens=False)["input_ids"]
    encode_max_length = max_length + len(sep_inputs) + len(prompt_inputs)
    rows = []
    for query, passage in pairs:
        query_ids = tokenizer(card.query.format(query=query), return_tensors=None, add_special_tokens=False,
                              max_length=max_length * 3 // 4, truncation=True)["input_ids"]
        passage_ids = tokenizer(card.document.format(document=passage), return_tensors=None,
                                add_special_tokens=False, max_length=max_length, truncation=True)["input_ids"]
        if tokenizer.bos_token_id is not None and tokenizer.bos_token_id != tokenizer.pad_token_id:
            query_ids = [tokenizer.bos_token_id] + query_ids
        rows.append(query_ids + _only_second(query_ids, sep_inputs + passage_ids, encode_max_length) + sep_inputs
                    + prompt_inputs)
    batch = tokenizer.pad({"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]}, padding=True,
                          pad_to_multiple_of=8, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    mask = batch["attention_mask"]
    if mask[:, -1].sum() == mask.shape[0]:  # left padding
        last = logits[:, -1, :]
    else:
        last = torch.stack([logits[i, int(n) - 1, :] for i, n in enumerate(mask.sum(dim=1))])
    return rows, last[:, yes_loc].numpy()


def mxbai_v2_scores(card, model, folder, pairs, max_length):
    """MxbaiRerankV2.prepare_inputs and forward (mxbai-rerank 0.1.6), step for step: the static pieces tokenized
    apart, max_length clamped to the positions they leave, "query: " + query cut to 3/4 of max_length, "\n" +
    "document: " + document cut to the room left, the pair cut 'only_second' to max_length (prepare_for_model, which
    transformers 5 no longer has: its transformers-4 rule, _only_second), the chat turn around it, a left-padded
    batch (to a multiple of 8), logit("1") - logit("0") at the last position. Returns (ids per pair, raw scores)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model_max_length = AutoConfig.from_pretrained(folder).max_position_embeddings

    def get_input_ids(x):
        return tokenizer(x, return_tensors=None, add_special_tokens=False)["input_ids"]

    yes_loc, no_loc = get_input_ids(card.true_token)[0], get_input_ids(card.false_token)[0]
    sep_inputs, task_prompt_inputs = get_input_ids(card.separator), get_input_ids(card.suffix[1])
    prefix_inputs, suffix_inputs = get_input_ids(card.prefix[0]), get_input_ids(card.suffix[2])
    predefined_length = len(prefix_inputs) + len(task_prompt_inputs) + len(suffix_inputs) + len(sep_inputs)
    if max_length + predefined_length > model_max_length:
        max_length = model_max_length - predefined_length
    rows = []
    for query, document in pairs:
        query_inputs = tokenizer(card.query.format(query=query), return_tensors=None, add_special_tokens=False,
                                 max_length=max_length * 3 // 4, truncation=True)
        available_tokens = model_max_length - len(query_inputs["input_ids"]) - predefined_length
        document_inputs = tokenizer(card.document.format(document=document), return_tensors=None,
                                    add_special_tokens=False, max_length=min(available_tokens, max_length),
                                    truncation=True)
        pair = query_inputs["input_ids"] + _only_second(query_inputs["input_ids"],
                                                        sep_inputs + document_inputs["input_ids"], max_length)
        rows.append(prefix_inputs + pair + sep_inputs + task_prompt_inputs + suffix_inputs)
    batch = tokenizer.pad({"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]},
                          padding="longest", pad_to_multiple_of=8, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return rows, (logits[:, -1, yes_loc] - logits[:, -1, no_loc]).numpy()


def piece_card_check(card, model, folder, tokenizer, template, max_length):
    """The export's more_checks for a PieceCard: the served token ids and both outputs against the reference's
    scoring (card.scoring): `logits` its raw score, `scores` the sigmoid of it."""
    import numpy as np
    import onnxruntime as ort

    from .cross_encoder import parity_pairs

    def check(onnx_path, tolerance):
        pairs = parity_pairs(tokenizer, True)
        rows = [piece_ids(template["pieces"], tokenizer.backend_tokenizer, q, p)[0] for q, p in pairs]
        card_rows, raw = globals()[card.scoring](card, model, folder, pairs, max_length)
        for i, (row, theirs) in enumerate(zip(rows, card_rows)):
            if row != theirs:
                at = next((k for k, (a, b) in enumerate(zip(row, theirs)) if a != b), min(len(row), len(theirs)))
                fail(f"reference check failed: pair {i} ({pairs[i][0][:40]!r}, {pairs[i][1][:40]!r}) is served as "
                     f"{len(row)} ids, {card.reference} gives {len(theirs)}, first different at token {at}")
        ids = np.full((len(rows), max(map(len, rows))), tokenizer.pad_token_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        logits, scores = session.run(["logits", "scores"], {"input_ids": ids, "attention_mask": mask})
        worst = float(np.abs(scores[:, 0] - 1 / (1 + np.exp(-raw))).max())
        figures = {"model_card": card.checkpoint, "reference": card.reference, "model_card_same_token_ids": len(pairs),
                   "model_card_max_abs_diff": worst,
                   "model_card_raw_max_abs_diff": float(np.abs(logits[:, 0] - raw).max()),
                   "truncated_pairs": sum(piece_ids(template["pieces"], tokenizer.backend_tokenizer, q, p)[2]
                                          for q, p in pairs)}
        print(f"export: reference check on {len(pairs)} pairs vs {card.reference}'s scoring ({card.checkpoint}): "
              f"{figures}")
        raw_worst = figures["model_card_raw_max_abs_diff"]
        if worst > tolerance or raw_worst > tolerance * max(1.0, float(np.abs(raw).max())):
            fail(f"reference check failed: scores differ by {worst:.3g} (raw scores by {raw_worst:.3g}) > {tolerance} "
                 f"from {card.reference}'s")
        return figures

    return check


def export_pieces(args, folder, config, repository, started, card):
    """A yes/no reranker whose prompt is its reference code's (PieceCard): the two-row (or one-row) graph, pairs
    built from pieces by the tokenizer model, checked against the reference's scoring."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .cross_encoder import Scorer, install

    if read_json(folder, "modules.json") is not None:
        fail(f"{FLAG}: this folder has sentence-transformers modules; {card.checkpoint}'s layout has none (its "
             f"prompt and score are {card.reference}'s)")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        fail(f"{args.model}: the tokenizer has no pad token, which {card.reference} pads with")
    if tokenizer.truncation_side != "right":
        fail(f"{args.model}: the tokenizer cuts texts from the {tokenizer.truncation_side}; the tokenizer model cuts "
             f"{card.reference}'s pieces from the right")
    tokens = [card.true_token] + ([card.false_token] if card.false_token else [])
    ids = [tokenizer(token, add_special_tokens=False)["input_ids"] for token in tokens]
    if not all(ids):
        fail(f"{args.model}: the tokenizer gives no token for "
             f"{', '.join(repr(token) for token, i in zip(tokens, ids) if not i)}")
    true_id, false_id = ids[0][0], (ids[1][0] if card.false_token else None)
    template, served, max_length = piece_template(card, tokenizer, config, args.max_length or card.max_length)
    if max_length <= 0:
        fail(f"{args.model}: its prompt leaves no room in {config.max_position_embeddings} positions")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    names = tokenizer.convert_ids_to_tokens([true_id] + ([] if false_id is None else [false_id]))
    score = f"P({names[0]}) against {names[1]}" if false_id is not None else f"sigmoid(logit {names[0]})"
    return install(args, folder, config, repository, started, Scorer(
        graph=build_yes_no(model, true_id, false_id), tokenizer=tokenizer, max_length=served,
        reference=None, template=template, decoder=True, labels=1, label_names=[names[0]],
        title=f"yes/no reranker, {config.model_type}, {score} at the last token, {card.reference}'s prompt and "
              f"cuts at max length {max_length} ({served} tokens with the prompt)",
        more_checks=piece_card_check(card, model, folder, tokenizer, template, max_length),
        manifest={"yes_no_reranker": {"true_token_id": true_id, "false_token_id": false_id, "score": score,
                                      "template_over": f"{card.reference}'s prompt pieces",
                                      "reference": card.reference, "max_length": max_length}}))
