"""One `kolibri probe` run, start to finish: check the options, choose c(n), simulate (where the
options say: here, local processes, Ray), measure with the model if asked, and return the
ProbeResult that every output renders.

Scope: the workflow and its decisions. What it needs from the terminal (progress bars, notes,
loading a model with progress) comes in as a `Ui`, so cli/ only parses, calls and renders.
"""

import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.costs.pricing import Pricing
from kolibri_cli.errors import KolibriError, refuse_unused
from kolibri_cli.goldens.stream import empty_golden_files, models_of
from kolibri_cli.probe.config import ProbeConfig, nothing_selected
from kolibri_cli.probe.result import ProbeResult, build_result

MEASURE_REPEATS = 5  # --costs measure: medians of this many interleaved timings per row count


@dataclass(frozen=True)
class Ui:
    """What the workflow asks of the terminal: cli/ gives it one."""

    load_model: Callable  # (spec | None, threads | None, weights: bool) -> Model, with progress
    load_tokenizer: Callable  # (spec | None, engine, api, timeout) -> what tokenizes for a server
    sampling: Callable  # (model, given options: dict) -> Sampling (a random seed is said)
    progress: Callable  # (label) -> context manager yielding ticks(done, total)
    simulating: Callable  # () -> context manager yielding a bar: .update(Throughput), .shown
    note: Callable[[str], None]  # one line on stderr


def run(cfg: ProbeConfig, ui: Ui) -> ProbeResult:
    """Check, price, simulate (and measure): the result, gates applied."""
    check(cfg)
    note_empty_files(cfg, ui)
    cfg.pricing = pricing(cfg, ui)
    model = (load_model(cfg, ui, weights=cfg.bench or in_process(cfg))
             if cfg.measure or cfg.bench else None)
    extra = [bench_golden(model)] if cfg.bench else []
    measured = load = goldens = None
    if cfg.measure or cfg.concurrency:  # each needs the goldens themselves, not just counts
        goldens = goldens_in_memory(cfg) + extra
        runs, throughput = simulate(cfg, in_memory_tasks(cfg, goldens), ui)
    else:
        runs, throughput = simulate(cfg, planned_tasks(cfg, extra), ui)
    if cfg.measure:
        measured = measure(cfg, model, goldens, runs, ui)
    if cfg.concurrency:
        load = under_load(cfg, runs, measured, goldens, ui, model)
    return build_result(cfg, runs, cfg.pricing, measured, throughput, load)


def note_empty_files(cfg: ProbeConfig, ui: Ui) -> None:
    for path in empty_golden_files(cfg.goldens):
        ui.note(f"note: {path} is empty: skipped")


def under_load(cfg: ProbeConfig, runs: list, measured: dict | None, goldens: list, ui: Ui,
               model=None):
    """Every configuration at every concurrency asked for (probe/load.py), under the run's c(n)
    as a curve over tokens in flight; measured on llama-server, under its own curves."""
    from kolibri_cli.engines import LOCAL
    from kolibri_cli.probe.answer import ranking
    from kolibri_cli.probe.load import load_report

    fastest = ranking(runs, measured)[0].run
    pricing, decode = cfg.pricing, None
    if cfg.measure and cfg.engine == LOCAL:
        pricing, decode = server_load_costs(cfg, model, ui)
    with ui.progress("simulating under load ") as ticks:
        ticks(0, 1)
        report = load_report(runs, fastest, cfg.concurrency, pricing.costs, goldens, pricing,
                             decode)
        ticks(1, 1)
    report.pricing = None if pricing is cfg.pricing else pricing  # a server's own c(T) only
    return report


def server_load_costs(cfg: ProbeConfig, model, ui: Ui):
    """(Pricing, DecodeCurve) of a llama-server started here, for the load: c(T) by prompt
    evaluation on a one-slot server up to the most tokens a step holds (unless --costs gave a
    curve), and its batched decode d(B) on one server with -np B; one server at a time."""
    from kolibri_cli.bench.engine_costs import curve_costs, local_decode_costs
    from kolibri_cli.engines import LOCAL
    from kolibri_cli.probe.load import DecodeCurve

    k = max(k for _, k, _ in cfg.settings())
    pricing, how = cfg.pricing, "--costs"
    if pricing.source != "given":
        with ui.progress("timing llama-server's c(T) ") as ticks:
            curve = curve_costs(LOCAL, model, k, max(cfg.concurrency) * (k + 1),
                                MEASURE_REPEATS, gguf=cfg.gguf, threads=cfg.threads,
                                timeout=cfg.timeout, step=ticks)
        pricing, how = Pricing("run", curve.costs), "prompt evaluation"
    with ui.progress("timing llama-server's batched decode ") as ticks:
        d = local_decode_costs(model, cfg.concurrency, MEASURE_REPEATS, cfg.gguf, cfg.threads,
                               cfg.timeout, ticks)
    return pricing, DecodeCurve(d, f"llama-server -np {max(d)}, timed in this run; c(T) by "
                                f"{how}")


