"""How the bench chain's seed was chosen: simulate k=5 window 1-4 over the default model's
greedy continuation of the bench prompt for seeds 0..N-1 and print the pass ratio of each.

    python probes/bench_seeds.py [N] [PATH ...]    (PATH: a numeric path, default float32 int16)

A seed whose chain cycles from the start reaches the top ratio (63 plain steps / 14 passes);
kolibri_cli.bench.chain.BENCH_SEED is the smallest seed whose chain cycles with period 2 from the
first token on every path listed: the chain is random tokens, so a logit that moves in its last
bits on another path can change it.
"""

import sys

from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, bench_prompt
from kolibri_cli.decode.generate import generate_plain
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.probe.simulate import simulate_chain
from kolibri_cli.store.models import open_model


def main(n: int, paths: list[str]) -> None:
    models = {p: open_model(numerics=p) for p in paths}
    print("seed  path      passes  ratio  accepted/drafted  first tokens")
    for seed in range(n):
        for path, model in models.items():
            prompt = bench_prompt(model, seed)
            chain = generate_plain(model, prompt, BENCH_NEW_TOKENS).output_ids
            c = simulate_chain(prompt, chain, NgramProposer(5, 1, 4), 5)
            print(f"{seed:4d}  {path:8s}  {c.verify_passes:6d}  {c.ratio:5.2f}  "
                  f"{c.drafts_accepted:3d}/{c.drafts_proposed:<3d}           {chain[:6]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20, sys.argv[2:] or ["float32", "int16"])
