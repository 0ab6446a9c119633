"""c(n) of a server from synthetic-acceptance requests: pass lengths replayed from the returned
ids, the per-round solve, the least-squares line. Fake servers with known pass costs; no timing."""

from contextlib import contextmanager

import numpy as np
import pytest

from kolibri_cli.bench.engine_costs import (
    PassTimes,
    ServerCosts,
    cost_round,
    pass_lengths,
    prompt_eval_costs,
    solve_pass_ms,
)
from kolibri_cli.costs.model import line_slope
from kolibri_cli.decode.proposers import make_proposer
from kolibri_cli.engines import Completion
from kolibri_cli.errors import KolibriError

PROMPT = list(range(100, 132)) * 2  # a periodic prompt: 32 distinct ids, twice


def pass_ms(length: int) -> float:
    """The fake server's cost of a pass: not on a line, so a solve that assumed one would miss."""
    return {1: 20.0, 2: 31.0, 3: 45.0, 4: 52.0, 5: 70.0, 6: 74.0}[length]


class FakeSynthServer:
    """ngram-simple (n-gram 1, m drafts) with every draft accepted, as llama-server's synthetic
    acceptance; the 'model' picks each pass's last token: the periodic continuation, except on
    every `stray`-th pass a token from 3 back in the period (the next draft comes up short) or
    one never seen (nothing to draft next)."""

    def __init__(self, m: int, stray: int = 5):
        self.m, self.stray, self.calls = m, stray, []

    def complete(self, prompt, max_tokens, ignore_eos=False) -> Completion:
        self.calls.append(ignore_eos)
        out, lengths = [PROMPT[0]], []
        proposer = make_proposer("llamacpp-simple", max(self.m, 1), (1, 1))
        while len(out) < max_tokens:
            budget = min(self.m, max_tokens - len(out) - 1)
            context = np.asarray(prompt + out, dtype=np.int64)
            drafted = list(proposer.propose(context, budget)) if self.m else []
            nxt = prompt[(len(prompt) + len(out) + len(drafted)) % 32]
            if self.stray and len(lengths) % self.stray == self.stray - 1:
                nxt = prompt[(len(out) + len(drafted) + 29) % 32] if len(lengths) % 2 else 999
            out += drafted + [nxt]
            lengths.append(1 + len(drafted))
        drafted = sum(lengths) - len(lengths)
        return Completion(out, sum(map(pass_ms, lengths)) / 1e3, drafted, drafted)


def test_line_slope_least_squares_through_c1():
    assert line_slope({1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}) == pytest.approx(0.5)
    assert line_slope({1: 20.0, 2: 30.0, 3: 40.0}) == pytest.approx(0.5)  # any unit
    # a middle point off the line by +-0.1 moves the slope by the least-squares weight only
    assert line_slope({1: 1.0, 2: 1.6, 3: 1.9}) == pytest.approx((1 * 0.6 + 2 * 0.9) / 5)
    assert line_slope({1: 1.0}) == 0.0
    with pytest.raises(KolibriError, match="c\\(1\\)"):
        line_slope({2: 1.5})


def test_solve_prices_short_passes_at_the_rounds_known_costs():
    lengths = [1] * 3 + [3] * 4 + [5] * 10
    total = sum(map(pass_ms, lengths))
    assert solve_pass_ms(total, lengths, {1: 20.0, 3: 45.0}) == pytest.approx(70.0)
    # a length not measured this round is put on the line between 1 and n: exact when c is linear
    linear = {1: 20.0, 3: 40.0, 5: 60.0}
    total = 3 * 20 + 4 * 40 + 10 * 60
    assert solve_pass_ms(total, lengths, {1: 20.0}) == pytest.approx(60.0)
    assert solve_pass_ms(sum(linear[n] for n in lengths), lengths, {1: 20.0}) == pytest.approx(60)


def test_pass_lengths_replay_the_servers_drafts():
    server = FakeSynthServer(m=4)
    c = server.complete(PROMPT, 121)
    lengths = pass_lengths(PROMPT, c, 4, 121)
    assert sum(lengths) == len(c.output_ids) - 1
    assert {1, 5} <= set(lengths) and len(set(lengths)) > 2  # full, empty and short passes
    assert sum(map(pass_ms, lengths)) == pytest.approx(1e3 * c.decode_s)