# ---- checks -----------------------------------------------------------------------------------


MAX_SETTINGS = 4096  # configurations a run replays: 82,000 printed nothing and grew 10 MB/s


def check(cfg: ProbeConfig) -> None:
    """Options that cannot run together, or mean nothing in this run, and outputs that cannot be
    written: one error line each, before anything runs."""
    from kolibri_cli.engines import LOCAL, is_server

    if not in_process(cfg):
        if not cfg.measure:
            raise KolibriError(f"--engine {cfg.engine} is where --measure runs: add --measure")
        if not is_server(cfg.engine):
            raise KolibriError(f"unknown --engine {cfg.engine!r}: kolibri, {LOCAL} or a base URL")
        if cfg.engine != LOCAL and not cfg.baseline:
            raise KolibriError("a speculating server at a URL needs its plain twin for the "
                               "measured speedup: add --baseline URL")
    if cfg.baseline and (in_process(cfg) or cfg.engine == LOCAL):
        raise KolibriError("--baseline goes with --engine URL (a server you started)")
    if cfg.measure and cfg.ray is not None:
        raise KolibriError("--measure runs the model here, on a few goldens: drop --ray")
    if (n := len(cfg.settings())) > MAX_SETTINGS:
        raise KolibriError(f"{n:,} settings (proposers x --k x --window): at most "
                           f"{MAX_SETTINGS:,} a run (each is replayed over every golden and "
                           "kept in the report); sweep fewer at a time")
    check_unused(cfg)
    check_outputs(cfg)


def check_unused(cfg: ProbeConfig) -> None:
    """Options (or PROBE.toml keys) that mean nothing in this run: one error line."""
    from kolibri_cli.engines import LOCAL

    if not (cfg.measure or cfg.bench or cfg.measure_costs):
        refuse_unused({"--model": cfg.model}, "--measure, --bench or --costs measure (the "
                      "simulation alone needs no model)")
    if not cfg.measure:
        refuse_unused({"--repeats": cfg.repeats,
                       "--allow-model-mismatch": cfg.allow_model_mismatch or None,
                       **{f"--{key.replace('_', '-')}": value
                          for key, value in cfg.sampling_overrides().items()}}, "--measure")
    if in_process(cfg):
        timeout = None if cfg.timeout == ProbeConfig.timeout else cfg.timeout
        refuse_unused({"--engine-api": cfg.engine_api, "--gguf": cfg.gguf, "--timeout": timeout},
                      f"--measure on a server (--engine {LOCAL} or a URL)")
    elif cfg.engine == LOCAL:
        refuse_unused({"--engine-api": cfg.engine_api}, "--engine URL")
    else:
        refuse_unused({"--gguf": cfg.gguf}, f"--engine {LOCAL}")


def check_outputs(cfg: ProbeConfig) -> None:
    """Every file the run writes can be written (checked now, not after the run), none twice,
    and none is an input: a report over the goldens or PROBE.toml destroyed them."""
    from kolibri_cli.store.atomic import check_writable

    inputs = [Path(p) for p in (*cfg.goldens, cfg.source, cfg.lookup_cache_static,
                                cfg.lookup_cache_dynamic) if p and Path(p).is_file()]
    outputs = [(o, p) for o, p in (("--markdown", cfg.markdown), ("--rows", cfg.rows),
                                   ("--plot", cfg.plot)) if p]
    for option, path in outputs:
        check_writable(path)
        if path.is_file() and any(path.samefile(i) for i in inputs):
            raise KolibriError(f"{option} {path} is an input of this run; name another file")
    targets = [os.path.realpath(p) for _, p in outputs]
    if len(set(targets)) < len(targets):
        raise KolibriError("--markdown, --rows and --plot name the same file; name one each")


def in_process(cfg: ProbeConfig) -> bool:
    """--measure runs kolibri's own kernel (not a server)."""
    return cfg.engine in (None, "kolibri")


# ---- c(n) -------------------------------------------------------------------------------------


