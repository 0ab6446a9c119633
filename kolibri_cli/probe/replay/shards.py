"""The simulation at scale: goldens streamed in pieces, replayed by any number of workers, merged
exactly.

Work is a list of tasks, each a piece of one golden file (or goldens given in memory) and the
configurations to replay on it. Proposers that start fresh at each chain take pieces of any
size; a proposer that shares state across requests takes a whole file as one ordered stream
(a file is one server's traffic: its state starts fresh at each file, so the counts do not
depend on how the work is spread). Results come back in task order and are summed as integers:
any number of workers, local or on Ray, gives the totals of one process, per-chain rows in
input order, and categories in order of first appearance.
Non-goals: where the tasks run (workers.py), rendering, the model.
"""

import dataclasses
import gc
import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kolibri_cli.decode.proposers import DEFAULT_PROPOSER, LlamaCppOptions
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.goldens.stream import (
    PIECE_BYTES,
    Piece,
    find_golden_files,
    limit_stops,
    piece_size,
    plan_pieces,
    read_piece,
)
from kolibri_cli.probe.config import ProbeConfig
from kolibri_cli.probe.replay import ChainCounts, Chains, Replayer, SimConfig
from kolibri_cli.probe.result import counts_json
from kolibri_cli.probe.simulate import Counts, GoldenSim, SimRun
from kolibri_cli.text import shown

ROWS_IN_REPORT = 1000  # per-chain rows stay in the report up to this many chains...
REPORT_ROWS_BYTES = 16 << 20  # ...of an input of at most this size (else --rows FILE has them)
BATCH = 1024  # chains replayed per compiled call
MAX_SEEDS = 64  # sampled chains: counts kept per seed up to this many seeds (for their spread)
PARALLEL_MIN_BYTES = 2 * PIECE_BYTES  # less input runs in one process unless told otherwise
FAST_MIN_STEPS = 50_000  # below, in a task's first batch, compiling (3-8 s once) costs more


@dataclass(frozen=True)
class Task:
    """Replay `configs` over one piece of a golden file, or over goldens given in memory."""

    configs: tuple[SimConfig, ...]
    piece: Piece | None = None
    goldens: tuple[Golden, ...] = ()  # in memory (the bench chain, a list handed to simulate)
    category: tuple[str, ...] | None = None  # keep only these categories
    where: str | None = None  # and only the goldens meeting this (probe/where.py)
    max_tokens: int | None = None  # replay only the first N output ids of each golden
    keep_rows: bool = False  # send back each chain's counts (for the report)
    rows_json: bool = False  # send back each chain's counts as JSONL (for --rows FILE)
    fast_path: bool | None = None  # compiled replays: None = for big tasks; False = never

    @property
    def nbytes(self) -> int:
        return 0 if self.piece is None else piece_size(self.piece)


@dataclass
class Share:
    """One configuration's counts over one task."""

    total: Counts
    categories: dict[str, Counts] = field(default_factory=dict)
    chains: int = 0
    rows: list[GoldenSim] | None = None
    rows_json: list[bytes] = field(default_factory=list)  # JSONL, a chunk per batch
    eos_ids: frozenset = frozenset()
    by_seed: dict[tuple[int, str], Counts] = field(default_factory=dict)  # (seed, category)


@dataclass
class TaskResult:
    shares: list[Share]  # one per configuration of the task, in its order
    nbytes: int  # the piece's size on disk
    cpu_seconds: float  # CPU time the task took in its worker (reading, parsing, replaying)


