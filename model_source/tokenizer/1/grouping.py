"""Length grouping for the tokenizer: which requests of one execute share a padded width.

Triton's dynamic batcher merges only requests of equal shape, in arrival order. The tokenizer therefore sorts the
requests of one execute by length, cuts them into groups, pads every request of a group to the group's width and
sends the groups one after the other: each group reaches the encoder's queue as a run of equal shapes and runs as
one batch. Pure functions, no Triton imports: tests call them directly.
"""


def round_up(n, multiple):
    return -(-n // multiple) * multiple


def pad_width(tokens, multiple, power_of_two=False, max_width=None):
    """The padded width of a row of `tokens` tokens: rounded up to `multiple`; with power_of_two, to the next power
    of two first (then to `multiple`, at most `max_width`: the longest text padded), so texts of nearby lengths share
    one of a few widths (a GPU's setting: there a wider run costs less than one more run)."""
    if power_of_two:
        return min(round_up(1 << (tokens - 1).bit_length(), multiple), max_width or float("inf"))
    return round_up(tokens, multiple)


ATTENTION_WIDTH = 4096  # a run's attention (rows x width^2) is at most max_tokens texts' tokens at this width


def fits(rows, width, max_tokens):
    """Whether `rows` rows padded to `width` may share one encoder run: max_tokens padded tokens at most, and (issue
    71: attention's memory grows with rows x width^2; one 8,192-token text took bge-m3's encoder to 11 GiB) the
    attention of max_tokens tokens in texts of ATTENTION_WIDTH at most, which only texts wider than that reach. A
    lone row always runs. The encoder's batcher holds the same rule (embedding/token_budget.c)."""
    return rows <= 1 or (rows * width <= max_tokens and rows * width * width <= max_tokens * ATTENTION_WIDTH)


def plan_groups(request_lengths, multiple=8, overhead_tokens=256, min_efficiency=0.5, max_tokens=16384,
                power_of_two=False, max_width=None):
    """request_lengths: per request, the token count of each of its rows (after truncation). Widths: pad_width().

    Returns [(request indices, padded width)] in sending order (widest first). The cut minimizes the encoder's
    work, sum over groups of (overhead_tokens + rows x width): one more encoder run costs `overhead_tokens`, a
    wider group costs its padding. A group never holds more than `max_tokens` padded tokens nor more attention than
    `fits` allows, and a group of several
    widths keeps real/padded tokens >= `min_efficiency`. Requests of equal width are never split unless a group
    would exceed max_tokens, so the search runs over runs of equal width (blocks), not over requests."""
    if not request_lengths:
        return []
    widths = [pad_width(max(rows), multiple, power_of_two, max_width) for rows in request_lengths]
    order = sorted(range(len(request_lengths)), key=lambda i: -widths[i])
    blocks = []  # [width, request indices, rows, real tokens]; equal widths, each within max_tokens
    for i in order:
        rows, real = len(request_lengths[i]), sum(request_lengths[i])
        last = blocks[-1] if blocks else None
        if last and last[0] == widths[i] and fits(last[2] + rows, widths[i], max_tokens):
            last[1].append(i)
            last[2] += rows
            last[3] += real
        else:
            blocks.append([widths[i], [i], rows, real])
    if len(blocks) == 1:
        return [(blocks[0][1], blocks[0][0])]
    # best[e]: least cost of blocks[:e]; cut[e]: where the last group of that solution starts.
    count = len(blocks)
    best, cut = [0.0] + [float("inf")] * count, [0] * (count + 1)
    for end in range(1, count + 1):
        rows = real = 0
        for start in range(end - 1, -1, -1):
            width = blocks[start][0]
            rows += blocks[start][2]
            real += blocks[start][3]
            if not fits(rows, width, max_tokens) and start < end - 1:
                break  # wider starts only add rows and width (a lone block is always allowed)
            if end - start > 1 and real < min_efficiency * rows * width:
                continue
            cost = best[start] + overhead_tokens + rows * width
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], count
    while end > 0:
        start = cut[end]
        groups.append(([i for block in blocks[start:end] for i in block[1]], blocks[start][0]))
        end = start
    return groups[::-1]
