"""The kernel compiled ahead, in a child process, for a model's block types (store/precompile.py)
is the specialization the model itself then loads from numba's cache: loading and generating
compiles nothing more, and the child's compile events reach the parent's callback."""

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
    assert ahead.proc.returncode == 0
    assert events[0][2] == 1 and events[-1][2] == 0 and events[-1][1] > 10
    assert "kernel._forward" in {what for what, _, _ in events}  # named as numba reports it
    out = subprocess.run([sys.executable, "-c", CHECK, name], capture_output=True, text=True,
                         env=os.environ, check=True).stdout
    assert json.loads(out) == []  # the decode and prefill paths: all from the cache
