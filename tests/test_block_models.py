"""A model imported from a GGUF runs from the file's own blocks, and its logits are bitwise the
float32 path's on the same (dequantized) weights: for every block type, every L, any split."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import LEAN

from kolibri_cli.engine import blockfile
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.model import load_model
from kolibri_cli.engine.weights import layout
from kolibri_cli.store import cache, synthetic

pytest.importorskip("gguf")


def tiny_gguf(path, block_type, tied: bool = False, **shape):
    """2 layers, d 256 (one K-quant super-block a row), 4/2 heads, every matrix `block_type` (or
    each the type `block_type(kind, layer, n_layers)` names); `shape` overrides these sizes"""
    types = block_type if callable(block_type) else lambda kind, layer, n: block_type
    sizes = dict(n_layers=2, d=256, ff=512, heads=4, kv_heads=2, vocab=300, context=96) | shape
    synthetic.write(path, tied=tied, types=types, **sizes)


def float32_twin(model) -> Transformer:
    """The same model on the float32 path: every tensor decoded, stored as F32 rows."""
    tensors = blockfile.float_tensors(model.path / blockfile.NAME)
    return Transformer(model.config, layout(model.config, tensors))


def split_logits(tf, ids, cuts):
    cache_ = tf.new_cache(len(ids))
    bounds = [0, *cuts, len(ids)]
    return np.concatenate([tf.forward(ids[a:b], a, cache_)
                           for a, b in zip(bounds, bounds[1:], strict=False)])


_AVX2 = """
import sys
from pathlib import Path
import numpy as np
from numba.core.registry import cpu_target
from kolibri_cli.engine import simd
from kolibri_cli.engine.model import load_model
assert cpu_target.target_context.codegen().magic_tuple()[1:] == ("haswell", "")
assert not simd.LUT and not simd.VNNI and "avx512f" not in simd.target_features()
folder, numerics, ids, cuts, out = sys.argv[1:]
tf = load_model(Path(folder), "tiny", numerics=numerics, kernels=("lean",)).transformer
ids = np.load(ids)
bounds = [0, *map(int, cuts.split(",")), len(ids)]
cache = tf.new_cache(len(ids))
np.save(out, np.concatenate([tf.forward(ids[a:b], a, cache) for a, b in zip(bounds, bounds[1:])]))
"""


def avx2_split_logits(folder, numerics: str, ids, cuts, tmp_path) -> np.ndarray:
    """`split_logits` of the model in `folder`, computed by a process that compiles kolibri for
    an AVX2 CPU without AVX-512 (numba's target Haswell, with Haswell's own features), with its
    own numba cache; it checks that kolibri took the non-AVX-512 code."""
    env = {k: v for k, v in os.environ.items() if k != "KOLIBRI_SIMD"}
    env |= {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "",
            "NUMBA_CACHE_DIR": str(tmp_path / "numba-haswell")}
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "avx2-logits.npy"
    args = [str(folder), numerics, str(tmp_path / "ids.npy"), ",".join(map(str, cuts)), str(out)]
    proc = subprocess.run([sys.executable, "-c", _AVX2, *args], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return np.load(out)


@pytest.mark.parametrize("block_type", synthetic.TYPES)
def test_blocks_equal_float32_path(kolibri_home, tmp_path, block_type):
    path = tmp_path / f"tiny-{block_type}.gguf"
    tiny_gguf(path, block_type, tied=block_type == "Q4_0")
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, numerics="float32", kernels=LEAN)  # not int16
    assert set(model.weights.storage()) == {block_type}
    blocks, floats = model.transformer, float32_twin(model)
    rng = np.random.default_rng(len(block_type))
    ids = rng.integers(0, model.config.vocab_size, 90)
    want = split_logits(floats, ids, [])
    assert np.isfinite(want).all() and want.std() > 0
    for n in range(1, 17):  # every L as the first call, then decode steps
        assert np.array_equal(split_logits(blocks, ids[:n + 3], [n])[:n], want[:n]), n
    for _ in range(3):
        cuts = sorted(rng.choice(np.arange(1, 90), 5, replace=False).tolist())
        assert np.array_equal(split_logits(blocks, ids, cuts), want), cuts
