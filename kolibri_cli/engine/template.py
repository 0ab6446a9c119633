"""Chat templates, rendered like transformers' `apply_chat_template` and bounded like untrusted
code: a template comes with the model, and a model is a download.

transformers' environment: jinja2's immutable sandbox, trim_blocks + lstrip_blocks,
loopcontrols, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII. The sandbox
already refuses attribute escapes and ranges over 100,000; kolibri adds what it lacks — a time
limit (loops nested inside loops), a memory limit (`'x' * 10**10`, a huge `center()` or
`format`), a size limit on the text produced, a cap on `**`, and recursion caught — so a hostile
template costs a few seconds and one error line, never the machine.
Non-goals: tool calling, multi-turn chats; the time limit works on the main thread only, the
memory limit on Linux only (elsewhere the other bounds still hold).
"""

import json
import math
import signal
import threading
from contextlib import contextmanager
from datetime import datetime

from kolibri_cli.errors import KolibriError
from kolibri_cli.text import printable

SECONDS = 5.0  # rendering a real template takes milliseconds
MAX_CHARS = 1 << 24  # of rendered text: far above any context
MEMORY = 1 << 28  # bytes the render may allocate on top of what the process holds
MAX_EXPONENT_BITS = 1 << 16  # `a ** b` on integers: at most this many bits in the result


class TemplateLimit(Exception):
    """The render ran past one of the bounds."""


class ChatTemplateError(KolibriError):
    """The chat template cannot render a prompt: `reason`, then what to do, which the command
    knows (generate: --raw; chat needs the template: cli/chat.py says so)."""

    def __init__(self, reason: str, hint: str = "use --raw"):
        super().__init__(f"{reason}; {hint}")
        self.reason = reason


def compile_template(source: str):
    """The jinja2 Template, or a KolibriError if it does not parse."""
    from jinja2 import TemplateError

    try:
        with _bounded():
            return _environment().from_string(source)
    except KolibriError:
        raise
    except (TemplateError, TemplateLimit, RecursionError, MemoryError, ValueError) as e:
        raise ChatTemplateError(f"the chat template does not parse ({_what(e)})") from None


def render(template, **variables) -> str:
    """The template's text for `variables`, within the bounds; any failure is one KolibriError."""
    try:
        with _bounded():
            parts, size = [], 0
            for chunk in template.generate(**variables):
                size += len(chunk)
                if size > MAX_CHARS:
                    raise TemplateLimit(f"it produced more than {MAX_CHARS} characters")
                parts.append(chunk)
            text = "".join(parts)
    except KolibriError:
        raise
    except Exception as e:  # the template is code from the model's files: any failure is its own
        raise ChatTemplateError(f"the chat template failed to render ({_what(e)})") from None
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        raise ChatTemplateError("the chat template produced invalid text (a lone surrogate)")
    return text


def _what(e: BaseException) -> str:
    if isinstance(e, MemoryError):
        return f"it needed more than {MEMORY >> 20} MB of memory"
    if isinstance(e, RecursionError):
        return "it recursed too deeply"
    return printable(f"{type(e).__name__}: {e}" if not isinstance(e, TemplateLimit) else str(e),
                     160)


def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["**"])

        def call_binop(self, context, operator, left, right):
            if operator == "**" and _too_big_power(left, right):
                raise TemplateLimit(f"{shown_int(left)} ** {shown_int(right)} is too large")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise KolibriError(f"chat template: {printable(str(message), 200)}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _too_big_power(base, exponent) -> bool:
    if not all(isinstance(x, int) for x in (base, exponent)) or exponent <= 1 or abs(base) <= 1:
        return False
    return exponent * math.log2(abs(base)) > MAX_EXPONENT_BITS


def shown_int(x) -> str:
    return printable(str(x), 20) if not isinstance(x, int) or x.bit_length() < 64 else "a big int"


@contextmanager
def _bounded():
    with _time_limit(SECONDS), _memory_limit(MEMORY):
        yield


@contextmanager
def _time_limit(seconds: float):
    """SIGALRM after `seconds` raises TemplateLimit in the render (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal,
                                                                                 "setitimer"):
        yield
        return

    def expired(signum, frame):
        raise TemplateLimit(f"it ran longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    pending = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if pending[0]:  # someone else's timer was running: give it back
            signal.setitimer(signal.ITIMER_REAL, *pending)


@contextmanager
def _memory_limit(extra: int):
    """The address space may grow by `extra` bytes while the block runs: a bigger allocation is a
    MemoryError instead of swapping the machine to a halt (Linux; a no-op elsewhere)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    limit = used + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield  # the user's own limit is tighter already
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
