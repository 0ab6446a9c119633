"""Every engine call against a hostile server (tests/hostile.py, 127.0.0.1 only): each bad answer
ends in exit 0 or one `error:` line with exit 1 within the deadline, no request carries the API
key anywhere but the engine's URL, and no golden file is written from a bad answer.

Commands fed: `goldens record --engine URL` (llama.cpp, vllm and openai APIs), `bench --engine
URL` (c(n) by prompt evaluation) and `probe --measure --engine URL --baseline URL`. Peak memory
is measured in a child process for the answers that are large by design (a 1 GB stream, 2M
tokens for 128), against a normal recording's."""

import math
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from conftest import COMPILING
from crafted import golden_line, write_goldens
from hostile import (
    MB,
    PROPS,
    HostileServer,
    completion,
    deep,
    drip,
    endless,
    json_answer,
    redirect,
)
from typer.testing import CliRunner

from kolibri_cli.cli import app

KEY = "sk-hostile-test-key"


@pytest.fixture
def servers():
    made = []

    def make(routes: dict | None = None) -> HostileServer:
        made.append(HostileServer(routes))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    monkeypatch.setenv("KOLIBRI_API_KEY", KEY)
    monkeypatch.delenv("KOLIBRI_DEBUG", raising=False)
    return tmp_path


def one_error(result, progress: str = "") -> str:
    """The run's single `error:` line (exit 1, nothing else on stderr but lines starting with
    `progress`, no traceback)."""
    assert "Traceback" not in result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip() and not
             line.startswith(COMPILING) and not (progress and line.startswith(progress))]
    assert result.exit_code == 1 and len(lines) == 1, (result.exit_code, result.stderr)
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], lines[0]
    assert KEY not in result.stderr
    return lines[0]


def record(tmp_path, folder, url, api="llama.cpp", n=8, timeout=20, extra=()):
    (tmp_path / "prompts.txt").write_text("hello there\n")
    args = ["goldens", "record", "--engine", url, "--engine-api", api, "-m", str(folder), "-p",
            str(tmp_path / "prompts.txt"), "-o", str(tmp_path / "out.jsonl"), "-n", str(n),
            "--timeout", str(timeout), *extra]
    return CliRunner().invoke(app, args)


def llama(server_routes: dict) -> dict:
    return {("GET", "/props"): json_answer(PROPS)} | server_routes


# ---- the key stays with the engine: redirects are refused, never followed ---------------------


@pytest.mark.parametrize("route, status", [(("POST", "/completion"), 302),
                                           (("GET", "/props"), 307),
                                           (("POST", "/completion"), 308)])
def test_a_redirect_elsewhere_is_refused_and_the_key_stays_home(env, tiny_llama_folder, servers,
                                                                route, status):
    catcher = servers()
    engine = servers(llama({route: redirect(status, f"{catcher.url}/steal")}))
    result = record(env, tiny_llama_folder(), engine.url)
    line = one_error(result)
    assert f"HTTP {status}, a redirect to {catcher.url}/steal" in line
    assert catcher.requests == []  # nothing, let alone the key, reached the other port
    assert all(h.get("Authorization") == f"Bearer {KEY}" for _, _, h in engine.requests)
    assert not (env / "out.jsonl").exists()


@pytest.mark.parametrize("route", [("GET", "/props"), ("POST", "/completion")])
def test_bench_refuses_a_redirect_and_the_key_stays_home(env, tiny_llama_folder, servers, route):
    """c(n) by a server's prompt evaluation (`bench --engine URL`) uses the same policy."""
    catcher = servers()
    engine = servers(llama({("POST", "/completion"): json_answer(completion(
        [5], {"prompt_n": 1, "prompt_ms": 2.0, "predicted_ms": 1.0, "predicted_n": 1}))}
        | {route: redirect(302, f"{catcher.url}/steal")}))
    result = CliRunner().invoke(app, ["bench", "-m", str(tiny_llama_folder()), "--engine",
                                      engine.url, "--k", "1", "--repeats", "1"])
    assert f"HTTP 302, a redirect to {catcher.url}/steal" in one_error(result)
    assert catcher.requests == []
    assert engine.requests and all(h.get("Authorization") == f"Bearer {KEY}"
                                   for _, _, h in engine.requests)


