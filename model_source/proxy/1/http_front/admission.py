"""Admission by work (WorkGate), decided at a request's first Triton call: after its key, its JSON and its fields
have been checked, so a request that can never succeed gets its 401/4xx, never a 429 to retry.

A new request is refused at once (429) when the work already in flight would take longer than `admission_target_s`
to finish at the rate the server has recently finished work (Little's law: wait = work in flight / completion
rate), or when max_concurrent_requests requests are admitted. A bound in requests is the wrong unit when requests
differ 10x in size; a fixed bound in tokens is right for one model on one machine only; the rate is measured, so the
bound follows the model and the hardware.

A request's cost is its body's size plus REQUEST_COST (texts, documents and images arrive in the body, so its size
follows the work). The rate is in the same unit, so the unit cancels out. Three rules keep one request from turning
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

_current = contextvars.ContextVar("admission_request", default=None)


class Ticket:
    """One admitted request: it leaves the gate when the request is over and its BLS calls have returned, or at once
    when it is abandoned (client gone, deadline passed)."""

    def __init__(self, gate, cost, light):
        self.gate, self.cost, self.light, self.calls, self.closed, self.open = gate, cost, light, 0, False, True

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

    def abandon(self):
        """Nobody waits for this request's answer any more: it leaves the gate now."""
        self.closed = True
        if self.open:
            self.open = False
            self.gate.abandon(self)

    def _maybe_finish(self):
        if self.closed and self.calls == 0 and self.open:
            self.open = False
            self.gate.finish(self)


def held(cost, share):
    """What a request of `cost` holds of the gate: at most `share` (None: all of it)."""
    return cost if share is None else min(cost, share)


class WorkGate:
    """Used from the HTTP server's event loop only (no locks)."""

    def __init__(self, target_s, max_requests, clock=time.monotonic):
        self.target_s, self.max_requests, self.clock = target_s, max_requests, clock
        self.open = set()  # tickets admitted and not finished (at most max_requests)
        self.busy_s = 0.0  # time with work in flight, in all
        self.finished = 0  # cost finished, in all
        self.mark = clock()
        self.samples = deque()  # (busy_s, finished) at each finish, over the last RATE_WINDOW_S of busy time

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
        """Cost finished per busy second between the window's first and last finish; None while less than
        MIN_MEASURED_S is measured. Time since the last finish does not count: a job still running is no evidence
        that the server got slower."""
        if len(self.samples) < 2:
            return None
        (busy0, finished0), (busy1, finished1) = self.samples[0], self.samples[-1]
        span = busy1 - busy0
        return (finished1 - finished0) / span if span >= MIN_MEASURED_S else None

    def budget(self):
        """admission_target_s x the measured rate: the cost the gate lets in flight (None: no rate yet, or
        admission by work off)."""
        rate = self.rate()
        return self.target_s * rate if rate and self.target_s > 0 else None

    def share(self):
        """The most of the budget one request's cost holds (None: no budget)."""
        budget = self.budget()
        return None if budget is None else REQUEST_SHARE * budget

    def wait_s(self, cost=0):
        """How long the work in flight, as a request of `cost` sees it (counted), plus `cost` would take at the
        measured rate; None: not known yet."""
        rate = self.rate()
        return None if not rate else (self.counted(self.is_light(cost)) + held(cost, self.share())) / rate

    def refusal(self, cost):
        """Why a request of `cost` is refused now (a sentence), or None: admit it. A request is always admitted when
        nothing is in flight (a request over the bound on its own would otherwise never run)."""
        if len(self.open) >= self.max_requests:
            return (f"{len(self.open)} requests in progress, the limit is {self.max_requests} "
                    f"(setting max_concurrent_requests)")
        self._advance()
        wait = self.wait_s(cost)
        if self.target_s > 0 and self.open and wait is not None and wait > self.target_s:
            return (f"the work in progress would take {wait:.1f} s to finish, over admission_target_s "
                    f"({self.target_s:g} s)")
        return None

    def admit(self, cost):
        self._advance()
        ticket = Ticket(self, cost, self.is_light(cost))
        self.open.add(ticket)
        return ticket

    def finish(self, ticket):
        self._advance()
        self.open.discard(ticket)
        self.finished += ticket.cost
        # A light request's finish while a heavy one runs is not a sample: the heavy one's progress shows only when it
        # finishes, so the rate between would count the light work alone and fall toward 0 (the budget with it, and
        # every light request would turn heavy). Its cost counts in the next sample, over all the busy time since.
        if not (ticket.light and any(t.light is False for t in self.open)):
            self.samples.append((self.busy_s, self.finished))
        while len(self.samples) > 2 and self.samples[-1][0] - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()

    def abandon(self, ticket):
        self._advance()
        self.open.discard(ticket)
        self.samples.clear()  # the abandoned work may still run in Triton: measure the rate afresh

    def _advance(self):
        now = self.clock()
        if self.open:
            self.busy_s += now - self.mark
        self.mark = now


class RequestAdmission:
    """One HTTP inference request: its cost and deadline from its arrival, and its admission, taken by its first
    Triton call (`enter`) and shared by all of them (gather's tasks each copy the context, not this object)."""

    def __init__(self, gate, cost, timeout_s, clock=time.monotonic):
        self.gate, self.cost, self.clock = gate, cost, clock
        self.end = clock() + timeout_s
        self.ticket, self.refused = None, None

    def enter(self):
        """None once admitted (again: a no-op); else the refusal's sentence (the same for every call of it)."""
        if self.ticket is None and self.refused is None:
            self.refused = self.gate.refusal(self.cost)
            if self.refused is None:
                self.ticket = self.gate.admit(self.cost)
        return self.refused

    def left_s(self):
        return self.end - self.clock()

    def hold(self):
        return self.ticket.hold() if self.ticket is not None else (lambda *_: None)

    def close(self):
        if self.ticket is not None:
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
