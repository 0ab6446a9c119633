"""Speculation under load (probe/load.py) against a naive reference of the step model: B slots,
each replaying the goldens in its order, one pass per slot per step, a step costing c(tokens in
flight); plain runs B tokens a step at c(B)."""

import itertools
import json

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.costs.model import cost_model
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.probe.load import crossover, load_curve, load_point, load_report, slot_orders
from kolibri_cli.probe.replay.shards import simulate
from kolibri_cli.probe.simulate import Counts, GoldenSim, SimRun


def passes_run(chains: dict[str, list[tuple[int, int]]], k: int = 3) -> SimRun:
    """A run whose goldens made exactly these passes: [(drafted, accepted), ...] per golden."""
    goldens = []
    for gid, passes in chains.items():
        counts = Counts(plain_steps=sum(a + 1 for _, a in passes), drafted_at=[0] * k,
                        accepted_at=[0] * k)
        for d, a in passes:
            counts.record_pass(d, a)
        goldens.append(GoldenSim(gid, "c", counts))
    return SimRun("vllm", k, (1, 2), goldens, Counts(), chains=len(goldens))


def naive_speedup(chains: dict, b: int, c) -> float:
    """The step model written out: every slot's passes in its order, step by step."""
    names = list(chains)
    streams = [list(itertools.chain.from_iterable(chains[names[i]] for i in order))
               for order in slot_orders(len(names), b)]
    steps = len(streams[0])
    assert all(len(s) == steps for s in streams)  # every slot walks every golden once
    spec = 0.0
    for s in range(steps):
        spec += c(sum(1 + stream[s][0] for stream in streams))
    plain_steps = sum(a + 1 for passes in chains.values() for _, a in passes)
    return plain_steps * c(b) / spec


TWO = {"a": [(2, 2), (0, 0), (3, 1)], "b": [(1, 0), (1, 1)]}  # 6 + 3 plain steps


@pytest.mark.parametrize("costs", [{1: 1.0, 2: 1.5}, {1: 1.0, 2: 1.1, 4: 1.3, 8: 3.0}])
@pytest.mark.parametrize("b", [1, 2, 3, 5])
def test_two_sequences_of_known_drafts_match_the_naive_step_model(costs, b):
    run, c = passes_run(TWO), cost_model(costs)
    assert load_point(run, b, c).speedup == pytest.approx(naive_speedup(TWO, b, c))


def test_one_slot_is_the_single_sequence_prediction():
    c = cost_model({1: 1.0, 2: 1.5})  # linear: c(n) = 1 + 0.5 (n - 1)
    point = load_point(passes_run(TWO), 1, c)
    assert point.speedup == pytest.approx(9 / (c(3) + c(1) + c(4) + c(2) + c(2)))
    assert point.tokens_per_step == pytest.approx(9 / 5)
    assert point.acceptance == pytest.approx(4 / 7)


def test_the_best_k_changes_with_concurrency():
    """Long drafts win alone (a forward of a few rows costs little more than one), short ones
    win under load (past 8 tokens every row costs as much as a plain step)."""
    long = {"a": [(4, 3)] * 4 + [(4, 1)] * 2, "b": [(4, 4), (4, 2), (4, 0)]}
    short = {"a": [(1, 1)] * 8 + [(1, 0)] * 2, "b": [(1, 1), (1, 1), (1, 0), (1, 0), (1, 1)]}
    c = cost_model({1: 1.0, 2: 1.05, 4: 1.15, 8: 1.4, 16: 11.0})
    alone = [load_point(passes_run(x, k), 1, c).speedup for x, k in ((long, 4), (short, 1))]
    loaded = [load_point(passes_run(x, k), 8, c).speedup for x, k in ((long, 4), (short, 1))]
    assert alone[0] > alone[1] and loaded[0] < loaded[1]
    for chains, k in ((long, 4), (short, 1)):
        for b in (1, 8):
            assert load_point(passes_run(chains, k), b, c).speedup == pytest.approx(
                naive_speedup(chains, b, c))


def test_crossover_is_the_last_concurrency_that_still_pays():
    run = passes_run(TWO)
    curve = load_curve(run, [1, 2, 4, 8], {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4, 16: 6.0, 32: 14.0})
    paying = [p.concurrency for p in curve.points if p.speedup >= 1.02]
    assert paying and crossover(curve) == paying[-1] and crossover(curve) < 8


