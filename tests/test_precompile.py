"""The kernel compiled ahead, in child processes, for a model's block types (store/precompile.py)
is the specialization the model itself then loads from numba's cache: loading and generating
compiles nothing more, and the children's compile events reach the parent's callback. Its two
halves (engine/kernel.py compile_half) are what the kernel calls: compiled apart, the kernel's
own compile then links them and compiles only its top functions."""

import json
import os
import subprocess
import sys

import pytest
from test_block_models import tiny_gguf

from kolibri_cli.store import cache, precompile

pytest.importorskip("gguf")

CHECK = """
import json, sys
from kolibri_cli.engine.jit import compile_events
from kolibri_cli.store.models import open_model
seen = []
with compile_events(lambda what, done, busy: seen.append(what)):
    m = open_model(sys.argv[1], kernels=("lean",))
    m.transformer.prefill(list(range(40)), 0, m.transformer.new_cache(48))
print(json.dumps(seen))
"""


def test_compiled_ahead_is_what_the_model_loads(kolibri_home, tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))  # empty: all compiles here
    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, lambda kind, layer, n: "Q8_0" if kind == "token_embd" else "Q4_0")
    name, _ = cache.import_gguf(path)
    events = []
    ahead = precompile.start(("Q4_0", "Q8_0"), lambda *e: events.append(e))
    assert ahead is not None
    ahead.wait()
    assert [p.returncode for p in ahead.procs] == [0] * len(ahead.procs)
    assert len(ahead.procs) == (2 if precompile._cores() >= 2 else 1)
    assert events[0][2] == 1 and events[-1][2] == 0 and events[-1][1] > 10
    assert "kernel._forward" in {what for what, _, _ in events}  # named as numba reports it
    out = subprocess.run([sys.executable, "-c", CHECK, name], capture_output=True, text=True,
                         env=os.environ, check=True).stdout
    assert json.loads(out) == []  # the decode and prefill paths: all from the cache


def test_the_pull_compiles_ahead_what_the_default_path_runs(kolibri_home, tmp_path, monkeypatch):
    """A registry model of Q8_0 embedding and Q4_1 layers (the default model's types), compiled
    ahead as a pull does (store/models.py): its default path (int16 on a CPU with AVX2 and F16C)
    then loads and runs with nothing compiled in the foreground."""
    from kolibri_cli.engine.kernel import _specs
    from kolibri_cli.engine.model import folder_numerics, load_weights
    from kolibri_cli.engine.weights import kernel_types
    from kolibri_cli.store import models

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))  # empty: all compiles here
    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, lambda kind, layer, n: "Q8_0" if kind == "token_embd" else "Q4_1")
    name, folder = cache.import_gguf(path)
    types = ("Q8_0", "Q4_1")  # the embedding's first
    numerics = folder_numerics(folder)
    m = models.open_model(name, weights=False)
    tiny = precompile.tiny_model(kernel_types(types, numerics))[1]
    assert _specs(tiny) == _specs(load_weights(folder, m.config, numerics))
    source = cache.WheelSource("x==1", "x.gguf", "0" * 64, kernel_types=types)
    monkeypatch.setitem(cache.REGISTRY, "not-pulled", source)
    ahead = models._compile_ahead("not-pulled", None, None)
    assert ahead is not None
    ahead.wait()
    assert [p.returncode for p in ahead.procs] == [0] * len(ahead.procs)
    out = subprocess.run([sys.executable, "-c", CHECK, name], capture_output=True, text=True,
                         env=os.environ, check=True).stdout
    assert json.loads(out) == []  # the default path's decode and prefill: all from the cache


TOP = {"kernel._layer", "kernel._forward", "kernel._attend_for.chain", "matmul.n_rows", ""}


def _compiled(half: str, stdin: str = "") -> list[str]:
    """The kolibri functions a precompile child reported compiling, in order ("waiting": the
    rest half is done, the kernel's own compile follows)."""
    out = subprocess.run([sys.executable, "-m", "kolibri_cli.store.precompile", "--half", half,
                          "Q4_0", "Q8_0"], input=stdin, capture_output=True, text=True,
                         env=os.environ, check=True).stdout
    return [line.split("\t")[0] for line in out.splitlines()]


def test_the_halves_are_what_the_kernel_calls(tmp_path, monkeypatch):
    """The matmul half compiles matmul only; the rest half everything else the kernel calls but
    matmul; after both, the kernel's compile adds its top functions only (its callees all come
    from the cache: the halves were compiled for the argument types the kernel passes)."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    matmul = set(_compiled("matmul"))
    assert "matmul._run" in matmul and not {w for w in matmul if not w.startswith("matmul.")} - {""}
    rest = _compiled("rest", "go\n")
    half, top = rest[:rest.index("waiting")], set(rest[rest.index("waiting") + 1:])
    assert {"attention.attention", "attention.qkv_to_cache", "matmul.embed_rows"} <= set(half)
    assert "matmul._run" not in half
    assert "kernel._forward" in top and top <= TOP, top - TOP
