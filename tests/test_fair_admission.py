"""Fair admission through the real server (issues 59, 69): heavy requests cannot close the gate to light ones, on a
machine that is not quiet.

Found on 2 cores: three clients looping a legal 600-sentence /similarity (two in flight, 30-44 s each) held the
whole work budget between them, and a 1-text /v1/embeddings got 429 on 104 of 105 tries over 150 s. The target:
with those three heavy clients looping, >= 95 % of the 1-text requests are served, their p95 is <= 3 s, and the
heavy clients are still served. Issue 69: the same with a busy process per core beside the server (nice 10,
bench/background_load.py); then every heavy request ran to a 504 and 4 of 63 light requests were served. Now no heavy
request may run past its deadline: each is served or refused up front (a 429 while the heavy work in flight would
not finish in time). The full-size measurement (100 words a sentence, 120 s) is `python -m bench.fairness
--background-load` (docs/overload.md)."""
import os
import threading
import time

import httpx
import numpy as np
import pytest

from bench.background_load import BackgroundLoad
from model_library.in_process import model_module
from triton_clients import VARIED_TEXTS

pytestmark = pytest.mark.serial  # `make test` runs it alone: light requests' latency beside heavy clients

admission = model_module("proxy", "http_front.admission")

HEAVY_CLIENTS = 3
HEAVY_SENTENCES = 600  # several pieces of the rerank model's 256
HEAVY_WORDS = 40  # per sentence (the report's had ~100: 30-44 s a request; the same gate, a shorter test)
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a", "panda", "eats",
         "bamboo", "in", "the", "quiet", "forest"]
LIGHT_S = 30.0  # how long the light client sends, while the heavy clients loop (60 requests: 3 may fail)
LIGHT_EVERY_S = 0.5


@pytest.fixture(scope="module")
def fair_server(server):
    """The shipped admission settings (admission_target_s 2, max_concurrent_requests 256): the shared server's."""
    return server


def test_light_requests_are_served_while_heavy_clients_loop(fair_server):
    sentences = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(HEAVY_WORDS)) for i in range(HEAVY_SENTENCES)]
    heavy_body = {"inputs": {"source_sentence": "a panda", "sentences": sentences}}
    stop = threading.Event()
    heavy = {"served": 0, "refused": 0, "other": [], "seconds": []}

    def heavy_client():
        with httpx.Client(base_url=fair_server.proxy_url, timeout=300) as client:
            while not stop.is_set():
                started = time.monotonic()
                response = client.post("/similarity", json=heavy_body)
                if response.status_code == 200:
                    assert len(response.json()) == HEAVY_SENTENCES
                    heavy["served"] += 1
                    heavy["seconds"].append(round(time.monotonic() - started, 1))
                elif response.status_code == 429:
                    heavy["refused"] += 1
                    stop.wait(float(response.headers.get("retry-after", "1")))
                else:
                    heavy["other"].append((response.status_code, response.text[:200]))

    with httpx.Client(base_url=fair_server.proxy_url, timeout=60) as client:
        started = time.monotonic()
        while time.monotonic() - started < 3:  # a measured rate first: admission by work is on
            assert client.post("/v1/embeddings", json={"input": VARIED_TEXTS[:8]}).status_code == 200
        with BackgroundLoad(procs=os.cpu_count(), nice=10) as load:  # other work on the same cores (issue 69)
            threads = [threading.Thread(target=heavy_client) for _ in range(HEAVY_CLIENTS)]
            for thread in threads:
                thread.start()
            time.sleep(2.0)  # the heavy requests are in flight
            light = []  # (status, seconds)
            reasons = {}
            began = time.monotonic()
            while time.monotonic() - began < LIGHT_S:
                sent = time.monotonic()
                response = client.post("/v1/embeddings", json={"input": [VARIED_TEXTS[len(light) % 40]]})
                light.append((response.status_code, time.monotonic() - sent))
                if response.status_code == 429:  # why, for the report
                    reason = response.json()["error"]["message"][:90]
                    reasons[reason] = reasons.get(reason, 0) + 1
                if response.status_code not in (200, 429):
                    pytest.fail(f"light request: {response.status_code} {response.text[:300]}")
                time.sleep(max(0.0, LIGHT_EVERY_S - (time.monotonic() - sent)))
            # the heavy clients: each still served (one finished request at least), then stopped
            deadline = time.monotonic() + 120
            while heavy["served"] < HEAVY_CLIENTS and time.monotonic() < deadline:
                time.sleep(0.5)
            stop.set()
            for thread in threads:
                thread.join(timeout=300)
    served = [seconds for status, seconds in light if status == 200]
    p95 = float(np.percentile([seconds for _, seconds in light], 95))
    print(f"\nlight 1-text /v1/embeddings beside {HEAVY_CLIENTS} looping 600-sentence /similarity: "
          f"{len(served)}/{len(light)} served ({len(served) / len(light):.1%}), p95 {p95:.2f} s, "
          f"p50 {float(np.median([s for _, s in light])):.2f} s; heavy: {heavy}; refusals {reasons}; {load.describe()}")
    assert not heavy["other"], heavy["other"]  # no 504: each heavy request served or refused up front (429)
    assert len(served) >= 0.95 * len(light), light
    assert p95 <= 3.0, light
    assert heavy["served"] >= HEAVY_CLIENTS, heavy