@dataclass
class Throughput:
    """How fast the simulation went (so far, during a run)."""

    chains: int = 0  # distinct goldens replayed
    replays: int = 0  # (golden, configuration) pairs replayed
    steps: int = 0  # plain decode steps simulated, summed over configurations
    seconds: float = 0.0  # wall time
    cpu_seconds: float = 0.0  # summed over the tasks: what the work costs, however busy the cores
    done_bytes: int = 0
    total_bytes: int = 0
    workers: int = 1
    executor: str = "local"  # "local" (one process), "processes" or "ray"

    @property
    def replays_per_s(self) -> float:
        return self.replays / self.seconds if self.seconds else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0

    @property
    def steps_per_cpu_s(self) -> float:
        """Decode steps per CPU-second of the workers: the speed of one core."""
        return self.steps / self.cpu_seconds if self.cpu_seconds else 0.0

    def line(self, configurations: int) -> str:
        """One line: what was simulated, how fast, on how many workers."""
        per = f"{self.steps_per_s / self.workers / 1e6:.2f}M per worker, " \
            if self.workers > 1 else ""
        where = {"local": "1 process", "processes": f"{self.workers} processes",
                 "ray": f"Ray, {self.workers} CPUs"}.get(self.executor, self.executor)
        times = f" x {configurations} configurations" if configurations > 1 else ""
        return (f"simulated {self.chains:,} chains{times}: {self.steps / 1e6:.2f}M decode steps "
                f"in {self.seconds:.1f} s — {self.replays_per_s:,.0f} chains/s, "
                f"{self.steps_per_s / 1e6:.2f}M steps/s ({per}{where}; "
                f"{self.steps_per_cpu_s / 1e6:.2f}M steps per CPU-second)")

    def to_json(self) -> dict:
        names = ("chains", "replays", "steps", "seconds", "cpu_seconds", "workers", "executor")
        return {name: getattr(self, name) for name in names} | {
            "replays_per_s": self.replays_per_s, "steps_per_s": self.steps_per_s,
            "steps_per_cpu_s": self.steps_per_cpu_s}


OnProgress = Callable[[Throughput], None]
OnRows = Callable[[bytes], None]


# ---- planning ---------------------------------------------------------------------------------


def configs_of(cfg: ProbeConfig) -> list[SimConfig]:
    """Every configuration of the probe (ProbeConfig.settings), in its order."""
    priced = cfg.priced_costs()
    costs = None if priced is None else tuple(priced.items())
    llamacpp = _absolute(cfg.llamacpp_options())
    return [SimConfig(p, k, w, costs, cfg.cross_request, i, llamacpp)
            for i, (p, k, w) in enumerate(cfg.settings())]


def _absolute(options: LlamaCppOptions) -> LlamaCppOptions:
    """The cache files as absolute paths: a worker (a Ray worker) may run in another folder."""
    files = {name: Path(path).absolute() for name in ("lookup_cache_static",
                                                      "lookup_cache_dynamic")
             if (path := getattr(options, name)) is not None}
    return dataclasses.replace(options, **files)


def plan_tasks(cfg: ProbeConfig, extra: list[Golden] | None = None, rows_json: bool = False,
               piece_bytes: int | None = None) -> list[Task]:
    """The tasks of a probe over the goldens `cfg` names (then `extra`, as one more stream).

    Ordered configurations come first (a whole file each: the longest tasks start early)."""
    files = find_golden_files(cfg.goldens)
    if not files:
        where = ", ".join(str(p) for p in cfg.goldens)
        raise KolibriError(f"no golden files (*.jsonl) found in {where}; pass --goldens FILE")
    stops = limit_stops(files, _one_by_one(cfg.category, cfg.where), cfg.limit) if cfg.limit \
        else {}
    configs = configs_of(cfg)
    ordered = tuple(c for c in configs if c.ordered)
    free = tuple(c for c in configs if not c.ordered)
    common = dict(category=tuple(cfg.category) if cfg.category else None, where=cfg.where,
                  max_tokens=cfg.max_tokens, rows_json=rows_json)
    tasks = []
    if ordered:
        whole = plan_pieces(files, 0, stops)
        tasks += [Task(ordered, piece, **common) for piece in whole]
    if free:
        pieces = plan_pieces(files, piece_bytes or PIECE_BYTES, stops)
        tasks += [Task(free, piece, **common) for piece in pieces]
    if extra:
        tasks.append(Task(tuple(configs), goldens=tuple(extra), **common))
    small = sum(t.nbytes for t in tasks) <= REPORT_ROWS_BYTES
    return [dataclasses.replace(t, keep_rows=small) for t in tasks]


def _one_by_one(categories: list[str] | None, where: str | None) -> Callable[[Golden], bool]:
    """Whether one golden is selected (--limit counts them as it reads)."""
    from kolibri_cli.probe.where import parse_where

    wanted = set(categories or ())
    kept = parse_where(where) if where else None
    return lambda g: (not wanted or g.category in wanted) and (
        kept is None or bool(kept.mask([g])[0]))


# ---- one task (runs in a worker) --------------------------------------------------------------


def run_task(task: Task) -> TaskResult:
    """Replay the task's configurations over its goldens, batch by batch (memory stays flat).
    Small tasks use the reference loop: compiling the replays would take longer."""
    with _no_cycle_collection():
        return _run_task(task)


