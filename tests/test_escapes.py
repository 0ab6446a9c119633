r"""Backslash escapes in what is typed (the prompt, --system, --stop, chat's lines) read as
llama.cpp's CLI reads them: a shell passes "\n" as a backslash and an n."""

import json

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import process_escapes


@pytest.mark.parametrize("typed, read", [
    (r"a,b\n1,2", "a,b\n1,2"),
    (r"\t\r\n", "\t\r\n"),
    (r"say \"hi\" it\'s", "say \"hi\" it's"),
    (r"C:\\temp", "C:\\temp"),
    (r"\\n", "\\n"),  # an escaped backslash, then a plain n
    (r"\x41\x62", "Ab"),
    (r"\xc3\xa9t\xC3\xA9", "été"),  # bytes of the UTF-8 text
    (r"\d \w \u00e9 \0", r"\d \w \u00e9 \0"),  # not llama.cpp's: kept as typed
    (r"\x4", r"\x4"),  # \x needs two hex digits
    (r"\xg1", r"\xg1"),
    ("ends in \\", "ends in \\"),
    ("a\\\nb", "a\\\nb"),  # a backslash before a real newline stays
    ("été\\n", "été\n"),
])
def test_escapes_read_as_llama_cpp_reads_them(typed, read):
    assert process_escapes(typed) == read


def test_an_escape_that_makes_invalid_utf8_is_one_error():
    with pytest.raises(KolibriError, match=r"--stop is not UTF-8 once its escapes are read "
                                           r"\(byte 0xff at offset 1.*--no-escape"):
        process_escapes(r"a\xff", "--stop")


def _chat_folder(tiny_llama_folder):
    from test_chat import CHATML

    folder = tiny_llama_folder()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return folder


def _generate(folder, *args, input=None) -> dict:
    r = CliRunner().invoke(app, ["generate", "-m", str(folder), "--json", *args], input=input)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_prompt_and_system_are_read_with_their_escapes(kolibri_home, tiny_llama_folder):
    """Escaped == the real characters typed; --no-escape keeps the backslashes; stdin is taken
    as it is (a file holds its newlines, and code its backslashes)."""
    folder = _chat_folder(tiny_llama_folder)
    ids = lambda *a, **kw: _generate(folder, "-n", "1", *a, **kw)["prompt_ids"]  # noqa: E731
    real = ids("--raw", "a,b\n1,2")
    assert ids("--raw", r"a,b\n1,2") == real
    assert len(ids("--raw", "--no-escape", r"a,b\n1,2")) == len(real) + 1  # byte-level tokens
    assert ids("--raw", "-", input=r"a,b\n1,2") == ids("--raw", "--no-escape", r"a,b\n1,2")
    chat_real = ids("--system", "be\tbrief", "hi")
    assert ids("--system", r"be\tbrief", "hi") == chat_real
    assert ids("--system", r"be\tbrief", "--no-escape", "hi") != chat_real


def test_stop_strings_are_read_with_their_escapes(kolibri_home, tiny_llama_folder):
    """A --stop written with escapes stops where the same text typed as it is stops; with
    --no-escape it is another string, which never comes."""
    folder = tiny_llama_folder()
    free = _generate(folder, "-n", "24", "--raw", "hi")
    stop = free["text"][1:3]
    assert len(stop) == 2 and free["stop_reason"] == "length"
    escaped = "".join(f"\\x{b:02x}" for b in stop.encode())
    stopped = _generate(folder, "-n", "24", "--raw", "hi", "--stop", stop)
    assert stopped["stop_reason"] == "stop" and len(stopped["output_ids"]) < 24
    read = _generate(folder, "-n", "24", "--raw", "hi", "--stop", escaped)
    assert (read["output_ids"], read["stop_reason"]) == (stopped["output_ids"], "stop")
    kept = _generate(folder, "-n", "24", "--raw", "hi", "--stop", escaped, "--no-escape")
    assert kept["output_ids"] == free["output_ids"] and kept["stop_reason"] == "length"


def test_a_bad_escape_is_one_error_line(kolibri_home, tiny_llama_folder):
    r = CliRunner().invoke(app, ["generate", "-m", str(tiny_llama_folder()), "--stop", r"\xff",
                                 "hi"])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("error: a --stop string is not UTF-8 once its escapes are read")
    assert len(r.stderr.strip().splitlines()) == 1


def test_chat_reads_the_escapes_of_a_typed_line(kolibri_home, tiny_llama_folder):
    import re

    folder = _chat_folder(tiny_llama_folder)

    def prompt_tokens(line: str, *args) -> int:
        r = CliRunner().invoke(app, ["chat", "-m", str(folder), "-n", "1", "--no-history",
                                     *args], input=f"{line}\n/bye\n")
        assert r.exit_code == 0, r.output
        return int(re.search(r"prompt (\d+) tokens", r.stderr).group(1))

    assert prompt_tokens(r"a\tb") == prompt_tokens("a\tb")
    assert prompt_tokens(r"a\tb", "--no-escape") == prompt_tokens("a\tb") + 1
