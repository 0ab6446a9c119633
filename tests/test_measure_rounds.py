"""The measured probe's protocol (probe/measure/): rounds spread over the run, more rounds for
short goldens, a rotating order that turns around, and disturbed decode steps counted at their
peers' median. Fake timings only: nothing here is timed."""

import pytest
from tiny_models import MODELS

from kolibri_cli.decode.generate import GenerationResult, VerifyPass, generate_plain, generate_spec
from kolibri_cli.decode.proposers import make_proposer
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.probe import measure
from kolibri_cli.probe.replay.shards import simulate

PROMPTS = [[5, 6, 7, 8] * 5, [9, 3, 9, 3, 9] * 3, [11, 12, 13, 14, 15, 16, 11, 12]]


def golden(i: int, n: int) -> Golden:
    prompt = PROMPTS[i]
    return Golden(f"g{i}", "tiny", "", False, prompt,
                  generate_plain(MODELS[0], prompt, n).output_ids, "tiny", "0" * 64)


def result(steps: list[float], drafted: list[int] | None = None) -> GenerationResult:
    mode = "plain" if drafted is None else "spec"
    passes = [VerifyPass(i, d, 0) for i, d in enumerate(drafted or [])]
    return GenerationResult([1], [2] * (len(steps) + 1), "", 0.0, sum(steps), len(steps) + 1,
                            mode=mode, passes=passes, step_s=steps)


def at_speeds(monkeypatch, plain: list[float], spec: list[float]) -> None:
    """The measured probe's plain and spec runs, each run's every step 10 ms x its speed: the
    speeds in turn (one a run), as a whole run slowed or sped up by the machine."""
    speeds = {"plain": iter(plain), "spec": iter(spec)}

    def timed(run):
        run.step_s = [0.01 * next(speeds[run.mode])] * len(run.step_s)
        run.decode_s = sum(run.step_s)
        return run

    monkeypatch.setattr(measure, "generate_plain", lambda *a, **k: timed(generate_plain(*a, **k)))
    monkeypatch.setattr(measure, "generate_spec", lambda *a, **k: timed(generate_spec(*a, **k)))


def test_step_times_add_up_to_the_decode_time_one_per_forward():
    model, prompt = MODELS[0], PROMPTS[0]
    plain = generate_plain(model, prompt, 20)
    spec = generate_spec(model, prompt, 20, make_proposer("vllm", 4, (1, 4)))
    assert any(p.drafted for p in spec.passes)  # multi-row steps are covered
    for run in (plain, spec):
        assert len(run.step_s) == len(run.step_rows) == run.forward_passes - 1
        assert sum(run.step_s) == pytest.approx(run.decode_s, rel=1e-9, abs=1e-12)
    assert spec.step_rows == [1 + p.drafted for p in spec.passes]
    assert plain.step_rows == [1] * 19


def test_a_disturbed_step_counts_at_its_peers_median_and_others_stay_as_timed():
    """Steps of 1 row take 1.0 and 1.1 (within DISTURBED of their median), 3-row steps 2.0; one
    1-row step took 5.0 (disturbed: counted at the 1-row median, 1.0), and one 3-row step 2.5
    (within 1.3 x 2.0: kept). The peers are pooled over the runs of one configuration."""
    runs = [result([1.0, 2.0, 1.1, 1.0], [0, 2, 0, 0]),
            result([1.0, 2.5, 5.0, 1.0], [0, 2, 0, 0]),
            result([1.1, 2.0, 1.0], [0, 2, 0])]
    assert measure.undisturbed_times(runs) == pytest.approx([5.1, 1 + 2.5 + 1.0 + 1, 4.1])
    plain = [result([1.0, 1.0, 1.0]), result([1.0, 9.0, 1.0])]
    assert measure.undisturbed_times(plain) == pytest.approx([3.0, 3.0])


def test_a_run_without_step_times_counts_its_decode_time():
    run, spec = result([]), result([0.1, 0.2], [0, 1])
    run.decode_s = 0.7
    spec.step_s = []  # passes, but no step times (a result made elsewhere)
    assert measure.undisturbed_times([run, spec, result([0.2, 0.2])]) == pytest.approx(
        [0.7, 0.3, 0.4])


def test_shorter_goldens_get_more_rounds_up_to_a_cap():
    goldens = [golden(0, 40), golden(1, 20), golden(2, 3)]
    assert measure.rounds_per_golden(goldens, 3) == [3, 6, measure.MORE_ROUNDS * 3]
    assert measure.rounds_per_golden(goldens, 3, more=False) == [3, 3, 3]


