"""The bench chain: a seeded random raw prompt whose greedy continuation cycles early.

It measures the verify pass when drafts ARE accepted (not the proposer): 128 distinct random
ordinary token ids (no control, added or padding ids), 64 new tokens, no chat template.
"""

import numpy as np

BENCH_SEED = 5  # its chain is a 2-cycle from the first token (seeds scanned: docs/bench.md)
BENCH_PROMPT_TOKENS = 128
BENCH_NEW_TOKENS = 64


def bench_prompt(model, seed: int = BENCH_SEED) -> list[int]:
    ordinary = np.asarray(model.tokenizer.ordinary_ids(model.config.vocab_size), dtype=np.int64)
    rng = np.random.default_rng(seed)
    return rng.choice(ordinary, BENCH_PROMPT_TOKENS, replace=False).tolist()