def test_the_gate_keeps_a_share_for_light_requests_and_its_rate_through_heavy_ones():
    """The gate alone, on a made-up clock: after a measured rate, two heavy requests (each over the share one request
    may hold) fill the budget. A third heavy one is refused, while light requests arriving every 0.5 s (0.3 s each)
    are all admitted, and their finishes do not drag the rate toward 0 (it stays the rate measured before)."""
    now = [0.0]
    gate = admission.WorkGate(2.0, 256, clock=lambda: now[0])
    for _ in range(40):  # 2 s of light traffic: 1,000 per 0.05 s, a rate of 20,000 per second
        ticket = gate.admit(1_000)
        now[0] += 0.05
        ticket.close()
    rate = gate.rate()
    assert rate == pytest.approx(20_000, rel=0.05)
    heavy = [gate.admit(500_000) for _ in range(2)]  # each holds half the budget (40,000) at most
    assert all(ticket.light is False for ticket in heavy)
    assert "admission_target_s" in gate.refusal(500_000)  # a third heavy one: the budget is full
    admitted = 0
    for _ in range(60):  # 30 s of light requests beside them
        assert gate.refusal(1_000) is None, gate.refusal(1_000)
        light = gate.admit(1_000)
        assert light.light is True
        admitted += 1
        now[0] += 0.3
        light.close()
        now[0] += 0.2
    assert admitted == 60 and gate.rate() == pytest.approx(rate)
    assert gate.refusal(20_000) is not None  # a request over the reserve (10,000) is heavy: the budget is full
    for ticket in heavy:
        ticket.close()
    assert gate.refusal(500_000) is None and gate.rate() != pytest.approx(rate)  # the heavy work measured in


def measured_gate(now):
    """A gate on a made-up clock after 2 s of light traffic: a rate of 20,000 per busy second, budget 40,000."""
    gate = admission.WorkGate(2.0, 256, clock=lambda: now[0])
    for _ in range(40):
        ticket = gate.admit(1_000, 60.0)
        now[0] += 0.05
        ticket.close()
    return gate


def test_heavy_requests_are_admitted_only_while_they_can_finish_by_their_deadlines():
    """Issue 69: heavy requests run one at a time until the heavy rate is measured, then as many as finish, at that
    rate, before the earliest deadline among them; the next is refused with a 429 (retry), never run to a 504."""
    now = [0.0]
    gate = measured_gate(now)
    first = gate.admit(300_000, 60.0)
    assert first.heavy and gate.heavy_rate() is None
    refused = gate.refusal(300_000, 60.0)
    assert refused.retry and "one request at a time" in refused.reason
    assert gate.refusal(1_000, 60.0) is None  # a light one is not judged so
    now[0] += 20.0
    first.close()  # 300,000 in 20 s of heavy work: 15,000 per second
    assert gate.heavy_rate() == pytest.approx(15_000)
    second = gate.admit(300_000, 60.0)
    assert gate.refusal(300_000, 60.0) is None  # both done in 40 s: within both deadlines
    now[0] += 25.0  # 35 s left to the second's deadline: with a third, 40 s of work in flight
    refused = gate.refusal(300_000, 60.0)
    assert refused.retry and "past a deadline" in refused.reason, refused
    second.close()
    assert gate.refusal(300_000, 60.0) is None


