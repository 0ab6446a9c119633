"""The same model gives the same bits whatever CPU numba compiled the kernel for.

numba compiles for the host CPU; `NUMBA_CPU_NAME` makes it compile for another one while
keeping the host's instruction set (numba passes the host's features), so what changes is
LLVM's tuning for that CPU: its preferred vector width and cost model. A sum LLVM may
re-associate then came out in another order on an Intel server CPU (8 lanes) than on AMD Zen 5
(16 lanes): every logit's low bits moved, and the int8 path, which rounds activations to 8 bits,
turned that into different greedy tokens; both integer paths (int8, int16) are checked. Each
target runs in a process with its own numba cache; with the host's instruction set it runs on
any CPU, so nothing is skipped for missing features.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import LEAN
from numba.core.registry import cpu_target
from test_block_models import split_logits, tiny_gguf

from kolibri_cli.engine.model import load_model
from kolibri_cli.store import cache

pytest.importorskip("gguf")
# Intel server tuning (prefers 256-bit vectors) and AMD Zen 4 tuning (512-bit): on either CPU,
# at least one of them is not the host's own choice
TARGETS = ("icelake-server", "znver4")

_LOGITS = """
import sys
from pathlib import Path
import numpy as np
from numba.core.registry import cpu_target
from kolibri_cli.engine.model import load_model
folder, out = Path(sys.argv[1]), sys.argv[2]
ids, cuts = (np.array(a.split(","), np.int64) for a in sys.argv[3:5])
bounds = [0, *cuts, len(ids)]
got = {}
for numerics in ("float32", "int8", "int16"):
    tf = load_model(folder, "tiny", numerics=numerics, kernels=("lean",)).transformer
    c = tf.new_cache(len(ids))
    got[numerics] = np.concatenate([tf.forward(ids[a:b], a, c) for a, b in zip(bounds, bounds[1:])])
np.savez(out, cpu=cpu_target.target_context.codegen()._get_host_cpu_name(), **got)
"""
CUTS = [37, 38]  # of 40 tokens: a 37-token prefill, a 1-token decode, a 2-token verify


def _compiled_for() -> str:
    return cpu_target.target_context.codegen()._get_host_cpu_name()


@pytest.mark.bitwise
@pytest.mark.parametrize("target", TARGETS)
def test_logits_do_not_depend_on_the_cpu_compiled_for(kolibri_home, tmp_path, target):
    if target == _compiled_for():
        pytest.skip(f"this process already compiles for {target}")
    path = tmp_path / "tiny-Q4_1.gguf"
    tiny_gguf(path, "Q4_1", tied=True)
    name, folder = cache.import_gguf(path)
    ids = np.arange(40) * 7 % 300
    env = os.environ | {"NUMBA_CPU_NAME": target, "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    env.pop("NUMBA_CPU_FEATURES", None)
    out = tmp_path / "logits.npz"
    args = [str(folder), str(out), ",".join(map(str, ids)), ",".join(map(str, CUTS))]
    proc = subprocess.run([sys.executable, "-c", _LOGITS, *args], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    theirs = np.load(out)
    assert str(theirs["cpu"]) == target  # really compiled for the other CPU
    for numerics in ("float32", "int8", "int16"):
        ours = split_logits(load_model(folder, name, numerics=numerics, kernels=LEAN).transformer,
                            ids, CUTS)
        assert ours.std() > 0 and np.array_equal(theirs[numerics], ours), numerics


# numpy picks its loops by the CPU it runs on (AVX-512: Intel SVML's float32 power; AVX2: the C
# library's; FMA or not in its float32 cos/sin). Disabling every optional target makes this host
# run numpy as a CPU without them would; the kernel's own code stays the host's build.
_NUMPY_BASELINE = """
import sys
from pathlib import Path
import numpy as np
from kolibri_cli.engine.model import load_model
folder, out = Path(sys.argv[1]), sys.argv[2]
ids, cuts = (np.array(a.split(","), np.int64) for a in sys.argv[3:5])
bounds = [0, *cuts, len(ids)]
got = {}
for numerics in ("float32", "int8", "int16"):
    tf = load_model(folder, "tiny", numerics=numerics, kernels=("lean",)).transformer
    c = tf.new_cache(len(ids))
    got[numerics] = np.concatenate([tf.forward(ids[a:b], a, c) for a, b in zip(bounds, bounds[1:])])
np.savez(out, **got)
"""


def _numpy_targets() -> str:
    from numpy._core._multiarray_umath import __cpu_dispatch__
    return " ".join(__cpu_dispatch__)


@pytest.mark.bitwise
def test_logits_do_not_depend_on_numpys_cpu_dispatch(kolibri_home, tmp_path):
    """Float32, int8 and int16 logits of a default-shaped model (head_dim 64, 9/3 heads, rows of
    576) are bitwise those of a process whose numpy runs without its AVX2/AVX-512 loops: an int8
    golden recorded on an AVX-512 host diverged on AVX2 through the RoPE tables' last bits."""
    path = tmp_path / "tiny-Q4_1.gguf"
    tiny_gguf(path, "Q4_1", tied=True, d=576, ff=1536, heads=9, kv_heads=3)
    name, folder = cache.import_gguf(path)
    ids = np.arange(40) * 7 % 300
    env = os.environ | {"NPY_DISABLE_CPU_FEATURES": _numpy_targets()}
    out = tmp_path / "logits.npz"
    args = [str(folder), str(out), ",".join(map(str, ids)), ",".join(map(str, CUTS))]
    proc = subprocess.run([sys.executable, "-c", _NUMPY_BASELINE, *args], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    theirs = np.load(out)
    for numerics in ("float32", "int8", "int16"):
        ours = split_logits(load_model(folder, name, numerics=numerics, kernels=LEAN).transformer,
                            ids, CUTS)
        assert ours.std() > 0 and np.array_equal(theirs[numerics], ours), numerics
