"""Benchmark: chains vs trees head to head on the chat goldens (not a test; prints ratios).

    .venv/bin/python probes/tree_bench.py [--proposer suffix:8:1-4 --proposer adaptive-tree:16]
        [--rounds 5] [--threads 2] [--json]

Each round runs every golden plainly and with every proposer given (NAME[:K[:WINDOW]], default
settings where omitted), rotating the order from golden to golden so that machine noise hits all
alike; a round's speedup of a proposer = the round's plain decode seconds / its spec decode
seconds over all goldens. Reported: the median over rounds (and each round), the modelled
speedup with c(n) timed in the same run, spec ids == plain ids, the proposer's time per pass, a
verify pass's cost in plain decode steps (measured, and what c(1 + drafts) models), and c(n) of a
chain and of a tree forward of n tokens timed side by side.
One proposer instance per proposer and round serves the goldens in file order, as the probe does.
"""

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from kolibri_cli.bench.timing import verify_costs
from kolibri_cli.decode.costs import cost_model
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import default_settings, make_proposer, parse_window
from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
from kolibri_cli.probe.shard import simulate

DEFAULT = ["suffix:8:1-4", "sglang:4:1-12", "adaptive-tree:16"]


def parse(spec: str) -> tuple[str, int, tuple[int, int]]:
    name, *rest = spec.split(":")
    k, window = default_settings(name)
    if rest:
        k = int(rest[0])
    if len(rest) > 1:
        window = parse_window(rest[1])
    return name, k, window