@contextmanager
def _no_cycle_collection():
    """Parsing allocates millions of objects and no cycles: the cycle collector would only
    walk them (~15% of a task's time); reference counting frees them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run_task(task: Task) -> TaskResult:
    start = time.process_time()
    replayers = None
    shares = [Share(Counts(drafted_at=[0] * c.k, accepted_at=[0] * c.k),
                    rows=[] if task.keep_rows else None) for c in task.configs]
    for batch in _batches(_goldens(task), BATCH):
        table = Chains(batch)
        if replayers is None:
            fast_path = task.fast_path
            if fast_path is None:
                fast_path = table.plain_steps >= FAST_MIN_STEPS
            replayers = [Replayer(c, fast_path) for c in task.configs]
        for replayer, share in zip(replayers, shares, strict=True):
            _add(share, replayer.replay(table), table, replayer.config, task)
    return TaskResult(shares, task.nbytes, time.process_time() - start)


def _goldens(task: Task) -> Iterator[Golden]:
    from kolibri_cli.probe.where import parse_where

    goldens = read_piece(task.piece) if task.piece is not None else iter(task.goldens)
    wanted = set(task.category or ())
    kept = (g for g in goldens if not wanted or g.category in wanted)
    for g in parse_where(task.where).select(kept) if task.where else kept:
        yield g if not task.max_tokens else dataclasses.replace(
            g, output_ids=g.output_ids[: task.max_tokens])


def _batches(items: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _add(share: Share, table: ChainCounts, chains: Chains, config: SimConfig, task: Task) -> None:
    share.total.add(table.sum())
    _add_categories(share.categories, table.by_key(chains.categories))
    seeded = [None if seed is None else (seed, cat)
              for seed, cat in zip(chains.seeds, chains.categories, strict=True)]
    _add_categories(share.by_seed, table.by_key(seeded))
    share.chains += len(chains)
    share.eos_ids |= set(chains.eos.tolist())
    if share.rows is not None:
        named = zip(chains.ids, chains.categories, chains.seeds, strict=True)
        share.rows += [GoldenSim(i, cat, table.chain(n), seed)
                       for n, (i, cat, seed) in enumerate(named)]
    if task.rows_json:
        share.rows_json.append(_row_lines(table, chains, config))


def _row_lines(table: ChainCounts, chains: Chains, config: SimConfig) -> bytes:
    head = {"proposer": config.proposer, "k": config.k, "window": list(config.window)}
    lines = [json.dumps(head | {"id": gid, "category": cat}
                        | counts_json(table.chain(n), per_pass=True), ensure_ascii=False)
             for n, (gid, cat) in enumerate(zip(chains.ids, chains.categories, strict=True))]
    return ("\n".join(lines) + "\n").encode()


def _add_categories(into: dict, more: dict) -> None:
    for name, counts in more.items():
        if name in into:
            into[name].add(counts)
        else:
            into[name] = counts


# ---- merging (in the driver) ------------------------------------------------------------------


class RunBuilder:
    """One configuration's shares, merged in task order into its SimRun."""

    def __init__(self, config: SimConfig, rows_limit: int | None = ROWS_IN_REPORT):
        self.config = config
        self.rows_limit = rows_limit  # drop the per-chain rows past this many chains
        self.total = Counts(drafted_at=[0] * config.k, accepted_at=[0] * config.k)
        self.categories: dict[str, Counts] = {}
        self.chains, self.streams = 0, 0
        self.rows: list[GoldenSim] | None = []
        self.eos_ids: set[int] = set()
        self.by_seed: dict[tuple[int, str], Counts] | None = {}  # None: too many seeds

    def add(self, share: Share) -> None:
        self.total.add(share.total)
        _add_categories(self.categories, share.categories)
        self.chains += share.chains
        self.streams += 1
        self.eos_ids |= share.eos_ids
        if self.by_seed is not None:
            _add_categories(self.by_seed, share.by_seed)
            if len({seed for seed, _ in self.by_seed}) > MAX_SEEDS:
                self.by_seed = None
        too_many = self.rows_limit is not None and self.chains > self.rows_limit
        if share.rows is None or self.rows is None or too_many:
            self.rows = None
        else:
            self.rows += share.rows

    def run(self) -> SimRun:
        c = self.config
        if self.rows is not None:
            _check_unique_ids(self.rows)
        ordered = c.ordered
        return SimRun(proposer=c.proposer, k=c.k, window=c.window, goldens=self.rows,
                      total=self.total, costs=None if c.costs is None else dict(c.costs),
                      cross_request=c.cross_request, eos_ids=tuple(sorted(self.eos_ids)),
                      llamacpp=c.llamacpp,
                      categories=self.categories, chains=self.chains, ordered=ordered,
                      streams=self.streams if ordered else 0, by_seed=self._seeds())

    def _seeds(self) -> dict[int, dict[str, Counts]] | None:
        """{seed: {category: counts}}, seeds in order of first appearance."""
        if self.by_seed is None:
            return None
        nested: dict[int, dict[str, Counts]] = {}
        for (seed, category), counts in self.by_seed.items():
            nested.setdefault(seed, {})[category] = counts
        return nested


