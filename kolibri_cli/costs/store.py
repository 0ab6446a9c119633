"""c(n) as `kolibri bench` measured it, kept in the kolibri home so `kolibri probe` prices forward
passes, and `kolibri generate`'s adaptive proposers draft, with this host's kernel rather than a
guess.

One JSON file, `bench-costs.json`, with one entry per (model sha256, threads, numerics): the
runs that timed it (the latest KEEP_RUNS), each with its provenance (when, kolibri and commit,
CPU, kernel) and every round it timed, c(n) per round. Measurements are kept, not overwritten:
the entry's c(n) is the median over the rounds of the runs of the latest run's kernel (the same
kolibri, commit, CPU and kernel id), whose spread the probe carries into its interval; runs of
another kernel stay as history but price nothing. Format 1 files (one median curve per entry, no
runs) are still read, as one run without rounds. Written whole and atomically under a lock (two
benches never lose each other's entries); a file that does not parse is a KolibriError naming
it, never half-used. Non-goal: costs of other engines (a server's c(n) is timed by the probe
itself).
"""

import json
import math
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.home import cache_root, make_private
from kolibri_cli.store.atomic import write_text_atomic

FILE = "bench-costs.json"
MAX_ROWS = 65536  # the most tokens of one forward a stored c(n) may name
FORMAT = 2  # the file's "format" written; READ formats are read, another value is refused
READ = (1, 2)  # 1: one median curve per entry, no runs
KEEP_RUNS = 8  # runs kept per entry: the most recent
MAX_ROUNDS = 64  # rounds a stored run may hold


@dataclass(frozen=True)
class BenchRun:
    """One run that timed c(n): when, by what, and each round's c(n)."""

    measured_at: str  # ISO 8601, UTC, seconds
    kolibri: str  # kolibri's version
    commit: str  # the git commit kolibri ran from, "" if not a checkout
    cpu: str  # the host's CPU model
    kernel: str  # kernel_id() of the kernel timed ("": from before kernels were named)
    rounds: tuple  # ({n: c(n)}, ...): each round's forward(n) / forward(1)

    @property
    def provenance(self) -> tuple[str, str, str, str]:
        return self.kolibri, self.commit, self.cpu, self.kernel

    def to_json(self) -> dict:
        return asdict(self) | {"rounds": [{str(n): c for n, c in sorted(r.items())}
                                          for r in self.rounds]}

    @classmethod
    def from_json(cls, obj) -> "BenchRun":
        if not isinstance(obj, dict) or set(obj) != set(cls.__dataclass_fields__):
            raise ValueError("a run without the expected keys")
        strings = ("measured_at", "kolibri", "commit", "cpu", "kernel")
        if not all(isinstance(obj[k], str) for k in strings):
            raise ValueError("a run with a non-string date or version")
        if not isinstance(obj["rounds"], list) or len(obj["rounds"]) > MAX_ROUNDS:
            raise ValueError("a run whose rounds are not a list")
        return cls(**{k: obj[k] for k in strings},
                   rounds=tuple(_costs(r) for r in obj["rounds"]))


def median_costs(rounds) -> dict[int, float]:
    """c(n) per n: the median over the rounds that timed n."""
    ns = sorted({n for r in rounds for n in r})
    return {n: statistics.median(r[n] for r in rounds if n in r) for n in ns}


