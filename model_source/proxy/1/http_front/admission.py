"""Admission by work (WorkGate), decided at a request's first Triton call: after its key, its JSON and its fields
have been checked, so a request that can never succeed gets its 401/4xx, never a 429 to retry.

A new request is refused at once (429) when the work already in flight would take longer than the admission target
(sixteen typical requests' time, at least MIN_TARGET_S, at most admission_target_s or, when more, DEADLINE_SHARE of
request_timeout_s: target()) to finish at the rate the
server has recently finished work (Little's law: wait = work in flight / completion rate), or when
max_concurrent_requests requests are admitted. A bound in requests is the wrong unit when requests differ 10x in size;
a fixed bound in tokens is right for one model on one machine only; the rate is measured, so the bound follows the
model and the hardware.

A request's cost is its body's size plus REQUEST_COST (texts, documents and images arrive in the body, so its size
follows the work), plus what attention adds to its long texts (attention_cost: quadratic in a text's length). The
rate is in the same unit, so the unit cancels out. Three rules keep one request from turning
the gate against everyone (issue 49: one legal 1 MB /similarity whose client left refused every client for 137 s):
- the rate is measured between finishes only: a long job with no finish leaves it as it was, instead of driving it
  toward 0 and the estimated wait toward infinity;
- one request counts for at most REQUEST_SHARE of the budget (target x rate), so the others still get the rest;
- a request whose client has left or whose deadline has passed leaves the gate at once (`abandon`), even though
  Triton may still run what it was already given (24.07's BLS cannot cancel a call; the models stop feeding it at
  its deadline). The rate is measured again from there, since that work would read as a slow server.
A share of the budget is kept for light requests (issue 59: three clients looping a legal 600-sentence /similarity
held the whole budget between two of them, and a 1-text request got 429 on 104 of 105 tries): a request is light
when its cost fits in RESERVED_SHARE of the budget, and when one asks, the heavy requests in flight count for at most
(1 - RESERVED_SHARE) of the budget. Heavy requests are judged as before, against all of it, so a light request is
never refused for work the heavy ones hold beyond their part, and a load of light requests alone is admitted as
before.
The reserve holds while the rate is unknown, stale or collapsing (issue 69: with other work on the cores, heavy
requests that ran to their deadline cleared the rate, light finishes then measured it toward 0, and 59 of 63 light
requests were refused): the last rate measured stands until a new one is measured, a request past its deadline is no
finish, and light finishes beside heavy work are no samples.

Heavy requests are also judged against their deadline (issue 69: three looping 600-sentence /similarity calls on a
busy machine all ran to a 504), at the rate heavy work finishes (measured apart, between heavy finishes, over the
time heavy work is in flight):
- one that cannot finish within request_timeout_s even alone at that rate is refused before it runs, with a 4xx
  that names its size against what the server finishes in that time (too_much_work: not to be retried as it is);
- one that would finish, but not together with the heavy work already in flight (theirs and its own deadlines), is
  refused with a 429 (retry when that work is done); until the heavy rate is measured, heavy requests run one at a
  time.
A heavy request past its deadline says the heavy rate is below its cost over its time: that bound stands until a
heavy finish is measured. Work past its deadline stops being fed at once: each BLS model stops sending pieces at the
request's deadline and the tokenizer's queue policy drops what waited past it; what 24.07 still runs is the encoder
call already started (a BLS call cannot be cancelled): a rerank model's piece, a BLS model's group.
A refusal's Retry-After is the refusals per admission over the last RETRY_WINDOW_S, 1 to MAX_RETRY_AFTER_S: a
client that waits it comes back about when it can be admitted, instead of spending the cores' time on refusals.
The request's deadline (request_timeout_s from its arrival) is also kept here: every Triton call of the request gets
what is left of it, so sequential calls cannot take the timeout twice."""
import contextvars
import time
from collections import deque

REQUEST_COST = 512  # the fixed part of a request's cost (HTTP, BLS hops), in body bytes: tiny bodies are not free
RATE_WINDOW_S = 20.0  # the rate is measured over this many seconds of busy time (time with work in flight)
MIN_MEASURED_S = 1.0  # busy time before the rate is trusted; until then only max_concurrent_requests applies
REQUEST_SHARE = 0.5  # the most of the budget (admission_target_s x rate) one request's cost may hold
RESERVED_SHARE = 0.25  # of the budget, kept for light requests (those whose cost fits in it): heavy ones count for
# at most the rest when a light one asks

