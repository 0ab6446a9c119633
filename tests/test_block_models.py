"""A model imported from a GGUF runs from the file's own blocks, and its logits are bitwise the
float32 path's on the same (dequantized) weights: for every block type, every L, any split."""

import numpy as np
import pytest

from kolibri_cli.engine import blockfile
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.model import load_model
from kolibri_cli.engine.weights import layout
from kolibri_cli.store import cache, synthetic

pytest.importorskip("gguf")


def tiny_gguf(path, block_type: str, tied: bool = False):
    """2 layers, d 256 (one K-quant super-block a row), 4/2 heads, every matrix `block_type`"""
    synthetic.write(path, n_layers=2, d=256, ff=512, heads=4, kv_heads=2, vocab=300, context=96,
                    tied=tied, types=lambda kind, layer, n: block_type)


def float32_twin(model) -> Transformer:
    """The same model on the float32 path: every tensor decoded, stored as F32 rows."""
    tensors = blockfile.float_tensors(model.path / blockfile.NAME)
    return Transformer(model.config, layout(model.config, tensors))


def split_logits(tf, ids, cuts):
    cache_ = tf.new_cache(len(ids))
    bounds = [0, *cuts, len(ids)]
    return np.concatenate([tf.forward(ids[a:b], a, cache_)
                           for a, b in zip(bounds, bounds[1:], strict=False)])


@pytest.mark.parametrize("block_type", synthetic.TYPES)
def test_blocks_equal_float32_path(kolibri_home, tmp_path, block_type):
    path = tmp_path / f"tiny-{block_type}.gguf"
    tiny_gguf(path, block_type, tied=block_type == "Q4_0")
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name)
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
