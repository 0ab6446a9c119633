"""probe/targets.py: `model_targets` gives the counts the simulation and a live run fed the
same costs give, and a measured block takes each golden's time as the statistic of its rounds;
probes/guard_targets.py parses its options."""

import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from tiny_models import MODELS

from kolibri_cli.costs.model import BENCH_CONTEXT, CostTable, cost_model, octave
from kolibri_cli.decode import generate as generate_module
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import make_proposer
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.probe import measure, targets
from kolibri_cli.probe.replay.shards import simulate

COSTS = {1: 1.0, 2: 1.49, 3: 1.72, 4: 1.86, 5: 2.23, 6: 2.28, 7: 2.52, 8: 2.66, 9: 3.06}
PROMPTS = [[5, 6, 7, 8] * 5, [9, 3, 9, 3, 9] * 3, [11, 12, 13, 14, 15, 16, 11, 12],
           [21, 22, 23] * 4 + [24, 25]]


def tiny_goldens(model, n: int = 40) -> list[Golden]:
    return [Golden(i, "tiny", "", False, p, generate_plain(model, p, n).output_ids, "tiny",
                   "0" * 64, {"engine": "kolibri"}, [0]) for i, p in enumerate(PROMPTS)]


def feeding(monkeypatch, c) -> None:
    """Live runs time each forward as c(rows) seconds: the table a live guard fills then holds
    exactly the costs `model` feeds its replayed guard."""
    def timer(proposer):
        return lambda rows, context, seconds: proposer.costs.add(rows, context, c(rows))

    monkeypatch.setattr(generate_module, "_timer", timer)


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_a_measuring_guard_replayed_drafts_as_a_live_run_fed_the_same_costs(monkeypatch, seed):
    model, c = MODELS[seed], cost_model(COSTS)
    feeding(monkeypatch, c)
    drafted_any = False
    for golden in tiny_goldens(model):
        live = make_proposer("guard", targets.GUARD_K, (1, 4), CostTable())
        spec = generate_spec(model, golden.prompt_ids, len(golden.output_ids), live)
        plain_steps, cost = targets.replay(golden, make_proposer(
            "guard", targets.GUARD_K, (1, 4), CostTable()), targets.GUARD_K, c, True)
        lengths = [p.drafted for p in spec.passes]
        drafted_any |= any(lengths)
        assert plain_steps == len(golden.output_ids) - 1
        assert cost == pytest.approx(sum(c(1 + d) for d in lengths))
    assert drafted_any  # the comparison covered drafting, not only plain steps


def test_model_gives_the_simulations_figures_for_every_arm(monkeypatch):
    """The guard given c(n) and the fixed settings: the probe simulation's modelled speedup; the
    measuring guard: the passes of live runs timed as c(rows). Overall and worst golden."""
    model, c = MODELS[0], cost_model(COSTS)
    goldens = tiny_goldens(model)
    report = targets.model_targets(COSTS, goldens, {"tiny": goldens}, 2)["tiny"]
    measuring, warm, given, *fixed = report.values()
    assert len(fixed) == 2

    sim = simulate(goldens, targets.GUARD_K, (1, 4), "guard", COSTS)
    assert given["overall"] == pytest.approx(sim.modelled_speedup())
    per_golden = [sim.modelled_speedup(chain.counts) for chain in sim.goldens]
    assert given["worst"] == pytest.approx(min(per_golden))
    for (name, figures), run in zip(list(report.items())[3:],
                                    targets.rank_fixed(goldens, COSTS, 2), strict=True):
        assert name == run.name and figures["overall"] == pytest.approx(run.modelled_speedup())

    feeding(monkeypatch, c)
    seed = [[octave(BENCH_CONTEXT), n, [x]] for n, x in COSTS.items() if n > 1]
    for figures, new_table in ((measuring, CostTable), (warm, lambda: CostTable.seeded(seed))):
        steps, spent = {}, {}
        for golden in goldens:
            live = make_proposer("guard", targets.GUARD_K, (1, 4), new_table())
            passes = generate_spec(model, golden.prompt_ids, len(golden.output_ids), live).passes
            steps[golden.id] = len(golden.output_ids) - 1
            spent[golden.id] = sum(c(1 + p.drafted) for p in passes)
        assert figures["overall"] == pytest.approx(sum(steps.values()) / sum(spent.values()))
        worst = min(steps, key=lambda i: steps[i] / spent[i])
        assert figures["worst_id"] == worst
        assert figures["worst"] == pytest.approx(steps[worst] / spent[worst])
        assert figures["overall"] > 1.0  # the copier's chains repeat: drafting pays