RETRY_WINDOW_S = 5.0  # Retry-After follows the refusals per admission over this many seconds...
MAX_RETRY_AFTER_S = 8  # ...up to this
TARGET_REQUESTS = 16  # the served gate's target: this many typical requests' time, at most admission_target_s...
MIN_TARGET_S = 0.25  # ...and at least this
DEADLINE_SHARE = 0.5  # ...or, when a typical request is slow (bge-m3 on CPU), at most this x request_timeout_s
TOKEN_BYTES = 4  # a token's length in UTF-8 bytes, about: the attention term of a text's cost (attention_cost)...
ATTENTION_WIDTHS = 1.5  # ...n^2 / (this x the model's width) tokens more for a text of n tokens
TYPICAL_OF = 64  # a typical request: the median cost of this many last finished
HEAVY_WINDOW_S = 120.0  # the heavy rate is measured over this many seconds of heavy busy time (a few heavy finishes)
EXPIRED_MARGIN = 0.9  # a heavy request past its deadline: the heavy rate is taken as at most this x its cost / its time

_current = contextvars.ContextVar("admission_request", default=None)


class Refusal(str):
    """Why a request is refused: the sentence, and `retry`: True, busy now (429, Retry-After); False, too much work
    for its deadline at the measured rate (4xx, too_much_work: retrying it as it is would fail again)."""

    def __new__(cls, reason, retry=True):
        refusal = super().__new__(cls, reason)
        refusal.retry, refusal.retry_after_s = retry, 1
        return refusal

    @property
    def reason(self):
        return str(self)


class Ticket:
    """One admitted request: it leaves the gate when the request is over and its BLS calls have returned, or at once
    when it is abandoned (client gone, deadline passed)."""

    def __init__(self, gate, cost, light, end=None):
        self.gate, self.cost, self.light, self.calls, self.closed, self.open = gate, cost, light, 0, False, True
        self.end = end  # its deadline (the gate's clock), None: none known
        self.admitted_heavy_busy_s = gate.heavy_busy_s  # the gate's heavy busy time when it was admitted

    @property
    def heavy(self):
        """Judged against the heavy rate and its deadline: over the reserve (light None, no rate yet: not yet)."""
        return self.light is False

    def hold(self):
        """A BLS call starts; returns the function to call (once or more) when it has returned or was given up."""
        self.calls += 1
        released = [False]

        def release(*_):
            if not released[0]:
                released[0] = True
                self.calls -= 1
                self._maybe_finish()
        return release

    def close(self):
        self.closed = True
        self._maybe_finish()

    def abandon(self, expired=False):
        """Nobody waits for this request's answer any more (its client left; expired: its deadline passed): it
        leaves the gate now."""
        self.closed = True
        if self.open:
            self.open = False
            self.gate.abandon(self, expired)

    def _maybe_finish(self):
        if self.closed and self.calls == 0 and self.open:
            self.open = False
            self.gate.finish(self)


def held(cost, share):
    """What a request of `cost` holds of the gate: at most `share` (None: all of it)."""
    return cost if share is None else min(cost, share)


