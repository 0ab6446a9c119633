"""The bench chain: a seeded random raw prompt whose greedy continuation cycles early.

It measures the verify pass when drafts ARE accepted (not the proposer): 128 distinct random
token ids (control tokens excluded), 64 new tokens, no chat template.
"""

import numpy as np

BENCH_SEED = 5  # its chain is a 2-cycle from the first token (seeds scanned: docs/bench.md)
BENCH_PROMPT_TOKENS = 128
BENCH_NEW_TOKENS = 64
FIRST_ORDINARY_ID = 17  # ids 0-16 are control tokens in the default model


def bench_prompt(vocab_size: int, seed: int = BENCH_SEED) -> list[int]:
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(FIRST_ORDINARY_ID, vocab_size), BENCH_PROMPT_TOKENS, replace=False)
    return ids.tolist()
