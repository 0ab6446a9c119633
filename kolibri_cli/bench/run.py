"""`kolibri bench`: plain vs speculative speed on the bench chain, c(n), prefill speed, and the
memory-bandwidth bound of the weights as stored — every ratio taken from figures measured in the
same run (medians of repeats), a peer's (llama.cpp on the same GGUF) included."""

import resource
import statistics
import sys
from dataclasses import asdict, dataclass

from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, BENCH_SEED, bench_prompt
from kolibri_cli.bench.peers import PeerResult
from kolibri_cli.bench.timing import measure_read_bandwidth, prefill_time
from kolibri_cli.bench.versus import DecodeRounds
from kolibri_cli.costs.pricing import Pricing
from kolibri_cli.costs.timing import costs, curve_sizes, forward_rounds, median_times, round_costs
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.sampling import GREEDY, Sampling

COST_CONTEXT = 100  # tokens in the cache when c(n) is timed (a short chat prompt)


@dataclass
class BenchResult:
    model: str
    numerics: str  # the numeric path the kernel ran (Model.numerics)
    threads: int
    proposer: str
    k: int
    window: tuple[int, int]
    repeats: int
    bandwidth_gb_s: float  # measured read bandwidth
    storage: dict[str, int]  # block type -> matrices stored so (Q4_1, Q8_0, F32, ...)
    bytes_per_token: int  # weight bytes one decode step reads, as stored
    bound_tokens_per_s: float  # bandwidth / bytes_per_token
    plain_tokens_per_s: float  # median decode tok/s on the bench chain
    spec_tokens_per_s: float
    spec_speedup: float  # spec / plain
    fraction_of_bound: float  # plain / bound
    forward_ms: dict[int, float]  # median n-token forward time at COST_CONTEXT
    costs: dict[int, float]  # c(n) = forward(n) / forward(1)
    cost_rounds: list[dict[int, float]]  # each round's c(n): the spread the store keeps
    chain_seed: int
    chain_tokens: int
    plain_steps: int
    verify_passes: int
    drafts_proposed: int
    drafts_accepted: int
    identical: bool  # spec ids == plain ids on every repeat
    sampling: dict  # Sampling.to_dict() of both runs ({} = greedy)
    sample_us_per_token: float  # median time choosing a token from its logits (plain run)
    sample_fraction: float  # median share of plain decode time spent choosing tokens
    prefill_tokens: int  # prompt length of the prefill timing (0: not measured)
    prefill_tokens_per_s: float
    peak_rss_bytes: int  # of this process, up to the end of kolibri's runs (before the
    # bandwidth measurement's buffer and the peer)
    peer: PeerResult | None = None
    rounds: DecodeRounds | None = None  # decode against the peer, alternating
    pricing: Pricing | None = None  # the c(n) the proposer drafted by; None: it takes none

    def peer_ratios(self) -> dict[str, float]:
        """kolibri / peer for every figure both measured (decode per repack variant, prefill
        per variant, c(k+1))."""
        if self.peer is None:
            return {}
        if self.rounds is not None:  # medians of the rounds' ratios
            out = {f"decode vs {v}": statistics.median(self.rounds.ratios(v))
                   for v in self.rounds.peer}
        else:
            out = {f"decode vs {v}": self.plain_tokens_per_s / tps
                   for v, tps in self.peer.decode_tokens_per_s.items()}
        if self.prefill_tokens:
            out |= {f"prefill vs {v}": self.prefill_tokens_per_s / tps
                    for v, tps in self.peer.prefill_tokens_per_s.items()}
        n = max(self.costs)
        if n in self.peer.costs:
            out[f"c({n}) vs no repack"] = self.costs[n] / self.peer.costs[n]
        return out

    @property
    def pass_ratio(self) -> float:
        return self.plain_steps / self.verify_passes if self.verify_passes else 0.0

    @property
    def efficiency(self) -> float:
        """spec/plain over the pass ratio: the share of the passes saved that became speed
        (1.0 when a verify pass costs one decode step; 0.0 when nothing was verified)"""
        return self.spec_speedup / self.pass_ratio if self.pass_ratio else 0.0

    def to_dict(self) -> dict:
        d = asdict(self) | {"pass_ratio": self.pass_ratio, "efficiency": self.efficiency,
                            "peer_ratios": self.peer_ratios()}
        d["forward_ms"] = {str(n): t for n, t in self.forward_ms.items()}
        d["costs"] = {str(n): c for n, c in self.costs.items()}
        d["cost_rounds"] = [{str(n): c for n, c in r.items()} for r in self.cost_rounds]
        d["peer"] = self.peer.to_dict() if self.peer else None
        d["rounds"] = self.rounds.to_dict() if self.rounds else None
        d["pricing"] = self.pricing.to_json() if self.pricing else None
        return d


