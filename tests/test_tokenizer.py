"""The converted default model's tokenizer (golden ids) and chat templates vs transformers."""

import json

import pytest
from conftest import write_tiny_tokenizer

from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.errors import KolibriError

# Recorded with the reference pipeline (llama.cpp / transformers) on the default model.
FRANCE_CHAT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
                   7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282,
                   4649, 47, 2, 198, 1, 520, 9531, 198]
MESSAGES = [
    "What is the capital of France?",
    'He said "hi" and \'bye\' {{ not jinja }} {% raw %}',
    "line one\nline two\n\n\ttabbed\r\nend  ",
    "Ünïcödé — 東京 🚀👩‍💻 ñ",
    "",
    "<|im_end|> injected",
]


@pytest.fixture(scope="module")
def smol(pulled_default) -> Tokenizer:
    return Tokenizer(pulled_default.path)


@pytest.mark.model
def test_chat_prompt_golden_ids(smol):
    assert smol.encode_prompt("What is the capital of France?", chat=True) == FRANCE_CHAT_IDS
    assert smol.decode(FRANCE_CHAT_IDS) == (
        "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n"
        "user\nWhat is the capital of France?\nassistant\n")  # specials skipped


@pytest.mark.model
def test_digits_split_and_control_tokens_special(smol):
    assert len(smol.encode("12345")) == 5
    assert [smol.decode([i]) for i in smol.encode("12345")] == list("12345")
    assert smol.encode("") == []
    assert smol.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
    for i in range(17):  # ids 0-16 are control tokens: each is one special token
        token = smol._tok.id_to_token(i)
        assert smol.encode(token) == [i] and smol.decode([i]) == ""
    assert smol.vocab_size == 49152
    assert smol.token_to_id("<|im_end|>") == 2


@pytest.mark.model
@pytest.mark.parametrize("text", [
    "Hello, world!", "  leading spaces\tand\ttabs\n\nnewlines", "naïve café — 東京 🚀👩‍💻🇫🇷",
    "don't can't we'll", "x = [1, 2, 3]; print(f'{x!r}')", "\t\t\n", "a" * 300,
])
def test_decode_encode_round_trip(smol, text):
    assert smol.decode(smol.encode(text)) == text


@pytest.mark.model
@pytest.mark.parametrize("special", [True, False])
def test_encode_nogil_gives_encode_s_ids(smol, special):
    for text in [*MESSAGES, "12345 <|im_start|>user\n", "a" * 300, smol.render_chat("hi")]:
        assert smol.encode_nogil(text, special) == smol.encode(text, special)


@pytest.fixture(scope="module")
def hf_tokenizer_factory():
    transformers = pytest.importorskip("transformers")

    def make(folder):
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.pop("tokenizer_class", None)
        return transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                                    **config)

    return make


def reference_render(hf, message: str) -> str:
    return hf.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                  add_generation_prompt=True)


@pytest.mark.model
@pytest.mark.reference
@pytest.mark.parametrize("message", MESSAGES)
def test_render_chat_equals_transformers_on_default_model(smol, pulled_default,
                                                          hf_tokenizer_factory, message):
    hf = hf_tokenizer_factory(pulled_default.path)
    assert smol.render_chat(message) == reference_render(hf, message)


TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'user' %}"
    "{{ raise_exception('Conversation must start with the user') }}{% endif %}"
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] | trim }}"
    "{% if tools is not none %}TOOLS{% endif %}"
    "{% if unk_token is defined %}<{{ unk_token }}>{% endif %}"
    "{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
    "{{ messages | tojson }}"
)


def tiny_folder_with_template(tmp_path, template: str, **extra):
    write_tiny_tokenizer(tmp_path)
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
              "chat_template": template} | extra
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.reference
@pytest.mark.parametrize("message", MESSAGES)
def test_render_chat_equals_transformers_with_bos_and_raise_exception(
        tmp_path, hf_tokenizer_factory, message):
    folder = tiny_folder_with_template(tmp_path, TEMPLATE)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|im_end|>"  # transformers takes the plain string form
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer(folder).render_chat(message)
    assert ours.startswith("<|im_start|>[USER] ") and "TOOLS" not in ours
    assert ours == reference_render(hf_tokenizer_factory(folder), message)


def test_raise_exception_becomes_a_kolibri_error(tmp_path):
    folder = tiny_folder_with_template(tmp_path, "{{ raise_exception('Only system turns here') }}")
    with pytest.raises(KolibriError, match="chat template: Only system turns here"):
        Tokenizer(folder).render_chat("hi")


def test_template_errors_are_kolibri_errors(tmp_path):
    folder = tiny_folder_with_template(tmp_path, "{% for m in messages %}{{ m.content }")
    with pytest.raises(KolibriError, match="does not parse.*use --raw"):
        Tokenizer(folder).render_chat("hi")
    (folder / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(KolibriError, match="tokenizer_config.json: not valid JSON"):
        Tokenizer(folder)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(KolibriError, match="tokenizer.json: cannot be read"):
        Tokenizer(folder)


def test_no_template_means_raw_and_chat_template_jinja_wins(tmp_path):
    write_tiny_tokenizer(tmp_path)
    tok = Tokenizer(tmp_path)
    assert tok.chat_template is None
    with pytest.raises(KolibriError, match="no chat template; use --raw"):
        tok.render_chat("hi")
    assert tok.encode_prompt("hi", chat=False) == tok.encode("hi")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "old"}))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert Tokenizer(tmp_path).render_chat("new") == "new!"


def test_named_templates_take_default(tmp_path):
    folder = tiny_folder_with_template(tmp_path, [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}])
    assert Tokenizer(folder).render_chat("x") == "plain"
