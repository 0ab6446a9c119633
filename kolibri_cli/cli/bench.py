"""`kolibri bench`: plain vs speculative speed, c(n), and the memory-bandwidth bound."""

from typing import Annotated

import typer

from kolibri_cli.cli import options as opt
from kolibri_cli.decode.proposers import DEFAULT_K, DEFAULT_PROPOSER


def bench(
    model: opt.ModelOpt = None,
    k: opt.KOpt = DEFAULT_K,
    window: opt.WindowOpt = opt.WINDOW_DEFAULT,
    proposer_name: opt.ProposerOpt = DEFAULT_PROPOSER,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1,
                                         help="Repeats; medians are reported.")] = 5,
    temperature: opt.TemperatureOpt = None,
    top_k: opt.TopKOpt = None,
    top_p: opt.TopPOpt = None,
    min_p: opt.MinPOpt = None,
    repetition_penalty: opt.RepetitionPenaltyOpt = None,
    seed: opt.SeedOpt = None,
    greedy: opt.GreedyOpt = False,
    threads: opt.ThreadsOpt = None,
    as_json: opt.JsonOpt = False,
) -> None:
    """Plain vs spec tok/s on the bench chain, c(n), the memory-bandwidth bound and the cost of
    choosing tokens (sampling noise included), all from one run."""
    from kolibri_cli.bench.run import run_bench
    from kolibri_cli.cli import render
    from kolibri_cli.engine.jit import get_threads

    drafter = opt.proposer(k, window, proposer_name)  # bad settings fail before the model loads
    given = opt.sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed, greedy)
    m = opt.load_model(model, threads)
    opt.fit_context(drafter.k, drafter.window_max, m)
    how = opt.resolve_sampling(m, given)
    render.err.print(f"benchmarking {m.name}: {repeats} repeats, {get_threads()} threads ...")
    result = run_bench(m, lambda: opt.proposer(k, window, proposer_name), repeats, get_threads(),
                       how)
    if as_json:
        return opt.print_json(result.to_dict())
    render.out.print(render.bench_table(result))
