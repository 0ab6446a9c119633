"""`kolibri serve`'s worker in-process, on a tiny model: the bounded queue holds exactly
--max-queue requests behind the running one (0: none), and a bug after a generation fails that
request without killing the one thread every later request needs."""

import queue
import threading

import pytest

pytest.importorskip("prometheus_client")

from kolibri_cli.decode.sampling import Sampling  # noqa: E402
from kolibri_cli.serve.metrics import Metrics  # noqa: E402
from kolibri_cli.serve.requests import Ask  # noqa: E402
from kolibri_cli.serve.worker import Busy, Job, Worker  # noqa: E402

WAIT_S = 120


@pytest.fixture
def start_worker(tiny_llama_folder):
    from kolibri_cli.store.models import open_model

    model, started = open_model(str(tiny_llama_folder())), []

    def start(max_queue: int) -> Worker:
        worker = Worker(model, False, max_queue, Metrics("tiny", 4), threads=1)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.cancel_all()
        worker.stop()


def _job(name: str, hold: threading.Event | None = None) -> tuple[Job, queue.Queue]:
    """A greedy 4-token completion whose events land in the returned queue; with `hold`, its
    first step waits for that event (the worker is busy with it until then)."""
    events: queue.Queue = queue.Queue()

    def emit(kind: str, value) -> None:
        events.put((kind, value))
        if kind == "tokens" and hold is not None:
            hold.wait(WAIT_S)

    return Job(name, Ask("completion", [5, 6, 7], "", 4, Sampling()), emit), events


def _outcome(events: queue.Queue) -> tuple[str, object]:
    while (event := events.get(timeout=WAIT_S))[0] == "tokens":
        pass
    return event


@pytest.mark.parametrize("max_queue", [0, 2])
def test_the_queue_holds_max_queue_requests_behind_the_running_one(start_worker, max_queue):
    worker, hold = start_worker(max_queue), threading.Event()
    running, running_events = _job("running", hold)
    worker.submit(running)
    assert running_events.get(timeout=WAIT_S)[0] == "tokens"  # generating, held at step one
    waiting = [_job(f"waiting{i}") for i in range(max_queue)]
    for job, _ in waiting:
        worker.submit(job)
    with pytest.raises(Busy):  # --max-queue 0 once queued without bound
        worker.submit(_job("refused")[0])
    hold.set()
    assert [_outcome(events)[0] for events in (running_events, *(e for _, e in waiting))] == \
        ["done"] * (1 + max_queue)
    again, events = _job("again")
    worker.submit(again)  # the slots came back
    assert _outcome(events)[0] == "done"


def test_a_bug_after_the_generation_fails_that_request_and_the_worker_goes_on(start_worker):
    worker = start_worker(2)
    observe, calls = worker.metrics.observe, []

    def broken_once(usage, results, times) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in counting")
        observe(usage, results, times)

    worker.metrics.observe = broken_once
    first, first_events = _job("first")
    worker.submit(first)
    kind, error = _outcome(first_events)
    assert kind == "error" and error.status == 500 and "a bug in counting" in error.message
    second, second_events = _job("second")
    worker.submit(second)
    kind, ([result], usage) = _outcome(second_events)
    assert kind == "done" and len(result.output_ids) == usage.completion_tokens == 4
