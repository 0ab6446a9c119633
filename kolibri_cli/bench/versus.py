"""kolibri against llama.cpp on plain decode, in alternating rounds of one run: each round times
kolibri decoding DECODE_TOKENS tokens, then `llama-bench -n DECODE_TOKENS` with llama.cpp's
default flags and with `--repack 0`, so load changes on the machine hit all three alike. Each
figure is reported per round (the spread) and as the median, beside its fraction of the memory
bandwidth bound: the bandwidth over the bytes the engine reads per token (kolibri's weights as it
stores them; llama.cpp's: the GGUF's tensors a token reads).

kolibri's decode is timed as llama-bench's tg test runs: one token per forward from an empty
cache, no sampling cost, nothing stops it early.
Non-goals: prefill and c(n) (llama-bench runs them once, `peers.run_llama_bench`).
"""

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kolibri_cli.bench.peers import DECODE_TOKENS, decode_run

VARIANTS = {"repack": [], "no repack": ["--repack", "0"]}  # llama.cpp's flags per variant


@dataclass
class DecodeRounds:
    threads: int
    kolibri: list[float]  # decode tok/s per round
    peer: dict[str, list[float]]  # variant -> llama.cpp's decode tok/s per round
    kolibri_bytes_per_token: int  # weights one kolibri decode step reads, as stored
    peer_bytes_per_token: int  # the GGUF's tensors one llama.cpp decode step reads
    bandwidth_gb_s: float  # measured read bandwidth
    failures: dict[str, str] = field(default_factory=dict)  # variant -> what went wrong

    def ratios(self, variant: str) -> list[float]:
        """kolibri / llama.cpp per round"""
        return [k / p for k, p in zip(self.kolibri, self.peer[variant], strict=False)]

    def fraction_of_bound(self, tokens_per_s: float, bytes_per_token: int) -> float:
        return tokens_per_s * bytes_per_token / (1e9 * self.bandwidth_gb_s)

    def summary(self) -> dict:
        """Medians and spreads (min, max) of every figure, and the fractions of the bound"""
        out = {"kolibri": _spread(self.kolibri) | {"fraction_of_bound": self.fraction_of_bound(
            statistics.median(self.kolibri), self.kolibri_bytes_per_token)}}
        for v, tps in self.peer.items():
            out[v] = _spread(tps) | {
                "fraction_of_bound": self.fraction_of_bound(statistics.median(tps),
                                                            self.peer_bytes_per_token),
                "ratio": _spread(self.ratios(v))}
        return out

    def to_dict(self) -> dict:
        return asdict(self) | {"summary": self.summary()}


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def kolibri_decode(transformer, n: int = DECODE_TOKENS) -> float:
    """tok/s of n one-token forwards from an empty cache (token ids fixed, as llama-bench's)"""
    cache = transformer.new_cache(n)
    ids = np.arange(1, n + 1) % transformer.config.vocab_size
    transformer.forward(ids[:1], 0, cache)  # warm
    t0 = time.perf_counter()
    for i in range(n):
        transformer.forward(ids[i:i + 1], i, cache)
    return n / (time.perf_counter() - t0)


def gguf_bytes_per_token(gguf: Path) -> int:
    """Bytes of the GGUF's tensors one decode step reads: all of them, but the token embedding
    when an output matrix of its own exists (then a token reads one of its rows)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


def decode_rounds(model, binary: Path, gguf: Path, threads: int, rounds: int,
                  bandwidth: float) -> DecodeRounds:
    """`rounds` rounds of kolibri, llama.cpp (default flags), llama.cpp (--repack 0)"""
    result = DecodeRounds(threads, [], {v: [] for v in VARIANTS},
                          model.weights.nbytes_per_token(), gguf_bytes_per_token(gguf),
                          bandwidth / 1e9)
    for _ in range(rounds):
        result.kolibri.append(kolibri_decode(model.transformer))
        for v, flags in VARIANTS.items():
            if v in result.failures:
                continue
            try:
                result.peer[v].append(decode_run(binary, gguf, threads, flags))
            except RuntimeError as e:
                result.failures[v] = str(e)
    result.peer = {v: tps for v, tps in result.peer.items() if tps}
    return result
