"""`kolibri goldens import`: logged chat traffic -> goldens through the tokenizer and template."""

import json

import pytest
from conftest import write_tiny_tokenizer

from kolibri_cli.engine.model import Identity, TokenizerOnly
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.traces import import_traces

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    write_tiny_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return TokenizerOnly("tiny", Tokenizer(folder), None, None, (2,),
                         Identity(model_sha256="ab" * 32))


def write(tmp_path, lines) -> str:
    path = tmp_path / "traces.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def pair(question: str, answer: str, finish: str = "stop", **extra) -> dict:
    return {"request": {"model": "m", "max_tokens": 64,
                        "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": question}]},
            "response": {"model": "served-m", "choices": [
                {"message": {"role": "assistant", "content": answer},
                 "finish_reason": finish}]}} | extra


def test_request_response_pairs_become_goldens(tmp_path, model):
    golden, cut = import_traces(write(tmp_path, [pair("Hi?", "Hello.", id="a"),
                                                 pair("Long?", "Yes", "length")]), model)
    tok = model.tokenizer
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n" \
           "<|im_start|>assistant\n"
    assert golden.prompt_ids == tok.encode(text, add_special_tokens=False)
    assert golden.prompt_ids[0] == 1  # <|im_start|> as the special token, not its characters
    assert golden.output_ids == tok.encode("Hello.", add_special_tokens=False) + [2]
    assert cut.output_ids == tok.encode("Yes", add_special_tokens=False)  # no eos: cut short
    assert (golden.id, cut.id, golden.prompt, golden.chat) == ("a", 2, "Hi?", True)
    assert golden.reference == {"engine": "import", "retokenized": True,
                                "served_model": "served-m", "max_tokens": 64,
                                "request_sampling": {}}
    assert golden.sampling == {}  # the request named no sampling: greedy
    assert golden.model == "tiny" and golden.eos_ids == [2]


def test_conversations_ending_with_the_answer(tmp_path, model):
    conv = {"category": "support", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "text",
                                                                      "text": "?"}]},
        {"role": "assistant", "content": "A."}]}
    (g,) = import_traces(write(tmp_path, [conv]), model)
    assert g.category == "support" and g.prompt == "Q?"
    assert g.output_ids[-1] == 2


@pytest.mark.parametrize("line, message", [
    ("{not json", "traces.jsonl:1: not JSON"),
    ([1, 2], "traces.jsonl:1: expected a JSON object"),
    ({"messages": [{"role": "user", "content": "q"}]}, "must end with the assistant's answer"),
    ({"request": {"messages": []}, "response": {}}, "no 'messages' list"),
    ({"request": {"messages": [{"role": "user", "content": "q"}]}, "response": {"choices": []}},
     r"no choices\[0\].message"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]},
                   {"role": "assistant", "content": "a"}]}, "only text content"),
])
def test_bad_lines_name_file_and_line(tmp_path, model, line, message):
    with pytest.raises(KolibriError, match=message):
        import_traces(write(tmp_path, [line]), model)


def test_duplicate_ids_and_empty_files(tmp_path, model):
    with pytest.raises(KolibriError, match="traces.jsonl:2: duplicate id 'x'"):
        import_traces(write(tmp_path, [pair("a", "b", id="x"), pair("c", "d", id="x")]), model)
    with pytest.raises(KolibriError, match="no traces"):
        import_traces(write(tmp_path, [""]), model)
    with pytest.raises(KolibriError, match="traces file not found"):
        import_traces(tmp_path / "missing.jsonl", model)


def test_devices_are_refused_not_read(model):
    # /dev/zero was read until memory ran out; /dev/null has the same kind and ends at once
    with pytest.raises(KolibriError, match="is a device or socket, expected a traces file"):
        import_traces("/dev/null", model)


def test_a_model_without_chat_template_is_named_not_told_to_use_raw(tmp_path, model):
    folder = tmp_path / "plain"
    folder.mkdir()
    write_tiny_tokenizer(folder)
    plain = TokenizerOnly("plain", Tokenizer(folder), None, None, (2,), Identity())
    with pytest.raises(KolibriError, match="plain has no chat template") as e:
        import_traces(write(tmp_path, [pair("a", "b")]), plain)
    assert "--raw" not in str(e.value)  # goldens import has no --raw


