"""Per-pass times on the bench chain (a 2-cycle): the guard, warm from the kept timings as
`kolibri generate --spec` starts, against a fixed rule, each pass's time in plain steps.

    python probes/pass_times.py [--runs 16] [--k 16] [--window 1-2] [--threads N]

Plain, the guard and vllm (`--k`, `--window`) take turns over `--runs` rounds. Printed per
configuration: the median decode time and speedup, the draft sequences (rows per pass) most
runs had, each row count's median pass time over the median plain step, and each pass's for the
commonest sequence (a request's first pass at a row count against its later ones); then
`verify_costs`' c(n) at the chain's middle (what guard_targets.py's modelled figures use).
Where the guard's passes trail its model on the bench chain, this shows whether its drafts
(from its own cost table) or the passes' times differ (docs/guard.md, Measured).
"""

import argparse
import statistics
import sys
from collections import Counter, defaultdict

from kolibri_cli.bench.timing import verify_costs
from kolibri_cli.decode.costs import CostTable, warm_table
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import make_proposer
from kolibri_cli.engine.jit import get_threads, set_threads
from kolibri_cli.probe.targets import GUARD_K, bench_golden
from kolibri_cli.store.models import open_model

NEW_TOKENS = 64


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=16, help="rounds of plain, guard and vllm")
    p.add_argument("--k", type=int, default=16, help="vllm's draft length")
    p.add_argument("--window", default="1-2", help="vllm's n-gram window, MIN-MAX")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: all)")
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    low, _, high = args.window.partition("-")
    window = (int(low), int(high or low))
    model = open_model(None)
    golden = bench_golden(model)
    kept, source = warm_table(model.sha256, model.numerics, get_threads())
    print(f"threads {get_threads()}; the guard's costs start from: {source} "
          f"({len(kept.cells())} cells)")
    arms = {"plain": None,
            "guard": lambda: make_proposer("guard", GUARD_K, (1, 4),
                                           CostTable.seeded(kept.cells())),
            f"vllm k={args.k} window={args.window}":
                lambda: make_proposer("vllm", args.k, window)}
    names, results = list(arms), {name: [] for name in arms}
    for r in range(args.runs):
        order = names[r % 3:] + names[:r % 3]
        for name in order if r % 2 == 0 else order[::-1]:
            new = arms[name]
            results[name].append(generate_plain(model, golden.prompt_ids, NEW_TOKENS) if new is None
                                 else generate_spec(model, golden.prompt_ids, NEW_TOKENS, new()))
    step = statistics.median(s for x in results["plain"] for s in x.step_s)
    plain = statistics.median(x.decode_s for x in results["plain"])
    print(f"plain: step {step * 1e3:.2f} ms, decode {plain * 1e3:.1f} ms (medians)")
    for name in names[1:]:
        runs = results[name]
        decode = statistics.median(x.decode_s for x in runs)
        print(f"{name}: decode {decode * 1e3:.1f} ms, speedup {plain / decode:.3f}")
        sequences = Counter(tuple(x.step_rows) for x in runs).most_common(3)
        for rows, count in sequences:
            print(f"   rows per pass {list(rows)}: {count} of {len(runs)} runs")
        common = [x for x in runs if tuple(x.step_rows) == sequences[0][0]]
        print("   the commonest's passes, each's time / plain step: " + " ".join(
            f"{statistics.median(x.step_s[i] for x in common) / step:.2f}"
            for i in range(len(sequences[0][0]))))
        by_rows = defaultdict(list)
        for x in runs:
            for rows, seconds in zip(x.step_rows, x.step_s, strict=True):
                by_rows[rows].append(seconds)
        print("   pass time / plain step by rows: " + " ".join(
            f"{rows}:{statistics.median(v) / step:.2f}" for rows, v in sorted(by_rows.items())))
    middle = len(golden.prompt_ids) + NEW_TOKENS // 2
    rel = verify_costs(model.transformer, max(args.k, GUARD_K) + 1, middle, 3)
    print("verify_costs c(n) at the chain's middle: " + " ".join(
        f"{n}:{c:.2f}" for n, c in sorted(rel.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