def test_pass_lengths_refuse_counters_that_do_not_add_up():
    c = FakeSynthServer(m=2).complete(PROMPT, 61)
    c.drafted = c.accepted = c.drafted - 1
    with pytest.raises(KolibriError, match="synthetic acceptance"):
        pass_lengths(PROMPT, c, 2, 61)


class Openers:
    """Openers of fake synthetic-acceptance servers that count how many are open at once."""

    def __init__(self, sizes):
        self.servers = {n: FakeSynthServer(n - 1) for n in sizes}
        self.open = self.most_open = 0

    @contextmanager
    def opened(self, n):
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            yield self.servers[n]
        finally:
            self.open -= 1

    def __call__(self) -> dict:
        return {n: (lambda n=n: self.opened(n)) for n in self.servers}


@pytest.mark.parametrize("reverse", [False, True])
def test_cost_round_recovers_every_pass_cost_despite_short_passes(reverse):
    openers = Openers(range(1, 7))
    servers = openers.servers
    times = {n: PassTimes(n) for n in servers}
    cost_round(openers(), PROMPT, times, new_tokens=120, reverse=reverse)
    assert {n: t.ms[0] for n, t in times.items()} == pytest.approx(
        {n: pass_ms(n) for n in servers})
    assert all(s.calls == [True] for s in servers.values())  # every request ignores eos
    assert times[1].full == [1.0] and all(0 < t.full[0] < 1 for n, t in times.items() if n > 1)
    assert openers.most_open == 1  # one synthetic-acceptance server at a time


def test_a_large_k_is_timed_on_a_grid_of_servers_one_at_a_time():
    """k = 48: a grid of n (not 49 servers), timed never more than one server up."""
    from kolibri_cli.bench.engine_costs import cost_sizes, measure_costs

    sizes = cost_sizes(48)
    assert sizes[:8] == list(range(1, 9)) and sizes[-1] == 49 and len(sizes) < 16
    openers = Openers(sizes[:6])  # the fake prices passes of up to 6 tokens
    measured = measure_costs(openers(), PROMPT, 2, "llama-server")
    assert openers.most_open == 1 and [len(p.ms) for p in measured.passes] == [2] * 6


def test_server_costs_report_raw_medians_and_the_line():
    passes = [PassTimes(1, [20, 22, 21]), PassTimes(2, [31, 40, 30]), PassTimes(3, [45, 44, 50])]
    costs = ServerCosts("llama-server", "synthetic acceptance", 1, 64, 120, 3, passes)
    assert costs.costs == pytest.approx({1: 1.0, 2: 31 / 21, 3: 45 / 21})
    slope = line_slope(costs.costs)
    doc = costs.to_dict()
    assert doc["costs"]["3"] == pytest.approx(45 / 21)  # raw, not smoothed
    assert doc["fit"]["slope"] == pytest.approx(slope)
    assert doc["fit"]["costs"]["3"] == pytest.approx(1 + 2 * slope)


class ChainServer:
    """Answers each golden with its own chain; with a proposer, counts drafts as llama-server."""

    def __init__(self, goldens, proposer=None, k: int = 0):
        self.chains = {tuple(g.prompt_ids): g.output_ids for g in goldens}
        self.proposer, self.k = proposer, k

    def complete(self, prompt_ids, n, how=None):
        from kolibri_cli.probe.simulate import ServerCounting, simulate_chain

        chain = self.chains[tuple(prompt_ids)][:n]
        if self.proposer is None:
            return Completion(chain, 1.0)
        sim = simulate_chain(prompt_ids, chain, self.proposer, self.k, ServerCounting(n, (2,)))
        return Completion(chain, 0.8, sim.drafts_proposed, sim.drafts_accepted)


@pytest.mark.parametrize("ms, on_line", [({1: 10, 2: 15, 3: 20, 4: 25}, True),
                                         ({1: 10, 2: 15, 3: 30, 4: 25}, False)])
def test_measured_probe_predicts_with_raw_costs_and_on_their_line(ms, on_line):
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
    from kolibri_cli.probe.measure.engine import measure_on_server
    from kolibri_cli.probe.replay.shards import simulate

    goldens = load_goldens(DEFAULT_CHAT)[:4]
    run = simulate(goldens, 3, (2, 2), "llamacpp-simple")
    spec = ChainServer(goldens, run.new_proposer(), 3)
    m = measure_on_server(ChainServer(goldens), spec, goldens, run, repeats=1,
                          costs=lambda: ms, engine="fake")
    assert m.speedup == pytest.approx(1.25) and m.costs[3] == ms[3] / 10  # raw c(n)
    assert m.cost_slope == pytest.approx(line_slope(ms))
    assert (m.predicted_on_line == pytest.approx(m.predicted_speedup)) is on_line
    assert m.to_json()["predicted_on_line"] == m.predicted_on_line


