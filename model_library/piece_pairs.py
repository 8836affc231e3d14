"""A yes/no reranker's pair as its reference code builds it (exporter/families/yes_no_reranker.py, PieceCard: the
fixed pieces from the folder's pair_template.json): the query and the document tokenized apart, each cut its own way,
the separator and the document cut 'only_second' so the pair fits, the fixed pieces' ids around them. One rule, run
by the tokenizer model on what it serves and by the export on the ids it checks against the reference's."""


def pair_ids(pieces, query_ids, document_ids):
    """(the pair's token ids, the query was cut, the pair was cut) from the formatted query's and document's ids."""
    query_cut = len(query_ids) > pieces["query_max_length"]
    query_ids = query_ids[:pieces["query_max_length"]]
    limit = pieces["document_max_length"]
    if pieces["document_room"] is not None:
        limit = min(limit, pieces["document_room"] - len(query_ids))
    cut = query_cut or len(document_ids) > limit
    first = (pieces["prefix_ids"] if pieces["prefix_in_pair"] else []) + query_ids
    second = pieces["separator_ids"] + document_ids[:limit]
    over = len(first) + len(second) - pieces["pair_max_length"]
    if 0 < over < len(second):  # 'only_second', as transformers 4 cut it (left whole when it cannot)
        second, cut = second[:-over], True
    head = [] if pieces["prefix_in_pair"] else pieces["prefix_ids"]
    return head + first + second + pieces["suffix_ids"], query_cut, cut