def test_crossover_needs_the_wash_margin_and_the_interval_above_one():
    """A speedup of 1.01x at B is a wash there, as at B = 1: the crossover stops before it;
    and a point whose interval reaches below 1.00x does not pay, however high its figure."""
    from dataclasses import replace

    from kolibri_cli.probe.load import LoadCurve, LoadPoint

    def point(b, speedup, interval=None, answer=""):
        return LoadPoint(b, speedup, 1.0, 1.0, None, 1.0, interval, answer)

    curve = LoadCurve(None, [point(1, 1.3), point(2, 1.01), point(4, 1.2)])
    assert crossover(curve) == 1
    judged = LoadCurve(None, [point(1, 1.3, (1.1, 1.5), "pays"),
                              point(2, 1.25, (0.97, 1.5), "a wash")])
    assert crossover(judged) == 1
    assert crossover(LoadCurve(None, [replace(judged.points[0], answer="a wash")])) is None


def spread_goldens(n: int = 8) -> dict:
    """n goldens of mixed passes: drafting pays alone and stops paying as B grows."""
    return {f"g{i}": [(2, 2), (2, 1), (0, 0), (2, 0)] * (2 + i % 3) + [(1, 1)] * (i % 2)
            for i in range(n)}


def test_each_b_is_judged_by_the_rule_of_b_1_and_b_1_is_the_headline():
    from kolibri_cli.costs.pricing import Pricing
    from kolibri_cli.probe.answer import judge, predicted_verdict

    costs = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5, 8: 3.0, 16: 7.0, 32: 15.0}
    pricing = Pricing("given", costs)
    long = passes_run(spread_goldens(), 3)
    long.costs = costs
    for g in long.goldens:
        long.total.add(g.counts)
    report = load_report([long], long, [1, 2, 4, 8], costs, None, pricing)
    headline = predicted_verdict([long], long, pricing)
    first = report.fastest.points[0]
    assert (first.answer, first.interval) == (headline.answer, headline.interval)
    for p in report.fastest.points:
        assert p.interval[0] < p.speedup < p.interval[1]
        assert p.answer == judge(p.speedup, p.interval, 8)
    answers = [p.answer for p in report.fastest.points]
    assert answers[0] == "pays" and answers[-1] == "does not pay"
    assert report.crossover == max(b for b, a in zip([1, 2, 4, 8], answers, strict=True)
                                   if a == "pays")


def test_too_few_goldens_under_load_are_said_at_every_b():
    costs = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5}
    run = passes_run(spread_goldens(3), 3)
    run.costs = costs
    report = load_report([run], run, [1, 2], costs, None)
    assert [p.answer for p in report.fastest.points] == ["too few goldens"] * 2
    assert report.crossover is None


def test_guard_under_load_never_loses_much_and_matches_alone(kolibri_home):
    """The guard runs live, pricing each pass at the step's load: at B = 1 it is the single-
    sequence simulation exactly; under load it drafts less, and stays near plain."""
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
    from kolibri_cli.probe.answer import predicted_speed

    goldens = [Golden(g.id, g.category, g.prompt, g.chat, g.prompt_ids, g.output_ids[:48],
                      g.model, g.model_sha256) for g in load_goldens(DEFAULT_CHAT)[:6]]
    costs = {1: 1.0, 2: 1.32, 3: 1.47}
    run = simulate(goldens, 16, (1, 4), "guard", costs)
    report = load_report([run], run, [1, 2, 4, 8], costs, goldens)
    points = report.fastest.points
    assert points[0].speedup == pytest.approx(predicted_speed(run).predicted)
    assert all(p.speedup >= 0.97 for p in points)
    assert points[-1].in_flight / 8 < points[0].in_flight  # it drafts less under load


