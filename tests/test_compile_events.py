"""The compile progress line is driven by numba's own compile events (numba.core.event), not by
a clock: each start and end of a compile is reported with the kolibri function being compiled,
a cache hit reports nothing, and the CLI's line shows what is prepared in the user's words (never
numba's names), which part of how many, the functions compiled, and the time."""

import io
import time

import numba
import numpy as np
from numba.core import event
from rich.console import Console

from kolibri_cli.cli import render
from kolibri_cli.engine import matmul
from kolibri_cli.engine.jit import compile_events


def fresh(func):
    """A new dispatcher of a kolibri function, with no cache: calling it compiles, always."""
    return numba.njit(func.py_func)


def test_each_compile_start_and_end_is_reported_with_the_kolibri_function():
    seen = []
    padded = fresh(matmul._padded)
    with compile_events(lambda what, done, busy: seen.append((what, done, busy))):
        padded(np.ones((2, 40), np.float32))
    assert seen[0] == ("matmul._padded", 0, 1)  # the first event: its start
    starts = [b for (_, d, b), (_, d0, b0) in zip(seen[1:], seen, strict=False) if b > b0]
    ends = [d for (_, d, b), (_, d0, b0) in zip(seen[1:], seen, strict=False) if d == d0 + 1]
    assert len(starts) + 1 == len(ends) == seen[-1][1] >= 1  # each compile: a start, an end
    assert seen[-1][2] == 0  # none under way after the last end
    assert all(what in ("matmul._padded", "") for what, _, _ in seen)  # numba's own: unnamed


def test_a_cached_or_compiled_function_reports_nothing():
    padded = fresh(matmul._padded)
    padded(np.ones((1, 8), np.float32))
    seen = []
    with compile_events(lambda *a: seen.append(a)):
        padded(np.ones((3, 8), np.float32))  # the same types: no compile
    assert seen == []


def test_no_listener_is_left_behind():
    seen = []
    with compile_events(lambda *a: seen.append(a)):
        pass
    fresh(matmul._padded)(np.ones((1, 8), np.float32))
    assert seen == []


def test_the_cli_line_says_what_in_words_which_part_how_many_and_the_time(monkeypatch):
    """numba's compile events, sent here in a fixed order (a kolibri function, a numba helper it
    needs, their ends, then the next part), each drawn as it arrives: rich redraws on its own
    clock, and on a fast host a real compile ends before the first redraw."""
    from kolibri_cli.engine.kernel import KERNEL_WORDS

    buf = io.StringIO()
    monkeypatch.setattr(render, "err", Console(file=buf, force_terminal=True, width=200))
    ours, helper = fresh(matmul._padded), numba.njit(lambda x: x)
    lines = []
    with render.progress_bar() as bars:
        def draw(what, finished, under_way):
            bars.compiling(what, finished, under_way)
            bars.bar.refresh()
            lines.append(buf.getvalue())

        with compile_events(draw):
            bars.preparing(KERNEL_WORDS["lean"], 0, 2)
            for start, dispatcher in [(1, ours), (1, helper), (0, helper), (0, ours)]:
                (event.start_event if start else event.end_event)(
                    "numba:compile", data={"dispatcher": dispatcher})
            bars.preparing(KERNEL_WORDS["verify"], 1, 2)
            event.start_event("numba:compile", data={"dispatcher": ours})
    drawn = [text[len(before):] for before, text in zip(["", *lines], lines, strict=False)]
    lean = f"compiling {KERNEL_WORDS['lean']} for this machine (1 of 2 parts"
    assert lean + "; 0 functions so far)" in drawn[0]
    assert lean + "; 1 functions so far)" in drawn[2]
    assert f"compiling {KERNEL_WORDS['verify']} for this machine (2 of 2 parts; 2 functions" \
        in drawn[4]
    assert not any("matmul" in text or "_padded" in text for text in drawn)  # numba's names
    assert all("0:00:0" in text for text in drawn)  # the elapsed time column
    assert "50%" in drawn[4]  # a part of two done (rich estimates the time left from it)
    assert "compiled 2 functions" in buf.getvalue()


def test_the_lines_clock_runs_across_several_top_level_compiles(monkeypatch):
    """The kernel compiles as several top-level calls with nothing under way between them: the
    line's elapsed time stops when the block ends, not at the first call's end."""
    monkeypatch.setattr(render, "err", Console(file=io.StringIO(), force_terminal=True))
    with render.progress_bar() as bars, compile_events(bars.compiling):
        fresh(matmul._padded)(np.ones((2, 40), np.float32))
        time.sleep(0.2)
        after_pause = time.monotonic()
        fresh(matmul._padded)(np.ones((2, 40), np.float32))
    (task,) = bars.bar.tasks
    shown = task.finished_time if task.finished else task.elapsed  # as TimeElapsedColumn
    assert task.start_time + shown >= after_pause  # rich's clock is time.monotonic
    assert task.description == f"compiled {bars.compiled} functions"
    assert task.finished