@dataclass(frozen=True)
class BenchCosts:
    """One `kolibri bench` run's c(n) and what it ran on."""

    model: str  # the model's name as bench showed it
    model_sha256: str  # Model.sha256: what goldens record as model_sha256
    threads: int  # kernel threads
    numerics: str  # Model.numerics: "float32" (the stored values), "q8_0", "int8" or "int16"
    costs: dict[int, float]  # c(n) = forward(n) / forward(1), n = 1..k+1
    measured_at: str  # ISO 8601, UTC, seconds
    kolibri: str  # kolibri's version
    commit: str  # the git commit kolibri ran from, "" if not a checkout
    cpu: str  # the host's CPU model
    kernel: str = ""  # kernel_id() of the kernel timed; "" in files written before it was kept
    runs: tuple = field(default=(), compare=False)  # BenchRun, oldest first (the latest: the
    # fields above); () in an entry made before it is saved

    @property
    def key(self) -> tuple[str, int, str]:
        return self.model_sha256, self.threads, self.numerics

    @property
    def provenance(self) -> tuple[str, str, str, str]:
        return self.kolibri, self.commit, self.cpu, self.kernel

    @property
    def priced_runs(self) -> list:
        """The runs of the latest run's kernel: what `costs` is the median of."""
        return [r for r in self.runs if r.provenance == self.provenance]

    @property
    def rounds(self) -> tuple:
        """Every round of the priced runs (a run without rounds: its curve, as one)."""
        return tuple(x for r in self.priced_runs for x in (r.rounds or ()))

    @property
    def date(self) -> str:
        """"2026-11-30 22:41 UTC": when it was measured, for one line of output."""
        return self.measured_at[:16].replace("T", " ") + " UTC"

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "runs"} | {
            "costs": {str(n): c for n, c in sorted(self.costs.items())},
            "runs": [r.to_json() for r in self.runs]}

    @classmethod
    def from_json(cls, obj) -> "BenchCosts":
        """An entry as read from the file; anything else is a ValueError saying what."""
        optional = {"kernel", "runs"}
        if not isinstance(obj, dict) or set(obj) - optional != set(
                cls.__dataclass_fields__) - optional:
            raise ValueError("an entry without the expected keys")
        obj = {"kernel": ""} | obj  # an entry from before kernels were named: a stale one
        strings = ("model", "model_sha256", "numerics", "measured_at", "kolibri", "commit", "cpu",
                   "kernel")
        if not all(isinstance(obj[k], str) for k in strings):
            raise ValueError("an entry with a non-string name, date or version")
        if isinstance(obj["threads"], bool) or not isinstance(obj["threads"], int) \
                or obj["threads"] < 1:
            raise ValueError(f"threads {obj['threads']!r}")
        entry = cls(**{k: obj[k] for k in strings}, threads=obj["threads"],
                    costs=_costs(obj["costs"]))
        if "runs" not in obj:  # format 1: its median curve, as one run without rounds
            return replace(entry, runs=(_run_of(entry, ()),))
        if not isinstance(obj["runs"], list) or not obj["runs"]:
            raise ValueError("an entry without runs")
        return replace(entry, runs=tuple(BenchRun.from_json(r) for r in obj["runs"]))


def _run_of(entry: BenchCosts, rounds) -> BenchRun:
    return BenchRun(entry.measured_at, entry.kolibri, entry.commit, entry.cpu, entry.kernel,
                    tuple(rounds) or (dict(entry.costs),))


def _costs(raw) -> dict[int, float]:
    """{"1": 1.0, "2": 1.49, ...}: n from 1 (consecutive, or a grid: 1..16, 24, 32, ...) up to
    MAX_ROWS, finite positive c(n), c(1) = 1."""
    if not isinstance(raw, dict) or not raw or any(
            isinstance(c, bool) or not isinstance(c, int | float) for c in raw.values()):
        raise ValueError("costs that are not a table of numbers c(n)")
    try:
        costs = {int(n): float(c) for n, c in raw.items()}
    except ValueError:
        raise ValueError(f"costs {raw!r}") from None
    if 1 not in costs or costs[1] != 1.0 or min(costs) < 1 or max(costs) > MAX_ROWS or any(
            not math.isfinite(c) or c <= 0 for c in costs.values()):
        raise ValueError(f"costs {raw!r}: c(1) = 1 and finite positive c(2), c(3), ...")
    return dict(sorted(costs.items()))


def entry_for(model, threads: int, costs: dict[int, float], rounds=()) -> BenchCosts:
    """The entry for c(n) just timed on `model` (an engine Model) with `threads` threads, by this
    kolibri on this CPU (`rounds`: each round's c(n), `costs` their median)."""
    from kolibri_cli import __version__

    entry = BenchCosts(model=model.name, model_sha256=model.sha256, threads=threads,
                       numerics=model.numerics, costs=costs, measured_at=now(),
                       kolibri=__version__, commit=source_commit(), cpu=cpu_model(),
                       kernel=kernel_id())
    return replace(entry, runs=(_run_of(entry, rounds),))


def path() -> Path:
    return cache_root() / FILE


