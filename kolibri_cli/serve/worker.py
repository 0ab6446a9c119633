"""One generation at a time: requests wait in a bounded queue for the one worker thread, which
runs the generators `kolibri generate` runs (plain, or speculative with the guard drafting by the
c(n) it times as it goes), hands each step's ids back as they come and stops a request whose
client went away at its next step.

One thread, because the engine holds one sequence at a time and its kernel already uses every
core; a full queue refuses at once (`Busy`) instead of letting clients wait without bound.
Non-goals: batching, priorities, HTTP (app.py).
"""

import dataclasses
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from kolibri_cli.decode.drafting import Drafting
from kolibri_cli.decode.generate import GenerationResult, generate_plain, generate_spec
from kolibri_cli.decode.proposers import DEFAULT_SPEC_PROPOSER, default_settings, make_proposer
from kolibri_cli.decode.sampling import Logprobs, Sampler, Sampling
from kolibri_cli.engine.jit import get_threads, set_threads
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.home import YES_WORDS
from kolibri_cli.serve.requests import ApiError, Ask

PROPOSER = DEFAULT_SPEC_PROPOSER  # what --spec drafts with, as `kolibri generate --spec`


class Busy(Exception):
    """The queue is full: the request is refused, not kept waiting."""


class Cancelled(Exception):
    """The client went away: its generation stops at the next step."""


@dataclass
class Usage:
    """One request's counts, as its answer's `usage` and the /metrics counters carry them.
    Drafts are counted as the probe counts them: none aimed past the final token."""

    prompt_tokens: int
    completion_tokens: int  # the eos id included, when generation stopped on it
    verify_passes: int = 0  # speculative decode steps (a pass may carry no draft)
    drafts: int = 0  # passes that carried a draft (vLLM's num_drafts)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts with > i accepted
    plain_steps: int = 0  # decode steps that ran one token (no draft)

    @classmethod
    def of_all(cls, results: list[GenerationResult]) -> "Usage":
        """A request's usage over its choices: the prompt once, the rest summed."""
        each = [cls.of(r) for r in results]
        width = max(len(u.accepted_per_pos) for u in each)
        return cls(each[0].prompt_tokens, *(sum(getattr(u, f) for u in each) for f in (
            "completion_tokens", "verify_passes", "drafts", "draft_tokens", "accepted_tokens")),
            [sum(u.accepted_per_pos[i] for u in each if i < len(u.accepted_per_pos))
             for i in range(width)], sum(u.plain_steps for u in each))

    @classmethod
    def of(cls, r: GenerationResult) -> "Usage":
        if r.mode != "spec":
            return cls(len(r.prompt_ids), len(r.output_ids), plain_steps=len(r.step_s))
        st, counted = r.spec_stats(), r.counted()
        return cls(len(r.prompt_ids), len(r.output_ids), st["verify_passes"],
                   sum(d > 0 for d, _ in counted), st["drafts_proposed"], st["drafts_accepted"],
                   st["accepted_per_position"], sum(p.drafted == 0 for p in r.passes))

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "verify_passes": self.verify_passes, "drafts": self.drafts,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "accepted_tokens_per_pos": self.accepted_per_pos,
                "plain_steps": self.plain_steps}


@dataclass(frozen=True)
class Times:
    """A finished request's seconds from its arrival (read and queued) to: its generation's
    start, its first token, its end — what vLLM's latency histograms observe."""

    queue_s: float
    first_token_s: float
    total_s: float


@dataclass(frozen=True)
class Step:
    """The ids one decode step added to choice `index`, and with logprobs asked, each one's
    (token, logprob, [(id, logprob)] of the top)."""

    index: int
    ids: list[int]
    logprobs: list | None = None


