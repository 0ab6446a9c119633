"""c(n) of an inference server: the time of a verify pass of n tokens over a plain decode step.

Two methods:
- synthetic acceptance (llama-servers kolibri starts): timed in the server's real decode loop,
  sampling, drafting and bookkeeping included. n = 1 is a plain server; for n > 1 llama-server
  runs with engines.synth_args(n-1): ngram-simple with n-gram size 1 drafts up to n-1 tokens that
  followed the last token's previous occurrence and every draft is accepted. The model still
  picks each pass's last token, so the history does not stay periodic everywhere and some passes
  carry fewer tokens; ngram-simple is deterministic, so replaying it over the returned ids gives
  every pass's length (checked against the server's counters), and the shorter passes are priced
  at the same round's lower-n figures before the rest is divided over the n-token passes.
  Requests ignore eos, so every server decodes the same number of tokens at the same positions
  (a plain model stops on eos after 16 tokens of the periodic prompt).
- prompt evaluation (a llama.cpp server at a URL, which kolibri cannot restart with other
  flags; and any c(T) curve, `--curve`): n new tokens after a cached prefix are one n-token
  batch, timed by the server (`timings.prompt_ms`). An approximation: llama.cpp computes logits
  for the batch's last row only, where a verify pass needs all n, and a batch of many sequences
  one per sequence (the output head is a small share of a large model, not of a 135M one).
Rounds alternate over n, in alternating order (drift hits every n alike), and are repeated;
medians reported, with the least-squares line c(n) = 1 + slope (n - 1) through them beside.
The synthetic-acceptance servers run one at a time: each round starts the server of each n,
warms it with one short request, times one and stops it, so memory holds one such server
whatever k is (k + 1 of them at once took ~12 GB at k = 48). Above TIMED_EVERY tokens n is timed
on a half-octave grid, linear between (timing.curve_sizes).
- batched decode (`decode_costs`): d(B), one decode step of B sequences, one token each, each
  at its own context, over one sequence's step (as llama-batched-bench times it): one
  llama-server with -np B, B requests at once, the step time per request its decode time over
  its tokens. What a plain step of B sequences costs; a B-token prompt reads one cache and runs
  one attention, so it underprices it (probe/load.py).
Non-goals: vLLM/SGLang (they report no per-request timings; give their c(n) with --costs).
"""

import statistics
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.callbacks import Ticks
from kolibri_cli.costs.model import line_slope
from kolibri_cli.costs.timing import curve_sizes
from kolibri_cli.decode.proposers import LlamaCppSimpleProposer, draft
from kolibri_cli.engines import (
    LOCAL,
    Completion,
    ServerApi,
    connect,
    is_server,
    serving,
    synth_args,
)
from kolibri_cli.errors import KolibriError

# The contexts timed, 64..184 positions, are a chat request's: llama.cpp pads attention to
# multiples of 256 positions, and a pass past 256 costs more (more so for n > 1): c(n) timed on
# longer contexts overprices chat-length passes.
PERIOD = 32  # tokens in the repeating unit: longer than any pass, so drafts are never cut short
PERIODS = 2  # the prompt holds the unit this many times (64 tokens)
NEW_TOKENS = 120  # decode steps per timed request (about the goldens' length)
PROMPT_SEED = 5
TIMED_EVERY = 8  # c(n) timed at every n up to this, on a grid above (a pass of k + 1 tokens)
WARM_TOKENS = 8  # a server just started answers one request this long before it is timed

MAX_DECODE_SLOTS = 64  # the most sequences a batched decode is timed with (beyond: the line)

Opener = Callable[[], AbstractContextManager[ServerApi]]  # `with opener() as server:` ...


def check_engine(engine: str) -> None:
    """`kolibri bench --engine`: llama-servers started here or a server's URL."""
    if not is_server(engine):
        raise KolibriError(f"unknown --engine {engine!r}: kolibri, {LOCAL} or a llama.cpp "
                           "server's base URL")


def tokenizer_api(engine: str, api: str | None) -> str | None:
    """The API a URL's tokenizer is read through (llama.cpp unless told); none for the
    llama-servers started here (the model's own tokenizer)."""
    return None if engine == LOCAL else api or "llama.cpp"


