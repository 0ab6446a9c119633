"""The measured probe: run each golden prompt with the model, plain and speculative, and set the
measurement beside the simulation and the cost model's prediction.

Per golden: spec ids must equal plain ids (the lossless law); the model's plain chain is compared
with the golden (first divergent index); the real spec run's counts must equal the simulation's
over that chain; c(n) is measured at the golden's context length and turned into a predicted
speedup from the simulated draft lengths. Like the simulation, one proposer instance serves
every golden in order (two: one for the real spec runs, one for the simulation over the model's
own plain chains), so stateful proposers see the same history in both.
Non-goals: rendering (report.py, render_probe.py).
"""


from kolibri_cli.bench.timing import verify_costs
from kolibri_cli.callbacks import Ticks
from kolibri_cli.decode.generate import GenerationResult, generate_plain, generate_spec
from kolibri_cli.decode.sampling import Sampling
from kolibri_cli.goldens.chains import Golden, first_divergence
from kolibri_cli.probe.report import Measured, MeasuredGolden
from kolibri_cli.probe.simulate import (
    SimRun,
    div_or_none,
    predicted_speedup,
    simulate_chain,
    spec_time,
)

COST_REPEATS = 3


def _step_s(plain: GenerationResult) -> float:
    """Seconds per plain decode step, measured in the plain run."""
    return plain.decode_s / max(plain.new_tokens - 1, 1)


def measure_golden(model, golden: Golden, sim_counts, run: SimRun, proposers: tuple | None = None,
                   sampling: Sampling | None = None) -> tuple[MeasuredGolden, dict]:
    """`proposers` = (for the spec run, for the simulation over the plain chain); fresh ones by
    default. `sampling`: how to choose tokens (default: as the golden was recorded)."""
    n = len(golden.output_ids)
    spec_proposer, sim_proposer = proposers or (run.new_proposer(), run.new_proposer())
    how = golden.sampler if sampling is None else sampling
    plain = generate_plain(model, golden.prompt_ids, n, sampling=how)
    spec = generate_spec(model, golden.prompt_ids, n, spec_proposer, sampling=how)
    stats = spec.spec_stats()
    own = simulate_chain(golden.prompt_ids, plain.output_ids, sim_proposer, run.k)
    context = len(golden.prompt_ids) + n // 2  # c(n) at the golden's (mid-chain) context length
    rel = verify_costs(model.transformer, run.k + 1, context, COST_REPEATS)
    costs = {m: c * _step_s(plain) for m, c in rel.items()}  # seconds per m-token forward
    per_pass = spec.proposer_s / max(len(spec.passes), 1)
    measured = MeasuredGolden(
        id=golden.id,
        plain_tokens_per_s=plain.decode_tokens_per_s,
        spec_tokens_per_s=spec.decode_tokens_per_s,
        speedup=plain.decode_s / spec.decode_s if spec.decode_s else 0.0,
        predicted_speedup=predicted_speedup(sim_counts.plain_steps, sim_counts.draft_lengths,
                                            costs, per_pass),
        spec_equals_plain=spec.output_ids == plain.output_ids,
        first_divergence=first_divergence(plain.output_ids, golden.output_ids),
        counts_match_simulation=(stats["verify_passes"], stats["drafts_proposed"],
                                 stats["drafts_accepted"])
        == (own.verify_passes, own.drafts_proposed, own.drafts_accepted),
        verify_passes=stats["verify_passes"],
        drafts_proposed=stats["drafts_proposed"],
        drafts_accepted=stats["drafts_accepted"],
    )
    totals = {"plain_s": plain.decode_s, "spec_s": spec.decode_s,
              "plain_tokens": plain.new_tokens - 1, "spec_tokens": spec.new_tokens - 1,
              "predicted_plain_s": sim_counts.plain_steps * costs[1],
              "predicted_spec_s": spec_time(sim_counts.draft_lengths, costs, per_pass),
              "rel_costs": rel, "proposer_s": spec.proposer_s, "passes": len(spec.passes)}
    return measured, totals


def measure_run(model, goldens: list[Golden], run: SimRun, step: Ticks | None = None,
                sampling: Sampling | None = None) -> Measured:
    """Measure one configuration over every golden; overall figures are sums."""
    per, totals = [], []
    proposers = (run.new_proposer(), run.new_proposer())
    for i, (golden, sim) in enumerate(zip(goldens, run.goldens, strict=True)):
        m, t = measure_golden(model, golden, sim.counts, run, proposers, sampling)
        per.append(m)
        totals.append(t)
        if step:
            step(i + 1, len(goldens))
    total = lambda key: sum(t[key] for t in totals)  # noqa: E731
    plain_s, spec_s = total("plain_s"), total("spec_s")
    return Measured(
        plain_tokens_per_s=total("plain_tokens") / plain_s if plain_s else 0.0,
        spec_tokens_per_s=total("spec_tokens") / spec_s if spec_s else 0.0,
        speedup=plain_s / spec_s if spec_s else 0.0,
        predicted_speedup=div_or_none(total("predicted_plain_s"), total("predicted_spec_s")),
        costs=_median_costs([t["rel_costs"] for t in totals]),
        proposer_s_per_pass=total("proposer_s") / max(total("passes"), 1),
        spec_equals_plain=all(m.spec_equals_plain for m in per),
        counts_match_simulation=all(m.counts_match_simulation for m in per),
        goldens=per,
    )


def _median_costs(costs: list[dict[int, float]]) -> dict[int, float]:
    import statistics

    return {n: statistics.median(c[n] for c in costs) for n in costs[0]} if costs else {}