def _check_unique_ids(rows: list[GoldenSim]) -> None:
    """The report names each golden's row by its id: two goldens under one id would merge in
    every table that shows rows (checked where rows are kept, up to ROWS_IN_REPORT chains)."""
    seen: set = set()
    for row in rows:
        if str(row.id) in seen:  # 1 and "1" are one name in the report
            raise KolibriError(f"duplicate golden id {shown(row.id)}: ids name a golden's row in "
                               "the report (1 and \"1\" are one); make them unique")
        seen.add(str(row.id))


def simulate_tasks(tasks: list[Task], run_all: Callable | None = None,
                   on_progress: OnProgress | None = None, on_rows: OnRows | None = None,
                   workers: int = 1, executor: str = "local",
                   rows_limit: int | None = ROWS_IN_REPORT) -> tuple[list[SimRun], Throughput]:
    """Run every task (through `run_all(run_task, tasks)`, which yields results in task order;
    default: here, one after the other) and merge them into one SimRun per configuration, in
    configs_of order."""
    configs = sorted({c for t in tasks for c in t.configs}, key=lambda c: c.index)
    builders = {c: RunBuilder(c, rows_limit) for c in configs}
    progress = Throughput(total_bytes=sum(t.nbytes for t in tasks), workers=workers,
                          executor=executor)
    start = time.perf_counter()
    results = (run_all or map)(run_task, tasks)
    for task, result in zip(tasks, results, strict=True):
        for config, share in zip(task.configs, result.shares, strict=True):
            builders[config].add(share)
            if on_rows is not None and share.rows_json:
                on_rows(b"".join(share.rows_json))
        progress.chains = max(b.chains for b in builders.values())
        progress.replays = sum(b.chains for b in builders.values())
        progress.steps = sum(b.total.plain_steps for b in builders.values())
        progress.done_bytes += result.nbytes
        progress.cpu_seconds += result.cpu_seconds
        progress.seconds = time.perf_counter() - start
        if on_progress is not None:
            on_progress(progress)
    return [b.run() for b in builders.values()], progress


# ---- in memory --------------------------------------------------------------------------------


def simulate(
    goldens: list[Golden], k: int, window: tuple[int, int], proposer: str = DEFAULT_PROPOSER,
    costs: dict[int, float] | None = None, cross_request: bool = False,
    fast_path: bool | None = None, llamacpp: LlamaCppOptions | None = None,
) -> SimRun:
    """Simulate one configuration over goldens in memory (one stream, in order), here."""
    return sweep(goldens, [k], [window], proposer, costs, cross_request, fast_path, llamacpp)[0]


def sweep(
    goldens: list[Golden], ks: list[int], windows: list[tuple[int, int]],
    proposers: str | list[str] = DEFAULT_PROPOSER, costs: dict[int, float] | None = None,
    cross_request: bool = False, fast_path: bool | None = None,
    llamacpp: LlamaCppOptions | None = None,
) -> list[SimRun]:
    """Every (proposer, k, window) over goldens in memory, proposer-major then k-major (as
    configs_of; empty `ks` or `windows`: each proposer's own), per-chain rows kept."""
    from kolibri_cli.decode.proposers import canonical_proposer

    names = [proposers] if isinstance(proposers, str) else proposers
    options = llamacpp or LlamaCppOptions()
    cfg = ProbeConfig(k=ks, window=windows, proposer=[canonical_proposer(n) for n in names],
                      costs=costs, cross_request=cross_request, min_hits=options.min_hits,
                      n_min=options.n_min, lookup_cache_static=options.lookup_cache_static,
                      lookup_cache_dynamic=options.lookup_cache_dynamic)
    task = Task(tuple(configs_of(cfg)), goldens=tuple(goldens), keep_rows=True,
                fast_path=fast_path)
    return simulate_tasks([task], rows_limit=None)[0]