@pytest.mark.parametrize("location, shown", [
    ("ftp://127.0.0.1/x", "ftp://127.0.0.1/x"), ("http://[::1", "http://[::1"),
    ("http://u:pw@[::1/\x1b[2J", "***@[::1/\\x1b[2J"), ("", "nowhere")])
def test_a_redirect_anywhere_is_refused(env, tiny_llama_folder, servers, location, shown):
    engine = servers(llama({("POST", "/completion"): redirect(302, location)}))
    line = one_error(record(env, tiny_llama_folder(), engine.url))
    assert f"a redirect to {shown};" in line and "pw" not in line, line


def test_user_and_password_in_the_url_are_basic_auth_to_that_host(env, tiny_llama_folder,
                                                                   servers):
    engine = servers(llama({("POST", "/completion"): json_answer(completion([5, 6, 7]))}))
    url = engine.url.replace("http://", "http://alice:s%40cret@")
    result = record(env, tiny_llama_folder(), url)
    assert result.exit_code == 0, result.stderr
    import base64

    assert {h["Authorization"] for _, _, h in engine.requests} == {
        "Basic " + base64.b64encode(b"alice:s@cret").decode()}
    assert "s%40cret" not in (env / "out.jsonl").read_text()  # the URL is recorded masked


# ---- wrong shapes: one line naming the field and the server ----------------------------------

BAD_COMPLETIONS = {
    "timings NaN": (completion([5, 6], {"predicted_ms": math.nan}), "timings.predicted_ms is nan"),
    "timings Infinity": (completion([5, 6], {"predicted_ms": math.inf}),
                         "timings.predicted_ms is inf"),
    "timings a string": (completion([5, 6], {"predicted_ms": "fast"}),
                         "timings.predicted_ms is the string 'fast'"),
    "timings a list": (completion([5, 6], [1, 2]), "timings is a list of 2"),
    "draft counter a string": (completion([5, 6], {"predicted_ms": 3, "draft_n": "x"}),
                               "timings.draft_n is the string 'x'"),
    "probabilities of ints": (completion([5, 6]) | {"completion_probabilities": [1, 2]},
                              "completion_probabilities[0] is 1"),
    "a logprob NaN": (completion([5]) | {"completion_probabilities": [{"top_logprobs": [
        {"logprob": math.nan}, {"logprob": -1}]}]}, "top_logprobs[0].logprob is nan"),
    "ids beyond the vocabulary": (completion([5, 10**9]), "tokens[1] is 1000000000"),
    "ids of 1e40": (completion([5, 1e40]), "tokens[1] is 1e+40"),
    "ids that are booleans": (completion([True, 5]), "tokens[0] is true"),
    "ids that are strings": (completion(["5"]), "tokens[0] is the string '5'"),
    "no ids": (completion([]), "no list of token ids 'tokens'"),
    # integers past float's range (math.isfinite raised OverflowError) or int64's
    "timings a 400-digit integer": (completion([5, 6], {"predicted_ms": 10**400}),
                                    "timings.predicted_ms is 1000"),
    "a counter past int64": (completion([5, 6], {"predicted_ms": 3, "draft_n": 2**63}),
                             "timings.draft_n is 9223372036854775808; expected an integer in"),
    "a logprob of 400 digits": (completion([5]) | {"completion_probabilities": [{"top_logprobs": [
        {"logprob": -(10**400)}, {"logprob": -1}]}]}, "top_logprobs[0].logprob is -1000"),
    "more ids than asked for": (completion([5] * 9), "holds 9 token ids, more than the 8"),
    "the answer a list": ([completion([5])], "the answer is a list of 1"),
    "a stop type that is not text": (completion([5]) | {"stop_type": {"a": 1}}, "stop_type is"),
}


@pytest.mark.parametrize("name", list(BAD_COMPLETIONS))
def test_a_bad_completion_is_one_line_and_writes_nothing(env, tiny_llama_folder, servers, name):
    answer, expected = BAD_COMPLETIONS[name]
    engine = servers(llama({("POST", "/completion"): json_answer(answer)}))
    line = one_error(record(env, tiny_llama_folder(), engine.url))
    assert expected in line and f"{engine.url}/completion" in line, line
    assert not (env / "out.jsonl").exists()