def tree_costs(model, max_n: int, context_len: int = 150, repeats: int = 5) -> dict:
    """c(n) of a chain and of a tree (a binary tree in breadth-first order: node j's parent is
    (j - 1) // 2) of n tokens, time / time of a 1-token forward, timed interleaved in one run."""
    cache = model.new_cache(context_len + max_n)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, context_len + max_n)
    model.prefill(ids[:context_len], 0, cache)
    tokens = ids[context_len:]
    shapes = {"chain": lambda n: None, "tree": lambda n: [-1, *((j - 1) // 2 for j in range(1, n))]}
    times = {(kind, n): [] for kind in shapes for n in range(1, max_n + 1)}
    for r in range(repeats + 1):  # the first round warms up
        for kind, n in times:
            cache.length = context_len
            t0 = time.perf_counter()
            model.forward(tokens[:n], context_len, cache, parents=shapes[kind](n))
            if r:
                times[(kind, n)].append(time.perf_counter() - t0)
    one = float(np.median(times[("chain", 1)]))
    return {kind: {n: float(np.median(times[(kind, n)])) / one for n in range(1, max_n + 1)}
            for kind in shapes}


def one_round(model, goldens, configs, costs, r: int) -> dict:
    """Decode seconds per mode over all goldens, the plain chains, spec ids == plain ids, and the
    proposers' seconds and passes."""
    secs = {"plain": 0.0} | dict.fromkeys(configs, 0.0)
    same, prop, passes = dict.fromkeys(configs, True), dict.fromkeys(configs, 0.0), dict.fromkeys(
        configs, 0)
    forwards = {"plain": 0} | dict.fromkeys(configs, 0)  # decode forwards (prefill not counted)
    drafters = {c: make_proposer(*parse(c), costs=costs) for c in configs}
    order, chains = ["plain", *configs], []
    for i, g in enumerate(goldens):
        n, shift, outs = len(g.output_ids), (i + r) % len(order), {}
        for mode in order[shift:] + order[:shift]:
            if mode == "plain":
                run = generate_plain(model, g.prompt_ids, n)
            else:
                run = generate_spec(model, g.prompt_ids, n, drafters[mode])
                prop[mode] += run.proposer_s
                passes[mode] += len(run.passes)
            secs[mode] += run.decode_s
            forwards[mode] += run.forward_passes - 1
            outs[mode] = run.output_ids
        for c in configs:
            same[c] &= outs[c] == outs["plain"]
        chains.append(replace(g, output_ids=outs["plain"]))
    return {"secs": secs, "same": same, "proposer_s": prop, "passes": passes, "chains": chains,
            "forwards": forwards}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--proposer", action="append", help="NAME[:K[:WINDOW]] (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from kolibri_cli.store.models import open_model

    if args.threads:
        from kolibri_cli.engine.jit import set_threads

        set_threads(args.threads)
    model = open_model(None)
    model.transformer.warm_up()
    goldens = load_goldens(DEFAULT_CHAT)
    configs = args.proposer or DEFAULT
    ks = [parse(c)[1] for c in configs]
    rel = verify_costs(model.transformer, max(ks) + 1, 150, 3)  # c(n) at a chat context
    shapes = tree_costs(model.transformer, max(ks) + 1)
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(model, goldens, configs, rel, r))
        sp = {c: rounds[-1]["secs"]["plain"] / rounds[-1]["secs"][c] for c in configs}
        print(f"round {r + 1}: " + ", ".join(f"{c} {v:.3f}x" for c, v in sp.items()),
              file=sys.stderr, flush=True)
    report = {"costs": {str(n): c for n, c in rel.items()}, "rounds": args.rounds,
              "forward_costs": {kind: {str(n): c for n, c in cs.items()}
                                for kind, cs in shapes.items()},
              "proposers": {}}
    c_of = cost_model(rel)
    for c in configs:
        name, k, window = parse(c)
        ratios = [rd["secs"]["plain"] / rd["secs"][c] for rd in rounds]
        sim = simulate(rounds[0]["chains"], k, window, name, rel)  # the model's own chains
        total = sim.total
        by_length = total.passes_by_draft_length()  # passes per draft length (summed counts)
        pass_costs = sum(n * c_of(1 + d) for d, n in enumerate(by_length))
        modelled = total.plain_steps / pass_costs
        prop = sum(rd["proposer_s"][c] for rd in rounds) / max(sum(rd["passes"][c]
                                                                    for rd in rounds), 1)
        # what a verify pass cost, in plain decode steps: measured (spec decode seconds per
        # forward over plain decode seconds per forward; proposer time included) and modelled
        step_s = sum(rd["secs"]["plain"] for rd in rounds) / sum(rd["forwards"]["plain"]
                                                               for rd in rounds)
        pass_s = sum(rd["secs"][c] for rd in rounds) / sum(rd["forwards"][c] for rd in rounds)
        report["proposers"][c] = {
            "median_speedup": statistics.median(ratios), "speedups": ratios,
            "modelled_speedup": modelled, "ratio": total.ratio,
            "pass_cost_measured": pass_s / step_s,
            "pass_cost_modelled": pass_costs / total.verify_passes,
            "drafts_per_pass": total.drafts_proposed / total.verify_passes,
            "spec_equals_plain": all(rd["same"][c] for rd in rounds),
            "proposer_us_per_pass": 1e6 * prop,
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"c(n) at context 150: {', '.join(f'{n}:{v:.3f}' for n, v in rel.items())}")
    for kind, cs in shapes.items():
        print(f"c(n) of a {kind:5s} forward: {', '.join(f'{n}:{v:.3f}' for n, v in cs.items())}")
    print(f"{'proposer':24s} {'median':>8s} {'rounds':>30s} {'modelled':>9s} {'ratio':>6s} "
          f"{'drafts/pass':>11s} {'pass cost':>10s} {'modelled':>9s} {'us/pass':>8s} ids")
    for c, p in report["proposers"].items():
        rounds_txt = " ".join(f"{v:.2f}" for v in p["speedups"])
        print(f"{c:24s} {p['median_speedup']:7.3f}x {rounds_txt:>30s} "
              f"{p['modelled_speedup']:8.3f}x {p['ratio']:5.2f}x {p['drafts_per_pass']:11.2f} "
              f"{p['pass_cost_measured']:10.3f} {p['pass_cost_modelled']:9.3f} "
              f"{p['proposer_us_per_pass']:8.0f} {'same' if p['spec_equals_plain'] else 'DIFF'}")


if __name__ == "__main__":
    main()
