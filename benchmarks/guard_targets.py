"""The guard's targets, measured: the guard against the best fixed settings, in one interleaved
run per goldens file (docs/guard.md).

    python benchmarks/guard_targets.py prompts QUESTION.jsonl OUTDIR
    python benchmarks/guard_targets.py run --tune TUNE.jsonl --goldens A.jsonl [--goldens B.jsonl]
        [--bench] [--threads N] [--repeats 3] [--fixed 2] [--max-tokens N] [--null]
        [--statistic median|min] [--warm] [--json OUT]

    python benchmarks/guard_targets.py model --costs C1,C2,... --tune TUNE.jsonl --goldens A.jsonl
        [--bench] [--fixed 2] [--max-tokens N]

`prompts` writes the Spec-Bench tune and report splits (first turns, 5 prompts per category,
disjoint) as prompt files for `kolibri goldens record`.

`run`:
1. times c(n), n = 1..17, at the tune split's median context length;
2. ranks every fixed setting (vllm, hf, llamacpp-simple; k 1-8, 10, 12, 16; windows 1-4, 2-4,
   1-2, 1, 2, 3-4) on the tune split by exact simulation and the modelled speedup under that
   c(n), and keeps the best `--fixed` (none of this looks at the reported goldens);
3. per goldens file: the guard (cap 16, measuring its own costs) and those fixed settings,
   measured with the model in one interleaved run (rounds over every golden, plain and each
   configuration taking turns; `--repeats` rounds for the longest golden, more for shorter
   ones; a golden's speedup is the median of its rounds' own ratios of undisturbed times, or
   with `--statistic min` the ratio of the least disturbed ones: docs/probe.md, "Measured
   speedup"), spec == plain and counts == simulation checked;
4. `--null`: also a guard that never drafts, so a golden's ratio is noise and the spec loop's
   own overhead alone (an A/A check of how low the worst golden goes without any drafting);
5. `--bench`: the bench chain (a 2-cycle) likewise, against the fixed settings that simulate
   best on it;
6. `--warm`: first, what a user's earlier `kolibri generate --spec` runs leave behind: the
   guard generates each tune-split golden's first tokens (its prompt, as many tokens as
   measured) and keeps its timings in the kolibri home, so the measured guard starts from kept
   timings instead of calibrating (each block prints where its costs started from).

`model`: no timing, exact counts. The guard as `kolibri generate` runs it (an empty cost table
that every pass then feeds, here with the time the given c(n) says), beside the best `--fixed`
settings on the tune split under that c(n): per goldens file the modelled speedup (plain steps
over the summed c(1 + draft) of the passes) overall and the worst golden; `--bench`: the bench
chain likewise, beside the fixed settings best on it. What the measured figures would be
without noise.

Each block prints the load average before and after. The targets: worst golden >= 0.97x plain,
the guard overall >= the best fixed setting measured, on the bench chain >= 90% of the best
fixed setting.
"""

import argparse
import json
import os
import statistics
import sys
import time

from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, BENCH_SEED, bench_prompt
from kolibri_cli.bench.timing import verify_costs
from kolibri_cli.decode.costs import (
    BENCH_CONTEXT,
    CostTable,
    cost_model,
    keep_table,
    octave,
    warm_table,
)
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import make_proposer
from kolibri_cli.goldens.chains import Golden, load_goldens, read_prompts
from kolibri_cli.probe.measure import measure_runs
from kolibri_cli.probe.report import interval_text
from kolibri_cli.probe.shard import simulate, sweep
from kolibri_cli.probe.simulate import simulate_chain
from kolibri_cli.store.models import open_model

GUARD_K = 16
FIXED = ["vllm", "hf", "llamacpp-simple"]
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


def say(*parts) -> None:
    print(*parts, flush=True)


def write_prompts(question: str, outdir: str) -> None:
    prompts = {p.id: p for p in read_prompts(question)}
    os.makedirs(outdir, exist_ok=True)
    for name, ids in (("tune", TUNE_IDS), ("report", REPORT_IDS)):
        path = os.path.join(outdir, f"specbench_{name}.jsonl")
        with open(path, "w") as f:
            for i in ids:
                p, category = prompts[i], "mt_bench" if i <= MT_BENCH_LAST else prompts[i].category
                f.write(json.dumps({"id": p.id, "category": category, "prompt": p.prompt}) + "\n")
        say(f"wrote {len(ids)} prompts to {path}")