@pytest.mark.parametrize("body, expected", [
    (deep(100_000), "nesting ~1,000 deep"),
    (b'{"tokens": [' + b"9" * 5000 + b"]}", "a number of 4,300+ digits"),
    (b"\xff\xfe{", "the answer is not JSON"),
])
def test_json_no_server_sends_is_one_line(env, tiny_llama_folder, servers, body, expected):
    engine = servers(llama({("POST", "/completion"): json_answer(body)}))
    assert expected in one_error(record(env, tiny_llama_folder(), engine.url))


@pytest.mark.parametrize("props, expected", [
    ([1, 2], "/props: the answer is a list of 2; expected a JSON object"),
    (PROPS | {"model_path": ["a"]}, "model_path is a list of 1; expected a string"),
    (PROPS | {"build_info": "x" * 5000}, "build_info is the string"),
    (PROPS | {"model_alias": "\ud800"}, "model_alias is the string"),
])
def test_bad_props_are_one_line(env, tiny_llama_folder, servers, props, expected):
    engine = servers({("GET", "/props"): json_answer(props),
                      ("POST", "/completion"): json_answer(completion([5]))})
    assert expected in one_error(record(env, tiny_llama_folder(), engine.url))


@pytest.mark.parametrize("answer, expected", [
    ({"choices": [{"text": "", "finish_reason": "length"}]}, "the answer is empty"),
    ({"choices": [{"text": ["x"]}]}, "the answer has no text"),
    ({"choices": "abc"}, "choices is the string 'abc'"),
    ({"choices": [{"text": "hi", "finish_reason": "stop"}], "timings": {"predicted_ms": -1}},
     "timings.predicted_ms is -1"),
])
def test_a_bad_text_answer_is_one_line(env, tiny_llama_folder, servers, answer, expected):
    engine = servers({("POST", "/v1/completions"): json_answer(answer)})
    line = one_error(record(env, tiny_llama_folder(), engine.url, api="openai",
                            extra=("--served-model", "m")))
    assert expected in line


@pytest.mark.parametrize("answer, expected", [
    ({"choices": [{"token_ids": [5, False]}]}, "token_ids[1] is false"),
    ({"choices": [{"token_ids": [5, 1000]}]}, "token_ids[1] is 1000; expected a token id in "
     "0..999"),
])
def test_bad_vllm_ids_are_one_line(env, tiny_llama_folder, servers, answer, expected):
    engine = servers({("POST", "/v1/completions"): json_answer(answer),
                      ("GET", "/version"): json_answer({"version": "0.11"})})
    line = one_error(record(env, tiny_llama_folder(), engine.url, api="vllm",
                            extra=("--served-model", "m")))
    assert expected in line


@pytest.mark.parametrize("timings, expected", [
    ({"prompt_n": "abc", "prompt_ms": 5.0}, "timings.prompt_n is the string 'abc'"),
    ({"prompt_n": 1, "prompt_ms": 0}, "timings.prompt_ms is 0; expected a finite number of "
     "milliseconds > 0"),
    ({"prompt_n": 1, "prompt_ms": math.nan}, "timings.prompt_ms is nan"),
    ({"prompt_n": 1, "prompt_ms": -5}, "timings.prompt_ms is -5"),
    ({"prompt_n": 1, "prompt_ms": 10**400}, "timings.prompt_ms is 1000"),
    ({}, "no prompt timings"),
])
def test_bad_prompt_timings_for_cn_are_one_line(env, tiny_llama_folder, servers, timings,
                                                 expected):
    engine = servers(llama({("POST", "/completion"): json_answer(completion([5], timings))}))
    result = CliRunner().invoke(app, ["bench", "-m", str(tiny_llama_folder()), "--engine",
                                      engine.url, "--k", "1", "--repeats", "1"])
    assert expected in one_error(result)


def measure(env, folder, spec, plain):
    goldens = write_goldens(env / "g.jsonl", golden_line(output_ids=[5, 6, 7, 5, 6, 7, 5, 6]))
    return CliRunner().invoke(app, [
        "probe", "-g", str(goldens), "--measure", "-m", str(folder), "--allow-model-mismatch",
        "--engine", spec.url, "--baseline", plain.url, "--engine-api", "llama.cpp",
        "--proposer", "llamacpp-simple", "--repeats", "1", "--json"])


