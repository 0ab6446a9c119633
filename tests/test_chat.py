"""`kolibri chat` through a real pseudo-terminal (pexpect): streamed turns with stats, history
kept, /spec and /reset, Ctrl-C stopping an answer without leaving; `kolibri --version`."""

import io
import json
import os
import signal
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


def _spawn(args: list[str], home) -> "pexpect.spawn":
    env = os.environ | {"KOLIBRI_HOME": str(home), "COLUMNS": "200", "TERM": "dumb"}
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
    except pexpect.TIMEOUT:
        shown = child.logfile_read.getvalue()
        pytest.fail(f"no {pattern!r} within {child.timeout} s; the terminal showed "
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


@pytest.mark.model
def test_ctrl_c_stops_the_answer_not_the_session(pulled_default):
    child = _spawn(["-n", "2000", "--temperature", "0.7", "--seed", "1"], pulled_default.home)
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
