"""Admission by work (WorkGate): new work is refused at once when the work already in flight would take longer than
`admission_target_s` to finish at the rate the server has recently finished work (Little's law: wait = work in
flight / completion rate). A bound in requests is the wrong unit when requests differ 10x in size; a fixed bound in
tokens is right for one model on one machine only. The rate is measured, so the bound follows the model and the
hardware, and admitted requests wait about admission_target_s at most, however many clients there are.

A request's cost is its body's size plus REQUEST_COST (texts, documents and images arrive in the body, so its size
follows the work); the rate is in the same unit, so the unit cancels out. The cost stays in flight until every BLS
call made for the request has returned, also when its client has left (Triton 24.07's BLS cannot cancel a call)."""
import contextvars
import time
from collections import deque

REQUEST_COST = 512  # the fixed part of a request's cost (HTTP, BLS hops), in body bytes: tiny bodies are not free
RATE_WINDOW_S = 20.0  # the rate is measured over this many seconds of busy time (time with work in flight)
MIN_MEASURED_S = 1.0  # busy time before the rate is trusted; until then only max_concurrent_requests applies

_ticket = contextvars.ContextVar("admission_ticket", default=None)


class Ticket:
    """One admitted request: its cost leaves the gate when the request is over and its BLS calls have returned."""

    def __init__(self, gate, cost):
        self.gate, self.cost, self.calls, self.closed = gate, cost, 0, False

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

    def _maybe_finish(self):
        if self.closed and self.calls == 0 and self.cost is not None:
            self.gate.finish(self.cost)
            self.cost = None


class WorkGate:
    """Used from the HTTP server's event loop only (no locks)."""

    def __init__(self, target_s, clock=time.monotonic):
        self.target_s, self.clock = target_s, clock
        self.in_flight = 0  # cost admitted and not finished
        self.busy_s = 0.0  # time with work in flight, in all
        self.finished = 0  # cost finished, in all
        self.mark = clock()
        self.samples = deque()  # (busy_s, finished) after each finish, over the last RATE_WINDOW_S of busy time

    def rate(self):
        """Cost finished per busy second, over the window; None while less than MIN_MEASURED_S is measured."""
        if not self.samples:
            return None
        busy, finished = self.samples[0]
        span = self.busy_s - busy
        return (self.finished - finished) / span if span >= MIN_MEASURED_S else None

    def wait_s(self, cost=0):
        """How long the work in flight (plus `cost`) would take at the measured rate; None: not known yet."""
        rate = self.rate()
        return None if not rate else (self.in_flight + cost) / rate

    def admit(self, cost):
        """A Ticket, or None when the request must be refused. A request is always admitted when nothing is in
        flight (a request over the bound on its own would otherwise never run)."""
        self._advance()
        wait = self.wait_s(cost)
        if self.target_s > 0 and self.in_flight and wait is not None and wait > self.target_s:
            return None
        self.in_flight += cost
        ticket = Ticket(self, cost)
        _ticket.set(ticket)
        return ticket

    def finish(self, cost):
        self._advance()
        self.in_flight -= cost
        self.finished += cost
        self.samples.append((self.busy_s, self.finished))
        while len(self.samples) > 2 and self.busy_s - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()

    def _advance(self):
        now = self.clock()
        if self.in_flight:
            self.busy_s += now - self.mark
        self.mark = now


def hold():
    """For a BLS call about to start in the current request: the release function (a no-op outside a request)."""
    ticket = _ticket.get()
    return ticket.hold() if ticket is not None else (lambda *_: None)
