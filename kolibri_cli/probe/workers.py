"""Where the simulation's tasks run: here, in local worker processes, or on a Ray cluster.

Each executor is a context manager with `run_all(fn, tasks)`, which yields fn(task) for every
task in task order while keeping a bounded number of tasks in flight (results wait in order,
so memory stays flat), and `workers`, the tasks it runs at once.
Non-goals: what a task does (replay/shards.py), progress display (the CLI).
"""

import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from kolibri_cli.errors import KolibriError

IN_FLIGHT_PER_WORKER = 8  # tasks queued per worker: keeps workers busy past a slow task


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Here:
    """One process, this one."""

    name = "local"
    workers = 1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def run_all(self, fn: Callable, tasks: Iterable) -> Iterator:
        return map(fn, tasks)


class Processes:
    """N local worker processes (spawned: no state is shared with this one)."""

    name = "processes"

    def __init__(self, workers: int):
        self.workers = workers

    def __enter__(self):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self._pool = ProcessPoolExecutor(self.workers, multiprocessing.get_context("spawn"),
                                         initializer=_ignore_interrupts)
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # an error or Ctrl-C: stop the workers' tasks now
            _terminate_workers(self._pool)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def run_all(self, fn: Callable, tasks: Iterable) -> Iterator:
        from concurrent.futures.process import BrokenProcessPool

        try:
            yield from _in_order(lambda t: self._pool.submit(fn, t), lambda f: f.result(),
                                 tasks, self.workers * IN_FLIGHT_PER_WORKER)
        except BrokenProcessPool:
            raise KolibriError("a worker process died (out of memory?); try fewer --workers "
                               "or smaller golden files") from None


class RayCluster:
    """Tasks on a Ray cluster at `address` ("auto": the one this machine belongs to; "local": a
    new local Ray instance with `workers` CPUs, or all cores), one CPU each."""

    name = "ray"

    def __init__(self, address: str = "local", workers: int | None = None):
        self.address, self.requested = address, workers

    def __enter__(self):
        ray = _import_ray()
        if self.address == "local":
            ray.init(address="local", num_cpus=self.requested or cores(),
                     include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        else:
            try:
                ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise KolibriError(f"cannot reach the Ray cluster at {self.address}: "
                                   f"{str(e).splitlines()[0]}") from None
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        self._ray = ray
        return self

    def __exit__(self, *exc) -> None:
        self._ray.shutdown()

    def run_all(self, fn: Callable, tasks: Iterable) -> Iterator:
        ray = self._ray
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        try:
            yield from _in_order(remote.remote, ray.get, tasks,
                                 self.workers * IN_FLIGHT_PER_WORKER)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, KolibriError):
                raise KolibriError(str(cause)) from None
            raise KolibriError(f"a Ray task failed: {str(e).splitlines()[0]}") from None


def _in_order(submit: Callable, result: Callable, tasks: Iterable, window: int) -> Iterator:
    """result(submit(task)) for each task, in task order, with at most `window` in flight."""
    pending = deque()
    for task in tasks:
        pending.append(submit(task))
        if len(pending) >= window:
            yield result(pending.popleft())
    while pending:
        yield result(pending.popleft())


def _terminate_workers(pool) -> None:
    """ProcessPoolExecutor.terminate_workers (Python 3.14), or its equivalent before it."""
    if hasattr(pool, "terminate_workers"):
        pool.terminate_workers()
        return
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise KolibriError("--ray needs Ray: pip install 'kolibri-cli[ray]'") from None
    return ray


def _ignore_interrupts() -> None:
    """Workers leave Ctrl-C to the main process, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