def test_every_round_runs_each_once_and_the_order_turns_around():
    """Plain (-1) and every configuration once per round; over the rounds each runs in every
    place, and each runs after more than one other (the order rotates and reverses)."""
    arms, rounds = 3, 8
    orders = [measure.round_order(arms, 0, r) for r in range(rounds)]
    assert all(sorted(o) == [-1, 0, 1, 2] for o in orders)
    for who in (-1, 0, 1, 2):
        assert {o.index(who) for o in orders} == {0, 1, 2, 3}
        before = {o[o.index(who) - 1] for o in orders if o.index(who) > 0}
        assert len(before) > 1


def spy(monkeypatch) -> list[tuple]:
    """Record (kind, prompt) of every run the measurement makes, in order."""
    calls = []

    def plain(model, prompt, *args, **kwargs):
        calls.append(("plain", tuple(prompt)))
        return generate_plain(model, prompt, *args, **kwargs)

    def spec(model, prompt, *args, **kwargs):
        calls.append(("spec", tuple(prompt)))
        return generate_spec(model, prompt, *args, **kwargs)

    monkeypatch.setattr(measure, "generate_plain", plain)
    monkeypatch.setattr(measure, "generate_spec", spec)
    return calls


def test_rounds_go_over_every_golden_before_the_next_round(monkeypatch):
    """Round-major: a golden's rounds are spread over the run. The 8-token golden runs in 4
    rounds where the 16-token ones run in 2, plain and the configuration once each per round;
    the figures are still right (spec == plain, counts == simulation)."""
    goldens = [golden(0, 16), golden(1, 8), golden(2, 16)]
    calls = spy(monkeypatch)
    [m] = measure.measure_runs(MODELS[0], goldens, [simulate(goldens, 3, (1, 4), "vllm")],
                               repeats=2, cost_repeats=1).values()
    prompts = [p for _, p in calls[::2]]  # each golden's round takes two calls in a row
    ids = {tuple(g.prompt_ids): g.id for g in goldens}
    assert [ids[p] for p in prompts] == ["g0", "g1", "g2", "g0", "g1", "g2", "g1", "g1"]
    assert all({calls[i][0], calls[i + 1][0]} == {"plain", "spec"} for i in range(0, 16, 2))
    assert m.spec_equals_plain and m.counts_match_simulation and m.repeats == 2


def test_a_proposer_sharing_state_gets_the_same_rounds_for_every_golden(monkeypatch):
    """Extra rounds for short goldens would feed a proposer that learns across requests a
    history the simulation never sees: with one measured, every golden runs `repeats` rounds."""
    goldens = [golden(0, 16), golden(1, 8)]
    calls = spy(monkeypatch)
    [m] = measure.measure_runs(MODELS[0], goldens, [simulate(goldens, 3, (1, 4), "adaptive")],
                               repeats=2, cost_repeats=1).values()
    assert len(calls) == 2 * 2 * 2
    assert m.spec_equals_plain and m.counts_match_simulation


def test_a_disturbed_plain_step_does_not_move_the_measured_speedup(monkeypatch):
    """Every step takes 10 ms, except one plain step that another process held for a second:
    the golden's speedup is still plain steps / spec passes."""
    goldens = [golden(0, 24)]
    spikes = iter([True, False, False])

    def plain(*args, **kwargs):
        run = generate_plain(*args, **kwargs)
        run.step_s = [0.01] * len(run.step_s)
        if next(spikes):
            run.step_s[5] = 1.0
        run.decode_s = sum(run.step_s)
        return run

    def spec(*args, **kwargs):
        run = generate_spec(*args, **kwargs)
        run.step_s = [0.01] * len(run.step_s)
        run.decode_s = sum(run.step_s)
        return run

    monkeypatch.setattr(measure, "generate_plain", plain)
    monkeypatch.setattr(measure, "generate_spec", spec)
    [m] = measure.measure_runs(MODELS[0], goldens, [simulate(goldens, 3, (1, 4), "vllm")],
                               repeats=1, cost_repeats=1, statistic=min).values()
    [g] = m.goldens
    assert g.verify_passes < 23  # drafts were accepted: the spec run has fewer steps
    assert g.speedup == pytest.approx(23 / g.verify_passes)


def test_a_goldens_speedup_is_the_median_of_its_rounds_own_ratios():
    """Round by round plain / spec: 1.0 / 0.5, 3.0 / 1.5 (a slow spell slowed both), 1.2 / 1.0:
    ratios 2, 2, 1.2, median 2 (the medians of the times, 1.2 / 1.0, would say 1.2); `min`
    takes the least disturbed times' ratio."""
    import statistics

    plain, spec = [1.0, 3.0, 1.2], [0.5, 1.5, 1.0]
    assert measure.paired_speedup(plain, spec, statistics.median) == pytest.approx(2.0)
    assert measure.paired_speedup(plain, spec, min) == pytest.approx(2.0)
    assert measure.paired_speedup([1.0, 1.2], [1.0, 0.4], min) == pytest.approx(2.5)