@dataclass
class Job:
    """One request on its way through the queue. `emit(kind, value)` (thread-safe) receives
    ("tokens", Step) per step, then ("done", (results, usage)) — a GenerationResult per
    choice — ("cancelled", None) or ("error", ApiError)."""

    id: str
    ask: Ask
    emit: Callable[[str, object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()


class Worker:
    """`start()` warms the kernels up, then `submit(job)` until `stop()`."""

    def __init__(self, model, spec: bool, max_queue: int, metrics, threads: int | None = None,
                 log=None, note: Callable[[str], None] = lambda line: None):
        self.model, self.spec, self.metrics, self.threads = model, spec, metrics, threads
        self.log, self.note = log, note  # a goldens.log.GoldenLog (--record) or None
        self.costs = None  # the proposer's measuring CostTable (the guard's), shared by all
        self.drafting: Drafting | None = None  # --spec: what every request drafts with
        self.kernel_threads: int | None = None  # the threads the worker's kernel calls use
        self._queue: queue.Queue[Job | None] = queue.Queue()  # bounded by _slots
        # the running request and those waiting behind it; a Queue's maxsize cannot say
        # "none may wait" (0 is unbounded there)
        self._slots = threading.BoundedSemaphore(max_queue + 1)
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kolibri-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed

    def submit(self, job: Job) -> None:
        """Queue `job`, or `Busy` when max_queue requests already wait behind a running one."""
        if not self._slots.acquire(blocking=False):
            raise Busy
        self._queue.put(job)
        self.metrics.waiting.set(self._queue.qsize())

    def cancel_all(self) -> None:
        """Stop the running request at its next step and skip the queued ones (shutdown past
        its drain time: nobody is left to answer)."""
        self._closing.set()

    def stop(self) -> None:
        """After the last request: the thread ends (a queued job still runs first)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _main(self) -> None:
        try:
            self._prepare()
        except BaseException as e:  # noqa: BLE001 - handed to start(), in the caller's thread
            self._failed = e
        self._ready.set()
        if self._failed is None:
            while (job := self._queue.get()) is not None:
                self.metrics.waiting.set(self._queue.qsize())
                try:
                    self._serve(job)
                finally:
                    self._slots.release()

    def _prepare(self) -> None:
        """Thread count (numba's is per thread), the guard's c(n) from earlier runs, and every
        kernel compiled or loaded before the first request."""
        if self.threads:
            set_threads(self.threads)
        self.kernel_threads = get_threads()
        if self.spec:
            self.drafting = Drafting.checked(None, None, PROPOSER).for_model(
                self.model, self.note, self.kernel_threads)
            self.costs = self.drafting.costs()
        ids = self.model.tokenizer.encode_nogil("Hello")[:4] or [0]  # as requests are read
        generate_plain(self.model, ids, 2)
        if self.spec:  # frozen default c(n): the warm-up's timings stay out of the table
            generate_spec(self.model, ids, 2, make_proposer(PROPOSER, *default_settings(PROPOSER)))
        Sampler(Sampling(temperature=1.0))

    def _serve(self, job: Job) -> None:
        if job.cancelled.is_set() or self._closing.is_set():  # gone while it waited
            self.metrics.count("cancelled")
            return job.emit("cancelled", None)
        self.metrics.running.set(1)
        try:
            done = self._finish(job, *self._generate(job))
        except Cancelled:
            self.metrics.count("cancelled")
            return job.emit("cancelled", None)
        except KolibriError as e:
            self.metrics.count("error")
            return job.emit("error", ApiError(400, str(e)))
        except Exception as e:  # a bug: this request fails, the server goes on
            self.metrics.count("error")
            self._report(job, e)
            return job.emit("error", ApiError(500, f"internal error ({type(e).__name__}: {e})",
                                              kind="server_error"))
        finally:
            self.metrics.running.set(0)
        job.emit("done", done)

    def _finish(self, job: Job, results: list[GenerationResult], times: list[float]
                ) -> tuple[list[GenerationResult], Usage]:
        """A finished request counted and recorded (inside _serve's net: a bug here fails
        the request, not the worker): what its answer carries."""
        usage = Usage.of_all(results)
        now = time.perf_counter()
        self.metrics.observe(usage, results, Times(times[0] - job.arrived,
                                                   times[1] - job.arrived, now - job.arrived))
        for index, result in enumerate(results):
            self._record(job, result, index)
        return results, usage

    def _generate(self, job: Job) -> tuple[list[GenerationResult], list[float]]:
        """Every choice's generation, one after the other; each sampled choice has its own
        seed (the request's + its index). Also when it started and its first token came."""
        a, times = job.ask, [time.perf_counter()]
        results = []
        for index in range(a.n):
            sampling = a.sampling if a.sampling.greedy or not index else dataclasses.replace(
                a.sampling, seed=(a.sampling.seed + index) % 2**64)
            results.append(self._choice(job, index, sampling, times))
        return results, times

    def _choice(self, job: Job, index: int, sampling: Sampling, times: list[float]
                ) -> GenerationResult:
        a = job.ask
        logprobs = None if a.logprobs is None else Logprobs(a.logprobs)
        done = [0]  # output tokens emitted so far

        def on_tokens(ids: list[int]) -> None:
            if job.cancelled.is_set() or self._closing.is_set():
                raise Cancelled
            if len(times) == 1:
                times.append(time.perf_counter())
            rows = None if logprobs is None else [
                logprobs.at[len(a.prompt_ids) + done[0] + i] for i in range(len(ids))]
            done[0] += len(ids)
            job.emit("tokens", Step(index, ids, rows))

        how = {"sampling": sampling, "stop": list(a.stop), "logprobs": logprobs}
        if not self.spec:
            return generate_plain(self.model, a.prompt_ids, a.max_tokens, on_tokens, **how)
        proposer = self.drafting.new(self.costs)
        return generate_spec(self.model, a.prompt_ids, a.max_tokens, proposer, on_tokens, **how)

    def _record(self, job: Job, result: GenerationResult, index: int) -> None:
        """Append a finished choice as a golden chain (--record); a failed write is noted
        and recording stops (the requests go on)."""
        if self.log is None:
            return
        try:
            self.log.add(trace(job, result, self.model, index))
        except OSError as e:
            self.note(f"recording stopped: {self.log.path}: {e.strerror or e}")
            self.log = None

    def _report(self, job: Job, e: Exception) -> None:
        if os.environ.get("KOLIBRI_DEBUG", "").strip().lower() in YES_WORDS:
            self.note(traceback.format_exc())
        else:
            self.note(f"internal error in request {job.id} ({type(e).__name__}: {e}); this is "
                      "a kolibri bug — KOLIBRI_DEBUG=1 logs the traceback")


def trace(job: Job, result: GenerationResult, model, index: int = 0) -> Golden:
    """A finished choice as a golden chain: what `kolibri probe -g` simulates over (the
    request's id; with n > 1, `-index` after it)."""
    from kolibri_cli import __version__

    a = job.ask
    reference = {"engine": "kolibri", "engine_version": f"kolibri {__version__}",
                 "dtype": model.numerics, "max_tokens": a.max_tokens, "served": True,
                 "mode": result.mode, "stop_reason": result.stop_reason}
    name = job.id if a.n == 1 else f"{job.id}-{index}"
    return Golden(name, a.kind, a.prompt, a.kind == "chat", result.prompt_ids,
                  result.output_ids, model.name, model.sha256, reference, list(model.eos_ids),
                  result.sampling.to_dict())