def sampled_pair(question: str, answer: str, **sampling) -> dict:
    trace = pair(question, answer)
    trace["request"] |= sampling
    return trace


def test_the_requests_sampling_parameters_are_kept(tmp_path, model):
    from kolibri_cli.decode.sampling import Sampling
    from kolibri_cli.goldens.traces import sampled_share

    sampled, greedy, unsaid = import_traces(write(tmp_path, [
        sampled_pair("a", "b", temperature=0.7, top_p=0.9, seed=3, top_k=-1),
        sampled_pair("c", "d", temperature=0, top_p=0.5),
        pair("e", "f")]), model)
    assert sampled.sampling == Sampling(temperature=0.7, top_p=0.9, seed=3).to_dict()
    assert sampled.reference["request_sampling"] == {"temperature": 0.7, "top_p": 0.9,
                                                     "top_k": -1, "seed": 3}
    assert greedy.sampling == {} and unsaid.sampling == {}
    assert sampled_share([sampled, greedy, unsaid]) == (1, 0, 1)
    with pytest.raises(KolibriError, match=r"traces.jsonl:1: the request's sampling top-p "
                                           r"must be in \(0, 1\]"):
        import_traces(write(tmp_path, [sampled_pair("a", "b", temperature=1, top_p=2)]), model)


