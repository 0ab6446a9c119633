"""The typer app factory and the one error boundary of the command line."""

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

import typer
from typer._click import exceptions as click_errors  # typer's own click (private: bounded)
from typer.core import TyperGroup

from kolibri_cli.errors import KolibriError
from kolibri_cli.home import YES_WORDS, cache_warning


class _Group(TyperGroup):
    """Turns a KolibriError into one line on stderr, Ctrl-C into exit 130 and SIGTERM into exit
    143 (both after cleaning up) — in one place."""

    def main(self, *args, **kwargs):
        _reserve_closed_std_fds()
        try:
            with _signals_as_exits():
                return super().main(*args, **kwargs)
        finally:
            _flush_or_quiet()  # what is still buffered, before Python's own flush at exit

    def make_context(self, *args, **kwargs):
        try:  # --help and --version are printed while the context is made, before invoke
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:  # `kolibri --help | head -1`
            _quiet_closed_pipes()
            raise typer.Exit(0) from None
        except KeyboardInterrupt:  # click's own answer is "Aborted!" and exit 1
            typer.echo("\ninterrupted", err=True)
            raise typer.Exit(130) from None
        except KolibriError as e:  # `kolibri --version >&-`
            if os.environ.get("KOLIBRI_DEBUG", "").strip().lower() in YES_WORDS:
                raise
            _error_line(str(e))
            raise typer.Exit(e.exit_code) from None

    def invoke(self, ctx):
        debug = os.environ.get("KOLIBRI_DEBUG", "").strip().lower() in YES_WORDS
        if ctx.parent is None and (warning := cache_warning()):  # once a run, before the work
            typer.echo(warning, err=True)
        try:
            return super().invoke(ctx)
        except KolibriError as e:
            if debug:
                raise
            _error_line(str(e))
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("\ninterrupted", err=True)
            raise typer.Exit(130) from None
        except Terminated as e:
            typer.echo("\nterminated", err=True)
            raise typer.Exit(e.code) from None
        except click_errors.NoArgsIsHelpError:
            raise  # the help text, as asked for
        except click_errors.UsageError as e:  # an option's value: one line too, exit 2
            where = f" (see {e.ctx.command_path} --help)" if e.ctx else ""
            _error_line(f"{e.format_message()}{where}")
            raise typer.Exit(e.exit_code) from None
        except (click_errors.ClickException, typer.Exit, typer.Abort):
            raise  # click's own handling
        except BrokenPipeError:  # the reader went away (`| head`): its choice, not a failure
            _quiet_closed_pipes()
            raise typer.Exit(0) from None
        except PermissionError as e:  # the user's files and folders: theirs to fix, not a bug
            if debug:
                raise
            where = f"{e.filename}: " if e.filename else ""
            _error_line(f"{where}permission denied; check the permissions of the file and its "
                        "folders")
            raise typer.Exit(1) from None
        except MemoryError:
            if debug:
                raise
            _error_line("out of memory; try a smaller model, prompt or setting")
            raise typer.Exit(1) from None
        except Exception as e:  # a bug: still one line, with the way to see it whole
            if debug:
                raise
            code = _signal_behind(e)
            if code:  # the user's Ctrl-C or SIGTERM, not a bug
                typer.echo("\ninterrupted" if code == signal.SIGINT else "\nterminated", err=True)
                raise typer.Exit(128 + code) from None
            _error_line(f"internal error ({type(e).__name__}: {e}); this is a kolibri bug — "
                        "KOLIBRI_DEBUG=1 shows the traceback")
            raise typer.Exit(1) from None


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread: every `finally` and atomic write cleans up as on
    Ctrl-C. A SystemExit, so no `except Exception` (nor chat's Ctrl-C handler) takes it."""


# (signal, time.monotonic()) of the latest SIGINT or SIGTERM that raised in this command
_last_signal: tuple[int, float] | None = None
SIGNAL_RECENT_S = 10.0


def _note_signal(signum: int | None) -> None:
    global _last_signal
    _last_signal = None if signum is None else (signum, time.monotonic())


def _signal_behind(e: BaseException) -> int | None:
    """The signal an exception really is: numba's argument conversion of a typed List runs Python
    code, and replaces an exception a signal raises there with its own TypeError."""
    if not (isinstance(e, TypeError) and str(e).startswith("can't unbox")):
        return None
    if _last_signal and time.monotonic() - _last_signal[1] <= SIGNAL_RECENT_S:
        return _last_signal[0]
    return None


def _interrupt(signum, frame):
    _note_signal(signum)
    raise KeyboardInterrupt


@contextmanager
def _signals_as_exits():
    """SIGTERM raises Terminated (exit 143) while a command runs; a second one kills at once, and
    a forked worker keeps the default (its parent cleans up). Ctrl-C raises KeyboardInterrupt as
    Python's own handler does (unless the shell ignores it); both are noted for the boundary."""
    _note_signal(None)
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread (a test runner's worker, say)
        return
    pid = os.getpid()

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != pid:
            os.kill(os.getpid(), signum)
        _note_signal(signum)
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def interrupt_between_tokens(streamer=None):
    """A token callback (streaming to `streamer`, if any) at which a first Ctrl-C stops the
    generation, instead of wherever the signal lands (inside numba's argument conversion it
    becomes a TypeError, or is lost); a second Ctrl-C stops it at once."""
    pressed: list[int] = []

    def on_tokens(new_ids: list[int]) -> None:
        if streamer is not None:
            streamer(new_ids)
        if pressed:
            raise KeyboardInterrupt

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, _interrupt)):
        yield on_tokens  # Ctrl-C ignored (nohup) or someone else's: left as it is
        return

    def defer(signum, frame):
        pressed.append(signum)
        if len(pressed) > 1:
            _interrupt(signum, frame)

    previous = signal.signal(signal.SIGINT, defer)
    try:
        yield on_tokens
    except TypeError as e:  # a second Ctrl-C inside numba's conversion
        if _signal_behind(e):
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:  # pressed after the last token: still a Ctrl-C
        raise KeyboardInterrupt


