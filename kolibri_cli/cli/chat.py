"""`kolibri chat`: an interactive multi-turn session at the terminal — answers streamed on stdout,
per-turn stats on stderr, Ctrl-C stops the current answer and keeps the session."""

from typing import Annotated

import typer

from kolibri_cli.cli import options as opt
from kolibri_cli.decode.proposers import DEFAULT_SPEC_PROPOSER

COMMANDS = (  # (what is typed, what it does): /help prints them
    ("/help", "this list"),
    ("/reset", "forget the conversation"),
    ("/system TEXT", "set the system message; /system alone: the model's default"),
    ("/spec on|off", "switch n-gram speculation"),
    ("/quit, /bye, /exit", "leave (or Ctrl-D); Ctrl-C stops an answer"),
)
QUIT = ("/quit", "/bye", "/exit")


def chat(
    model: opt.ModelOpt = None,
    max_tokens: Annotated[int, typer.Option(
        "--max-tokens", "-n", min=1, help="Most new tokens per answer.")] = 512,
    spec: Annotated[bool, typer.Option("--spec", help="Start with n-gram speculation on.")] = False,
    k: opt.KOpt = None,
    window: opt.WindowOpt = None,
    proposer_name: opt.SpecProposerOpt = None,
    costs: opt.CostsOpt = None,
    temperature: opt.TemperatureOpt = None,
    top_k: opt.TopKOpt = None,
    top_p: opt.TopPOpt = None,
    min_p: opt.MinPOpt = None,
    repetition_penalty: opt.RepetitionPenaltyOpt = None,
    seed: opt.SeedOpt = None,
    greedy: opt.GreedyOpt = False,
    system: opt.SystemOpt = None,
    stop: opt.StopOpt = None,
    escape: Annotated[bool, typer.Option(
        "--escape/--no-escape", help="Read \\n \\r \\t \\' \\\" \\\\ and \\xHH in the "
        "lines typed, --system and --stop as llama.cpp does; --no-escape: backslashes as typed "
        "(say, to paste code).")] = True,
    threads: opt.ThreadsOpt = None,
    history: Annotated[bool, typer.Option(
        "--history/--no-history", envvar="KOLIBRI_HISTORY",
        help="Keep the lines typed at the prompt in KOLIBRI_HOME/chat-history (mode 0600) for "
             "the next session (recalled with the arrow keys).")] = True,
) -> None:
    """Chat with the model, turn by turn (the whole conversation stays in its context). Lines
    are edited as in a shell; /help lists the commands."""
    from kolibri_cli.cli import render
    from kolibri_cli.cli.prompt import LineReader
    from kolibri_cli.decode import drafting
    from kolibri_cli.decode.chat import Conversation

    given = opt.sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed, greedy)
    proposer_name = proposer_name or DEFAULT_SPEC_PROPOSER
    draft = drafting.Drafting.checked(k, window, proposer_name, costs=costs)  # before the load
    system, stop = opt.typed(system, escape, "--system"), opt.typed_stops(stop, escape)
    m = opt.load_model(model, threads, drafter=draft.settings() if spec else None)
    conversation = Conversation(m, system)
    _check_template(conversation)
    settings = {"sampling": opt.resolve_sampling(m, given), "stop": stop,
                "drafting": draft.for_model(m, render.note),  # a table: each answer's timings
                "spec": spec}
    reader = LineReader(history, _say)
    _say(f"kolibri chat with {m.name}. /help lists the commands; Ctrl-D leaves, Ctrl-C stops "
         "an answer.")
    while (line := _read_line(reader, escape)) is not None:
        if line.startswith("/"):
            if not _command(line, conversation, settings):
                break
        elif line.strip():
            _turn(conversation, line, max_tokens, settings)


def _check_template(conversation) -> None:
    """A template that cannot render a first turn fails before the session starts, not at every
    turn."""
    from kolibri_cli.engine.template import ChatTemplateError
    from kolibri_cli.errors import KolibriError

    try:
        conversation.prompt_ids("hello")
    except ChatTemplateError as e:
        raise KolibriError(_template_text(e)) from None


def _template_text(e) -> str:
    """A ChatTemplateError as chat says it: generate's way out (--raw) is not chat's."""
    return (f"{e.reason}: kolibri chat needs the model's chat template (`kolibri generate --raw` "
            "prompts without one)")


def _read_line(reader, escape: bool) -> str | None:
    """The next line typed, its escapes read when `escape`; None at end of input. Ctrl-C at the
    prompt clears the line."""
    import sys

    from kolibri_cli.errors import KolibriError

    while sys.stdin is not None:  # None: started with stdin closed (<&-)
        try:
            return opt.typed(reader.read(">>> "), escape, "that line")
        except KolibriError as e:  # the line is gone; the session is not
            _say(f"error: {e}; type it again")
        except EOFError:
            print()
            return None
        except KeyboardInterrupt:
            print()
        except UnicodeDecodeError:  # a strict UTF-8 stdin
            _say("error: that line is not valid UTF-8; type it again")
    return None


def _command(line: str, conversation, settings: dict) -> bool:
    """Run a /command; False to leave the session."""
    word, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if word in QUIT:
        return False
    if word == "/help":
        width = max(len(c) for c, _ in COMMANDS)
        _say("\n".join(f"  {c:{width}}  {what}" for c, what in COMMANDS))
    elif word == "/reset":
        conversation.reset()
        _say("history cleared")
    elif word == "/system":
        conversation.set_system(arg or None)
        _say(f"system message: {arg}" if arg else "system message: the model's default")
    elif word == "/spec" and arg in ("on", "off"):
        settings["spec"] = arg == "on"
        _say(f"speculation {arg}")
    else:
        _say(f"unknown command {line.strip()!r}; /help lists the commands")
    return True


def _turn(conversation, line: str, max_tokens: int, settings: dict) -> None:
    from kolibri_cli.cli import render
    from kolibri_cli.cli.app import interrupt_between_tokens
    from kolibri_cli.cli.generate import stats_line
    from kolibri_cli.engine.template import ChatTemplateError
    from kolibri_cli.errors import KolibriError

    streamer = render.TextStreamer(conversation.model.tokenizer, settings["stop"])
    draft = settings["drafting"]
    drafter = draft.new() if settings["spec"] else None
    try:
        with interrupt_between_tokens(streamer) as on_tokens:
            result = conversation.reply(line, max_tokens, drafter, settings["sampling"],
                                        settings["stop"], on_tokens)
    except KeyboardInterrupt:
        streamer.finish()
        _say("(answer stopped)")
        return
    except KolibriError as e:
        streamer.finish()
        _say(f"error: {_template_text(e) if isinstance(e, ChatTemplateError) else e}")
        return
    streamer.finish()
    if drafter:
        draft.keep(drafter.costs, render.note)
    _say(stats_line(result))


def _say(text: str) -> None:
    from kolibri_cli.cli import render

    render.err.print(text, highlight=False, markup=False, soft_wrap=True)