def periodic_prompt(model, seed: int = PROMPT_SEED, longest: int = 0) -> list[int]:
    """PERIOD distinct random ordinary token ids (more when a pass of `longest` tokens needs
    them), repeated PERIODS times."""
    if model.vocab_size is None:
        raise KolibriError(f"the vocabulary size of {model.name} is not known: pass --model")
    unit = model.tokenizer.sample_ordinary(model.vocab_size, max(PERIOD, longest + 1), seed)
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

    @property
    def slope(self) -> float:
        return line_slope(self.costs)

    @property
    def costs_option(self) -> str | None:
        """c(1), c(2), ... as `kolibri probe --costs` takes them; None for a curve on a grid
        (its n are not consecutive: the probe reads it from a file, the JSON's `costs`)."""
        if sorted(self.costs) != list(range(1, max(self.costs) + 1)):
            return None
        return ",".join(f"{self.costs[n]:.3f}" for n in range(1, max(self.costs) + 1))

    @property
    def fitted(self) -> dict[int, float]:
        """c(n) on the least-squares line: the raw medians smoothed, for comparison."""
        return {n: 1.0 + self.slope * (n - 1) for n in self.costs}

    def to_dict(self) -> dict:
        return {"engine": self.engine, "method": self.method, "threads": self.threads,
                "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "repeats": self.repeats,
                "forward_ms": {str(n): t for n, t in self.forward_ms.items()},
                "costs": {str(n): c for n, c in self.costs.items()},
                "costs_option": self.costs_option,
                "fit": {"slope": self.slope,
                        "costs": {str(n): c for n, c in self.fitted.items()}},
                "passes": [{"n": p.n, "ms": p.ms, "full_share": p.full} for p in self.passes]}


def pass_lengths(prompt: list[int], c: Completion, m: int, max_tokens: int) -> list[int]:
    """Tokens carried by each pass of a synthetic-acceptance request: ngram-simple (n-gram 1,
    m drafts, the server's budget n_predict - generated - 1) replayed over the returned ids,
    every draft accepted. Must add up to the server's own draft counter."""
    proposer = LlamaCppSimpleProposer(m, 1, 1)
    ids = np.asarray(list(prompt) + list(c.output_ids), dtype=np.int64)  # [len(prompt) + N]
    lengths, pos, n = [], 1, len(c.output_ids)
    while pos < n:
        drafted = draft(proposer, ids[: len(prompt) + pos], min(m, max_tokens - pos - 1))
        lengths.append(1 + len(drafted))
        pos += 1 + len(drafted)
    if (c.drafted, c.accepted) != (sum(lengths) - len(lengths),) * 2:
        raise KolibriError(f"the server drafted/accepted {c.drafted}/{c.accepted} where "
                           f"ngram-simple (n-gram 1, m {m}) with every draft accepted gives "
                           f"{sum(lengths) - len(lengths)}: is it running with "
                           f"--spec-synth-rates (synthetic acceptance)?")
    return lengths


def solve_pass_ms(total_ms: float, lengths: list[int], known: dict[int, float]) -> float:
    """ms of one full pass (the longest in `lengths`) of a request that took `total_ms`: shorter
    passes are priced at `known` ms (the same round's), or, for a length not measured, on the
    line between a plain step and the full pass (so the result stays exact if c is linear)."""
    n = max(lengths)
    if n == 1:
        return total_ms / len(lengths)
    rest, weight = total_ms, 0.0
    for length in lengths:
        if length == n:
            weight += 1
        elif length in known:
            rest -= known[length]
        else:  # known[1]*(1-f) + t(n)*f with f the length's place between 1 and n
            f = (length - 1) / (n - 1)
            rest -= known[1] * (1 - f)
            weight += f
    return rest / weight


def measure_costs(servers: dict[int, Opener], prompt: list[int], repeats: int,
                  engine: str, threads: int | None = None, step: Ticks | None = None,
                  new_tokens: int = NEW_TOKENS) -> ServerCosts:
    """Time every server's passes, `repeats` rounds, each round in the other order."""
    times = {n: PassTimes(n) for n in sorted(servers)}
    for r in range(repeats):
        cost_round(servers, prompt, times, new_tokens, reverse=r % 2 == 1)
        if step:
            step(r + 1, repeats)
    return ServerCosts(engine, "synthetic acceptance", threads, len(prompt), new_tokens, repeats,
                       list(times.values()))