def test_a_sampled_trace_without_a_seed_is_kept_unseeded_not_seed_0(tmp_path, model,
                                                                    kolibri_home):
    """No run used seed 0: the golden keeps no seed; the probe counts it outside the spread
    over seeds; `goldens check` refuses it in one line, before loading any model."""
    from typer.testing import CliRunner

    from kolibri_cli.cli import app
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.replay import Chains

    traces = write(tmp_path, [sampled_pair("a", "b c", temperature=0.7),
                              sampled_pair("a", "b c", temperature=0.7, seed=0),
                              pair("c", "d", id="g")])
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(app, ["goldens", "import", str(traces), "-o", str(out), "-m",
                                 str(tmp_path / "tok"), "--json"])
    assert r.exit_code == 0, r.output
    assert (json.loads(r.stdout)["sampled"], json.loads(r.stdout)["unseeded"]) == (2, 1)
    assert "note: 1 of the 2 sampled requests name no seed: kept unseeded" in r.stderr
    unseeded, seeded, greedy = load_goldens(out)  # read back from the file
    assert "seed" not in unseeded.sampling and unseeded.sampling["temperature"] == 0.7
    assert (unseeded.unseeded, unseeded.seed) == (True, None)
    assert (seeded.unseeded, seeded.seed, greedy.unseeded, greedy.seed) == (False, 0, False, None)
    assert Chains([unseeded, seeded, greedy]).seeds == [None, 0, None]
    r = CliRunner().invoke(app, ["goldens", "check", str(out), "-m", str(tmp_path / "none")])
    assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.output
    assert r.stderr.strip().splitlines() == [
        f"error: golden 1 ({out}:1) was sampled without a recorded seed: no run can reproduce "
        "its tokens, so it cannot be checked (the probe still counts it, outside the spread "
        "over seeds)"]
    r = CliRunner().invoke(app, ["probe", "-g", str(out), "--k", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runs"][0]["chains"] == 3


def test_a_trace_longer_than_any_context_is_refused_before_it_is_tokenized(tmp_path, model):
    """Tokenizing costs ~160 bytes a character: a 12 MB answer took 1.9 GB and 23 s, and 200,000
    one-letter messages (4 MB of JSON) 1 GB. Past MAX_TEXT characters a line is one error."""
    from kolibri_cli.goldens.traces import MARKUP, MAX_TEXT

    long_answer = pair("q", "a" * (MAX_TEXT + 1))
    many = pair("q", "a")
    many["request"]["messages"] = [{"role": "user", "content": "x"}] * (MAX_TEXT // MARKUP)
    with pytest.raises(KolibriError, match=rf"traces.jsonl:1: the answer is {MAX_TEXT + 1:,} "
                                           rf"characters, more than {MAX_TEXT:,}"):
        import_traces(write(tmp_path, [long_answer]), model)
    with pytest.raises(KolibriError, match=r"traces.jsonl:2: the prompt \(64 a message for its "
                                           r"markup\) is 4,259,840 characters"):
        import_traces(write(tmp_path, [pair("q", "a"), many]), model)
    assert len(import_traces(write(tmp_path, [pair("q", "a" * 1000)]), model)) == 1


def chunks(answer: str, finish: str = "stop") -> list[dict]:
    """The chunks an OpenAI-compatible server streams for `answer` (vLLM, llama-server)."""
    pieces = [answer[i : i + 2] for i in range(0, len(answer), 2)]
    first = {"model": "served-m", "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                "finish_reason": None}]}
    return [first, *({"model": "served-m", "choices": [
        {"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces),
        {"model": "served-m", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {"model": "served-m", "choices": [], "usage": {"completion_tokens": 3}}]


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_streamed_responses_are_assembled(tmp_path, model, finish):
    """Chunks with choices[0].delta, logged as a list or as the SSE text, make the golden the
    whole response makes."""
    whole = pair("Hi?", "Hello there.", finish)
    streamed = pair("Hi?", "", finish, response=chunks("Hello there.", finish))
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks("Hello there.", finish))
    as_text = pair("Hi?", "", finish, response=sse + "data: [DONE]\n\n")
    a, b, c = import_traces(write(tmp_path, [whole | {"id": 1}, streamed | {"id": 2},
                                             as_text | {"id": 3}]), model)
    assert a.output_ids == b.output_ids == c.output_ids
    assert (a.output_ids[-1] == 2) == (finish == "stop")
    assert a.reference == b.reference == c.reference


def test_a_stream_without_deltas_is_refused(tmp_path, model):
    with pytest.raises(KolibriError, match=r"nor streamed chunks with choices\[0\].delta"):
        import_traces(write(tmp_path, [pair("q", "", response=[{"choices": [{"text": "x"}]}])]),
                      model)


def test_import_says_what_the_probe_does_with_sampled_traffic(tmp_path, model, kolibri_home):
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    folder = tmp_path / "tok"
    traces = write(tmp_path, [sampled_pair("a", "b", temperature=0.7, seed=1, id=1),
                              pair("c", "d", id=2)])
    args = ["goldens", "import", str(traces), "-o", str(tmp_path / "out.jsonl"), "-m",
            str(folder)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "note: 1 of 2 traces were sampled" in r.stderr and "probability p(d)" in r.stderr
    assert "note: 1 of 2 requests name no temperature" in r.stderr
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"served by served-m, not {folder}:" in warning[0]
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert (doc["sampled"], doc["no_temperature"], doc["served_elsewhere"]) == (1, 1,
                                                                              ["served-m"])


def test_probe_on_raw_traces_names_goldens_import(tmp_path):
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    for trace in (pair("q", "a"), {"messages": [{"role": "user", "content": "q"},
                                                {"role": "assistant", "content": "a"}]}):
        r = CliRunner().invoke(app, ["probe", "-g", str(write(tmp_path, [trace]))])
        assert r.exit_code == 1 and r.stdout == ""
        assert "logged chat traffic, not a golden chain: `kolibri goldens import" in r.stderr


def test_the_docs_example_log_lines_import(tmp_path, model):
    """docs/goldens.md's line of each server's log (wrapped there for reading) imports."""
    from pathlib import Path

    from kolibri_cli.decode.sampling import Sampling

    text = (Path(__file__).parents[1] / "docs" / "goldens.md").read_text()
    block = text.split("```jsonc\n// OpenAI", 1)[1].split("```", 1)[0]
    examples = [" ".join(part.splitlines()[1:]) for part in block.split("\n//")]
    assert len(examples) == 3
    openai, vllm, llama = import_traces(write(tmp_path, examples), model)
    assert (openai.id, openai.category) == ("t-001", "support")
    assert openai.sampling == Sampling(temperature=0.7, seed=42).to_dict()
    assert vllm.sampling == {} and vllm.reference["served_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert vllm.output_ids[:-1] == model.tokenizer.encode('[{"a": 1, "b": 2}]',
                                                          add_special_tokens=False)
    assert llama.sampling == Sampling(temperature=0.8, top_k=40, min_p=0.05, seed=7).to_dict()
    assert llama.output_ids == model.tokenizer.encode("Hello", add_special_tokens=False) + [2]
