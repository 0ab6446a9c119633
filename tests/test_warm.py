"""The background compile after a first run (bench/warm.py): it compiles every everyday path of a
model and leaves a marker; a cached model whose marker is missing starts one, a user's folder or
KOLIBRI_WARM=0 none, a second while one runs none; a command that needs those paths waits for
the running one, relaying its progress, and goes on once its lock is released."""

import json
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from kolibri_cli.bench import warm

WAIT_S = 900  # bounded: a cold numba cache compiles the tiny kernel for minutes on 2 cores


@pytest.fixture
def numba_root(tmp_path, monkeypatch):
    """warm's files in a folder of this test's (the compiled code stays in the session's)."""
    root = tmp_path / "numba"
    root.mkdir(mode=0o700)
    monkeypatch.setattr(warm.jitcache, "numba_root", lambda: root)
    return root


def _cached(folder, numerics="float32"):
    """A model as the cache opens it (a source sha256), without loading its weights."""
    return SimpleNamespace(path=folder, name="tiny", numerics=numerics, source_sha256="ab" * 32,
                           weights=object())


def test_compile_all_compiles_every_part_and_leaves_the_marker(numba_root, tiny_llama_folder):
    folder = tiny_llama_folder()
    assert not warm._marker(_cached(folder)).exists()
    warm.compile_all(folder, "tiny", "float32")
    assert warm._marker(_cached(folder)).exists()
    assert not (numba_root / warm.STATUS).exists()  # done: no progress left to show
    assert not warm.start(_cached(folder))  # nothing left to compile: nothing started
    assert not warm._marker(_cached(folder, "q8_0")).exists()  # another numeric path: its own


def test_start_runs_the_compile_in_the_background_once(tiny_llama_folder, monkeypatch):
    """In the session's numba folder (the child finds it by NUMBA_CACHE_DIR, as a real run
    does); the marker names this test's model folder, no other test's."""
    model = _cached(tiny_llama_folder())
    assert not warm.start(SimpleNamespace(**vars(model) | {"source_sha256": ""}))  # a folder
    assert not warm.start(model)  # KOLIBRI_WARM=0, as conftest sets it
    monkeypatch.setenv("KOLIBRI_WARM", "1")
    hold = _holder(warm.jitcache.numba_root())  # one is running: a second is not started
    assert not warm.start(model)
    hold.stdin.close()
    hold.wait(WAIT_S)
    started = _children()
    assert warm.start(model)
    new = _children() - started
    assert len(new) == 1
    deadline = time.monotonic() + WAIT_S
    while _alive(new) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(new)
    assert warm._marker(model).exists()
    assert not warm.start(model)  # warm now


def test_wait_relays_the_running_compiles_progress_until_its_lock_is_released(numba_root):
    from kolibri_cli.engine.kernel import KERNEL_WORDS

    warm._write(numba_root / warm.STATUS, json.dumps(
        {"what": KERNEL_WORDS["verify"], "done": 1, "parts": 6, "functions": 40}))
    hold, seen, notes = _holder(numba_root), [], []
    waiting = threading.Thread(target=warm.wait, args=(
        notes.append, lambda *a: seen.append(("part", *a)),
        lambda *a: seen.append(("functions", *a))), daemon=True)
    waiting.start()
    deadline = time.monotonic() + WAIT_S
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting.is_alive()  # held: still waiting
    hold.stdin.close()
    waiting.join(WAIT_S)
    assert not waiting.is_alive()
    assert seen[:2] == [("part", KERNEL_WORDS["verify"], 1, 6), ("functions", "", 40, 1)]
    assert len(notes) == 1 and "waiting" in notes[0]


def test_wait_gives_up_after_its_bound(numba_root, monkeypatch):
    """A background compile that never ends (stuck, stopped) does not hang a command: after
    WAIT_S it says so and returns, and the command compiles its own part."""
    monkeypatch.setattr(warm, "WAIT_S", 0.5)
    hold, notes = _holder(numba_root), []
    try:
        waiting = threading.Thread(target=warm.wait, args=(notes.append,), daemon=True)
        waiting.start()
        waiting.join(WAIT_S)
        assert not waiting.is_alive()  # returned while the lock is still held
        assert warm._held()
        assert len(notes) == 2 and "compiling what this command needs here" in notes[1]
    finally:
        hold.stdin.close()
        hold.wait(WAIT_S)


def test_only_a_plain_decoding_command_starts_the_background_compile(monkeypatch):
    """A command that compiled more than plain decoding (spec, bench, serve, probe) may time
    what it runs next: it starts no compile beside it."""
    from kolibri_cli.cli import options

    started = []
    monkeypatch.setattr(warm, "start", lambda model: started.append(model) or False)
    monkeypatch.setattr(warm, "wait", lambda *a: None)
    monkeypatch.setattr("kolibri_cli.store.models.open_model", lambda *a, **k: "model")
    options.load_model("m", drafter=None)
    assert started == ["model"]
    options.load_model("m")  # everything: bench, probe, serve
    options.load_model("m", drafter=SimpleNamespace(trees=False))  # generate --spec
    assert started == ["model"]


def test_wait_returns_at_once_when_none_runs(numba_root):
    notes = []
    warm.wait(notes.append)
    assert notes == []


def _holder(root) -> subprocess.Popen:
    """A process holding warm's lock until its stdin closes."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(root / warm.LOCK)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def _children() -> set[int]:
    """The pids of this test's `kolibri_cli.bench.warm` processes."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return {int(line.split()[0]) for line in out.splitlines()
            if "kolibri_cli.bench.warm" in line and "ps -eo" not in line}


def _alive(pids: set[int]) -> bool:
    return bool(pids & _children())