def pricing(cfg: ProbeConfig, ui: Ui):
    """The c(n) to price with (a guess where a measurement could be has a note); with
    `--costs measure`, timed now on the goldens' model and kept."""
    from kolibri_cli.costs.pricing import for_goldens
    from kolibri_cli.goldens.stream import models_of

    if not cfg.measure_costs:
        models = models_of(cfg.goldens) if cfg.costs is None and cfg.bench_costs else set()
        return for_goldens(cfg.costs, models, cfg.threads, cfg.bench_costs, cfg.engine)
    model = load_model(cfg, ui, spec=cfg.model or measured_model(cfg.goldens))
    ui.note(f"timing c(n) of {model.name} on this host (kept for later runs) ...")
    with ui.progress("timing c(n) ") as ticks:
        return measure_here(model, cfg, ticks)


def measured_model(goldens: list) -> str:
    """The name of the one model `--costs measure` times: the goldens' (one model only)."""
    models = models_of(goldens)
    if len(models) != 1:
        raise KolibriError("--costs measure times the goldens' model, but these goldens come "
                           f"from {len(models)} models; probe one model's goldens at a time, or "
                           "give --model")
    return next(iter(models))[0]


def measure_here(model, config, ticks=None) -> Pricing:
    """c(1..n) timed now on `model` (costs/timing.py time_here) for every row count the run's
    configurations verify (k + 1) — with --concurrency, a curve up to the most tokens a step
    holds (B x (k + 1)) — kept in the bench store; priced with their median (source "run")."""
    from kolibri_cli.costs.timing import time_here

    models = models_of(config.goldens)
    if models and model.sha256 not in {sha for _, sha in models}:
        raise KolibriError(f"--costs measure: {model.name} is not the model these goldens were "
                           "recorded from (its weights differ); give --model the goldens' model")
    top = max(k for _, k, _ in config.settings()) + 1
    return time_here(model, top, top * max(config.concurrency or [1]), MEASURE_REPEATS, ticks)


# ---- simulating -------------------------------------------------------------------------------


def planned_tasks(cfg: ProbeConfig, extra: list) -> list:
    from kolibri_cli.probe.replay.shards import plan_tasks

    return plan_tasks(cfg, extra, rows_json=cfg.rows is not None)


def goldens_in_memory(cfg: ProbeConfig) -> list:
    from kolibri_cli.probe.config import select_goldens
    from kolibri_cli.probe.replay.shards import ROWS_IN_REPORT

    return select_goldens(cfg, most=ROWS_IN_REPORT)


def in_memory_tasks(cfg: ProbeConfig, goldens: list) -> list:
    """One task over goldens held in memory, every per-chain row kept (the measured run needs
    them)."""
    from kolibri_cli.probe.replay.shards import Task, configs_of

    return [Task(tuple(configs_of(cfg)), goldens=tuple(goldens), keep_rows=True,
                 rows_json=cfg.rows is not None)]


def simulate(cfg: ProbeConfig, tasks: list, ui: Ui) -> tuple:
    """Run the tasks where the options say, with a progress bar (long runs) and the rows file;
    say the throughput when the bar was shown."""
    from kolibri_cli.probe.replay.shards import ROWS_IN_REPORT, simulate_tasks

    in_memory = len(tasks) == 1 and tasks[0].piece is None
    with executor_for(cfg, tasks, ui.note) as executor, ui.simulating() as bar, \
            rows_sink(cfg.rows) as on_rows:
        runs, throughput = simulate_tasks(
            tasks, executor.run_all, bar.update, on_rows, executor.workers, executor.name,
            rows_limit=None if in_memory else ROWS_IN_REPORT)
    if bar.shown:
        ui.note(throughput.line(len(runs)))
    if cfg.rows:
        ui.note(f"wrote {cfg.rows}")
    if not any(run.chains for run in runs):
        raise KolibriError(nothing_selected(cfg))
    return runs, throughput


@contextmanager
def rows_sink(path: Path | None):
    """A callback writing bytes to `path`, atomically: the file appears whole when the run
    succeeds, never half-written."""
    if path is None:
        yield None
        return
    from kolibri_cli.store.atomic import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield f.write


def executor_for(cfg: ProbeConfig, tasks: list, note=None):
    """Ray if asked; else local worker processes when there is more than one task to share
    (and, unless --workers says how many, enough input to pay for starting them); never more
    local processes than cores (each replays on one core and holds ~140 MB: `--workers 48`
    started 49), said through `note`."""
    from kolibri_cli.probe.replay.shards import PARALLEL_MIN_BYTES
    from kolibri_cli.probe.workers import Here, Processes, RayCluster, cores

    if cfg.ray is not None:
        return RayCluster(cfg.ray, cfg.workers)
    if cfg.workers and cfg.workers > cores() and note:
        note(f"note: --workers {cfg.workers}: this machine runs {cores()} at once; starting "
             f"at most {cores()} worker processes")
    small = sum(t.nbytes for t in tasks) < PARALLEL_MIN_BYTES
    workers = min(cfg.workers or (1 if small else cores()), cores(), len(tasks))
    return Processes(workers) if workers > 1 else Here()


