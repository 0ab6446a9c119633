"""`kolibri chat` through a real pseudo-terminal (pexpect): streamed turns with stats, history
kept, /spec, /reset, /system and /help, line editing and the typed lines kept across sessions,
Ctrl-C stopping an answer without leaving; `kolibri --version`."""

import io
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kolibri_cli import __version__
from kolibri_cli.cli import app
from kolibri_cli.decode.chat import Conversation
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.decode.sampling import Sampling

pexpect = pytest.importorskip("pexpect")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def chat_folder(tiny_llama_folder):
    folder = tiny_llama_folder()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return folder


def _as_from_a_shell() -> None:
    """Ctrl-C as a terminal user's shell starts a program: default and unblocked. A test
    worker may pass SIGINT on ignored (another test's code in the same process), and an ignored
    SIGINT stays ignored across exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _spawn(args: list[str], home, **env) -> "pexpect.spawn":
    env = os.environ | {"KOLIBRI_HOME": str(home), "COLUMNS": "200", "TERM": "dumb"} | env
    child = pexpect.spawn(sys.executable, ["-m", "kolibri_cli", "chat", *args], env=env,
                          encoding="utf-8", timeout=120, dimensions=(50, 200),
                          preexec_fn=_as_from_a_shell)
    child.logfile_read = io.StringIO()  # the whole transcript, for a failure's message
    child.expect(">>> ", timeout=900)  # the first model load of a test session compiles (~2 min)
    return child


def _expect(child, pattern, since: int = 0) -> None:
    """child.expect, failing with what the terminal showed from `since` (a transcript offset;
    pexpect's own message keeps its last 100 characters)."""
    try:
        child.expect(pattern)
    except (pexpect.TIMEOUT, pexpect.EOF) as e:
        shown = child.logfile_read.getvalue()
        pytest.fail(f"no {pattern!r} ({type(e).__name__} after {child.timeout} s at most); "
                    f"the terminal showed "
                    f"{len(shown) - since} characters since, first:\n{shown[since:][:3000]}"
                    f"\n... last:\n{shown[-300:]}")


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"kolibri {__version__}"


def test_chat_session_in_a_terminal(chat_folder, tmp_path):
    child = _spawn(["--model", str(chat_folder), "-n", "12", "--temperature", "0.8", "--seed",
                    "4"], tmp_path)
    child.sendline("hello there")
    child.expect(r"prompt (\d+) tokens, prefill \d+ ms, (\d+) new tokens")
    first_prompt = int(child.match.group(1))
    child.expect(r"T=0\.8 seed=4")
    child.expect(">>> ")
    child.sendline("/spec on")
    child.expect("speculation on")
    child.expect(">>> ")
    child.sendline("and again")
    child.expect(r"prompt (\d+) tokens.*verify passes")
    assert int(child.match.group(1)) > first_prompt + 12  # the history is in the prompt
    child.expect(">>> ")
    child.sendline("/reset")
    child.expect("history cleared")
    child.expect(">>> ")
    child.sendline("hello there")
    child.expect(r"prompt (\d+) tokens")
    assert int(child.match.group(1)) == first_prompt
    child.expect(">>> ")
    child.sendline("/nonsense")
    child.expect("unknown command")
    child.expect(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _leave(child) -> None:
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_typed_lines_are_edited_and_survive_a_restart(chat_folder, tmp_path):
    """Ctrl-B moves back in the line (helo -> hello); the lines typed are in
    KOLIBRI_HOME/chat-history, mode 0600; the next session recalls them with Ctrl-P."""
    args = ["--model", str(chat_folder), "-n", "3"]
    child = _spawn(args, tmp_path)
    child.send("helo\x02l\r")
    child.expect(r"prompt \d+ tokens")
    child.expect(">>> ")
    child.sendline("/system answer briefly")
    child.expect("system message: answer briefly")
    child.expect(">>> ")
    _leave(child)
    history = tmp_path / "chat-history"
    assert history.stat().st_mode & 0o777 == 0o600
    assert history.read_text().splitlines() == ["hello", "/system answer briefly"]
    child = _spawn(args, tmp_path)
    since = len(child.logfile_read.getvalue())
    child.send("\x10\x10")  # Ctrl-P twice: the first line of the last session
    _expect(child, "hello", since)
    child.send("\r")
    child.expect(r"prompt \d+ tokens")
    child.expect(">>> ")
    _leave(child)
    assert history.read_text().splitlines() == ["hello", "/system answer briefly", "hello"]


def test_a_multi_line_paste_is_one_turn(chat_folder, tmp_path):
    """Bracketed paste: the terminal is told to mark pastes (ESC [?2004h), and the lines of a
    marked paste are one turn, sent with Enter (without it, each line was a turn)."""
    child = _spawn(["--model", str(chat_folder), "-n", "2", "--no-history"], tmp_path,
                   TERM="xterm")  # a dumb terminal gets no bracketed paste from readline
    assert "\x1b[?2004h" in child.logfile_read.getvalue()
    since = len(child.logfile_read.getvalue())
    child.send("\x1b[200~first line\nsecond line\x1b[201~")
    child.send("\r")
    child.expect(r"prompt (\d+) tokens")
    pasted = int(child.match.group(1))
    child.expect(">>> ")
    assert child.logfile_read.getvalue()[since:].count("new tokens") == 1
    child.sendline("/reset")
    child.expect(">>> ")
    child.sendline("first line")
    child.expect(r"prompt (\d+) tokens")
    one = int(child.match.group(1))
    child.expect(">>> ")
    _leave(child)
    assert pasted - one == len("\nsecond line")  # the tiny tokenizer: a token per byte


@pytest.mark.parametrize("opt_out", [["--no-history"], {"KOLIBRI_HISTORY": "0"}])
def test_history_can_be_switched_off(chat_folder, tmp_path, opt_out):
    args, env = (opt_out, {}) if isinstance(opt_out, list) else ([], opt_out)
    child = _spawn(["--model", str(chat_folder), "-n", "2", *args], tmp_path, **env)
    child.sendline("/spec on")
    child.expect("speculation on")
    child.expect(">>> ")
    _leave(child)
    assert not (tmp_path / "chat-history").exists()


def test_help_system_and_no_history_without_a_terminal(chat_folder, tmp_path, monkeypatch):
    """/help lists every command; /system changes the prompt of the turns after it and /system
    alone goes back; lines read from a pipe are not kept."""
    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["chat", "--model", str(chat_folder), "-n", "2"], input=(
        "/help\nhi\n/system be brief and kind\n/reset\nhi\n/system\n/reset\nhi\n/nonsense\n"
        "/bye\n"))
    assert r.exit_code == 0, r.output
    for command in ("/help", "/reset", "/system TEXT", "/spec on|off", "/quit, /bye, /exit"):
        assert f"  {command} " in r.stderr, r.stderr
    prompts = [int(n) for n in re.findall(r"prompt (\d+) tokens", r.stderr)]
    assert len(prompts) == 3 and prompts[1] > prompts[0] + 2 and prompts[2] == prompts[0], r.stderr
    assert "system message: the model's default" in r.stderr
    assert "unknown command '/nonsense'; /help lists the commands" in r.stderr
    assert not (tmp_path / "chat-history").exists()


@pytest.mark.model
def test_ctrl_c_stops_the_answer_not_the_session(pulled_default):
    # --no-history: the pulled home is shared with tests that check it holds nothing else
    child = _spawn(["-n", "2000", "--temperature", "0.7", "--seed", "1", "--no-history"],
                   pulled_default.home)
    child.sendline("Write a very long story about a dragon who learns to cook. Use many chapters.")
    child.expect_exact("Use many chapters.")  # the line's echo: chat may still be reading it
    child.expect(r"\w+ \w+ \w+ \w+")  # the answer is streaming
    sent = len(child.logfile_read.getvalue())
    child.sendintr()
    _expect(child, r"\(answer stopped\)", since=max(0, sent - 600))
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_conversation_reuses_the_cache_and_matches_a_fresh_generation(chat_folder):
    """The second turn prefills only past the common prefix, and its answer equals a generation
    over the whole rendered conversation from scratch; the proposer sees earlier turns."""
    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.store.models import open_model

    model = open_model(str(chat_folder))
    conversation = Conversation(model, system="be brief")
    s = Sampling(temperature=0.9, seed=7)
    conversation.reply("abc abc abc", 10, None, s)
    ids = conversation.prompt_ids("abc again")
    reused = len(conversation.kv.ids)
    second = conversation.reply("abc again", 10, NgramProposer(3, 1, 3), s)
    assert second.prompt_ids == ids and 0 < reused < len(ids)
    assert second.output_ids == generate_plain(model, ids, 10, sampling=s).output_ids
    assert [m["role"] for m in conversation.messages] == ["user", "assistant"] * 2


def test_a_template_error_in_chat_names_no_option_chat_lacks(tiny_llama_folder, tmp_path,
                                                            monkeypatch):
    """chat has no --raw: a template that does not parse stops it before the session with one
    line naming what works instead; one that fails on a later turn is said the same way, and
    the session goes on."""
    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path / "home"))
    broken = tiny_llama_folder(name="broken")
    (broken / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m.content }"}))
    r = CliRunner().invoke(app, ["chat", "--model", str(broken)], input="hi\n")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("error: the chat template does not parse (")
    assert r.stderr.rstrip().endswith("): kolibri chat needs the model's chat template "
                                      "(`kolibri generate --raw` prompts without one)")
    assert "--raw" not in r.stderr.replace("kolibri generate --raw", "")
    picky = tiny_llama_folder(name="picky")  # renders "hello", fails on a turn of 20+ chars
    (picky / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ m.content }}{{ 1 // (20 - m.content | length) if "
        "m.content | length == 20 else '' }}{% endfor %}")}))
    r = CliRunner().invoke(app, ["chat", "--model", str(picky), "-n", "2"],
                           input="twenty characters!!!\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "error: the chat template failed to render (ZeroDivisionError" in r.stderr
    assert "kolibri chat needs the model's chat template" in r.stderr
    assert "use --raw" not in r.stderr


# Ctrl-C lands inside a forward, where numba's argument conversion would turn the
# KeyboardInterrupt into a TypeError of its own (seen in CI: "can't unbox a <class
# 'numba.typed.typedlist.List'> as a <NULL>", and the chat session ended as "a kolibri bug"). The
# patched forward does the same with an exception raised inside it: PRESSES SIGINTs at its AT-th
# call (or with BUG set, that TypeError and no signal).
SIGINT_IN_A_FORWARD = """
import os, signal, sys
from kolibri_cli.cli import app
from kolibri_cli.engine import kernel

real, calls = kernel.Transformer.forward, []

def forward(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == int(os.environ["AT"]):
        if os.environ.get("BUG"):
            raise TypeError("can't unbox a List as a <NULL>")
        for _ in range(int(os.environ["PRESSES"])):
            try:
                os.kill(os.getpid(), signal.SIGINT)  # its handler runs as this call returns
            except KeyboardInterrupt:
                raise TypeError("can't unbox a List as a <NULL>") from None
    return real(self, *args, **kwargs)

kernel.Transformer.forward = forward
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a shell
app(sys.argv[1:], prog_name="kolibri")
"""


def _with_sigint_in_a_forward(args, home, at: int, presses: int = 0, stdin: str = "",
                              bug: bool = False):
    env = dict(os.environ, KOLIBRI_HOME=str(home), AT=str(at), PRESSES=str(presses),
               BUG="1" if bug else "")
    env.pop("KOLIBRI_DEBUG", None)
    return subprocess.run([sys.executable, "-c", SIGINT_IN_A_FORWARD, *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_inside_a_forward_stops_the_answer_not_the_session(chat_folder, tmp_path,
                                                                  presses):
    """Ctrl-C during an answer stops it (once: at the next token, never inside the forward it
    lands in; twice: at once, numba's TypeError taken for it); the next question is answered."""
    p = _with_sigint_in_a_forward(["chat", "--model", str(chat_folder), "-n", "30"], tmp_path,
                                  at=3, presses=presses, stdin="hello there\nand again\n/exit\n")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("(answer stopped)") == 1 and "internal error" not in p.stderr, p.stderr
    assert p.stderr.count(" new tokens, ") == 1, p.stderr  # the second answer's stats line


def test_ctrl_c_inside_a_forward_in_generate_is_an_interrupt_not_a_bug(chat_folder, tmp_path):
    p = _with_sigint_in_a_forward(["generate", "--model", str(chat_folder), "-n", "60", "hello"],
                                  tmp_path, at=3, presses=2)
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip().splitlines()[-1] == "interrupted", p.stderr
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_numbas_type_error_without_a_signal_is_still_a_bug(chat_folder, tmp_path):
    p = _with_sigint_in_a_forward(["generate", "--model", str(chat_folder), "-n", "60", "hello"],
                                  tmp_path, at=3, bug=True)
    assert p.returncode == 1, p.stderr
    assert "internal error (TypeError: can't unbox" in p.stderr, p.stderr


def test_the_deferred_ctrl_c_handler_is_put_back():
    """One press waits for the token callback, which raises it; the handler before is restored
    (also after a press that came after the last token, which still interrupts)."""
    import threading

    from kolibri_cli.cli.app import interrupt_between_tokens

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers belong to the main thread")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupt_between_tokens() as on_tokens:
                os.kill(os.getpid(), signal.SIGINT)  # deferred: nothing raised here
                on_tokens([1])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            with interrupt_between_tokens() as on_tokens:
                on_tokens([1])
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with interrupt_between_tokens() as on_tokens:
            on_tokens([1])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