class WorkGate:
    """Used from the HTTP server's event loop only (no locks)."""

    def __init__(self, target_s, max_requests, clock=time.monotonic, target_requests=None, timeout_s=None):
        """target_s: admission_target_s (0: admission by work off); target_requests: the target is that many typical
        requests' time at the measured rate, between MIN_TARGET_S and target_s (None: target_s itself), or up to
        DEADLINE_SHARE x timeout_s (request_timeout_s; None: target_s) when that is more."""
        self.target_s, self.max_requests, self.clock = target_s, max_requests, clock
        self.target_requests = target_requests
        self.ceiling_s = target_s if timeout_s is None else max(target_s, DEADLINE_SHARE * timeout_s)
        self.recent_costs = deque(maxlen=TYPICAL_OF)  # the last finished requests' costs
        self.typical_cost = None  # their median
        self.open = set()  # tickets admitted and not finished (at most max_requests)
        self.busy_s = 0.0  # time with work in flight, in all
        self.finished = 0  # cost finished, in all
        self.mark = clock()
        self.samples = deque()  # (busy_s, finished) at each finish, over the last RATE_WINDOW_S of busy time
        self.last_rate = None  # the rate last measured: it stands while the window is too short to measure one
        self.heavy_busy_s = 0.0  # time with heavy work in flight, in all
        self.heavy_finished = 0  # heavy cost finished, in all
        self.heavy_samples = deque()  # (heavy_busy_s, heavy_finished): a heavy request's start on idle, each finish
        self.last_heavy_rate = None
        self.heavy_bound = None  # at most this heavy rate: what a heavy request past its deadline showed
        self.decisions = deque()  # (time, admitted) of each request's admission, over the last RETRY_WINDOW_S
        self.refused_now = 0  # refusals among them

    @property
    def requests(self):
        return len(self.open)

    @property
    def in_flight(self):
        """The cost admitted and not finished, each request's counted up to the share one request may hold: the
        share follows the rate, so a long job holds half the budget however the rate moves while it runs."""
        share = self.share()
        return sum(held(t.cost, share) for t in self.open)

    def counted(self, light):
        """The work in flight as a new request of that class sees it: for a light one, the heavy requests' part
        capped at what is not kept for light requests (RESERVED_SHARE)."""
        share, budget = self.share(), self.budget()
        heavy = sum(held(t.cost, share) for t in self.open if t.light is not True)
        lights = sum(t.cost for t in self.open if t.light is True)
        if light and budget is not None:
            heavy = min(heavy, (1 - RESERVED_SHARE) * budget)
        return heavy + lights

    def is_light(self, cost):
        """Whether a request of `cost` is light (it fits in the reserve); None while no budget is measured. Relative
        to the budget, not a size in bytes: the budget follows the model and the hardware."""
        budget = self.budget()
        return None if budget is None else cost <= RESERVED_SHARE * budget

    def rate(self):
        """Cost finished per busy second between the window's first and last finish; while less than MIN_MEASURED_S
        is measured (at first, or after work was abandoned), the rate last measured (None: never). Time since the
        last finish does not count: a job still running is no evidence that the server got slower."""
        measured = windowed(self.samples)
        if measured is not None:
            self.last_rate = measured
        return self.last_rate

    def heavy_rate(self):
        """Heavy cost finished per second of heavy work in flight, measured as rate() is from heavy finishes; at most
        what a heavy request past its deadline showed, until a heavy finish is measured again; None: not known."""
        measured = windowed(self.heavy_samples)
        if measured is not None:
            self.last_heavy_rate, self.heavy_bound = measured, None
        rate = self.last_heavy_rate
        if self.heavy_bound is not None:
            rate = self.heavy_bound if rate is None else min(rate, self.heavy_bound)
        return rate

    def budget(self):
        """admission_target_s x the measured rate: the cost the gate lets in flight (None: no rate yet, or
        admission by work off)."""
        rate = self.rate()
        return self.target() * rate if rate and self.target_s > 0 else None

    def target(self):
        """The wait the gate admits, in seconds: admission_target_s, or (target_requests) that many typical requests'
        time at the measured rate, at least MIN_TARGET_S, at most admission_target_s or, when more, DEADLINE_SHARE of
        request_timeout_s: a queue of a few requests of the served model, whatever it costs. Issue 69: with MiniLM,
        2 s was 40 requests queued; 200 clients got p99 8x that of 8 clients, 0.5 s gave 1.3x and more goodput.
        Issue 71: bge-m3 on 2 CPU cores takes ~2 s a passage, so 2 s refused 4 clients' passages 4 times in 5; half
        the timeout queues them, each admitted one still finishing within its deadline."""
        rate = self.last_rate
        if self.target_requests is None or not rate or self.typical_cost is None:
            return self.target_s
        return min(self.ceiling_s, max(MIN_TARGET_S, self.target_requests * self.typical_cost / rate))

    def share(self):
        """The most of the budget one request's cost holds (None: no budget)."""
        budget = self.budget()
        return None if budget is None else REQUEST_SHARE * budget

    def wait_s(self, cost=0):
        """How long the work in flight, as a request of `cost` sees it (counted), plus `cost` would take at the
        measured rate; None: not known yet."""
        rate = self.rate()
        return None if not rate else (self.counted(self.is_light(cost)) + held(cost, self.share())) / rate

    def refusal(self, cost, timeout_s=None, limit_s=None):
        """Why a request of `cost` with `timeout_s` to its deadline is refused now (a Refusal), or None: admit it. A
        request is always admitted by the work rule when nothing is in flight (a request over the bound on its own
        would otherwise never run); a heavy one, not when it cannot finish in its time (timeout_s None: no
        deadline rules). limit_s: request_timeout_s, as the refusal names it (default timeout_s)."""
        refused = self._refusal(cost, timeout_s, limit_s)
        if refused is not None and refused.retry:
            refused.retry_after_s = self._retry_after()
        return refused

    def _refusal(self, cost, timeout_s, limit_s):
        if len(self.open) >= self.max_requests:
            return Refusal(f"{len(self.open)} requests in progress, the limit is {self.max_requests} "
                           f"(setting max_concurrent_requests)")
        self._advance()
        wait = self.wait_s(cost)
        target = self.target()
        if self.target_s > 0 and self.open and wait is not None and wait > target:
            return Refusal(f"the work in progress would take {wait:.1f} s to finish, over the admission target "
                           f"({target:.2g} s: {self.target_requests} typical requests' time, at most "
                           f"{self.ceiling_s:g} s, admission_target_s or half of request_timeout_s when more)"
                           if self.target_requests else
                           f"the work in progress would take {wait:.1f} s to finish, over admission_target_s "
                           f"({self.target_s:g} s)")
        if timeout_s is None or self.target_s <= 0 or self.is_light(cost) is not False:
            return None
        return self.deadline_refusal(cost, timeout_s, timeout_s if limit_s is None else limit_s)

    def _decided(self, admitted):
        now = self.clock()
        self.decisions.append((now, admitted))
        self.refused_now += not admitted
        while self.decisions and self.decisions[0][0] < now - RETRY_WINDOW_S:
            self.refused_now -= not self.decisions.popleft()[1]

    def _retry_after(self):
        """Seconds a refused client should wait (Retry-After): the refusals per admission of the last few seconds,
        1 to MAX_RETRY_AFTER_S. With 200 clients and 1 s, each answered request cost seven refused ones (issue 69),
        CPU taken from the work on the same cores; a client that waits so long is admitted about once it retries."""
        self._decided(False)
        admitted = len(self.decisions) - self.refused_now
        return int(min(MAX_RETRY_AFTER_S, max(1, round(self.refused_now / max(1, admitted)))))

    def deadline_refusal(self, cost, timeout_s, limit_s):
        """A heavy request against its deadline: too much work for it at the heavy rate (4xx), or not with the heavy
        work in flight (429); None: it can finish in time."""
        heavy = [t for t in self.open if t.heavy]
        rate = self.heavy_rate()
        alone = rate or self.rate()  # before a heavy finish is measured, the rate of all work judges it alone
        if alone and cost / alone > timeout_s:
            return Refusal(f"this request is {cost:,} bytes of work, and this server finishes {alone * limit_s:,.0f} "
                           f"within request_timeout_s ({limit_s:g} s) at the rate it works now (it would take "
                           f"{cost / alone:.0f} s): send fewer or shorter texts per request", retry=False)
        if not heavy:
            return None
        if rate is None:
            return Refusal("another large request is in progress, and heavy work runs one request at a time until its "
                           "rate is measured")
        now = self.clock()
        done_s = (sum(t.cost for t in heavy) + cost) / rate
        deadlines = [timeout_s] + [t.end - now for t in heavy if t.end is not None]
        if done_s > min(deadlines):
            return Refusal(f"the large requests in progress and this one would take {done_s:.0f} s to finish at the "
                           f"measured rate, past a deadline (request_timeout_s {limit_s:g} s)")
        return None

    def admit(self, cost, timeout_s=None):
        self._advance()
        self._decided(True)
        ticket = Ticket(self, cost, self.is_light(cost), None if timeout_s is None else self.clock() + timeout_s)
        if ticket.heavy and not any(t.heavy for t in self.open) and not self.heavy_samples:
            self.heavy_samples.append((self.heavy_busy_s, self.heavy_finished))  # heavy work starts: measured from here
        self.open.add(ticket)
        return ticket

    def finish(self, ticket):
        self._advance()
        self.open.discard(ticket)
        self.finished += ticket.cost
        self.recent_costs.append(ticket.cost)
        self.typical_cost = sorted(self.recent_costs)[len(self.recent_costs) // 2]
        # A light request's finish while a heavy one runs is not a sample: the heavy one's progress shows only when it
        # finishes, so the rate between would count the light work alone and fall toward 0 (the budget with it, and
        # every light request would turn heavy). Its cost counts in the next sample, over all the busy time since.
        if not (ticket.light and any(t.heavy for t in self.open)):
            self.samples.append((self.busy_s, self.finished))
        trim(self.samples, RATE_WINDOW_S)
        if ticket.heavy:
            self.heavy_finished += ticket.cost
            self.heavy_samples.append((self.heavy_busy_s, self.heavy_finished))
            trim(self.heavy_samples, HEAVY_WINDOW_S)

    def abandon(self, ticket, expired=False):
        """`ticket` leaves unfinished: its client left, or (expired) its deadline passed."""
        self._advance()
        self.open.discard(ticket)
        self.samples.clear()  # the abandoned work may still run in Triton: measure the rate afresh (the last stands)
        if ticket.heavy:
            self.heavy_samples.clear()
            ran_s = self.heavy_busy_s - ticket.admitted_heavy_busy_s
            if expired and ran_s > 0:  # it did not finish in ran_s: the heavy rate is below its cost over that
                bound = EXPIRED_MARGIN * ticket.cost / ran_s
                self.heavy_bound = bound if self.heavy_bound is None else min(self.heavy_bound, bound)

    def _advance(self):
        now = self.clock()
        if self.open:
            self.busy_s += now - self.mark
            if any(t.heavy for t in self.open):
                self.heavy_busy_s += now - self.mark
        self.mark = now


def attention_cost(texts, hidden_size, max_length=None):
    """What attention adds to texts' cost, in body bytes: a text of n tokens costs each layer about 12 h^2 n
    multiply-adds in its matrices (the linear part: its bytes) and 2 h n^2 in attention, which runs slower per
    multiply-add on CPU, the more so the longer the text (memory-bound): measured with bge-m3 on 2 cores, a 4,096-token
    text took 2.9x its tokens' time at 256 tokens a text (the multiply-adds say 1.7x), a 1,024-token one 1.3x. So
    n^2 / (ATTENTION_WIDTHS h) tokens more, fitted at the long end where a refusal is decided, from the text's bytes
    (TOKEN_BYTES a token): bge-m3's 8,192 tokens cost 6.3x their bytes (they run ~70 s on 2 cores, past a 60 s timeout;
    a cost linear in bytes judged them at 15-40 s, issue 71), MiniLM's 256 tokens 1.4x.
    texts: arrays of str or bytes; hidden_size None: no term; max_length: the model's, in tokens (a text is truncated
    there, or refused with truncate false): a longer text counts as that many tokens' bytes."""
    if not hidden_size:
        return 0
    scale = TOKEN_BYTES * ATTENTION_WIDTHS * hidden_size
    longest = TOKEN_BYTES * max_length if max_length else float("inf")
    extra = 0
    for array in texts:
        for text in array.reshape(-1):
            if isinstance(text, (bytes, str)):
                extra += min(len(text), longest) ** 2 / scale
    return int(extra)


def windowed(samples):
    """The rate between a window's first and last sample; None while they span less than MIN_MEASURED_S."""
    if len(samples) < 2:
        return None
    (busy0, finished0), (busy1, finished1) = samples[0], samples[-1]
    span = busy1 - busy0
    return (finished1 - finished0) / span if span >= MIN_MEASURED_S else None


def trim(samples, window_s):
    """Keep the last window_s of busy time (and two samples at least)."""
    while len(samples) > 2 and samples[-1][0] - samples[1][0] >= window_s:
        samples.popleft()


class RequestAdmission:
    """One HTTP inference request: its cost and deadline from its arrival, and its admission, taken by its first
    Triton call (`enter`) and shared by all of them (gather's tasks each copy the context, not this object)."""

    def __init__(self, gate, cost, timeout_s, clock=time.monotonic):
        self.gate, self.cost, self.clock, self.timeout_s = gate, cost, clock, timeout_s
        self.end = clock() + timeout_s
        self.ticket, self.refused = None, None

    def enter(self, extra_cost=0):
        """None once admitted (again: a no-op); else the Refusal (the same for every call of it). extra_cost: what
        the first call's inputs add to the body's size (attention_cost), counted from the admission on."""
        if self.ticket is None and self.refused is None:
            self.cost += extra_cost
            left_s = self.left_s()
            self.refused = self.gate.refusal(self.cost, left_s, self.timeout_s)
            if self.refused is None:
                self.ticket = self.gate.admit(self.cost, left_s)
        return self.refused

    def left_s(self):
        return self.end - self.clock()

    def hold(self):
        return self.ticket.hold() if self.ticket is not None else (lambda *_: None)

    def close(self):
        """The request is answered: its cost leaves the gate when its calls have returned; past its deadline (its
        answer was the timeout), at once, unfinished."""
        if self.ticket is not None:
            if self.left_s() <= 0:
                self.ticket.abandon(expired=True)
            else:
                self.ticket.close()

    def abandon(self):
        if self.ticket is not None:
            self.ticket.abandon()


def begin(request):
    """The current task's request (its calls and the tasks it starts share it)."""
    _current.set(request)


def current():
    """The current HTTP request's RequestAdmission, or None (outside a request: tests, admin work)."""
    return _current.get()
