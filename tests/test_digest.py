"""One set of bits per numeric path on every x86 host: a digest of each path's logits (every
position, every vocabulary entry) on a fixed prompt of a small random model, recorded once.
Whichever CPU runs this checks its bits against the recorded ones, so a host-dependent bit (an
ISA variant, a vectorizer's width, a library's sum) fails on the first machine that has it.

When a path's arithmetic changes on purpose (and its fidelity is re-measured), record its new
digest here: the failure message prints it."""

import hashlib
from dataclasses import replace

import numpy as np
import pytest
from tiny_models import TINY

from kolibri_cli.engine import simd8
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights

# recorded on an AMD EPYC (Zen 3, AVX2, no AVX-512)
# hidden 448 = 14 blocks (int16 groups of 8, 4 and 2), intermediate 512 = 16 blocks
CONFIG = replace(TINY, vocab_size=96, hidden_size=448, intermediate_size=512, head_dim=32)
PROMPT = [3, 17, 42, 5, 88, 61, 2, 95, 30, 7, 54, 19]

DIGESTS = {  # sha256 of logits [12, 96] float32 (bytes), first 16 hex digits
    "float32": "f1235795b94a8f6c",
    "q8_0": "9fabb052c88e07b5",
    "int8": "b794e1b6a3f76403",
    "int16": "fc0d92c62690a89c",  # the lane-per-block arithmetic (engine/int16.py)
}


def _logits(numerics: str) -> np.ndarray:
    tf = Transformer(CONFIG, random_weights(CONFIG, seed=5, scale=0.2, storage=numerics))
    return tf.forward(PROMPT, 0, tf.new_cache(len(PROMPT)))


@pytest.mark.bitwise
@pytest.mark.parametrize("numerics", list(DIGESTS))
def test_each_numeric_path_gives_its_recorded_bits(numerics):
    if numerics == "int16" and not simd8.F16C:
        pytest.skip("the int16 path needs F16C in numba's target (refused without it)")
    logits = _logits(numerics)
    assert logits.shape == (len(PROMPT), CONFIG.vocab_size) and np.all(np.isfinite(logits))
    digest = hashlib.sha256(logits.tobytes()).hexdigest()[:16]
    assert digest == DIGESTS[numerics], f"{numerics}: recorded {DIGESTS[numerics]!r}, " \
                                        f"this host gives {digest!r}"