@pytest.mark.parametrize("timings", [None, {}])
def test_the_measured_probe_needs_decode_times(env, tiny_llama_folder, servers, timings):
    answer = completion([5, 6, 7, 5, 6, 7, 5, 6]) | {"timings": timings}
    spec, plain = (servers(llama({("POST", "/completion"): json_answer(answer)})) for _ in "ab")
    line = one_error(measure(env, tiny_llama_folder(), spec, plain), progress="simulated ")
    assert "the answer reports no decode time" in line


def test_the_measured_probe_refuses_a_redirect_too(env, tiny_llama_folder, servers):
    catcher = servers()
    bad = redirect(302, f"{catcher.url}/completion")
    spec, plain = (servers(llama({("POST", "/completion"): bad})) for _ in "ab")
    result = measure(env, tiny_llama_folder(), spec, plain)
    assert "a redirect to" in one_error(result, progress="simulated ")
    assert catcher.requests == []


# ---- unbounded answers: the deadline and the byte cap -----------------------------------------


def test_a_drip_of_bytes_ends_at_the_deadline(env, tiny_llama_folder, servers):
    engine = servers()
    engine.routes = llama({("POST", "/completion"): drip(engine, every=0.5)})
    t0 = time.monotonic()
    line = one_error(record(env, tiny_llama_folder(), engine.url, timeout=2))
    elapsed = time.monotonic() - t0
    assert "no answer within 2 s" in line
    assert elapsed < 12, elapsed  # a per-read timeout never ends: each read gets a byte


def test_a_stream_past_the_cap_is_cut_off(env, tiny_llama_folder, servers):
    engine = servers(llama({("POST", "/completion"): endless(64 * MB)}))
    line = one_error(record(env, tiny_llama_folder(), engine.url))
    assert "the answer is larger than 4.0 MB" in line


def many_tokens(n: int) -> bytes:
    """llama.cpp's answer with `n` tokens, as bytes (json.dumps of 2M would take seconds)."""
    return b'{"tokens": [' + b"5, " * (n - 1) + b'5], "timings": {"predicted_ms": 3.0}}'


def test_a_big_answer_with_its_length_is_refused_unread(env, tiny_llama_folder, servers):
    engine = servers(llama({("POST", "/completion"): json_answer(many_tokens(2_000_000))}))
    assert "the answer is larger than" in one_error(record(env, tiny_llama_folder(), engine.url))
    assert [r[1] for r in engine.requests].count("/completion") == 1  # not retried


# ---- peak memory in a child process: a 1 GB stream and 2M tokens, against a normal run --------


def _peak_mb(args: list[str], tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """Run `kolibri ARGS` in a child; (its result, its peak RSS in MB, from its own rusage)."""
    env = dict(os.environ, KOLIBRI_HOME=str(tmp_path / "home"), KOLIBRI_OFFLINE="1",
               KOLIBRI_API_KEY=KEY)
    env.pop("KOLIBRI_DEBUG", None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "kolibri_cli", *args], stdout=out,
                             stderr=err, env=env)
        killer = threading.Timer(300, p.kill)
        killer.start()
        _, status, usage = os.wait4(p.pid, 0)  # not p.wait(): wait4 gives this child's rusage
        killer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(args, p.returncode, out.read().decode(),
                                             err.read().decode())
    return result, usage.ru_maxrss / 1024  # KB on Linux


def test_large_answers_cost_no_memory(tmp_path, tiny_llama_folder, servers):
    """A 1 GB streamed answer and 2M tokens for n_predict=128 each end in one line, with a peak
    RSS within 200 MB of a normal recording's."""
    folder = tiny_llama_folder()
    (tmp_path / "p.txt").write_text("hello\n")

    def run(answer, out):
        engine = servers(llama({("POST", "/completion"): answer}))
        return _peak_mb(["goldens", "record", "--engine", engine.url, "--engine-api",
                         "llama.cpp", "-m", str(folder), "-p", str(tmp_path / "p.txt"), "-o",
                         str(tmp_path / out), "-n", "128", "--timeout", "60"], tmp_path)

    normal, normal_mb = run(json_answer(completion([5, 6, 7])), "good.jsonl")
    assert normal.returncode == 0, normal.stderr
    for answer in (endless(1 << 30), json_answer(many_tokens(2_000_000))):
        result, peak_mb = run(answer, "bad.jsonl")
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 1 and len(lines) == 1, result.stderr
        assert "larger than" in lines[0], lines[0]
        assert not (tmp_path / "bad.jsonl").exists()
        assert peak_mb < normal_mb + 200, (peak_mb, normal_mb)