def cut(goldens: list[Golden], max_tokens: int | None) -> list[Golden]:
    if not max_tokens:
        return goldens
    import dataclasses

    return [dataclasses.replace(g, output_ids=g.output_ids[:max_tokens]) for g in goldens]


def rank_fixed(goldens: list[Golden], costs: dict[int, float], keep: int) -> list:
    """The fixed settings with the best modelled speedup over `goldens` (exact simulation)."""
    runs = sweep(goldens, KS, WINDOWS, FIXED, costs)
    return sorted(runs, key=lambda r: -(r.modelled_speedup() or 0.0))[:keep]


def measure_block(model, name: str, goldens: list[Golden], fixed: list, costs: dict,
                  repeats: int, null: bool = False, statistic: str = "median") -> dict:
    runs = [simulate(goldens, GUARD_K, (1, 4), "guard")]  # live: it measures its own costs
    runs += [simulate(goldens, r.k, r.window, r.proposer, costs) for r in fixed]
    if null:  # the spec loop never drafting: what noise and the loop's own overhead alone give
        runs.append(simulate(goldens, 1, (1, 4), "guard", NEVER))
    modelled = [simulate(goldens, GUARD_K, (1, 4), "guard", costs), *runs[1:]]
    say(f"\n== {name}: {len(goldens)} goldens, {sum(len(g.output_ids) for g in goldens)} "
        f"tokens; {', '.join(r.name for r in runs)}; repeats {repeats}")
    before, t0 = load(), time.time()
    say(f"   before: {before}")
    measured = measure_runs(model, goldens, runs, repeats, cost_repeats=1,
                            statistic=STATISTICS[statistic])
    after = load()
    say(f"   after:  {after} ({time.time() - t0:.0f} s)")
    started = next(m.guard_costs_from for m in measured.values())  # the live guard's (first)
    say(f"   the guard's costs started from: {started}")
    out = {"goldens": len(goldens), "before": before, "after": after,
           "seconds": round(time.time() - t0, 1), "guard_costs_from": started, "runs": {}}
    for run, model_run, m in zip(runs, modelled, measured.values(), strict=True):
        worst = m.worst
        # the goldens whose 95% interval lies wholly under the target: surely slower than it
        under = [g.id for g in m.goldens
                 if not g.too_short and g.speedup_interval and g.speedup_interval[1] < WORST]
        out["runs"][run.name] = {
            "speedup": m.speedup, "worst": worst.speedup, "worst_id": worst.id,
            "worst_interval": worst.speedup_interval,
            "best": max(g.speedup for g in [g for g in m.goldens if not g.too_short] or m.goldens),
            "plain_tok_s": m.plain_tokens_per_s, "spec_equals_plain": m.spec_equals_plain,
            "counts_match_simulation": m.counts_match_simulation,
            "modelled": model_run.modelled_speedup(),
            "verify_passes": model_run.total.verify_passes,
            "drafted": model_run.total.drafts_proposed,
            "accepted": model_run.total.drafts_accepted,
            "per_golden": {g.id: g.speedup for g in m.goldens},
            "per_golden_interval": {g.id: g.speedup_interval for g in m.goldens},
            "surely_under": under}
        say(f"   {run.name:34s} overall {m.speedup:5.3f}x  worst {worst.speedup:5.3f}x "
            f"({worst.id}, 95% {interval_text(worst)}; surely under {WORST}: {len(under)})  "
            f"best {out['runs'][run.name]['best']:5.3f}x  plain "
            f"{m.plain_tokens_per_s:5.1f} tok/s  modelled "
            f"{model_run.modelled_speedup():5.3f}x  passes {model_run.total.verify_passes}  "
            f"accepted {model_run.total.drafts_accepted}/{model_run.total.drafts_proposed}  "
            f"spec==plain "
            f"{m.spec_equals_plain}  counts==sim {m.counts_match_simulation}")
    guard, *rest = out["runs"].values()
    rest = rest[: len(fixed)]  # not the null arm
    best = max(rest, key=lambda r: r["speedup"]) if rest else None
    out["targets"] = {
        "worst": guard["worst"], "worst_met": guard["worst"] >= WORST,
        "worst_interval": guard["worst_interval"], "surely_under": guard["surely_under"],
        "vs_best_fixed": guard["speedup"] / best["speedup"] if best else None,
    }
    return out


