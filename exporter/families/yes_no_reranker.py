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
cross_encoder.parity_check)."""
from dataclasses import dataclass

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
# By config.model_type: the model card each registered family is checked against (families.YES_NO_RERANKERS)
MODEL_CARDS = {"qwen3": QWEN3_RERANKER}


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

    modules = read_json(folder, "modules.json")
    if modules is not None and not states_it([(str(m.get("type", "")).rsplit(".", 1)[-1], "") for m in modules]):
        fail(f"{FLAG}: this folder's modules.json is a sentence-transformers pipeline of other modules; a yes/no "
             f"reranker folder has none, or {' → '.join(ST_MODULES)}")
    card = MODEL_CARDS[config.model_type]
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