def test_a_request_that_cannot_finish_in_its_time_is_refused_up_front_and_so_is_its_like_after_a_timeout():
    """Issue 69: at the measured rate, a request over what the server finishes within request_timeout_s is refused
    before it runs with a Refusal that is not a retry (the proxy's 413 too_much_work), naming its size and the limit.
    A heavy request that ran past its deadline bounds the heavy rate: the same request is then refused up front,
    while the reserve for light requests holds (the rate of all work stands)."""
    now = [0.0]
    gate = measured_gate(now)
    refused = gate.refusal(2_000_000, 60.0)  # 100 s at 20,000 per second
    assert not refused.retry and "2,000,000 bytes" in refused.reason and "request_timeout_s (60 s)" in refused.reason
    assert gate.refusal(1_000_000, 60.0) is None  # 50 s: it may run (alone)
    request = admission.RequestAdmission(gate, 1_000_000, 60.0, clock=lambda: now[0])
    assert request.enter() is None
    rate = gate.rate()
    now[0] += 61.0  # it ran to its deadline: answered with the timeout
    request.close()
    assert gate.requests == 0 and gate.heavy_rate() < 1_000_000 / 60.0
    refused = gate.refusal(1_000_000, 60.0)
    assert refused is not None and not refused.retry, refused
    assert gate.rate() == pytest.approx(rate) and gate.is_light(1_000) is True  # the reserve holds
    assert gate.refusal(1_000, 60.0) is None


@pytest.fixture(scope="module")
def short_deadline_server(minilm_repository, tmp_path_factory):
    """The shipped configs with a 3 s request timeout: a 600-sentence /similarity is more work than that."""
    from conftest import start_server, stop_server, wait_for_proxy
    running = start_server(minilm_repository, tmp_path_factory.mktemp("short_deadline_server"),
                           extra_env={"PROXY_REQUEST_TIMEOUT_S": "3"})
    wait_for_proxy(running)
    yield running
    stop_server(running)


def test_a_request_that_cannot_finish_in_its_time_gets_a_413_before_it_runs(short_deadline_server):
    """Issue 69, through tritonserver: with a measured rate, a legal /similarity that the server cannot finish within
    request_timeout_s is refused before it runs, at once, with 413 too_much_work naming its size against what the
    server finishes in that time, and no Retry-After (it would fail again as it is); the server serves on, the same
    request's smaller part included, and TEI's and OpenAI's shapes carry the kind."""
    sentences = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(100)) for i in range(HEAVY_SENTENCES)]
    with httpx.Client(base_url=short_deadline_server.proxy_url, timeout=60) as client:
        started = time.monotonic()
        while time.monotonic() - started < 3:  # a measured rate first
            assert client.post("/v1/embeddings", json={"input": VARIED_TEXTS[:8]}).status_code == 200
        sent = time.monotonic()
        refused = client.post("/similarity", json={"inputs": {"source_sentence": "a panda", "sentences": sentences}})
        took = time.monotonic() - sent
        body = refused.json()
        print(f"\n600 sentences of 100 words, request_timeout_s 3: {refused.status_code} after {took:.2f} s: "
              f"{body['error'][:200]}")
        assert refused.status_code == 413 and body["code"] == "too_much_work", body
        assert "bytes of work" in body["error"] and "request_timeout_s (3 s)" in body["error"], body
        assert "retry-after" not in refused.headers and took < 1.0, (refused.headers, took)
        openai = client.post("/v1/embeddings", json={"input": sentences})
        assert openai.status_code == 413 and openai.json()["error"]["code"] == "too_much_work", openai.text[:300]
        small = client.post("/similarity", json={"inputs": {"source_sentence": "a panda", "sentences": sentences[:4]}})
        assert small.status_code == 200 and len(small.json()) == 4, small.text[:300]
        # Issue 71: a text's attention counts as quadratic in its length, but only up to the max length, where it is
        # cut (truncate true): 20 KB judged whole would be ~4 s of work here; cut at 256 tokens it is served.
        long_text = " ".join(WORDS[k % len(WORDS)] for k in range(4_000))
        cut = client.post("/v1/embeddings", json={"input": [long_text]})
        assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 256, cut.text[:300]


def test_retry_after_follows_the_refusals_per_admission():
    """Issue 69: 200 clients told to retry after 1 s sent seven refused requests per answered one, CPU taken from the
    work; Retry-After is the refusals per admission over the last seconds, 1 s to MAX_RETRY_AFTER_S."""
    now = [0.0]
    gate = measured_gate(now)
    held = [gate.admit(20_000, 60.0) for _ in range(2)]  # the budget (40,000) full
    first = gate.refusal(20_000, 60.0)
    assert first.retry and first.retry_after_s == 1  # one refusal beside 42 admissions
    for _ in range(200):
        refused = gate.refusal(20_000, 60.0)
    assert refused.retry_after_s == 5  # 201 refusals, 42 admissions
    for _ in range(200):
        refused = gate.refusal(20_000, 60.0)
    assert refused.retry_after_s == admission.MAX_RETRY_AFTER_S
    now[0] += admission.RETRY_WINDOW_S + 1  # the window passes: back to 1 s
    assert gate.refusal(20_000, 60.0).retry_after_s == 1
    for ticket in held:
        ticket.close()


