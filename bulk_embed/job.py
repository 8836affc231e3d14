"""One bulk job: read the corpus window by window, send each window's texts sorted by length in requests of many
texts, several in flight, and keep each finished window as a part (store.py) until the output is written.

Fed like the onnxruntime ceiling is fed: the ceiling runs a corpus sorted by length in large batches; here each
window (a bounded number of rows, so memory stays flat whatever the corpus's size) is sorted by length and cut into
requests of up to the BLS model's texts per request, within its bytes per request and about four encoder runs of
padded tokens each; the server cuts each request into its own length groups, all queued at the encoder at once.
Requests in flight: the encoder's instances, or --in-flight. Measured on 2 cores (MiniLM, 2,000 mixed texts, four
interleaved runs): one request in flight 1.01-1.11x the ceiling's pass, two 0.84-0.89x (two requests' groups
compete for the one encoder and its cores).

Repeated ids (ids.py) are found here, on the main thread, as each window is read: in corpus order, so which row keeps
an id never depends on which request comes back first. A resumed job first takes the ids of the finished windows it
will not read again from their parts (embedded rows and rejects), then reads on; a window read again because a part
holds it already adds its ids and is not sent, so no row is ever the duplicate of itself.
"""
import concurrent.futures
import sys
import time
from dataclasses import dataclass, field

from bulk_embed import corpus, ids
from bulk_embed.doors import JobError, Refused, Retry
from model_library.model_errors import ErrorKind

INTERNAL_RETRIES = 5  # an internal error again and again is a fault, not a restart: the job stops
MAX_BACKOFF_S = 30.0


@dataclass
class Window:
    number: int
    waiting: int  # rows not answered yet
    rows: list = field(default_factory=list)  # (ordinal, id, truncated, {column: value})
    rejects: list = field(default_factory=list)


def plan(rows, limits):
    """The rows of one window, sorted by length, cut into requests (lists of rows)."""
    rows = sorted(rows, key=lambda row: len(row.text))
    budget = 4 * limits.max_batch_tokens
    requests, current, size = [], [], 0
    for row in rows:
        tokens = estimate_tokens(len(row.text), limits.max_length)  # the longest so far: rows come sorted
        full = len(current) >= limits.max_texts or size + len(row.text) + 4 > limits.max_request_bytes // 2 or \
            (len(current) + 1) * tokens > budget
        if current and full:
            requests.append(current)
            current, size = [], 0
        current.append(row)
        size += len(row.text) + 4
    if current:
        requests.append(current)
    return requests


def estimate_tokens(size, max_length):
    """Padded tokens of a text of `size` UTF-8 bytes, on the high side (~3 bytes a token in most scripts), for
    sizing requests only: the server counts the real ones."""
    tokens = size // 3 + 2
    return min(tokens, max_length) if max_length else tokens


def send(door, request, max_wait_s):
    """One request's rows answered: ([(ordinal, id, truncated, columns)], [rejects], tokens). Refused texts leave the
    request and the rest is sent again (a text over the max length with --no-truncate among them: the door sends
    truncate false, the tokenizer refuses it before the encoder runs); overload and restarts are waited out
    (Retry-After, else backoff)."""
    alive, rejects, waited, internal, attempt = list(request), [], 0.0, 0, 0
    while alive:
        try:
            answer = door.embed([row.text for row in alive])
        except Refused as refused:
            if not 0 <= refused.index < len(alive):
                raise JobError(f"the server refused text {refused.index} of a request of {len(alive)}") from None
            row = alive.pop(refused.index)
            rejects.append(reject(row, refused.kind, refused.message))
            continue
        except Retry as retry:
            internal += retry.kind == ErrorKind.INTERNAL
            pause = retry.after_s if retry.after_s is not None else min(MAX_BACKOFF_S, 0.5 * 2 ** attempt)
            attempt += 1
            if internal > INTERNAL_RETRIES or waited + pause > max_wait_s:
                raise JobError(f"gave up after {attempt} tries ({waited:.0f} s waited): {retry.reason}") from None
            time.sleep(pause)
            waited += pause
            continue
        answered = [(row.ordinal, row.id, bool(answer.truncated[k]),
                     {name: values[k] for name, values in answer.columns.items()}) for k, row in enumerate(alive)]
        return answered, rejects, answer.tokens
    return [], rejects, 0


def reject(row, kind, message):
    return {"row": row.ordinal, "id": row.id, "kind": kind, "problem": message}


class Progress:
    """tqdm on a terminal (rows, texts/s, tokens/s, ETA); nothing when stderr is not one; one summary line always."""

    def __init__(self, total, initial):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, unit="rows", disable=None, file=sys.stderr,
                        dynamic_ncols=True, smoothing=0.1)
        self.started, self.texts, self.tokens = time.monotonic(), 0, 0

    def update(self, rows, texts, tokens):
        self.texts += texts
        self.tokens += tokens
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{self.texts / elapsed:.1f} texts/s, {self.tokens / elapsed:.0f} tokens/s",
                                 refresh=False)
        self.bar.update(rows)

    def close(self):
        self.bar.close()
        return time.monotonic() - self.started