def load() -> list[BenchCosts]:
    """Every stored entry ([] when bench never ran); an unreadable file is a KolibriError."""
    file = path()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise KolibriError(f"cannot read {file}: {getattr(e, 'strerror', None) or e}") from None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") not in READ:
            raise ValueError(f"not format {' or '.join(map(str, READ))}")
        entries = doc.get("entries")
        if not isinstance(entries, list):
            raise ValueError("no list of entries")
        return [BenchCosts.from_json(e) for e in entries]
    except (ValueError, RecursionError, OverflowError, TypeError) as e:
        raise KolibriError(f"{file} is not a kolibri bench costs file ({e}); delete it, and "
                           "`kolibri bench` writes a new one") from None


def save(entry: BenchCosts, notify=None) -> BenchCosts:
    """Add `entry`'s run to the stored runs of its key (the latest KEEP_RUNS kept) and return
    what is kept for the key: c(n) the median over the rounds of the runs of this kernel (a
    narrow `kolibri bench --k 1` does not throw away c(2..9) or a curve that still hold; runs of
    another kernel stay, pricing nothing). An unreadable file is replaced (said through
    `notify`): it only ever held measurements bench can take again."""
    from filelock import FileLock

    make_private(cache_root() / "locks")
    with FileLock(str(cache_root() / "locks" / f"{FILE}.lock")):
        try:
            entries = load()
        except KolibriError as e:
            if notify:
                notify(f"note: {str(e).split('; ')[0]}: replacing it")
            entries = []
        stored = next((e for e in entries if e.key == entry.key), None)
        runs = (*(stored.runs if stored else ()), *(entry.runs or (_run_of(entry, ()),)))
        entry = replace(entry, runs=runs[-KEEP_RUNS:])
        entry = replace(entry, costs=median_costs(entry.rounds))
        kept = [e for e in entries if e.key != entry.key]
        doc = {"format": FORMAT, "entries": [e.to_json() for e in [*kept, entry]]}
        write_text_atomic(path(), json.dumps(doc, indent=1) + "\n")
    return entry


def keep(model, threads: int, costs: dict[int, float], notify=None, rounds=()) -> list[int]:
    """Keep a bench run's c(n) of `model` on `threads` (`save`); the n whose c(n) an earlier run
    of the same kernel timed and this one did not, kept beside them."""
    entry = entry_for(model, threads, costs, rounds)
    return sorted(set(save(entry, notify).costs) - set(entry.costs))


def forget(model_sha256: str) -> int:
    """Drop the entries of one model (`kolibri model rm`): how many were dropped. A file that
    does not parse is left as it is."""
    from filelock import FileLock

    if not path().is_file():
        return 0
    with FileLock(str(cache_root() / "locks" / f"{FILE}.lock")):
        try:
            entries = load()
        except KolibriError:
            return 0
        kept = [e for e in entries if e.model_sha256 != model_sha256]
        if len(kept) < len(entries):
            doc = {"format": FORMAT, "entries": [e.to_json() for e in kept]}
            write_text_atomic(path(), json.dumps(doc, indent=1) + "\n")
    return len(entries) - len(kept)


def timed_here(entry: BenchCosts) -> bool:
    """The entry was timed by this kolibri (version and commit) and kernel on this CPU."""
    from kolibri_cli import __version__

    here = (__version__, source_commit(), cpu_model(), kernel_id())
    return (entry.kolibri, entry.commit, entry.cpu, entry.kernel) == here


def kernel_id() -> str:
    """The compiled forward kernel: the key of its numba cache (the engine's sources, numba,
    llvmlite, KOLIBRI_SIMD) and the CPU numba compiles for. Any change makes a new id, so c(n)
    timed on another kernel reads as stale."""
    from llvmlite import binding
    from numba.core import config

    from kolibri_cli.engine import jitcache

    kernel = jitcache.cache_dir(Path(jitcache.__file__)).name
    target = f"{config.CPU_NAME or binding.get_host_cpu_name()} {config.CPU_FEATURES or ''}"
    return f"{kernel} {target}"


def find(entries: list[BenchCosts], model_sha256: str, numerics: str,
         threads: int | None = None) -> BenchCosts | None:
    """The latest entry for this model and numerics, with `threads` threads (None: any)."""
    found = [e for e in entries if e.model_sha256 == model_sha256 and e.numerics == numerics
             and threads in (None, e.threads)]
    return max(found, key=lambda e: e.measured_at, default=None)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit() -> str:
    """The git commit of the checkout kolibri runs from (an editable install), else ""."""
    here = Path(__file__).resolve().parent
    if not any((p / ".git").exists() for p in here.parents):
        return ""
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
