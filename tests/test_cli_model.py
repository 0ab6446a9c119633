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
    (row,) = listed["models"]
    assert (row["name"], row["path"]) == ("smollm2-135m-instruct", str(pulled_default.path))
    gguf = pulled_default.gguf.stat().st_size  # one copy of the weights: <= 1.05x the GGUF
    assert gguf < row["bytes"] <= 1.05 * gguf
    for args in (("model", "info", "--json"), ("model", "info", "smollm2-135m-instruct", "--json"),
                 ("model", "info", str(pulled_default.path), "--json")):
        result = run(*args)
        assert result.exit_code == 0, result.output
        info = json.loads(result.stdout)
        assert info["parameters"] == 134515008
        # 210 Q4_1 matrices (20 bytes a block of 32: the GGUF's float16 scales), the Q8_0 tied
        # head, norms
        assert info["bytes_per_token"] == 96576768
        assert info["storage"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
        assert info["chat_template"] is True and info["context_length"] == 8192
        assert (info["architecture"], info["layers"], info["heads"], info["kv_heads"]) == (
            "LlamaForCausalLM", 30, 9, 3)
        assert info["dtypes"] == ["F32", "U8"] and info["tied_head"] is True
        assert info["name"] == "smollm2-135m-instruct"
        assert info["source"]["gguf_sha256"].startswith("b179c952")
    table = run("model", "info")
    assert table.exit_code == 0 and "134,515,008 parameters" in table.stdout


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


# ---- kolibri model rm ----


def _home_files(home) -> dict[str, bytes]:
    return {p.relative_to(home).as_posix(): p.read_bytes()
            for p in sorted(home.rglob("*")) if p.is_file()}


def _import(run, tmp_path, name: str, seed: int):
    from crafted import gguf_tensors, write_gguf

    gguf = write_gguf(tmp_path / f"{name}-{seed}.gguf", tensors=gguf_tensors(seed))
    result = run("model", "import", str(gguf), "--name", name)
    assert result.exit_code == 0, result.output
    from kolibri_cli.store.cache import model_dir, provenance

    return provenance(model_dir(name))["gguf_sha256"]


def _keep_records(sha: str) -> None:
    """An entry of this weights' sha256 in bench-costs.json and guard-costs.json."""
    from kolibri_cli.costs import samples as guardcosts
    from kolibri_cli.costs import store as benchcosts

    benchcosts.save(benchcosts.BenchCosts(
        model=sha[:6], model_sha256=sha, threads=1, numerics="float32", costs={1: 1.0, 2: 1.2},
        measured_at="2026-01-01T00:00:00+00:00", kolibri="0", commit="", cpu="cpu"))
    guardcosts.save(f"{sha}|float32|1|kernel|cpu|target", [[0, 2, [1.2]]])


def test_model_rm_removes_everything_of_the_model_and_nothing_else(run, kolibri_home, tmp_path):
    """Three models: tiny and tiny.q4 (another GGUF; a name tiny is a prefix of), and same
    (tiny's GGUF again). rm tiny takes its folder and the temporary a killed import left; its
    c(n) and guard timings stay while `same` has the same weights, and go with `same`."""
    from kolibri_cli.store.atomic import temp_name

    tiny, other = _import(run, tmp_path, "tiny", 0), _import(run, tmp_path, "tiny.q4", 1)
    assert _import(run, tmp_path, "same", 0) == tiny != other
    for sha in (tiny, other):
        _keep_records(sha)
    models = kolibri_home / "models"
    from kolibri_cli.store import digests

    for name in ("tiny", "tiny.q4"):  # a digest remembered of a file in each folder
        digests.files_sha256([models / name / "config.json"])
    (models / temp_name("tiny", "partial")).mkdir()  # a killed import's
    (models / temp_name("tiny.q4", "partial")).mkdir()  # not tiny's
    before = _home_files(kolibri_home)

    result = run("model", "rm", "tiny", "--yes")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("removed tiny: ")
    assert "1 entries of digests.json" in result.stderr
    after = _home_files(kolibri_home)
    assert set(before) - set(after) == {f for f in before if f.startswith("models/tiny/")}
    assert [f for f in after if after[f] != before[f]] == ["digests.json"]  # shared weights:
    remembered = json.loads(after["digests.json"])["records"]  # their records stay
    assert sorted(remembered) == sorted(str(p.resolve()) for p in (
        *(tmp_path / f for f in ("tiny-0.gguf", "tiny.q4-1.gguf", "same-0.gguf")),
        models / "tiny.q4" / "config.json"))
    left = sorted(p.name for p in models.iterdir())
    assert left[1:] == ["same", "tiny.q4"] and left[0].startswith(".tiny.q4.")

    result = run("model", "rm", "same", "--yes", "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert done["name"] == "same" and done["files"] >= 4 and done["bytes"] > 0
    assert done["records"] == {"bench-costs.json": 1, "guard-costs.json": 1}
    from kolibri_cli.costs import samples as guardcosts
    from kolibri_cli.costs import store as benchcosts

    assert [e.model_sha256 for e in benchcosts.load()] == [other]
    assert json.loads(guardcosts.path().read_text())["kernels"].keys() == {
        f"{other}|float32|1|kernel|cpu|target"}
    (row,) = json.loads(run("model", "list", "--json").stdout)["models"]
    assert (row["name"], row["path"]) == ("tiny.q4", str(models / "tiny.q4")) and row["bytes"] > 0
    assert (tmp_path / "tiny-0.gguf").is_file()  # the imported file is the user's


def test_model_rm_without_a_terminal_needs_yes(run, kolibri_home, tmp_path):
    _import(run, tmp_path, "tiny", 0)
    line = assert_one_error_line(run("model", "rm", "tiny", input="y\n"), "pass --yes")
    assert line.startswith("error: not removing tiny (") and "without a terminal" in line
    assert (kolibri_home / "models" / "tiny" / "kolibri.json").is_file()
    assert_one_error_line(run("model", "rm", "nothing", "--yes"), "no model named nothing",
                          "(cached: tiny)")
    assert_one_error_line(run("model", "rm", "../models", "--yes"), "invalid model name")


def test_model_rm_asks_on_a_terminal(run, kolibri_home, tmp_path):
    import os
    import sys

    pexpect = pytest.importorskip("pexpect")
    _import(run, tmp_path, "tiny", 0)
    for answer, removed in (("n", False), ("y", True)):
        child = pexpect.spawn(sys.executable, ["-m", "kolibri_cli", "model", "rm", "tiny"],
                              env=os.environ | {"KOLIBRI_HOME": str(kolibri_home)},
                              encoding="utf-8", timeout=120)
        child.expect(r"Remove tiny \(\d+\.\d kB in .*models/tiny\)\? \[y/N\]: ")
        child.sendline(answer)
        child.expect("removed tiny: " if removed else "nothing removed")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        assert (kolibri_home / "models" / "tiny").exists() is not removed


def test_model_info_is_a_table_a_person_reads(run, tiny_llama_folder):
    """Labels and values in words and units (the JSON keeps the field names)."""
    result = run("model", "info", str(tiny_llama_folder()))
    assert result.exit_code == 0, result.output
    cells = [line.split("│")[1:3] for line in result.stdout.splitlines() if line.count("│") == 3]
    rows = {key.strip(): value.strip() for key, value in cells if key.strip()}
    assert rows == {
        "architecture": "LlamaForCausalLM, 202,048 parameters",
        "path": rows["path"],
        "layers": "2, hidden size 64",
        "attention": "4 query heads, 2 KV heads (GQA 2), head dim 16",
        "vocabulary": "1,000 tokens",
        "context": "256 tokens",
        "RoPE": "default, theta 10000",
        "features": "none (plain Llama attention and MLP, untied head)",
        "storage": "F32 x21 tensors (file dtypes: F32)",
        "read per token": "552.2 kB",
        "chat template": "no (kolibri generate --raw only)",
    }
    shown = "".join(value for key, value in cells if key.strip() != "path")
    assert not any(word in shown for word in ("True", "False", "_", "['"))


def test_pull_of_a_name_it_does_not_know_points_at_import_and_folders(run):
    line = assert_one_error_line(run("model", "pull", "Qwen/Qwen2.5-0.5B-Instruct"),
                                 "no model named 'Qwen/Qwen2.5-0.5B-Instruct' to pull")
    assert "`kolibri model import FILE.gguf`" in line and "Hugging Face folder" in line
    line = assert_one_error_line(run("generate", "-m", "qwen2.5", "hi"), "no model named")
    assert "kolibri model import FILE.gguf" in line and "Hugging Face folder" in line