def run(door, limits, source, work, options):
    """Embed what `work` (a store.Job) has not done yet; write the output. Returns the summary dict."""
    return Run(door, limits, work, options).go(source)


class Run:
    """The main thread reads and plans windows; `in_flight` worker threads send requests; each finished window is
    written as a part the moment its last row is answered."""

    def __init__(self, door, limits, work, options):
        self.door, self.limits, self.work, self.options = door, limits, work, options
        self.done = work.done_windows()
        self.windows, self.pending = {}, {}  # window number -> Window; future -> window number
        self.counts = {"rejected": 0, "truncated": 0}
        self.fail_on_duplicates = getattr(options, "duplicates", "keep-first") == "fail"
        self.pool = concurrent.futures.ThreadPoolExecutor(options.in_flight, thread_name_prefix="embed")

    def go(self, source):
        size = self.options.window
        first_open = next(k for k in range(len(self.done) + 1) if k not in self.done)
        self.format = source.format
        self.seen = ids.SeenIds() if corpus.has_ids(source.format, source.id_field) else None
        if self.seen is not None:  # the finished windows before the first open one are not read again
            for window in range(first_open):
                pairs = self.work.window_ids(window)
                self.seen.first_rows([i for _, i in pairs], [r for r, _ in pairs])
        self.progress = Progress(corpus.count(source.path, source.format),
                                 sum(self.done.values()) + self.work.rejected_count())
        try:
            buffer, number = [], first_open
            for row in corpus.rows(source.path, source.format, source.id_field, source.text_field,
                                   skip=first_open * size):
                if row.ordinal // size != number:
                    self.start_window(number, buffer)
                    for empty in range(number + 1, row.ordinal // size):  # blank lines only: an empty part
                        self.start_window(empty, [])
                    buffer, number = [], row.ordinal // size
                buffer.append(row)
            if buffer:
                self.start_window(number, buffer)
            while self.pending:
                self.settle()
        except BaseException:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.progress.close()
            raise
        self.pool.shutdown()
        elapsed = self.progress.close()
        summary = {**self.counts, "rejected": self.work.rejected_count(),
                   "duplicates": self.work.duplicate_count(), "ids_checked": self.seen is not None,
                   "embedded": sum(self.work.done_windows().values()), "seconds": elapsed,
                   "texts_per_s": self.progress.texts / elapsed if elapsed else 0.0,
                   "tokens_per_s": self.progress.tokens / elapsed if elapsed else 0.0}
        summary["id_kind"] = self.work.finish(self.options.output_format)
        return summary

    def start_window(self, number, rows):
        """Queue one window's requests (none if a part holds it already), never more than --in-flight at once."""
        repeated = ids.duplicates(self.seen, rows) if self.seen is not None else []
        if number in self.done:
            return
        if repeated and self.fail_on_duplicates:
            row, first = repeated[0]
            raise ids.DuplicateId(ids.refusal(row.id, row.ordinal, first, self.format))
        duplicate = {row.ordinal: first for row, first in repeated}  # a repeated id, whatever the row holds
        unreadable = [reject(row, ids.DUPLICATE, ids.problem(row.id, duplicate[row.ordinal], self.format))
                      if row.ordinal in duplicate else reject(row, ErrorKind.INVALID_INPUT, row.problem)
                      for row in rows if row.problem or row.ordinal in duplicate]
        readable = [row for row in rows if not row.problem and row.ordinal not in duplicate]
        self.progress.update(len(unreadable), 0, 0)
        if not readable:
            self.work.write_window(number, [], unreadable)
            return
        self.windows[number] = Window(number, len(readable), rejects=unreadable)
        for request in plan(readable, self.limits):
            while len(self.pending) >= self.options.in_flight:
                self.settle()
            future = self.pool.submit(send, self.door, request, self.options.max_wait)
            self.pending[future] = number

    def settle(self):
        """Take the answers of finished requests; write each window they complete."""
        finished, _ = concurrent.futures.wait(self.pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in finished:
            window = self.windows[self.pending.pop(future)]
            rows, rejects, tokens = future.result()  # a JobError stops the job here
            window.rows += rows
            window.rejects += rejects
            window.waiting -= len(rows) + len(rejects)
            self.counts["truncated"] += sum(r[2] for r in rows)
            self.progress.update(len(rows) + len(rejects), len(rows), tokens)
            if window.waiting == 0:
                self.work.write_window(window.number, window.rows, window.rejects)
                del self.windows[window.number]