def cost_round(servers: dict[int, Opener], prompt: list[int], times: dict[int, PassTimes],
               new_tokens: int = NEW_TOKENS, reverse: bool = False) -> None:
    """One request per server (in ascending n, or descending), each opened only for its request
    (`servers[n]()`: one server at a time); `times` gains one value per n."""
    if 1 not in servers:
        raise KolibriError("no plain server among the engines: c(n) needs c(1)")
    answers = {}
    for n in sorted(servers, reverse=reverse):
        steps = new_tokens // n * n  # whole passes: the last one is not cut by the budget
        with servers[n]() as server:
            answers[n] = (server.complete(prompt, 1 + steps, ignore_eos=True), 1 + steps)
    known: dict[int, float] = {}
    for n, (c, max_tokens) in sorted(answers.items()):
        if c.decode_s is None:
            raise KolibriError("the server reports no decode time (timings); c(n) needs "
                               "llama-server")
        lengths = [1] * (len(c.output_ids) - 1) if n == 1 else \
            pass_lengths(prompt, c, n - 1, max_tokens)
        if n not in lengths:
            raise KolibriError(f"the {n}-token server made no {n}-token pass on the periodic "
                               "prompt: is it running with --spec-synth-rates?")
        known[n] = solve_pass_ms(1e3 * c.decode_s, lengths, known)
        times[n].ms.append(known[n])
        times[n].full.append(lengths.count(n) / len(lengths))


def cost_sizes(k: int) -> list[int]:
    """The n a server's c(1..k+1) is timed at: every n up to TIMED_EVERY, a grid above."""
    return curve_sizes(min(k + 1, TIMED_EVERY), k + 1)


def kept(server: ServerApi) -> Opener:
    """An opener of a server that stays up (the caller's)."""
    return lambda: nullcontext(server)


def cost_servers(model, sizes: list[int], prompt: list[int], gguf=None,
                 threads: int | None = None, timeout: float = 600.0) -> dict[int, Opener]:
    """Openers of local llama-servers for each n of `sizes`: a plain one (n = 1), synthetic
    acceptance of n-1 drafts; each starts its server when opened and stops it when closed."""
    return {n: lambda n=n: _started(model, synth_args(n - 1) if n > 1 else (), prompt, gguf,
                                    threads, timeout)
            for n in sizes}


@contextmanager
def _started(model, args, prompt: list[int], gguf, threads, timeout) -> Iterator[ServerApi]:
    """A llama-server started with `args`, warmed: a new process's first request pays for its
    page faults and allocations, which no timed pass should."""
    with serving(LOCAL, model, gguf=gguf, threads=threads, args=args, timeout=timeout) as server:
        server.complete(prompt, WARM_TOKENS, ignore_eos=True)
        yield server


def prompt_eval_costs(api, prompt: list[int], sizes: list[int], repeats: int, engine: str,
                      step: Ticks | None = None, seed: int = PROMPT_SEED,
                      pool: list[int] | None = None) -> ServerCosts:
    """c(n) for each n of `sizes` (1 among them) of a llama.cpp server by prompt evaluation after
    a cached prefix: each round evaluates `prompt` once (cached), then prompt + n fresh tokens
    drawn from `pool` (default: the prompt's own ids) per n, ascending or descending by round."""
    pool = sorted(set(pool or prompt))
    if len(pool) <= max(sizes):
        raise KolibriError(f"{len(pool)} distinct tokens to draw from: c({max(sizes)}) needs "
                           f"{max(sizes) + 1}")
    rng = np.random.default_rng(seed)
    times = {n: PassTimes(n) for n in sorted(set(sizes))}
    last = None  # the previous suffix's first token: a new one must differ, or it is cached
    for r in range(repeats):
        api.evaluate(prompt)
        for n in sorted(times, reverse=r % 2 == 1):
            suffix = rng.choice([v for v in pool if v != last], n, replace=False).tolist()
            last = suffix[0]
            evaluated, ms = api.evaluate(prompt + suffix)
            if evaluated != n:
                raise KolibriError(f"{api.url} re-evaluated {evaluated} tokens instead of {n}: "
                                   "its prompt cache is off or shared (start it with -np 1)")
            times[n].ms.append(ms)
            times[n].full.append(1.0)
        if step:
            step(r + 1, repeats)
    return ServerCosts(engine, "prompt evaluation", None, len(prompt), 0, repeats,
                       list(times.values()))


def curve_costs(engine: str, model, k: int, most: int, repeats: int, api: str | None = None,
                gguf=None, threads: int | None = None, timeout: float = 600.0,
                step: Ticks | None = None) -> ServerCosts:
    """A server's c(T) curve: c(n) for n = 1..k+1 and on the grid up to `most` tokens
    (timing.curve_sizes), by prompt evaluation on a plain one-slot llama-server started here
    (`engine` llama-server) or on the llama.cpp server at the URL `engine`."""
    sizes = curve_sizes(k + 1, most)
    prompt = periodic_prompt(model)
    pool = model.tokenizer.sample_ordinary(model.vocab_size, max(sizes) + 1, PROMPT_SEED + 1)
    with serving(engine, model, api or "llama.cpp", gguf, threads, timeout=timeout) as server:
        if server.api != "llama.cpp":
            raise KolibriError("c(n) from a URL needs llama.cpp's per-request timings; for "
                               "other servers pass c(n) to the probe with --costs")
        costs = prompt_eval_costs(server, prompt, sizes, repeats, engine, step, pool=pool)
    costs.threads = threads
    return costs


