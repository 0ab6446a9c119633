"""Every everyday path compiled after a machine's first run, in a process of its own.

A command that loads a cached model whose paths are not all compiled yet starts
`python -m kolibri_cli.bench.warm PATH NAME NUMERICS` at the lowest priority (nice 19: the command
keeps the CPU, the compile takes what it leaves) and goes on. That process compiles, or loads
from numba's cache, each part a README command reaches (`PARTS`: the kernel's plain, verify and
tree specializations, the drafters and their cost model, sampling, bench's timers), then writes a
marker: later runs start nothing. numba writes each compiled function to a temporary file and
renames it, so a compile that is interrupted leaves nothing half written (the next run starts
it again, and loads what was done); a lock lets one run at a time. A command that needs more
than plain decoding while it runs waits for it (`wait`, its progress shown), rather than
compiling the same functions beside it on the same cores.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from kolibri_cli.callbacks import Compiling, Notify, Preparing
from kolibri_cli.engine import jitcache

LOCK = "warm.lock"
STATUS = "warm-status.json"
POLL_S = 0.25
WAIT_S = 300  # a command waits this long for a background compile, then compiles its own part
WORDS = {  # the parts past the kernel's, as a user knows what they serve
    "drafting": "the drafters and their cost model (speculative decoding)",
    "sampling": "sampling (--temperature)",
    "bench": "the bench's timers (kolibri bench)",
}


def start(model) -> bool:
    """Start the background compile for `model` when some everyday path of it is not compiled
    yet (no marker), its compiled code is kept on disk, and none runs already; whether it
    started. A user's folder starts nothing (it may be gone by the time the compile runs), nor
    does KOLIBRI_WARM=0."""
    if not _wanted(model) or _marker(model).exists() or _held():
        return False
    # -P: the current folder is not on its path (a user's or --user site-packages install still
    # imports); it lowers its own priority first thing (no preexec_fn: this process has threads)
    cmd = [sys.executable, "-P", "-m", "kolibri_cli.bench.warm", str(model.path), model.name,
           model.numerics]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return False  # each path compiles on its first use instead, as without this
    # reaped when it ends (a long `serve` keeps no zombie); it outlives a command that ends first
    threading.Thread(target=proc.wait, name="kolibri-warm-reaper", daemon=True).start()
    return True


def wait(notify: Notify | None = None, preparing: Preparing | None = None,
         compiling: Compiling | None = None) -> None:
    """Return when no background compile runs, or after WAIT_S of one (the command then
    compiles what it needs itself); while one does, say so and relay its progress (the part it
    prepares, the functions compiled) to `preparing` and `compiling`."""
    if jitcache.distrusted() is not None or not _held():
        return
    if notify:
        notify("an earlier run is compiling kolibri's other paths in the background; "
               "waiting for it (once per machine) ...")
    shown, since = None, time.monotonic()
    while _held():
        if time.monotonic() - since > WAIT_S:
            if notify:
                notify(f"the background compile still runs after {WAIT_S} s; compiling what this "
                       "command needs here instead")
            return
        status = _status()
        if status and status != shown:
            shown = status
            if preparing:
                preparing(status["what"], status["done"], status["parts"])
            if compiling:
                compiling("", status["functions"], 1)
        time.sleep(POLL_S)


def _wanted(model) -> bool:
    return (bool(model.source_sha256) and model.weights is not None
            and os.environ.get("KOLIBRI_WARM", "1").lower() not in ("0", "false", "no", "off")
            and jitcache.distrusted() is None and not _in_memory())


def _in_memory() -> bool:
    from kolibri_cli.engine.kernel import compiles_in_memory

    return compiles_in_memory()


def _marker(model) -> Path:
    """Names the model's folder, its numeric path and the sources of every package compiled
    here (a new version of any is a new marker)."""
    from kolibri_cli.bench import timing
    from kolibri_cli.costs import model as costs
    from kolibri_cli.decode import sampling
    from kolibri_cli.decode.proposers import guard
    from kolibri_cli.decode.proposers.llamacpp import simple
    from kolibri_cli.engine import kernel

    folders = [jitcache.cache_dir(Path(m.__file__)).name
               for m in (kernel, guard, simple, sampling, costs, timing)]
    key = hashlib.sha256(repr((str(model.path), model.numerics, folders)).encode())
    return jitcache.numba_root() / f"warm-{key.hexdigest()[:16]}"


def _held() -> bool:
    """Whether a background compile holds the lock now."""
    path = jitcache.numba_root() / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # never made: none ever ran
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # a shared lock taken here goes with it


def _status() -> dict | None:
    """The running compile's progress: {"what", "done", "parts", "functions"} (JSON, from our
    own folder: `wait` reads it only where jitcache trusts the folder)."""
    try:
        status = json.loads((jitcache.numba_root() / STATUS).read_text(encoding="utf-8"))
        return status if {"what", "done", "parts", "functions"} <= set(status) else None
    except (OSError, ValueError, TypeError):
        return None


def _write(path: Path, text: str) -> None:
    """Written whole or not at all (a reader never sees half a file); a failure is no error:
    the progress or the marker is missing, nothing worse."""
    from kolibri_cli.errors import KolibriError
    from kolibri_cli.store.atomic import write_text_atomic

    with contextlib.suppress(KolibriError, OSError):
        write_text_atomic(path, text)


@contextlib.contextmanager
def _lock():
    """The lock, held for the block; None when another process holds it."""
    root = jitcache.numba_root()
    from kolibri_cli.home import make_private

    make_private(root)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


def compile_all(path: Path, name: str, numerics: str) -> None:
    """Each part compiled or loaded (the process `start` runs), its progress in STATUS, then
    the marker; nothing when another process compiles or the marker is there."""
    from kolibri_cli.engine.jit import compile_events
    from kolibri_cli.engine.model import load_model

    with _lock() as mine:
        if not mine:
            return
        model = load_model(path, name, weights=True, numerics=numerics, kernels=("lean",))
        if _marker(model).exists():
            return
        parts = [*(lambda k=k: model.transformer.warm_up((k,)) for k in ("lean", "verify",
                                                                           "tree")),
                 lambda: _drafting(model), _sampling, _bench]
        from kolibri_cli.engine.kernel import KERNEL_WORDS

        words = [KERNEL_WORDS[k] for k in ("lean", "verify", "tree")] + list(WORDS.values())
        state = {"what": words[0], "done": 0, "parts": len(parts), "functions": 0}

        def compiled(what: str, finished: int, under_way: int) -> None:
            if finished != state["functions"]:
                state["functions"] = finished
                _write(jitcache.numba_root() / STATUS, json.dumps(state))

        with compile_events(compiled):
            for i, (part, what) in enumerate(zip(parts, words, strict=True)):
                state.update(what=what, done=i)
                _write(jitcache.numba_root() / STATUS, json.dumps(state))
                part()
        _write(_marker(model), "")
        with contextlib.suppress(OSError):
            (jitcache.numba_root() / STATUS).unlink()


def _drafting(model) -> None:
    """A few tokens with each drafter kernel and the guard's cost table, as `generate --spec`
    and `serve` run them (the timings are not kept)."""
    from kolibri_cli.decode.drafting import warm_costs
    from kolibri_cli.decode.generate import generate_spec
    from kolibri_cli.decode.proposers import DEFAULT_SPEC_PROPOSER, default_settings, make_proposer
    from kolibri_cli.engine.jit import get_threads

    name = DEFAULT_SPEC_PROPOSER
    costs = warm_costs(name, None, model, get_threads())
    ids = model.tokenizer.encode("Hello, hello, hello")[:8] or [0]
    generate_spec(model, ids, 4, make_proposer(name, *default_settings(name), costs=costs))


def _sampling() -> None:
    from kolibri_cli.decode.sampling import Sampler, Sampling

    Sampler(Sampling(temperature=1.0))


def _bench() -> None:
    import numpy as np

    from kolibri_cli.bench.timing import _parallel_sum

    _parallel_sum(np.ones(1 << 10, np.float32))  # as measure_read_bandwidth calls it


if __name__ == "__main__":
    os.nice(19)  # the command that started it keeps the CPU
    compile_all(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
