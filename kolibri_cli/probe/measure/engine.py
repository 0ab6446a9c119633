"""The measured probe on an inference server: each golden prompt runs on a plain server and on
a speculative one, alternating, `repeats` times (medians), beside kolibri's simulation.

Per golden: the spec server's ids must equal the plain server's; kolibri simulates the proposer
over the server's own plain chain, counting drafts as the server does (ServerCounting), and the
counts must equal the server's `draft_n` / `draft_n_accepted`; the predicted speedup prices the
simulated passes with the server's c(n) (bench.engine_costs), measured in the same run when the
servers are kolibri's own, else given (`--costs`). Measured speedup = plain decode time / spec
decode time, both as the server reports them (prompt processing excluded).
Non-goals: rendering (report.py), starting servers (the caller does).
"""

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from kolibri_cli.callbacks import Ticks
from kolibri_cli.costs.model import cost_model, line_slope
from kolibri_cli.decode.proposers import LlamaCppSimpleProposer, proposer_class
from kolibri_cli.decode.sampling import Sampling
from kolibri_cli.engines import Completion, ServerApi
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, first_divergence
from kolibri_cli.probe.result import Measured, MeasuredGolden, timed_only, too_short_to_time
from kolibri_cli.probe.simulate import ServerCounting, SimRun, div_or_none, simulate_chain

COST_ROUNDS = 3  # c(n) rounds per repeat: a round takes ~15 s, a repeat of 18 goldens minutes
LOCAL_SPEC = LlamaCppSimpleProposer.llama_server  # what measure_local starts: ngram-simple


@dataclass
class _Runs:
    """Every repeat of one golden: plain and spec answers."""

    plain: list[Completion]
    spec: list[Completion]


def request_tokens(golden: Golden) -> int:
    """The n_predict a golden was recorded with (its chain may have stopped earlier on eos)."""
    return int(golden.reference.get("max_tokens") or len(golden.output_ids))


def measure_on_server(plain: ServerApi, spec: ServerApi, goldens: list[Golden], run: SimRun,
                      repeats: int, costs: Callable[[], dict[int, float]] | None = None,
                      cost_round: Callable[[], None] | None = None, engine: str = "",
                      step: Ticks | None = None, sampling: Sampling | None = None) -> Measured:
    """`cost_round()` (optional) times the cost servers once per repeat, interleaved with the
    goldens; `costs()` then gives c(n) (relative or in ms) for the prediction. Each golden runs
    with its own sampling parameters unless `sampling` overrides them."""
    runs = {g.id: _Runs([], []) for g in goldens}
    for r in range(repeats):
        for i, g in enumerate(goldens):
            n = request_tokens(g)
            pair = (plain, spec) if (r + i) % 2 == 0 else (spec, plain)  # alternate the order
            how = sampling or g.sampler
            answers = {api: _timed(api, api.complete(g.prompt_ids, n, how)) for api in pair}
            runs[g.id].plain.append(answers[plain])
            runs[g.id].spec.append(answers[spec])
        if cost_round:
            cost_round()
        if step:
            step(r + 1, repeats)
    given = costs() if costs else None
    c = cost_model(given) if given else None
    # a proposer with state across requests is one server slot: one instance, goldens in the
    # order the server saw them first (the counts compared are the first repeat's)
    shared = run.new_proposer()
    per = [_golden(g, runs[g.id], run, c, shared if shared.shares_state else None)
           for g in goldens]
    slope = line_slope(given) if given else None
    return _overall(per, goldens, runs, c, engine or spec.url, repeats, slope)


def _timed(api: ServerApi, answer: Completion) -> Completion:
    """The answer, which must say how long its decode took (a server's own answer)."""
    if answer.decode_s is None:
        raise KolibriError(f"{api.url}: the answer reports no decode time (llama.cpp's "
                           "timings.predicted_ms); the measured speedup needs it")
    return answer


def _golden(golden: Golden, runs: _Runs, run: SimRun, c,
            proposer=None) -> tuple[MeasuredGolden, list[int]]:
    chain = runs.plain[0].output_ids
    counting = ServerCounting(request_tokens(golden), tuple(golden.eos_ids))
    sim = simulate_chain(golden.prompt_ids, chain, proposer or run.new_proposer(), run.k,
                         counting)
    spec = runs.spec[0]
    plain_s = statistics.median(a.decode_s for a in runs.plain)
    spec_s = statistics.median(a.decode_s for a in runs.spec)
    same = all(a.output_ids == chain for a in runs.plain + runs.spec)
    predicted = None if c is None else div_or_none(
        sim.plain_steps, sum(c(1 + d) for d in sim.draft_lengths))
    steps = len(chain) - 1
    return MeasuredGolden(
        id=golden.id,
        plain_tokens_per_s=steps / plain_s if plain_s else 0.0,
        spec_tokens_per_s=steps / spec_s if spec_s else 0.0,
        speedup=plain_s / spec_s if spec_s else 0.0,
        predicted_speedup=predicted,
        spec_equals_plain=same,
        first_divergence=first_divergence(chain, golden.output_ids),
        counts_match_simulation=(spec.drafted, spec.accepted)
        == (sim.drafts_proposed, sim.drafts_accepted),
        verify_passes=steps - (spec.accepted or 0),
        drafts_proposed=spec.drafted or 0,
        drafts_accepted=spec.accepted or 0,
        simulated_proposed=sim.drafts_proposed,
        simulated_accepted=sim.drafts_accepted,
        too_short=too_short_to_time(steps),
    ), sim.draft_lengths


