"""The guard's targets: the guard against the best fixed settings, modelled from exact counts or
measured with the model in one interleaved run per goldens file (docs/guard.md, "The targets").

The fixed settings are chosen on a tune split by exact simulation under a c(n) (nothing looks at
the reported goldens). Modelled: the guard as `kolibri generate` runs it (a cost table fed each
pass's cost as c(rows)) beside those settings, per goldens file the modelled speedup (plain
steps over the summed c(1 + draft) of the passes) overall and of the worst golden. Measured:
`measure_runs`' rounds, spec == plain and counts == simulation checked. The targets: worst
golden >= 0.97x plain, the guard overall >= the best fixed setting, on the bench chain >= 90%
of the best fixed setting.
Scope: the splits, choosing the fixed settings, the modelled and measured blocks as dicts (they
are written as JSON). Non-goals: printing (probes/guard_targets.py), the guard's policy
(decode/proposers/guard.py).
"""

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, BENCH_SEED, bench_prompt
from kolibri_cli.costs.model import (
    BENCH_CONTEXT,
    CostTable,
    cost_model,
    keep_table,
    octave,
    warm_table,
)
from kolibri_cli.costs.timing import verify_costs
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import (
    GUARD_K,
    GuardProposer,
    HfProposer,
    LlamaCppSimpleProposer,
    NgramProposer,
    Proposer,
)
from kolibri_cli.engine.jit import get_threads
from kolibri_cli.goldens.chains import Golden, read_prompts
from kolibri_cli.probe.measure import measure_runs
from kolibri_cli.probe.replay.shards import simulate, sweep
from kolibri_cli.probe.simulate import simulate_chain
from kolibri_cli.store.atomic import write_text_atomic

FIXED = [c.name for c in (NgramProposer, HfProposer, LlamaCppSimpleProposer)]  # rules to beat
KS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16]
WINDOWS = [(1, 4), (2, 4), (1, 2), (1, 1), (2, 2), (3, 4)]
# Spec-Bench question ids (first turns), 5 per category; mt_bench takes one of each of its
# first five subcategories.
REPORT_IDS = [81, 91, 101, 111, 121, *range(161, 166), *range(241, 246), *range(321, 326),
              *range(401, 406), *range(481, 486)]
TUNE_IDS = [131, 141, 151, 82, 92, *range(166, 171), *range(246, 251), *range(326, 331),
            *range(406, 411), *range(486, 491)]
MT_BENCH_LAST = 160  # ids 81-160 are MT-Bench's (its eight subcategories: one category here)
WORST = 0.97
NEVER = {1: 1.0, 2: 1e9}  # costs under which the guard never drafts (the null arm)
BENCH_SHARE = 0.90
STATISTICS = {"median": statistics.median, "min": min}  # a golden's time from its rounds


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def write_splits(question: str | Path, outdir: str | Path) -> list[Path]:
    """The Spec-Bench tune and report splits (first turns, 5 prompts per category, disjoint) as
    prompt files for `kolibri goldens record`, in `outdir`."""
    prompts = {p.id: p for p in read_prompts(question)}
    Path(outdir).mkdir(parents=True, exist_ok=True)
    written = []
    for name, ids in (("tune", TUNE_IDS), ("report", REPORT_IDS)):
        path = Path(outdir) / f"specbench_{name}.jsonl"
        lines = [json.dumps({"id": i, "category": "mt_bench" if i <= MT_BENCH_LAST
                             else prompts[i].category, "prompt": prompts[i].prompt})
                 for i in ids]
        write_text_atomic(path, "".join(line + "\n" for line in lines))
        written.append(path)
    return written


def cut(goldens: list[Golden], max_tokens: int | None) -> list[Golden]:
    """The first `max_tokens` output ids of each golden (all with None)."""
    if not max_tokens:
        return goldens
    return [dataclasses.replace(g, output_ids=g.output_ids[:max_tokens]) for g in goldens]


