"""The guard's targets, measured or modelled: the guard against the best fixed settings
(docs/guard.md, "The targets"; the figures come from kolibri_cli/probe/targets.py).

    python probes/guard_targets.py prompts QUESTION.jsonl OUTDIR
    python probes/guard_targets.py run --tune TUNE.jsonl --goldens A.jsonl [--goldens B.jsonl]
        [--bench] [--threads N] [--repeats 3] [--fixed 2] [--max-tokens N] [--null]
        [--statistic median|min] [--warm] [--json OUT]
    python probes/guard_targets.py model --costs C1,C2,... --tune TUNE.jsonl --goldens A.jsonl
        [--bench] [--fixed 2] [--max-tokens N]

`prompts` writes the Spec-Bench tune and report splits as prompt files for `kolibri goldens
record`.

`run`: times c(n), n = 1..17, at the tune split's median context; ranks every fixed setting
(vllm, hf, llamacpp-simple; k 1-8, 10, 12, 16; windows 1-4, 2-4, 1-2, 1, 2, 3-4) on the tune
split by exact simulation under that c(n) and keeps the best `--fixed`; then per goldens file
measures the guard (cap 16, measuring its own costs) and those settings in one interleaved run
(`--repeats` rounds for the longest golden, more for shorter ones; a golden's speedup is the
median of its rounds' own ratios, or with `--statistic min` the ratio of the least disturbed
ones: docs/simulation.md, "Measured speedup"). `--null` adds a guard that never drafts (an A/A arm:
noise and the spec loop's own time alone); `--bench` the bench chain against the fixed settings
best on it; `--warm` first runs the guard over the tune prompts and keeps its timings, as
earlier `kolibri generate --spec` runs would.

`model`: no timing, exact counts under the given c(n): the guard measuring its costs from an
empty table and from a warm one, the guard given c(n), and the best `--fixed` settings.
"""

import argparse
import json
import sys

from kolibri_cli.engine.jit import get_threads, set_threads
from kolibri_cli.goldens.chains import load_goldens
from kolibri_cli.probe import targets as t
from kolibri_cli.probe.report import fmt_ratio
from kolibri_cli.store.atomic import write_text_atomic
from kolibri_cli.store.models import open_model


def say(*parts) -> None:
    print(*parts, flush=True)


def print_block(name: str, block: dict) -> None:
    say(f"\n== {name}: {block['goldens']} goldens, {block['tokens']} tokens; repeats "
        f"{block['repeats']}; {block['seconds']:.0f} s")
    say(f"   before: {block['before']}\n   after:  {block['after']}")
    say(f"   the guard's costs started from: {block['guard_costs_from']}")
    for arm, r in block["runs"].items():
        interval = " - ".join(map(fmt_ratio, r["worst_interval"] or [])) or "-"
        say(f"   {arm:34s} overall {r['speedup']:5.3f}x  worst {r['worst']:5.3f}x "
            f"({r['worst_id']}, 95% {interval}; surely under {t.WORST}: "
            f"{len(r['surely_under'])})  best {r['best']:5.3f}x  plain {r['plain_tok_s']:5.1f} "
            f"tok/s  modelled {r['modelled']:5.3f}x  passes {r['verify_passes']}  accepted "
            f"{r['accepted']}/{r['drafted']}  spec==plain {r['spec_equals_plain']}  "
            f"counts==sim {r['counts_match_simulation']}")


def print_targets(blocks: dict) -> None:
    say("\ntargets:")
    for name, block in blocks.items():
        g = block["targets"]
        say(f"   {name}: guard worst {g['worst']:.3f}x (>= {t.WORST}: {g['worst_met']}; goldens "
            f"whose 95% interval is wholly under it: {len(g['surely_under'])}), "
            f"guard / best fixed {g['vs_best_fixed']:.3f}")