def _overall(per, goldens, runs: dict, c, engine: str, repeats: int,
             slope: float | None = None) -> Measured:
    """Overall figures over the goldens long enough to time (over all when none is)."""
    measured = [m for m, _ in per]
    timed = timed_only(list(zip(goldens, per, strict=True)), measured)
    kept = [g for g, _ in timed]
    steps = sum(len(runs[g.id].plain[0].output_ids) - 1 for g in kept)
    plain_s = sum(statistics.median(a.decode_s for a in runs[g.id].plain) for g in kept)
    spec_s = sum(statistics.median(a.decode_s for a in runs[g.id].spec) for g in kept)
    lengths = [d for _, (_, lengths) in timed for d in lengths]
    longest = max((d for _, lengths in per for d in lengths), default=0)
    predicted = None if c is None else div_or_none(steps, sum(c(1 + d) for d in lengths))
    on_line = None if slope is None else div_or_none(steps, sum(1 + slope * d for d in lengths))
    by_repeat = [div_or_none(sum(runs[g.id].plain[r].decode_s for g in kept),
                             sum(runs[g.id].spec[r].decode_s for g in kept)) or 0.0
                 for r in range(repeats)]  # 0.0: no decode time (1-token chains), as speedup
    return Measured(
        plain_tokens_per_s=steps / plain_s if plain_s else 0.0,
        spec_tokens_per_s=steps / spec_s if spec_s else 0.0,
        speedup=plain_s / spec_s if spec_s else 0.0,
        predicted_speedup=predicted,
        predicted_on_line=on_line, cost_slope=slope,
        costs={} if c is None else {n: c(n) for n in range(1, longest + 2)},
        proposer_s_per_pass=0.0,  # inside the server's pass time
        spec_equals_plain=all(m.spec_equals_plain for m in measured),
        counts_match_simulation=all(m.counts_match_simulation for m in measured),
        goldens=measured, engine=engine, repeats=repeats,
        speedup_range=(min(by_repeat), max(by_repeat)),
        left_out=len(measured) - len(timed),
    )


def measure_local(model, goldens: list[Golden], run: SimRun, repeats: int, threads: int | None,
                  gguf=None, timeout: float = 600.0, step: Ticks | None = None,
                  sampling: Sampling | None = None) -> Measured:
    """Start llama-servers on the model's GGUF — plain and speculative with the run's
    llamacpp-simple settings, kept up — and measure the run on them; c(n) is timed COST_ROUNDS
    times per repeat (alternating the order of n), between the goldens, on synthetic-acceptance
    servers started one at a time (engine_costs.cost_servers): three servers at most at once,
    whatever k is."""
    from contextlib import ExitStack

    from kolibri_cli.bench.engine_costs import (
        PassTimes,
        cost_round,
        cost_servers,
        cost_sizes,
        kept,
        periodic_prompt,
    )
    from kolibri_cli.engines import LOCAL, serving, spec_args

    if proposer_class(run.proposer).llama_server != LOCAL_SPEC:
        raise KolibriError(f"--engine {LOCAL} runs llama.cpp's {LOCAL_SPEC}: measure it with "
                           f"--proposer {LlamaCppSimpleProposer.name} (not {run.proposer})")
    with ExitStack() as stack:
        def start(args):
            return stack.enter_context(serving(LOCAL, model, gguf=gguf, threads=threads,
                                               args=args, timeout=timeout))

        plain = start(())
        spec = start(spec_args(LOCAL_SPEC, run.window[1], run.k))
        prompt = periodic_prompt(model, longest=run.k + 1)
        servers = cost_servers(model, cost_sizes(run.k), prompt, gguf, threads, timeout)
        servers[1] = kept(plain)
        times = {n: PassTimes(n) for n in servers}

        def cost_rounds():
            for _ in range(COST_ROUNDS):
                cost_round(servers, prompt, times, reverse=len(times[1].ms) % 2 == 1)

        measured = measure_on_server(
            plain, spec, goldens, run, repeats,
            costs=lambda: {n: t.median_ms for n, t in times.items()},
            cost_round=cost_rounds, engine=LOCAL, step=step, sampling=sampling)
        measured.cost_ms_rounds = {n: t.ms for n, t in times.items()}
        return measured


def measure_urls(model, goldens: list[Golden], run: SimRun, spec_url: str, plain_url: str,
                 repeats: int, costs: dict[int, float] | None, api: str | None = None,
                 timeout: float = 600.0, step: Ticks | None = None,
                 sampling: Sampling | None = None) -> Measured:
    """Measure on two running servers: `spec_url` speculates with the run's settings (the
    operator configured it so), `plain_url` is its plain twin; c(n) only from `costs`."""
    from kolibri_cli.engines import connect

    plain, spec = (connect(url, api, model.tokenizer, model.eos_ids, timeout,
                           vocab=model.vocab_size) for url in (plain_url, spec_url))
    return measure_on_server(plain, spec, goldens, run, repeats,
                             costs=(lambda: costs) if costs else None, engine=spec.url,
                             step=step, sampling=sampling)