def run_bench(model, new_proposer, repeats: int = 5, threads: int = 0,
              sampling: Sampling = GREEDY, prefill: int = 0, peer=None,
              curve: int = 0) -> BenchResult:
    """`new_proposer(costs)` gives a fresh proposer per repeat (stateful ones, suffix and
    adaptive, then repeat the same run), drafting by `costs` if it drafts by c(n): c(n) is timed
    first, so adaptive drafts by this run's c(n) rather than a guess. The sampling cost is the
    plain run's time in the sampler over its decode time, taken in the same run. `prefill` > 0
    also times a prompt of that many tokens; `peer(max_n, bandwidth)` runs the peer (after
    kolibri, in the same run) and returns its PeerResult and the decode rounds against it.
    `curve` > k + 1 also times c(n) on a grid up to that many tokens (for `kolibri probe
    --concurrency`)."""
    prompt = bench_prompt(model)
    k = new_proposer(None).k
    per_round = forward_rounds(model.transformer, k + 1, COST_CONTEXT, repeats,
                               sizes=curve_sizes(k + 1, max(curve, k + 1)))
    times = median_times(per_round)
    measured = costs(times)
    plain_tps, spec_tps, identical, sample_s = [], [], True, []
    for _ in range(repeats):  # alternate, so machine noise hits both modes alike
        proposer = new_proposer(measured)
        plain = generate_plain(model, prompt, BENCH_NEW_TOKENS, sampling=sampling)
        spec = generate_spec(model, prompt, BENCH_NEW_TOKENS, proposer, sampling=sampling)
        plain_tps.append(plain.decode_tokens_per_s)
        spec_tps.append(spec.decode_tokens_per_s)
        sample_s.append((plain.sample_s, plain.decode_s, plain.new_tokens - 1))
        identical &= spec.output_ids == plain.output_ids
    prefill_s = prefill_time(model.transformer, prefill, min(repeats, 3)) if prefill else 0.0
    peak_rss = _peak_rss_bytes()  # the model's runs
    bandwidth = measure_read_bandwidth()  # after: its 512 MiB array is not the model's memory
    stats, nbytes = spec.spec_stats(), model.weights.nbytes_per_token()
    p, s = statistics.median(plain_tps), statistics.median(spec_tps)
    versus, rounds = peer(k + 1, bandwidth) if peer else (None, None)
    return BenchResult(
        model=model.name, numerics=model.numerics, threads=threads, proposer=proposer.name, k=k,
        window=(proposer.window_min, proposer.window_max),
        repeats=repeats, bandwidth_gb_s=bandwidth / 1e9, bytes_per_token=nbytes,
        bound_tokens_per_s=bandwidth / nbytes, plain_tokens_per_s=p, spec_tokens_per_s=s,
        spec_speedup=s / p if p else 0.0, fraction_of_bound=p / (bandwidth / nbytes),
        forward_ms={n: 1e3 * t for n, t in times.items()}, costs=measured,
        cost_rounds=round_costs(per_round),
        chain_seed=BENCH_SEED, chain_tokens=len(plain.output_ids),
        plain_steps=len(plain.output_ids) - 1, verify_passes=stats["verify_passes"],
        drafts_proposed=stats["drafts_proposed"], drafts_accepted=stats["drafts_accepted"],
        identical=identical, sampling=sampling.to_dict(),
        sample_us_per_token=statistics.median(1e6 * s / max(n, 1) for s, _, n in sample_s),
        sample_fraction=statistics.median(s / d if d else 0.0 for s, d, _ in sample_s),
        prefill_tokens=prefill,
        prefill_tokens_per_s=prefill / prefill_s if prefill else 0.0,
        storage=model.weights.storage(),
        peak_rss_bytes=peak_rss,
        peer=versus, rounds=rounds,
        pricing=Pricing("run", measured) if proposer.costs is measured else None,
    )


def _peak_rss_bytes() -> int:
    """This process's peak resident memory: getrusage gives kilobytes on Linux, bytes on macOS"""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