def test_a_steps_peers_are_its_rounds_plain_and_configuration_steps(monkeypatch):
    """A round run during a slow spell (every step 3x) is not corrected against other rounds:
    its steps are compared within the round, so its paired ratio stands; one disturbed plain
    step in a quiet round is counted at the round's median."""
    timed = measure._Timed(plains=[result([1.0, 1.0, 1.0, 5.0]), result([3.0, 3.0, 3.0, 3.0])],
                           specs=[[(result([1.0, 2.0, 1.0], [0, 1, 0]), []),
                                   (result([3.0, 6.0, 3.0], [0, 1, 0]), [])]])
    plain_u, spec_u = measure._undisturbed_by_round(timed)
    assert plain_u == pytest.approx([4.0, 12.0])
    assert [u[0] for u in spec_u] == pytest.approx([4.0, 12.0])


def test_the_overall_speedup_is_paired_as_a_goldens_is(monkeypatch):
    """One golden, three rounds, every step of a run as long as the others but each round at
    its own speed: plain x 1.0, 1.25, 1.1 and spec x 1.1, 1.0, 1.25. The rounds' own ratios have
    the median (1 / 1.1) x plain steps / spec passes; the medians of the times alone would say
    1.1 / 1.1. With one golden the overall speedup is that golden's."""
    goldens = [golden(0, 24)]
    at_speeds(monkeypatch, [1.0, 1.25, 1.1], [1.1, 1.0, 1.25])
    [m] = measure.measure_runs(MODELS[0], goldens, [simulate(goldens, 3, (1, 4), "vllm")],
                               repeats=3, cost_repeats=1).values()
    [g] = m.goldens
    assert g.verify_passes < 23
    assert g.speedup == pytest.approx(23 / g.verify_passes / 1.1)
    assert m.speedup == pytest.approx(g.speedup)
    assert m.spec_tokens_per_s / m.plain_tokens_per_s == pytest.approx(23 / g.verify_passes)


def test_the_median_interval_is_its_order_statistics_by_the_binomial():
    """n = 12 rounds: P(Binomial(12, 1/2) <= 2) = 0.0193 <= 0.025 < P(<= 3) = 0.073, so the
    interval runs from the 3rd to the 10th smallest; n = 24: 7th to 18th; under 6 rounds no
    interval reaches 95% (even [min, max] covers 1 - 2 / 2**5 = 0.9375)."""
    values = [0.9 + 0.01 * i for i in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6)]  # 0.90 .. 1.01
    assert measure.median_interval(values) == pytest.approx((0.92, 0.99))
    assert measure.median_interval(list(range(24))) == (6, 17)
    assert measure.median_interval([1.0] * 6) == (1.0, 1.0)
    assert measure.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert measure.median_interval([]) is None


def test_the_median_interval_holds_the_true_median_as_often_as_it_says():
    """Skewed noise (lognormal, true median 1): over 4000 sets of 12 draws the interval holds 1
    in 1 - 2 P(Binomial(12, 1/2) <= 2) = 96.1% of them, whatever the noise's shape."""
    import random

    rng = random.Random(7)
    held = sum(lo <= 1.0 <= hi for lo, hi in (
        measure.median_interval([rng.lognormvariate(0.0, 0.5) for _ in range(12)])
        for _ in range(4000)))
    assert held / 4000 == pytest.approx(1 - 2 * 79 / 4096, abs=0.012)


def test_a_goldens_interval_comes_from_its_rounds_own_ratios(monkeypatch):
    """Six rounds of one golden, plain at speeds 1.0 .. 1.5 and spec always 1.0: the rounds'
    ratios spread by 1.5x, so the golden's interval is their [min, max] (6 rounds) around the
    median; with `min` as the statistic there is no interval."""
    import statistics

    goldens = [golden(0, 24)]

    def run(statistic):
        at_speeds(monkeypatch, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], [1.0] * 6)
        [m] = measure.measure_runs(MODELS[0], goldens, [simulate(goldens, 3, (1, 4), "vllm")],
                                   repeats=6, cost_repeats=1, statistic=statistic).values()
        return m.goldens[0]

    g = run(statistics.median)
    ratio = 23 / g.verify_passes  # plain steps over spec passes at equal speed
    assert g.speedup_interval == pytest.approx((ratio * 1.0, ratio * 1.5))
    assert g.speedup_interval[0] < g.speedup < g.speedup_interval[1]
    assert run(min).speedup_interval is None
