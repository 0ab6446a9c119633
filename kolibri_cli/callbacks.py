"""The progress callbacks lower layers accept; the CLI passes ones that drive its bars."""

from collections.abc import Callable

Ticks = Callable[[int, int], None]  # (done, total) of one task
Progress = Callable[[str, int, int], None]  # (stage, done, total): one bar per stage
Notify = Callable[[str], None]  # a one-line note for the user (stderr)
Compiling = Callable[[str, int, int], None]  # (function being compiled, compiles finished,
# compiles under way): numba's own compile events, see engine/jit.compile_events
Preparing = Callable[[str, int, int], None]  # (what is being prepared, in the user's words;
# parts done before it; parts in all): the kernel's specializations and the other compiled code
