"""c(n) of an inference server: the time of a verify pass of n tokens over a plain decode step.

Two methods:
- synthetic acceptance (llama-servers kolibri starts): timed in the server's real decode loop,
  sampling, drafting and bookkeeping included. n = 1 is a plain server; for n > 1 llama-server
  runs with servers.synth_args(n-1): ngram-simple with n-gram size 1 drafts the n-1 tokens that
  followed the last token's previous occurrence and every draft is accepted, so on a prompt that
  repeats a random sequence (period longer than any pass) nearly every pass carries n tokens. A
  pass that found nothing to draft is a plain step: it is priced at the same round's plain step
  and taken out.
- prompt evaluation (a llama.cpp server at a URL, which kolibri cannot restart with other
  flags): n new tokens after a cached prefix are one n-token batch, timed by the server
  (`timings.prompt_ms`). An approximation: llama.cpp computes logits for the batch's last row
  only, where a verify pass needs all n (the output head is a small share of a large model).
Rounds alternate over n (machine noise hits every n alike) and are repeated; medians reported.
Non-goals: vLLM/SGLang (they report no per-request timings; give their c(n) with --costs).
"""

import statistics
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.callbacks import Ticks
from kolibri_cli.errors import KolibriError
from kolibri_cli.servers import LOCAL, Completion, ServerApi, serving, synth_args

PERIOD = 64  # tokens in the repeating unit: longer than any pass, so drafts are never cut short
PERIODS = 3  # the prompt holds the unit this many times (192 tokens, a chat prompt's length)
NEW_TOKENS = 120  # decode steps per timed request (about the goldens' length)
PROMPT_SEED = 5


def periodic_prompt(model, seed: int = PROMPT_SEED) -> list[int]:
    """PERIOD distinct random ordinary token ids, repeated PERIODS times."""
    ordinary = np.asarray(model.tokenizer.ordinary_ids(model.config.vocab_size), dtype=np.int64)
    unit = np.random.default_rng(seed).choice(ordinary, PERIOD, replace=False).tolist()
    return unit * PERIODS


@dataclass
class PassTimes:
    """One server's verify passes: tokens per pass and the time of one, per round."""

    n: int  # tokens per verify pass (1 = a plain decode step)
    ms: list[float] = field(default_factory=list)  # ms per pass, one value per round
    full: list[float] = field(default_factory=list)  # share of passes that carried n tokens

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)


@dataclass
class ServerCosts:
    """c(n) of one engine, measured in one run."""

    engine: str
    method: str  # "synthetic acceptance" or "prompt evaluation"
    threads: int | None
    prompt_tokens: int
    new_tokens: int
    repeats: int
    passes: list[PassTimes]

    @property
    def forward_ms(self) -> dict[int, float]:
        return {p.n: p.median_ms for p in sorted(self.passes, key=lambda p: p.n)}

    @property
    def costs(self) -> dict[int, float]:
        ms = self.forward_ms
        if 1 not in ms:
            raise KolibriError("no plain server among the engines: c(n) needs c(1)")
        return {n: t / ms[1] for n, t in ms.items()}

    def to_dict(self) -> dict:
        return {"engine": self.engine, "method": self.method, "threads": self.threads,
                "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "repeats": self.repeats,
                "forward_ms": {str(n): t for n, t in self.forward_ms.items()},
                "costs": {str(n): c for n, c in self.costs.items()},
                "passes": [{"n": p.n, "ms": p.ms, "full_share": p.full} for p in self.passes]}


def pass_ms(c: Completion, n: int, step_ms: float | None) -> tuple[float, float]:
    """(ms per n-token pass, share of full passes) of one synthetic-acceptance request; passes
    without a draft are priced at `step_ms` (the plain step of the same round)."""
    if c.decode_s is None:
        raise KolibriError("the server reports no decode time (timings); c(n) needs llama-server")
    passes = len(c.output_ids) - 1 - (c.accepted or 0)
    if n == 1:
        return 1e3 * c.decode_s / max(passes, 1), 1.0
    full = (c.drafted or 0) / (n - 1)
    if full < 1 or step_ms is None:
        raise KolibriError(f"the {n}-token server drafted nothing on the periodic prompt: is it "
                           f"running with --spec-synth-rates (synthetic acceptance)?")
    plain = max(passes - full, 0.0)
    return (1e3 * c.decode_s - plain * step_ms) / full, min(full / max(passes, 1), 1.0)


def measure_costs(servers: dict[int, ServerApi], prompt: list[int], repeats: int,
                  engine: str, threads: int | None = None, step: Ticks | None = None,
                  new_tokens: int = NEW_TOKENS) -> ServerCosts:
    """Time every server's passes, round-robin, `repeats` rounds (plain server first)."""
    times = {n: PassTimes(n) for n in sorted(servers)}
    for r in range(repeats):
        cost_round(servers, prompt, times, new_tokens)
        if step:
            step(r + 1, repeats)
    return ServerCosts(engine, "synthetic acceptance", threads, len(prompt), new_tokens, repeats,
                       list(times.values()))


def cost_round(servers: dict[int, ServerApi], prompt: list[int], times: dict[int, PassTimes],
               new_tokens: int = NEW_TOKENS) -> None:
    """One request per server; `times` gains one value per n."""
    step_ms = None
    for n in sorted(servers):
        steps = new_tokens // n * n  # whole passes: the last one is not cut by the budget
        ms, full = pass_ms(servers[n].complete(prompt, 1 + steps), n, step_ms)
        step_ms = ms if n == 1 else step_ms
        times[n].ms.append(ms)
        times[n].full.append(full)


@contextmanager
def cost_servers(model, max_n: int, gguf=None, threads: int | None = None,
                 timeout: float = 600.0) -> Iterator[dict[int, ServerApi]]:
    """Local llama-servers for n = 1..max_n: a plain one, and synthetic acceptance of n-1 drafts."""
    with ExitStack() as stack:
        yield {n: stack.enter_context(serving(LOCAL, model, gguf=gguf, threads=threads,
                                              args=synth_args(n - 1) if n > 1 else (),
                                              timeout=timeout))
               for n in range(1, max_n + 1)}


def prompt_eval_costs(api, prompt: list[int], max_n: int, repeats: int, engine: str,
                      step: Ticks | None = None, seed: int = PROMPT_SEED) -> ServerCosts:
    """c(1..max_n) of a llama.cpp server at a URL by prompt evaluation after a cached prefix:
    each round evaluates `prompt` once (cached), then prompt + n fresh random tokens per n."""
    vocab = sorted(set(prompt))
    rng = np.random.default_rng(seed)
    times = {n: PassTimes(n) for n in range(1, max_n + 1)}
    last = None  # the previous suffix's first token: a new one must differ, or it is cached
    for r in range(repeats):
        api.evaluate(prompt)
        for n, t in times.items():
            suffix = rng.choice([v for v in vocab if v != last], n, replace=False).tolist()
            last = suffix[0]
            evaluated, ms = api.evaluate(prompt + suffix)
            if evaluated != n:
                raise KolibriError(f"{api.url} re-evaluated {evaluated} tokens instead of {n}: "
                                   "its prompt cache is off or shared (start it with -np 1)")
            t.ms.append(ms)
            t.full.append(1.0)
        if step:
            step(r + 1, repeats)
    return ServerCosts(engine, "prompt evaluation", None, len(prompt), 0, repeats,
                       list(times.values()))