def test_the_served_target_is_a_few_typical_requests_time_within_admission_target_s():
    """Issue 69: the gate admits TARGET_REQUESTS typical requests' time (the median cost of the last finished ones at
    the measured rate), between MIN_TARGET_S and admission_target_s: 40 ms requests queue 0.4 s, not 2 s."""
    now = [0.0]
    gate = admission.WorkGate(2.0, 256, clock=lambda: now[0], target_requests=10)
    assert gate.target() == 2.0  # nothing measured yet
    for _ in range(50):  # 1,000 per 0.04 s: 25,000 per second, a typical request 0.04 s
        ticket = gate.admit(1_000)
        now[0] += 0.04
        ticket.close()
    assert gate.target() == pytest.approx(0.4) and gate.budget() == pytest.approx(10_000)
    held = [gate.admit(1_000) for _ in range(10)]
    refused = gate.refusal(1_000)
    assert refused.retry and "admission target (0.4 s: 10 typical requests' time, at most 2 s, " in refused, refused
    for ticket in held:
        ticket.close()
    slow = admission.WorkGate(2.0, 256, clock=lambda: now[0], target_requests=10)
    for _ in range(5):  # 1,000 per 1 s: a typical request 1 s, 10 of them over admission_target_s
        ticket = slow.admit(1_000)
        now[0] += 1.0
        ticket.close()
    assert slow.target() == 2.0
    assert admission.WorkGate(2.0, 256, target_requests=None).target() == 2.0


def test_a_slow_model_queues_a_few_requests_up_to_half_the_timeout():
    """Issue 71: bge-m3 at its real size on 2 cores takes ~2 s a passage; a 2 s target refused four clients'
    passages four times in five. The target of a model whose typical requests are slow is that many requests' time
    up to DEADLINE_SHARE of request_timeout_s, so four passages queue (each still finishing within its deadline) while
    MiniLM's target is as before."""
    now = [0.0]

    def measured(seconds_each):
        gate = admission.WorkGate(2.0, 256, clock=lambda: now[0], target_requests=16, timeout_s=60.0)
        for _ in range(int(2 / seconds_each) + 2):  # 2 s of finishes: the rate measured
            ticket = gate.admit(2_000, 60.0)
            now[0] += seconds_each
            ticket.close()
        return gate

    passages = measured(2.0)
    assert passages.target() == pytest.approx(admission.DEADLINE_SHARE * 60.0)
    held = [passages.admit(2_000, 60.0) for _ in range(3)]
    assert passages.refusal(2_000, 60.0, 60.0) is None  # the fourth client's passage queues
    held += [passages.admit(2_000, 60.0) for _ in range(12)]
    refused = passages.refusal(2_000, 60.0, 60.0)  # 15 passages in flight: 32 s of work, over 30 s
    assert refused.retry and "at most 30 s" in refused, refused
    for ticket in held:
        ticket.close()
    assert measured(0.2).target() == pytest.approx(3.2)  # bge-m3's queries: 16 x 0.2 s
    assert measured(0.03).target() == pytest.approx(0.48)  # MiniLM's: as before


def test_a_texts_attention_adds_to_its_cost_as_its_length_over_the_model_width():
    """Issue 71: a cost linear in bytes judged bge-m3's 8,192-token text at 15-40 s where it runs past 60 s; attention
    adds n^2 / (ATTENTION_WIDTHS h) tokens (n tokens, width h): bge-m3's 8k text costs 6.3x its bytes, a query 1x."""
    long_text = "x" * (8192 * admission.TOKEN_BYTES)
    extra = admission.attention_cost([np.array([long_text], dtype=np.object_)], 1024)
    assert 1 + extra / len(long_text) == pytest.approx(1 + 8192 / (admission.ATTENTION_WIDTHS * 1024), rel=1e-3)
    texts = np.array([b"a short query", "x" * 400], dtype=np.object_).reshape(-1, 1)
    scale = admission.TOKEN_BYTES * admission.ATTENTION_WIDTHS * 1024
    assert admission.attention_cost([texts], 1024) == int((13 ** 2 + 400 ** 2) / scale)
    assert admission.attention_cost([texts], None) == 0  # no width recorded: the body's size alone
    # a text over the max length is truncated (or refused): it costs as a text of max_length tokens
    truncated = admission.attention_cost([np.array(["x" * 100_000], dtype=np.object_)], 384, max_length=256)
    assert truncated == int((256 * admission.TOKEN_BYTES) ** 2 / (admission.TOKEN_BYTES * admission.ATTENTION_WIDTHS
                                                                 * 384))