def server_costs(engine: str, model, k: int, repeats: int, threads: int | None,
                 api: str | None, gguf, timeout: float, step: Ticks | None = None,
                 note=lambda line: None, curve: int | None = None) -> ServerCosts:
    """c(1..k+1) of `engine` (with `curve`, c(T) up to that many tokens: curve_costs):
    llama-servers started here (synthetic acceptance), or a llama.cpp server at a URL (prompt
    evaluation); `note` says when servers start."""
    if curve:
        return curve_costs(engine, model, k, curve, repeats, api, gguf, threads, timeout, step)
    prompt = periodic_prompt(model, longest=k + 1)
    if engine == LOCAL:
        sizes = cost_sizes(k)
        note(f"timing c(n) on {len(sizes)} llama-servers, one at a time ...")
        servers = cost_servers(model, sizes, prompt, gguf, threads, timeout)
        return measure_costs(servers, prompt, repeats, LOCAL, threads, step)
    server = connect(engine, api or "llama.cpp", model.tokenizer, model.eos_ids, timeout,
                     vocab=model.vocab_size)
    if server.api != "llama.cpp":
        raise KolibriError("c(n) from a URL needs llama.cpp's per-request timings; for other "
                           "servers pass c(n) to the probe with --costs")
    return prompt_eval_costs(server, prompt, list(range(1, k + 2)), repeats, engine, step)


def decode_costs(server: ServerApi, prompts: list[list[int]], batches: list[int], repeats: int,
                 step: Ticks | None = None, new_tokens: int = NEW_TOKENS) -> dict[int, float]:
    """d(B) for each B of `batches` (1 among them, at most len(prompts)) on a server with at least
    max(B) slots: per round and B (ascending, or descending), B requests at once, request i on
    prompts[i], each decoding `new_tokens` with eos ignored; a step's ms is the median over the
    B requests of decode time / decoded tokens; d(B) the median over rounds of step(B) /
    step(1) of the same round (drift cancels)."""
    rounds = []
    with ThreadPoolExecutor(max(batches)) as pool:
        for r in range(repeats):
            ms = {b: _batch_step_ms(server, prompts[:b], new_tokens, pool)
                  for b in sorted(batches, reverse=r % 2 == 1)}
            rounds.append({b: t / ms[1] for b, t in ms.items()})
            if step:
                step(r + 1, repeats)
    return {b: statistics.median(x[b] for x in rounds) for b in sorted(batches)}


def _batch_step_ms(server: ServerApi, prompts: list[list[int]], new_tokens: int,
                   pool: ThreadPoolExecutor) -> float:
    answers = list(pool.map(lambda p: server.complete(p, new_tokens, ignore_eos=True), prompts))
    if any(a.decode_s is None or len(a.output_ids) < 2 for a in answers):
        raise KolibriError("the server reports no decode time (timings); d(B) needs llama-server")
    return statistics.median(1e3 * a.decode_s / (len(a.output_ids) - 1) for a in answers)


def local_decode_costs(model, batches: list[int], repeats: int, gguf=None,
                       threads: int | None = None, timeout: float = 600.0,
                       step: Ticks | None = None) -> dict[int, float]:
    """d(B) of a llama-server started here with -np max(B) slots (B capped at
    MAX_DECODE_SLOTS; the B asked for above it are priced on the line beyond), each request its
    own periodic prompt."""
    beyond = any(b > MAX_DECODE_SLOTS for b in batches)
    batches = sorted({1, *(b for b in batches if b <= MAX_DECODE_SLOTS)}
                     | ({MAX_DECODE_SLOTS} if beyond else set()))
    prompts = [periodic_prompt(model, PROMPT_SEED + 1 + i) for i in range(max(batches))]
    with serving(LOCAL, model, gguf=gguf, threads=threads, timeout=timeout,
                 slots=max(batches)) as server:
        server.complete(prompts[0], WARM_TOKENS, ignore_eos=True)
        return decode_costs(server, prompts, batches, repeats, step)