def run(args) -> None:
    if args.threads:
        set_threads(args.threads)
    model = open_model(None)
    tune = t.cut(load_goldens(args.tune), args.max_tokens)
    say(f"threads {get_threads()}; {args.statistic} of {args.repeats} rounds; {t.load()}")
    context, costs = t.tune_costs(model, tune)
    say(f"c(n) at {context} cached positions, n = 1..{t.GUARD_K + 1}: "
        + ", ".join(f"{c:.2f}" for c in costs.values()))
    if args.warm:
        w = t.warm(model, tune)
        say(f"warm: the guard over {w['prompts']} tune prompts ({w['seconds']:.0f} s); kept "
            f"timings before: {w['before']}, after: {w['after']} ({w['cells']} cells)")
    fixed = t.rank_fixed(tune, costs, args.fixed)
    say("best fixed on the tune split (modelled): "
        + "; ".join(f"{r.name} {r.modelled_speedup():.3f}x" for r in fixed))
    report = {"threads": get_threads(), "repeats": args.repeats, "max_tokens": args.max_tokens,
              "statistic": args.statistic, "warm": args.warm, "costs": costs,
              "context": context,
              "fixed": [[r.proposer, r.k, list(r.window), r.modelled_speedup()] for r in fixed],
              "blocks": {}}
    for path in args.goldens:
        goldens = t.cut(load_goldens(path), args.max_tokens)
        block = t.measure_block(model, goldens, fixed, costs, args.repeats, args.null,
                                args.statistic)
        print_block(path, block)
        report["blocks"][path] = block
    if args.bench:
        report["blocks"]["bench"] = t.bench_block(model, costs, args.fixed, args.repeats,
                                                  args.statistic)
        print_block("bench chain", report["blocks"]["bench"])
    print_targets(report["blocks"])
    if args.json:
        write_text_atomic(args.json, json.dumps(report, indent=1))


def model(args) -> dict:
    costs = {n: float(x) for n, x in enumerate(args.costs.split(","), start=1)}
    reported = {path: t.cut(load_goldens(path), args.max_tokens) for path in args.goldens}
    bench = t.bench_golden(open_model(None)) if args.bench else None
    report = t.model_targets(costs, t.cut(load_goldens(args.tune), args.max_tokens), reported,
                             args.fixed, bench)
    for name, arms in report.items():
        say(f"== {name}: {len(reported.get(name, [bench]))} goldens (modelled, exact counts)")
        for arm, m in arms.items():
            say(f"   {arm:34s} overall {m['overall']:5.3f}x  worst {m['worst']:5.3f}x "
                f"({m['worst_id']}, {m['worst_tokens']} tokens)")
    return report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("prompts", help="write the Spec-Bench tune and report prompt files")
    s.add_argument("question")
    s.add_argument("outdir")
    r = sub.add_parser("run", help="measure the targets")
    m = sub.add_parser("model", help="the guard and the best fixed settings modelled (no timing)")
    m.add_argument("--costs", required=True, help="c(1),c(2),... e.g. as timed by `run`")
    for a in (r, m):
        a.add_argument("--tune", required=True, help="goldens the fixed settings are chosen on")
        a.add_argument("--goldens", action="append", default=[], help="goldens reported on")
        a.add_argument("--bench", action="store_true", help="also the bench chain")
        a.add_argument("--fixed", type=int, default=2, help="fixed settings compared")
        a.add_argument("--max-tokens", type=int, default=None, help="first N output ids of each")
    r.add_argument("--threads", type=int, default=0, help="kernel threads (0: all cores)")
    r.add_argument("--repeats", type=int, default=3, help="rounds of the longest golden; a "
                   "shorter one runs in more, up to 4x, so each is timed over as many tokens")
    r.add_argument("--json", help="write the figures here")
    r.add_argument("--statistic", choices=sorted(t.STATISTICS), default="median",
                   help="a golden's figures from its rounds: median (of each round's ratio), "
                   "or min (the least disturbed times)")
    r.add_argument("--warm", action="store_true", help="first keep the guard's timings from "
                   "the tune prompts, as earlier `kolibri generate --spec` runs would")
    r.add_argument("--null", action="store_true", help="also a guard that never drafts (k 1, "
                   "c(2) huge): the spread noise and the spec loop alone give per golden")
    return p


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    if args.command == "prompts":
        for path in t.write_splits(args.question, args.outdir):
            say(f"wrote {path}")
    elif args.command == "model":
        model(args)
    else:
        run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
