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
                                "served_model": "served-m", "max_tokens": 64}
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