# ---- the model --------------------------------------------------------------------------------


def load_model(cfg: ProbeConfig, ui: Ui, weights: bool = True, spec: str | None = None):
    """The model --measure, --bench or --costs measure runs, checked to fit the drafts."""
    from kolibri_cli.decode.proposers import fit_context

    model = ui.load_model(spec or cfg.model, cfg.threads, True) if weights else \
        ui.load_tokenizer(spec or cfg.model, cfg.engine, cfg.engine_api, cfg.timeout)
    settings = cfg.settings()
    fit_context(max(k for _, k, _ in settings), max(w[1] for _, _, w in settings), model)
    return model


def bench_golden(model):
    """The bench chain (a seeded random raw prompt whose continuation cycles) as a golden: its
    output is the model's own greedy chain, generated here."""
    from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, BENCH_SEED, bench_prompt
    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.goldens.chains import Golden

    prompt = bench_prompt(model)
    chain = generate_plain(model, prompt, BENCH_NEW_TOKENS).output_ids
    return Golden(f"bench-seed{BENCH_SEED}", "bench", "", False, prompt, chain, model.name,
                  model.sha256, {"engine": "kolibri", "dtype": model.numerics}, list(model.eos_ids))


def measure(cfg: ProbeConfig, model, goldens: list, runs: list, ui: Ui) -> dict:
    """Run the model on every golden for the fastest simulated setting — of each proposer when
    comparing, all in one interleaved run so machine noise hits them alike: measuring a whole
    sweep would take minutes per configuration."""
    from kolibri_cli.goldens import record as recorder
    from kolibri_cli.probe.answer import fastest_per_proposer, ranking, run_key
    from kolibri_cli.probe.measure import live_runs, measure_runs

    recorder.check_model_matches(model, goldens, cfg.allow_model_mismatch)
    given = cfg.sampling_overrides()
    override = ui.sampling(model, given) if given else None
    ranked = ranking(runs)
    chosen = ([s.run for s in fastest_per_proposer(runs, ranked)] if len(cfg.proposer) > 1
              else [ranked[0].run])
    chosen = live_runs(chosen, cfg.pricing)
    if in_process(cfg):
        names = ", ".join(run.name for run in chosen)
        with ui.progress(f"measuring {names} ") as ticks:
            measured = measure_runs(model, goldens, chosen, cfg.measure_repeats(), ticks,
                                    override)
        note_divergence(model, measured, ui)
        return measured
    measured = {}
    for run in chosen:
        with ui.progress(f"measuring {run.name} on {cfg.engine} ") as ticks:
            measured[run_key(run)] = measure_server(cfg, model, goldens, run, ticks, override)
    return measured


def measure_server(cfg: ProbeConfig, model, goldens, run, ticks, sampling):
    from kolibri_cli.engines import LOCAL
    from kolibri_cli.probe.measure.engine import measure_local, measure_urls

    if cfg.engine == LOCAL:
        return measure_local(model, goldens, run, cfg.measure_repeats(), cfg.threads, cfg.gguf,
                             cfg.timeout, ticks, sampling)
    return measure_urls(model, goldens, run, cfg.engine, cfg.baseline, cfg.measure_repeats(),
                        cfg.costs, cfg.engine_api, cfg.timeout, ticks, sampling)


def note_divergence(model, measured: dict, ui: Ui) -> None:
    """The simulation assumes the model reproduces the goldens: say so when it does not."""
    from kolibri_cli.store.models import verify_hint
    from kolibri_cli.text import shown

    first = next(iter(measured.values()))
    diverged = [g for g in first.goldens if g.first_divergence is not None]
    if diverged:
        g = diverged[0]
        ui.note(f"note: the model's greedy output differs from {len(diverged)} of "
                f"{len(first.goldens)} goldens (first: {shown(g.id)} at output index "
                f"{g.first_divergence}), so simulated and real counts may differ"
                f"{verify_hint(model)}")


def plot_link(cfg: ProbeConfig) -> Path | None:
    """The PNG's path as the Markdown report links it (relative to the report)."""
    if not (cfg.plot and cfg.markdown):
        return None
    return Path(os.path.relpath(os.path.realpath(cfg.plot),
                                os.path.dirname(os.path.realpath(cfg.markdown))))
