"""`kolibri model ...` and the error paths of `kolibri generate` that fail before the model runs."""

import json

import numpy as np
import pytest
from conftest import tiny_llama_tensors
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.errors import KolibriError


@pytest.fixture
def run(kolibri_home, monkeypatch):
    """Invoke the CLI offline (an error path must never download) with a separate stderr."""
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")

    def invoke(*args: str, input: str | None = None):
        return CliRunner().invoke(app, list(args), input=input)

    return invoke


def assert_one_error_line(result, *fragments: str) -> str:
    """Exit 1, nothing on stdout, one `error:` line on stderr naming every fragment."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    # Leading newlines are tolerated: rich's Progress (render.progress_bar, around model loading)
    # ends with one even when it drew nothing on a non-terminal.
    lines = result.stderr.lstrip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def test_model_list_json_empty(run, kolibri_home):
    result = run("model", "list", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"cache": str(kolibri_home), "models": []}


@pytest.mark.model
def test_model_list_and_info_json_default(run, pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    listed = json.loads(run("model", "list", "--json").stdout)
    assert listed["models"] == [{"name": "smollm2-135m-instruct", "path": str(pulled_default.path)}]
    for args in (("model", "info", "--json"), ("model", "info", "smollm2-135m-instruct", "--json"),
                 ("model", "info", str(pulled_default.path), "--json")):
        result = run(*args)
        assert result.exit_code == 0, result.output
        info = json.loads(result.stdout)
        assert info["parameters"] == 134515008
        # 210 Q4_1 matrices (24 bytes a block of 32: float32 scales), the Q8_0 tied head, norms
        assert info["bytes_per_token"] == 111617280
        assert info["storage"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
        assert info["chat_template"] is True and info["context_length"] == 8192
        assert (info["architecture"], info["layers"], info["heads"], info["kv_heads"]) == (
            "LlamaForCausalLM", 30, 9, 3)
        assert info["dtypes"] == ["F32", "U8"] and info["tied_head"] is True
        assert info["name"] == "smollm2-135m-instruct"
        assert info["source"]["gguf_sha256"].startswith("b179c952")
    table = run("model", "info")
    assert table.exit_code == 0 and "134515008" in table.stdout


def test_model_info_json_tiny_folder(run, tiny_llama_folder):
    result = run("model", "info", str(tiny_llama_folder()), "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["parameters"] == sum(a.size for a in tiny_llama_tensors().values())
    assert info["chat_template"] is False and info["context_length"] == 256


def test_model_info_bad_path(run, tmp_path):
    assert_one_error_line(run("model", "info", str(tmp_path / "nope")), "does not exist")
    assert_one_error_line(run("model", "info", str(tmp_path), "--json"), "no config.json")


def test_model_info_does_not_pull(run, kolibri_home):
    assert_one_error_line(run("model", "info"), "not in the cache", "kolibri model pull")
    assert not (kolibri_home / "models").exists()


def test_model_pull_offline(run):
    assert_one_error_line(run("model", "pull"), "KOLIBRI_OFFLINE=1")


@pytest.mark.parametrize(("args", "fragments"), [
    (("generate", ""), ["prompt is empty"]),
    (("generate", "   \n"), ["prompt is empty"]),
    (("generate", "hi", "--max-tokens", "0"), ["--max-tokens", "0"]),
    (("generate", "hi", "--max-tokens", "-3"), ["--max-tokens", "-3"]),
    (("generate", "hi", "--model", "/nonexistent"), ["/nonexistent", "does not exist"]),
    (("generate", "hi", "--spec", "--k", "0"), ["--k", "0"]),
    (("generate", "hi", "--spec", "--window", "4-1"), ["4-1"]),
    (("generate", "hi", "--spec", "--window", "a-b"), ["a-b"]),
    (("generate", "hi", "--spec", "--window", ""), ["window"]),
    (("generate", "hi", "--spec", "--window", "0-3"), ["0-3"]),
    (("generate", "hi", "--compare", "--window", "1-2-3"), ["1-2-3"]),
])
def test_generate_bad_input(run, args, fragments):
    assert_one_error_line(run(*args), *fragments)


def test_generate_empty_stdin(run):
    assert_one_error_line(run("generate", "-", input=""), "prompt is empty")


def test_generate_default_model_offline_says_so(run):
    assert_one_error_line(run("generate", "hi"), "KOLIBRI_OFFLINE=1")


def test_generate_bad_folders(run, tmp_path, tiny_llama_folder):
    (tmp_path / "file.txt").write_text("x")
    result = run("generate", "hi", "--model", str(tmp_path / "file.txt"))
    assert_one_error_line(result, "is a file, not a model folder nor a .gguf file")
    gpt2 = tiny_llama_folder(name="gpt2", config_changes={"architectures": ["GPT2LMHeadModel"],
                                                          "model_type": "gpt2"})
    assert_one_error_line(run("generate", "hi", "--model", str(gpt2)), "'GPT2LMHeadModel'")
    tensors = tiny_llama_tensors()
    tensors["model.layers.1.mlp.down_proj.weight"] = np.zeros((64, 64), np.float32)
    wrong = tiny_llama_folder(name="wrong-shape", tensors=tensors)
    assert_one_error_line(run("generate", "hi", "--model", str(wrong)),
                          "model.layers.1.mlp.down_proj.weight", "(64, 64)", "(64, 128)")
    truncated = tiny_llama_folder(name="truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert_one_error_line(run("generate", "hi", "--model", str(truncated)), "truncated")


def test_debug_variable_lets_the_traceback_through(run, monkeypatch):
    monkeypatch.setenv("KOLIBRI_DEBUG", "1")
    result = run("model", "info", "/nonexistent")
    assert result.exit_code != 0 and isinstance(result.exception, KolibriError)