def bench_golden(model) -> Golden:
    prompt = bench_prompt(model)
    chain = generate_plain(model, prompt, BENCH_NEW_TOKENS).output_ids
    return Golden(f"bench-seed{BENCH_SEED}", "bench", "", False, prompt, chain, model.name,
                  model.sha256, {"engine": "kolibri"}, list(model.eos_ids))


def warm(model, tune: list[Golden]) -> None:
    """The guard over each tune golden's prompt for as many tokens as its (cut) output, keeping
    its timings after each, as `kolibri generate --spec` does (cli/options.py)."""
    from kolibri_cli.engine.jit import get_threads

    threads, t0 = get_threads(), time.time()
    _, before = warm_table(model.sha256, model.numerics, threads)
    for g in tune:
        table, _ = warm_table(model.sha256, model.numerics, threads)
        generate_spec(model, g.prompt_ids, len(g.output_ids),
                      make_proposer("guard", GUARD_K, (1, 4), table))
        keep_table(table, model.sha256, model.numerics, threads)
    table, after = warm_table(model.sha256, model.numerics, threads)
    say(f"warm: the guard over {len(tune)} tune prompts ({time.time() - t0:.0f} s); kept "
        f"timings before: {before}, after: {after} ({len(table.cells())} cells)")


def run(args) -> None:
    from kolibri_cli.engine.jit import get_threads, set_threads

    if args.threads:
        set_threads(args.threads)
    model = open_model(None)
    tune = cut(load_goldens(args.tune), args.max_tokens)
    context = int(statistics.median(len(g.prompt_ids) + len(g.output_ids) // 2 for g in tune))
    say(f"threads {get_threads()}; {args.statistic} of {args.repeats} rounds; {load()}")
    costs = verify_costs(model.transformer, GUARD_K + 1, context, 5)
    say(f"c(n) at {context} cached positions, n = 1..{GUARD_K + 1}: "
        + ", ".join(f"{c:.2f}" for c in costs.values()))
    if args.warm:
        warm(model, tune)
    fixed = rank_fixed(tune, costs, args.fixed)
    say("best fixed on the tune split (modelled): "
        + "; ".join(f"{r.name} {r.modelled_speedup():.3f}x" for r in fixed))
    report = {"threads": get_threads(), "repeats": args.repeats, "max_tokens": args.max_tokens,
              "statistic": args.statistic, "warm": args.warm,
              "costs": costs, "context": context,
              "fixed": [[r.proposer, r.k, list(r.window), r.modelled_speedup()] for r in fixed],
              "blocks": {}}
    for path in args.goldens:
        goldens = cut(load_goldens(path), args.max_tokens)
        report["blocks"][path] = measure_block(model, path, goldens, fixed, costs, args.repeats,
                                               args.null, args.statistic)
    if args.bench:
        golden = bench_golden(model)
        on_bench = rank_fixed([golden], costs, args.fixed)
        block = measure_block(model, "bench chain", [golden], on_bench, costs, args.repeats,
                              statistic=args.statistic)
        block["targets"]["met"] = (block["targets"]["vs_best_fixed"] or 0) >= BENCH_SHARE
        report["blocks"]["bench"] = block
    say("\ntargets:")
    for name, block in report["blocks"].items():
        t = block["targets"]
        say(f"   {name}: guard worst {t['worst']:.3f}x (>= {WORST}: {t['worst_met']}; goldens "
            f"whose 95% interval is wholly under it: {len(t['surely_under'])}), "
            f"guard / best fixed {t['vs_best_fixed']:.3f}")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json)


class _FedCosts:
    """A measuring guard whose table is fed each pass's cost as c(rows), as `kolibri generate`
    feeds it each pass's time (at the context the pass drafted from)."""

    def __init__(self, guard, c):
        self.guard, self.c = guard, c

    def __getattr__(self, name):
        return getattr(self.guard, name)

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
    warm = [[octave(BENCH_CONTEXT), n, [c]] for n, c in costs.items() if n > 1]
    arms = [("guard k=16 (measuring)", lambda: make_proposer("guard", GUARD_K, (1, 4),
                                                             CostTable()), GUARD_K, True),
            ("guard k=16 (measuring, warm)", lambda: make_proposer(
                "guard", GUARD_K, (1, 4), CostTable.seeded(warm)), GUARD_K, True),
            ("guard k=16 (given c(n))", lambda: make_proposer(
                "guard", GUARD_K, (1, 4), CostTable.from_costs(costs)), GUARD_K, False)]
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


def model(args) -> dict[str, dict]:
    costs = {n: float(x) for n, x in enumerate(args.costs.split(","), start=1)}
    fixed = rank_fixed(cut(load_goldens(args.tune), args.max_tokens), costs, args.fixed)
    blocks = [(path, cut(load_goldens(path), args.max_tokens), fixed) for path in args.goldens]
    if args.bench:
        golden = bench_golden(open_model(None))
        blocks.append(("bench chain", [golden], rank_fixed([golden], costs, args.fixed)))
    report = {}
    for name, goldens, best in blocks:
        say(f"== {name}: {len(goldens)} goldens (modelled, exact counts)")
        report[name] = model_block(goldens, model_arms(costs, best), cost_model(costs))
        for arm, m in report[name].items():
            say(f"   {arm:34s} overall {m['overall']:5.3f}x  worst {m['worst']:5.3f}x "
                f"({m['worst_id']}, {m['worst_tokens']} tokens)")
    return report


def main(argv: list[str]) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts", help="write the Spec-Bench tune and report prompt files")
    p.add_argument("question")
    p.add_argument("outdir")
    r = sub.add_parser("run", help="measure the targets")
    r.add_argument("--tune", required=True, help="goldens the fixed settings are chosen on")
    r.add_argument("--goldens", action="append", default=[], help="goldens reported on")
    r.add_argument("--bench", action="store_true", help="also the bench chain")
    r.add_argument("--threads", type=int, default=0, help="kernel threads (0: all cores)")
    r.add_argument("--repeats", type=int, default=3, help="rounds of the longest golden; a "
                   "shorter one runs in more, up to 4x, so each is timed over as many tokens")
    r.add_argument("--fixed", type=int, default=2, help="fixed settings measured")
    r.add_argument("--max-tokens", type=int, default=None, help="first N output ids of each")
    r.add_argument("--json", help="write the figures here")
    r.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                   help="a golden's figures from its rounds: median (of each round's ratio), "
                   "or min (the least disturbed times)")
    r.add_argument("--warm", action="store_true", help="first keep the guard's timings from "
                   "the tune prompts, as earlier `kolibri generate --spec` runs would")
    r.add_argument("--null", action="store_true", help="also a guard that never drafts (k 1, "
                   "c(2) huge): the spread noise and the spec loop alone give per golden")
    m = sub.add_parser("model", help="the guard and the best fixed settings modelled (no timing)")
    m.add_argument("--costs", required=True, help="c(1),c(2),... e.g. as timed by `run`")
    m.add_argument("--tune", required=True, help="goldens the fixed settings are chosen on")
    m.add_argument("--goldens", action="append", default=[], help="goldens reported on")
    m.add_argument("--fixed", type=int, default=2, help="fixed settings modelled")
    m.add_argument("--max-tokens", type=int, default=None, help="first N output ids of each")
    m.add_argument("--bench", action="store_true", help="also the bench chain (generated with "
                   "the default model), beside the fixed settings best on it")
    args = parser.parse_args(argv)
    if args.command == "prompts":
        write_prompts(args.question, args.outdir)
    elif args.command == "model":
        return model(args)
    else:
        run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