class StepTimedServer(ChainServer):
    """ChainServer whose decode time is `ms` per step, except `short_ms` on chains under
    MIN_TIMED_STEPS steps: the few-ms noise that gave 1-3 token chains their 'speedups'."""

    def __init__(self, goldens, ms: float, short_ms: float, proposer=None, k: int = 0):
        super().__init__(goldens, proposer, k)
        self.ms, self.short_ms = ms, short_ms

    def complete(self, prompt_ids, n, how=None):
        from kolibri_cli.probe.result import MIN_TIMED_STEPS

        answer = super().complete(prompt_ids, n, how)
        steps = len(answer.output_ids) - 1
        answer.decode_s = steps * (self.short_ms if steps < MIN_TIMED_STEPS else self.ms) / 1e3
        return answer


def test_measured_server_marks_goldens_too_short_to_time_and_leaves_them_out():
    """probe --measure on a server: a golden of 1-3 decode steps is marked too short, as with
    kolibri's own measurement, and the overall figures, the per-repeat range and the worst are
    the other goldens'."""
    from dataclasses import replace

    from kolibri_cli.cli.render.probe import measured_table
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
    from kolibri_cli.probe.measure.engine import measure_on_server
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.result import MIN_TIMED_STEPS

    lengths = {0: None, 1: 3, 2: MIN_TIMED_STEPS + 1}  # full, 2 steps, exactly 4 steps
    goldens = [replace(g, output_ids=g.output_ids[:lengths[i]])
               for i, g in enumerate(load_goldens(DEFAULT_CHAT)[:3])]
    run = simulate(goldens, 3, (2, 2), "llamacpp-simple")
    spec = StepTimedServer(goldens, 8.0, 30.0, run.new_proposer(), 3)
    m = measure_on_server(StepTimedServer(goldens, 10.0, 10.0), spec, goldens, run, repeats=2,
                          costs=lambda: {1: 10, 2: 15, 3: 20, 4: 25}, engine="fake")
    assert [g.too_short for g in m.goldens] == [False, True, False]
    assert m.goldens[1].speedup == pytest.approx(1 / 3)  # its noise, shown but not counted
    assert m.speedup == pytest.approx(1.25) and m.speedup_range == pytest.approx((1.25, 1.25))
    assert m.left_out == 1 and m.worst.id != goldens[1].id
    doc = m.to_json()
    assert doc["left_out"] == 1 and doc["goldens"][1]["too_short"] is True
    assert "1 golden(s) too short to time" in measured_table(m, "x").caption


class FakePromptCache:
    """llama.cpp's prompt evaluation after a cached prefix: only the ids past the longest cached
    prefix are evaluated, at `ms(n)` for n of them."""

    url = "http://fake"

    def __init__(self, ms):
        self.ms, self.cached, self.sizes = ms, [], []

    def evaluate(self, ids):
        same = next((i for i, (a, b) in enumerate(zip(ids, self.cached, strict=False)) if a != b),
                    min(len(ids), len(self.cached)))
        n, self.cached = len(ids) - same, list(ids)
        self.sizes.append(n)
        return n, self.ms(n)


def test_prompt_evaluation_curve_on_a_grid_alternates_its_order():
    api = FakePromptCache(lambda n: 10.0 + 2.5 * (n - 1) + (n > 8) * 3.0)
    sizes = [1, 2, 3, 4, 8, 12]
    costs = prompt_eval_costs(api, PROMPT, sizes, 2, "http://fake", pool=list(range(500, 530)))
    assert costs.costs == pytest.approx({n: (10 + 2.5 * (n - 1) + (n > 8) * 3) / 10
                                         for n in sizes})
    assert costs.costs_option is None  # not 1..n: the probe reads such a curve from a file
    timed = [n for n in api.sizes if 0 < n < len(PROMPT)]  # less the rounds' prefix requests
    assert timed == sizes + sizes[::-1]
    with pytest.raises(KolibriError, match="30 distinct tokens"):
        prompt_eval_costs(api, PROMPT, [1, 30], 1, "x", pool=list(range(500, 530)))