def tune_costs(model, tune: list[Golden]) -> tuple[int, dict[int, float]]:
    """(context, c(n) for n = 1..GUARD_K + 1 timed at the tune split's median context)."""
    context = int(statistics.median(len(g.prompt_ids) + len(g.output_ids) // 2 for g in tune))
    return context, verify_costs(model.transformer, GUARD_K + 1, context, 5)


def rank_fixed(goldens: list[Golden], costs: dict[int, float], keep: int) -> list:
    """The fixed settings with the best modelled speedup over `goldens` (exact simulation)."""
    runs = sweep(goldens, KS, WINDOWS, FIXED, costs)
    return sorted(runs, key=lambda r: -(r.modelled_speedup() or 0.0))[:keep]


def measure_block(model, goldens: list[Golden], fixed: list, costs: dict, repeats: int,
                  null: bool = False, statistic: str = "median") -> dict:
    """The live guard (measuring its own costs), the `fixed` settings and with `null` a guard
    that never drafts (noise and the spec loop's own overhead alone), measured interleaved."""
    runs = [simulate(goldens, GUARD_K, (1, 4), GuardProposer.name)]
    runs += [simulate(goldens, r.k, r.window, r.proposer, costs) for r in fixed]
    if null:
        runs.append(simulate(goldens, 1, (1, 4), GuardProposer.name, NEVER))
    modelled = [simulate(goldens, GUARD_K, (1, 4), GuardProposer.name, costs), *runs[1:]]
    before, t0 = load(), time.time()
    measured = measure_runs(model, goldens, runs, repeats, cost_repeats=1,
                            statistic=STATISTICS[statistic])
    out = {"goldens": len(goldens), "tokens": sum(len(g.output_ids) for g in goldens),
           "repeats": repeats, "before": before, "after": load(),
           "seconds": round(time.time() - t0, 1),
           "guard_costs_from": next(m.guard_costs_from for m in measured.values()),
           "runs": {run.name: _arm_figures(m, sim)
                    for run, sim, m in zip(runs, modelled, measured.values(), strict=True)}}
    out["targets"] = _targets(list(out["runs"].values())[: 1 + len(fixed)])
    return out


def _arm_figures(m, sim) -> dict:
    """One measured configuration's figures beside its exact counts."""
    worst = m.worst
    # the goldens whose 95% interval lies wholly under the target: surely slower than it
    under = [g.id for g in m.goldens
             if not g.too_short and g.speedup_interval and g.speedup_interval[1] < WORST]
    return {"speedup": m.speedup, "worst": worst.speedup, "worst_id": worst.id,
            "worst_interval": worst.speedup_interval,
            "best": max(g.speedup for g in [g for g in m.goldens if not g.too_short] or m.goldens),
            "plain_tok_s": m.plain_tokens_per_s, "spec_equals_plain": m.spec_equals_plain,
            "counts_match_simulation": m.counts_match_simulation,
            "modelled": sim.modelled_speedup(), "verify_passes": sim.total.verify_passes,
            "drafted": sim.total.drafts_proposed, "accepted": sim.total.drafts_accepted,
            "per_golden": {g.id: g.speedup for g in m.goldens},
            "per_golden_interval": {g.id: g.speedup_interval for g in m.goldens},
            "surely_under": under}


def _targets(arms: list[dict]) -> dict:
    """The guard (first) against the best of the fixed settings (the rest)."""
    guard, *rest = arms
    best = max(rest, key=lambda r: r["speedup"]) if rest else None
    return {"worst": guard["worst"], "worst_met": guard["worst"] >= WORST,
            "worst_interval": guard["worst_interval"], "surely_under": guard["surely_under"],
            "vs_best_fixed": guard["speedup"] / best["speedup"] if best else None}


def bench_golden(model) -> Golden:
    """The bench chain (a 2-cycle) as a golden: `kolibri bench`'s prompt, greedy."""
    prompt = bench_prompt(model)
    chain = generate_plain(model, prompt, BENCH_NEW_TOKENS).output_ids
    return Golden(f"bench-seed{BENCH_SEED}", "bench", "", False, prompt, chain, model.name,
                  model.sha256, {"engine": "kolibri"}, list(model.eos_ids))


def bench_block(model, costs: dict, fixed: int, repeats: int, statistic: str) -> dict:
    """The bench chain measured against the fixed settings that simulate best on it."""
    golden = bench_golden(model)
    block = measure_block(model, [golden], rank_fixed([golden], costs, fixed), costs, repeats,
                          statistic=statistic)
    block["targets"]["met"] = (block["targets"]["vs_best_fixed"] or 0) >= BENCH_SHARE
    return block


def warm(model, tune: list[Golden]) -> dict:
    """What earlier `kolibri generate --spec` runs leave behind: the guard over each tune
    golden's prompt for as many tokens as its output, keeping its timings after each."""
    threads, t0 = get_threads(), time.time()
    _, before = warm_table(model.sha256, model.numerics, threads)
    for g in tune:
        table, _ = warm_table(model.sha256, model.numerics, threads)
        generate_spec(model, g.prompt_ids, len(g.output_ids), GuardProposer(GUARD_K, 1, 4, table))
        keep_table(table, model.sha256, model.numerics, threads)
    table, after = warm_table(model.sha256, model.numerics, threads)
    return {"prompts": len(tune), "seconds": round(time.time() - t0, 1), "before": before,
            "after": after, "cells": len(table.cells())}


class _FedCosts(Proposer):
    """A measuring guard whose table is fed each pass's cost as c(rows), as `kolibri generate`
    feeds it each pass's time (at the context the pass drafted from)."""

    name = GuardProposer.name
    shares_state = GuardProposer.shares_state
    observes = True  # the pass's outcome says how many rows it verified

    def __init__(self, guard: GuardProposer, c):
        self.guard, self.c, self.k = guard, c, guard.k

    def propose(self, context, max_tokens: int) -> list[int]:
        return self.guard.propose(context, max_tokens)

    def observe(self, context, drafted: int, accepted: int) -> None:
        rows = 1 + drafted
        self.guard.costs.add(rows, len(context) - accepted - 1, self.c(rows))


def replay(golden: Golden, proposer, k: int, c, measuring: bool) -> tuple[int, float]:
    """(plain steps, summed c(rows) of the passes) simulating `golden`'s chain; a measuring
    guard's table is fed each pass's time as c(rows) (a 1-token pass takes 1)."""
    sim = simulate_chain(golden.prompt_ids, golden.output_ids,
                         _FedCosts(proposer, c) if measuring else proposer, k)
    return sim.plain_steps, sum(c(1 + d) for d in sim.draft_lengths)


def model_arms(costs: dict[int, float], fixed: list) -> list[tuple]:
    """(name, a new proposer, k, measuring) for the guard measuring its costs from an empty
    table (a first run) and from one holding them (warm: as a later run starts, from what earlier
    runs kept, or from `kolibri bench`), the guard given them, and each fixed setting."""
    seed = [[octave(BENCH_CONTEXT), n, [c]] for n, c in costs.items() if n > 1]
    arms = [("guard k=16 (measuring)", lambda: GuardProposer(GUARD_K, 1, 4, CostTable()),
             GUARD_K, True),
            ("guard k=16 (measuring, warm)", lambda: GuardProposer(
                GUARD_K, 1, 4, CostTable.seeded(seed)), GUARD_K, True),
            ("guard k=16 (given c(n))", lambda: GuardProposer(
                GUARD_K, 1, 4, CostTable.from_costs(costs)), GUARD_K, False)]
    return arms + [(r.name, r.new_proposer, r.k, False) for r in fixed]


def model_block(goldens: list[Golden], arms: list[tuple], c) -> dict[str, dict]:
    """Per arm: the modelled speedup overall (summed plain steps over summed pass costs), the
    worst golden's, and each golden's."""
    out = {}
    for name, new, k, measuring in arms:
        done = [(g.id, *replay(g, new(), k, c, measuring)) for g in goldens]
        worst = min(done, key=lambda d: d[1] / d[2])
        out[name] = {"overall": sum(d[1] for d in done) / sum(d[2] for d in done),
                     "worst": worst[1] / worst[2], "worst_id": worst[0],
                     "worst_tokens": worst[1] + 1,
                     "per_golden": {d[0]: d[1] / d[2] for d in done}}
    return out


def model_targets(costs: dict[int, float], tune: list[Golden], reported: dict[str, list[Golden]],
                  fixed: int, bench: Golden | None = None) -> dict[str, dict[str, dict]]:
    """Per reported goldens set (and the bench chain, if given): `model_block` of the guard's
    arms and the `fixed` best settings on the tune split (on the bench chain: on it)."""
    best = rank_fixed(tune, costs, fixed)
    blocks = [(name, goldens, best) for name, goldens in reported.items()]
    if bench:
        blocks.append(("bench chain", [bench], rank_fixed([bench], costs, fixed)))
    return {name: model_block(goldens, model_arms(costs, settings), cost_model(costs))
            for name, goldens, settings in blocks}
