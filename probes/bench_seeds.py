"""How the bench chain's seed was chosen: simulate k=5 window 1-4 over the default model's
greedy continuation of the bench prompt for seeds 0..N-1 and print the pass ratio of each.

    python probes/bench_seeds.py [N]

A seed whose chain cycles from the start reaches the top ratio (63 plain steps / 14 passes);
kolibri_cli.bench.chain.BENCH_SEED is the smallest such seed whose cycle has period 2.
"""

import sys

from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, bench_prompt
from kolibri_cli.decode.generate import generate_plain
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.probe.simulate import simulate_chain
from kolibri_cli.store.models import open_model


def main(n: int) -> None:
    model = open_model()
    print("seed  passes  ratio  accepted/drafted  first tokens")
    for seed in range(n):
        prompt = bench_prompt(model, seed)
        chain = generate_plain(model, prompt, BENCH_NEW_TOKENS).output_ids
        c = simulate_chain(prompt, chain, NgramProposer(5, 1, 4), 5)
        print(f"{seed:4d}  {c.verify_passes:6d}  {c.ratio:5.2f}  "
              f"{c.drafts_accepted:3d}/{c.drafts_proposed:<3d}           {chain[:6]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