def test_probe_concurrency_through_the_cli(tmp_path):
    path = tmp_path / "g.jsonl"
    pattern = [7, 8, 9, 7, 8, 3, 7, 8, 9, 4] * 3
    lines = [{"id": f"g{i}", "category": "c", "prompt": "p", "chat": True,
              "prompt_ids": [7, 8, 9, i], "output_ids": pattern + [i] * 3, "model": "m",
              "model_sha256": "0" * 64, "reference": {}} for i in range(4)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["probe", "--goldens", str(path), "--k", "1,4", "--window", "1-2", "--costs",
            "1,1.05,1.1,1.2,1.3,1.6,2,2.5,3", "--concurrency", "1,2,4,8", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    load = json.loads(result.stdout)["load"]
    assert load["concurrency"] == [1, 2, 4, 8] and len(load["points"]) == 4
    assert load["points"][0]["speedup"] == pytest.approx(json.loads(result.stdout)["best"][
        "speedup"])
    assert load["text"].startswith("under load: ") and set(load["settings"]) == {
        "vllm k=1 window=1-2", "vllm k=4 window=1-2"}
    gate = CliRunner().invoke(app, args[:-1] + ["--gate", "crossover >= 99"])
    assert gate.exit_code == 1 and "crossover" in gate.stderr
    bad = CliRunner().invoke(app, ["probe", "--goldens", str(path), "--concurrency", "0"])
    assert bad.exit_code == 1 and "concurrency must be a whole number >= 1" in bad.stderr


@pytest.mark.parametrize("b", [1, 2, 3, 5])
def test_plain_decode_of_b_sequences_is_priced_by_the_batched_decode_curve(b):
    """With the engine's batched decode d(B) timed, every step at B costs d(B) + c(T) - c(B):
    plain steps d(B), drafted rows at the prompt curve's price; d(1) = 1 leaves B = 1 as it was."""
    from kolibri_cli.probe.load import DecodeCurve

    c = cost_model({1: 1.0, 2: 1.1, 4: 1.3, 8: 3.0})
    decode = DecodeCurve({1: 1.0, 2: 1.6, 4: 2.9, 8: 5.5}, "fake")
    d = decode(b) - c(b)
    shifted = lambda t: c(t) + d  # noqa: E731
    got = load_point(passes_run(TWO), b, c, decode=decode).speedup
    assert got == pytest.approx(naive_speedup(TWO, b, shifted))
    if b == 1:
        assert got == pytest.approx(load_point(passes_run(TWO), 1, c).speedup)
    else:  # a dearer plain step leaves drafting relatively cheaper
        assert got > load_point(passes_run(TWO), b, c).speedup


def test_the_report_says_which_curve_priced_plain_decoding():
    from kolibri_cli.costs.pricing import Pricing
    from kolibri_cli.probe.load import DecodeCurve
    from kolibri_cli.probe.report import load_text

    costs = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5, 8: 3.0, 16: 7.0, 32: 15.0}
    run = passes_run(spread_goldens(), 3)
    run.costs = costs
    pricing = Pricing("given", costs)
    prompt = load_report([run], run, [1, 2, 4], costs, None, pricing)
    assert "as one B-token forward" in load_text(prompt, pricing)
    decode = DecodeCurve({1: 1.0, 2: 1.8, 4: 3.4}, "llama-server -np 4, timed in this run")
    batched = load_report([run], run, [1, 2, 4], costs, None, pricing, decode)
    assert "batched decode (llama-server -np 4" in load_text(batched, pricing)
    for p, q in zip(prompt.fastest.points[1:], batched.fastest.points[1:], strict=True):
        assert q.speedup > p.speedup and q.interval[0] < q.speedup < q.interval[1]
    assert batched.fastest.points[0] == prompt.fastest.points[0]


def test_a_measured_headline_is_the_b_1_row_of_the_load_table():
    """--measure --concurrency: B = 1 of the load table is the measured verdict's figure,
    interval and answer, labelled measured; the crossover reads it."""
    from kolibri_cli.probe.answer import Speed, verdict_of
    from kolibri_cli.probe.load import measured_at_one
    from kolibri_cli.probe.report import load_rows

    costs = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5, 8: 3.0, 16: 7.0, 32: 15.0}
    run = passes_run(spread_goldens(), 3)
    run.costs = costs
    report = load_report([run], run, [1, 2], costs, None)
    assert report.fastest.points[0].answer == "pays"
    measured = verdict_of(Speed(run, report.fastest.points[0].speedup, 0.97, (0.93, 1.01)))
    agreed = measured_at_one(report, measured)
    first = agreed.fastest.points[0]
    assert (first.speedup, first.interval, first.answer, first.basis) == (
        0.97, (0.93, 1.01), measured.answer, "measured")
    assert measured.answer == "a wash" and agreed.crossover is None
    assert agreed.fastest.points[1] == report.fastest.points[1]
    assert load_rows(agreed)[0][0] == "1 (measured)" and load_rows(report)[0][0] == "1"
    other = verdict_of(Speed(passes_run(TWO), 1.2, 1.1))  # another setting's: left as it is
    assert measured_at_one(report, other) is report
