"""The busy path, written once in the service layer: what a request the gate refused (admission.py: 429,
errors.NotAdmitted at its first Triton call) still gets before the 429. A request that can never succeed gets its
4xx busy or idle, so its client is never told to retry it (issue 59): the refusals that need no tokens are given
before admission (prechecks.py); the one that needs them, a text over the max length with truncate false (the
request parameter the routes pass: route_helpers.refusing_cut), is asked of the tokenizer alone (Service.measure:
outside admission, it waits for the busy encoder), whose too_long names the text as the model would.

BusyPath goes before the calls' own class (service.Service's Inference; the tests' fake service), so every route's
call takes this path and no route writes it."""
import asyncio

from model_library import model_errors

from .errors import ApiError, NotAdmitted, client_indices, rename_field

# What an ASCII text may count beyond one token per character: the special tokens a tokenizer adds to one text (2 for
# BERT's and XLM-R's) and SentencePiece's leading word piece, with room to spare
ASCII_SLACK = 5


def refuses_cut(parameters):
    """Whether a call's request parameters carry truncate false: an input over the max length is refused."""
    return (parameters or {}).get("truncate") is False


def surely_within(card, texts):
    """Whether none of `texts` can be over the model's max length, told without their tokens: an ASCII text (and
    prompt) gives at most one token per character whatever the tokenizer (WordPiece, BPE, SentencePiece), plus
    ASCII_SLACK. Says only that the tokenizer need not be asked (cut_while_busy), never that a text is cut."""
    prompts = [text for _, text in card.prompts]
    if not all(text.isascii() for text in prompts):
        return False
    room = card.max_length - max(map(len, prompts), default=0) - ASCII_SLACK
    return all(len(text) <= room and text.isascii() for text in texts)


async def in_order(*calls):
    """The calls side by side; the first one's error in the order given, else their results."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def answered(call, hopeless):
    """`call`'s answer; refused by the gate, `hopeless()` first (it raises the 4xx of a request that can never
    succeed), then the refusal."""
    try:
        return await call
    except NotAdmitted:
        await hopeless()
        raise


class BusyPath:
    """The service's calls that can refuse a text over the max length (embed, rerank, predict), and /embed_all's
    token count, as the routes call them; the state and the calls below are the class after this one's."""

    async def embed(self, card, texts, outputs, param, parameters=None):
        return await answered(super().embed(card, texts, outputs, param, parameters),
                              lambda: self.cut_while_busy(card, texts, param, parameters))

    async def rerank(self, card, query, documents, weights, parameters=None):
        return await answered(super().rerank(card, query, documents, weights, parameters),
                              lambda: self.rerank_cut_while_busy(card, query, documents, parameters))

    async def predict(self, card, inputs, param, parameters=None):
        return await answered(super().predict(card, inputs, param, parameters),
                              lambda: self.predict_cut_while_busy(card, inputs, param, parameters))

    async def count_tokens(self, card, texts, param, parameters):
        """The tokens of `texts` as the embedding step takes them (each cut at the max length; the prompt and the
        special tokens included), all together: the tokenizer's tokenize task; for a request the gate refused, the
        tokenizer alone (measure), so that an answer too large gets its 413 rather than a 429 to retry. The tokenizer
        cannot say in time: the refusal stands."""
        try:
            tokens = await self.tokenize(card, texts, param, {"add_special_tokens": True, **parameters})
        except NotAdmitted:
            measured = await self.measure(card, texts, param, parameters)
            if measured is None:
                raise
            return int(measured.tokens.sum())
        return sum(min(len(row), card.max_length) for row in tokens)

    async def cut_while_busy(self, card, texts, param, parameters, queries=None):
        """truncate false, and the gate refused the request: a text over the max length can never be served, but
        only its tokens tell, so the tokenizer alone is asked, with truncate false; its too_long names the text
        (param[i]). Not asked when every text is surely within the max length. Returns when none is cut, or the
        tokenizer could not say in time (the 429 stands)."""
        if not refuses_cut(parameters) or (queries is None and surely_within(card, texts)):
            return
        await self.measure(card, texts, param, parameters, queries)

    async def rerank_cut_while_busy(self, card, query, documents, parameters):
        """The query and the documents as the rerank model has them tokenized (a cross-encoder's: each document
        paired with the query, no prompt; else each text alone), named as the rerank model names them."""
        if not refuses_cut(parameters):
            return
        if card.kind == "cross-encoder":  # the tokenizer names the pairs' one query `query`
            await self.cut_while_busy(card, documents, "documents", {"truncate": False}, queries=query)
            return
        try:
            await in_order(self.cut_while_busy(card, [query], "query", parameters),
                           self.cut_while_busy(card, documents, "documents", parameters))
        except ApiError as error:
            if error.field == "query[0]":  # the query is one text, named alone (as the rerank model names it)
                rename_field(error, "query")
            raise

    async def predict_cut_while_busy(self, card, inputs, param, parameters):
        """The inputs as the classifier reads them (a text alone, a pair with its first text as the pair's query),
        each named param[i] as predict names it."""
        if not refuses_cut(parameters):
            return

        async def ask(indices, paired):
            if not indices:
                return
            with client_indices(param, indices):
                try:
                    await self.cut_while_busy(card, [inputs[i][-1] for i in indices], param, parameters,
                                              queries=[inputs[i][0] for i in indices] if paired else None)
                except ApiError as error:  # a pair's query[i]: its input
                    name, i = model_errors.split_field(error.field or "")
                    if name == "query" and i is not None:
                        rename_field(error, f"{param}[{i}]")
                        error.param = param
                    raise
        await in_order(ask([i for i, item in enumerate(inputs) if len(item) == 1], False),
                       ask([i for i, item in enumerate(inputs) if len(item) == 2], True))