def _error_line(message: str) -> None:
    """`error: message` as exactly one line: newlines and control characters escaped."""
    from kolibri_cli.text import clean

    typer.echo(f"error: {clean(message)}", err=True)


class _ClosedStdout:
    """sys.stdout when the shell closed it (`>&-`): output is an error, silence is not."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise KolibriError("cannot write the output: stdout is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("stdout is closed")


def _flush_or_quiet() -> None:
    """Flush stdout and stderr; a reader that went away meanwhile ends the output quietly."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            _quiet_closed_pipes()
        except (OSError, ValueError, AttributeError):
            pass  # closed, or not a stream: nothing to flush


def _broken_pipe(console) -> None:
    """rich's Console.on_broken_pipe, kolibri's way: a reader that went away (`| head`) is its
    choice, not a failure — rich's own answer is exit 1. Used by every rich console, --help's
    included (rich documents this method as the hook for it)."""
    if console.quiet:
        return
    _quiet_closed_pipes()
    raise typer.Exit(0)


def _quiet_closed_pipes() -> None:
    """Point fd 1 and 2, where their reader went away, at /dev/null: what is still buffered
    for them, and Python's flush at exit, then write nowhere instead of raising again."""
    import select

    for fd in (1, 2):
        try:
            poll = select.poll()
            poll.register(fd, select.POLLOUT)
            gone = any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
        except (OSError, ValueError, AttributeError):  # no poll (Windows), or fd not open
            gone = False
        if gone:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


def _reserve_closed_std_fds() -> None:
    """Open /dev/null on a closed fd 0, 1 or 2, so no file we open later takes that number (and
    gets our output written into it); a closed stdout then makes any output an error."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            new = os.open(os.devnull, os.O_RDWR)
            if new != fd:
                os.dup2(new, fd)
                os.close(new)
            closed.append(fd)
    if 1 in closed:
        sys.stdout = _ClosedStdout()


def make_typer(help: str) -> typer.Typer:
    import rich.console

    rich.console.Console.on_broken_pipe = _broken_pipe
    return typer.Typer(cls=_Group, help=help, no_args_is_help=True, add_completion=True,
                       pretty_exceptions_enable=False, rich_markup_mode="markdown")