def scripted(monkeypatch, plain_s: list[float], spec_s: list[float]) -> None:
    """Plain and speculative runs report these decode times, round after round (and no step
    times, so each run counts its decode time whole)."""
    plain_times, spec_times = iter(plain_s), iter(spec_s)

    def plain(*args, **kwargs):
        result = generate_plain(*args, **kwargs)
        result.decode_s, result.step_s = next(plain_times), []
        return result

    def spec(*args, **kwargs):
        result = generate_spec(*args, **kwargs)
        result.decode_s, result.step_s = next(spec_times), []
        return result

    monkeypatch.setattr(measure, "generate_plain", plain)
    monkeypatch.setattr(measure, "generate_spec", spec)


@pytest.mark.parametrize("statistic", ["min", "median"])
def test_run_takes_each_goldens_time_as_the_statistic_of_its_rounds(monkeypatch, statistic):
    """Rounds of 3, 1, 2 s plain and 1.5, 4, 5 s speculative: the least disturbed rounds give
    1 / 1.5 for the golden and overall; with the medians the golden's speedup is the median of
    its rounds' own ratios (2, 0.25, 0.4), and so is the overall, paired the same way (the
    medians' sums would say 2 / 4)."""
    model = MODELS[0]
    golden = tiny_goldens(model, 12)[:1]
    plain_s, spec_s = [3.0, 1.0, 2.0], [1.5, 4.0, 5.0]
    scripted(monkeypatch, plain_s, spec_s)
    block = targets.measure_block(model, golden, [], COSTS, 3, statistic=statistic)
    guard = next(iter(block["runs"].values()))
    overall, per_golden = {"min": (1 / 1.5, 1 / 1.5), "median": (0.4, 0.4)}[statistic]
    assert guard["per_golden"][0] == pytest.approx(per_golden)
    assert guard["worst"] == guard["best"] == block["targets"]["worst"] == guard["per_golden"][0]
    assert guard["speedup"] == pytest.approx(overall)
    assert guard["spec_equals_plain"] and guard["counts_match_simulation"]


def test_statistic_is_min_or_median():
    assert targets.STATISTICS == {"min": min, "median": statistics.median}
    script = Path(__file__).parents[1] / "probes" / "guard_targets.py"
    out = subprocess.run([sys.executable, str(script), "run", "--tune", "t.jsonl",
                          "--statistic", "mean"], capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice: 'mean'" in out.stderr


def test_warm_keeps_the_guards_timings_so_the_measured_guard_starts_from_them(kolibri_home):
    """`run --warm`: the guard over the tune goldens keeps its timings as `kolibri generate`
    does, so the measured guard, which calibrated from nothing before, starts from them."""
    from types import SimpleNamespace

    from kolibri_cli.costs.model import warm_table
    from kolibri_cli.engine.jit import get_threads

    tiny = MODELS[0]
    model = SimpleNamespace(**vars(tiny), sha256="ab" * 32, numerics="float32", name="tiny")
    goldens = tiny_goldens(model, 24)
    assert targets.measure_block(model, goldens[:1], [], COSTS, 1)[
        "guard_costs_from"] == "none"
    targets.warm(model, goldens[1:])
    table, source = warm_table(model.sha256, model.numerics, get_threads())
    assert source == "kept" and table.cells()  # multi-row passes were timed and kept
    assert targets.measure_block(model, goldens[:1], [], COSTS, 1)[
        "guard_costs_from"] == "kept"


def test_splits_are_disjoint_first_turns_five_per_category(tmp_path):
    """Spec-Bench's question file in, two prompt files of 30 out; MT-Bench's ids are one
    category."""
    rows = [{"question_id": i, "category": "writing" if i <= 160 else f"cat{(i - 161) // 80}",
             "turns": [f"question {i}", "a second turn"]} for i in range(81, 500)]
    question = tmp_path / "question.jsonl"
    question.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tune, report = targets.write_splits(question, tmp_path / "splits")
    splits = [[json.loads(line) for line in p.read_text().splitlines()] for p in (tune, report)]
    assert [len(s) for s in splits] == [30, 30]
    assert not {p["id"] for p in splits[0]} & {p["id"] for p in splits[1]}
    for split in splits:
        assert all(p["prompt"] == f"question {p['id']}" for p in split)
        assert all(p["category"] == "mt_bench" for p in split if p["id"] <= 160)
        counts = Counter(p["category"] for p in split)
        assert len(counts) == 6 and set(counts.values()) == {5}
