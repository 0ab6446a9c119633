"""Where the speculative loop's own time goes: a guard that never drafts against plain decoding,
per pass, split into the forward, the proposer and the rest of the loop.

    python probes/loop_overhead.py [--rounds 6] [--goldens 6] [--threads N]

The guard (k 1) is given c(2) = infinity, so it drafts nothing and every pass is one token, as
a plain step is: what is left between the two is the loop's bookkeeping (the null arm of
guard_targets.py, docs/guard.md). Plain and spec take turns over the first `--goldens` chat
goldens for `--rounds` rounds (64 tokens each); printed: the median and mean microseconds per
pass of each part, and the spec pass's total over the plain step's.
"""

import argparse
import statistics
import sys
import time

from kolibri_cli.decode.costs import CostTable
from kolibri_cli.decode.generate import VerifyPass, _Run
from kolibri_cli.decode.proposers import draft, make_proposer, start_request
from kolibri_cli.decode.sampling import GREEDY
from kolibri_cli.engine.jit import get_threads, set_threads
from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
from kolibri_cli.store.models import open_model

NEW_TOKENS = 64


def plain_pass_times(model, prompt_ids, n: int, into: dict) -> None:
    """generate_plain's loop, each step split into its forward and the rest."""
    run = _Run(model, prompt_ids, n, GREEDY, (), None)
    run.commit([run.prefill()], None)
    end = time.perf_counter()
    while not run.done:
        t0 = time.perf_counter()
        logits = run.tf.forward([run.out[-1]], run.last_pos, run.cache)  # [1, V]
        t1 = time.perf_counter()
        run.commit([run.pick(logits[0], len(run.out))], None)
        t2 = time.perf_counter()
        into["plain forward"].append(t1 - t0)
        into["plain rest"].append(t2 - t1 + t0 - end)
        end = t2


def spec_pass_times(model, prompt_ids, n: int, into: dict) -> None:
    """generate_spec's loop with a never-drafting guard, each pass split into the proposer,
    its forward and the rest."""
    proposer = make_proposer("guard", 1, (1, 4), CostTable.from_costs({1: 1.0, 2: float("inf")}))
    start_request(proposer, prompt_ids)
    run = _Run(model, prompt_ids, n, GREEDY, (), None)
    run.commit([run.prefill()], None)
    end = time.perf_counter()
    while not run.done:
        t0 = time.perf_counter()
        drafts = draft(proposer, run.context(), n - len(run.out) - 1)
        t1 = time.perf_counter()
        accepted, new = run.verify(drafts)
        VerifyPass(len(run.out), len(drafts), accepted, ())
        run.commit(new, None)
        t2 = time.perf_counter()
        into["spec proposer"].append(t1 - t0)
        into["spec forward"].append(run.forward_s)
        into["spec rest"].append(t2 - t1 - run.forward_s + t0 - end)
        end = t2


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6, help="rounds of plain and spec")
    p.add_argument("--goldens", type=int, default=6, help="how many chat goldens (first N)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: all)")
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    model = open_model(None)
    goldens = load_goldens(DEFAULT_CHAT)[: args.goldens]
    parts = {k: [] for k in ("plain forward", "plain rest", "spec proposer", "spec forward",
                             "spec rest")}
    for r in range(args.rounds):
        for g in goldens:
            n = min(NEW_TOKENS, len(g.output_ids))
            arms = [plain_pass_times, spec_pass_times]
            for arm in arms if r % 2 == 0 else arms[::-1]:
                arm(model, g.prompt_ids, n, parts)
    print(f"threads {get_threads()}; {len(goldens)} chat goldens x {args.rounds} rounds; "
          f"{len(parts['plain forward'])} plain steps, {len(parts['spec forward'])} spec passes")
    for name, seconds in parts.items():
        print(f"  {name:14s} median {1e6 * statistics.median(seconds):8.1f} us   "
              f"mean {1e6 * statistics.mean(seconds):8.1f} us")
    plain = sum(statistics.median(parts[k]) for k in ("plain forward", "plain rest"))
    spec = sum(statistics.median(parts[k]) for k in ("spec proposer", "spec forward", "spec rest"))
    print(f"  spec pass / plain step (sums of medians): {spec / plain:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
