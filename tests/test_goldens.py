"""Golden files and prompt files: round trip, validation errors with line numbers, Spec-Bench."""

import json
from pathlib import Path

import pytest

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import (
    Golden,
    load_goldens,
    read_prompts,
    save_goldens,
)
from kolibri_cli.goldens.stream import find_golden_files

REPO = Path(__file__).resolve().parents[1]
SPEC_BENCH = REPO.parent / "shared" / "datasets" / "spec_bench" / "question.jsonl"


def golden_dict(**changes) -> dict:
    g = {
        "id": "code-1", "category": "code", "prompt": "Write a loop.", "chat": True,
        "prompt_ids": [1, 9690, 198], "output_ids": [504, 33, 2], "model": "smollm2-135m-instruct",
        "model_sha256": "b179" + "0" * 60,
        "reference": {"engine": "transformers", "engine_version": "4.46", "dtype": "float32"},
    }  # fmt: skip
    g.update(changes)
    return g


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_round_trip(tmp_path):
    goldens = [Golden(**golden_dict()), Golden(**golden_dict(id=7, category="qa", chat=False))]
    save_goldens(tmp_path / "sub" / "g.jsonl", goldens)
    assert load_goldens(tmp_path / "sub" / "g.jsonl") == goldens
    assert [p.name for p in tmp_path.joinpath("sub").iterdir()] == ["g.jsonl"]  # no temp left


def test_identity_is_written_where_known_and_old_goldens_still_read(tmp_path):
    """Goldens of a model without weights carry "identity"; files written before it (no key)
    read as before, and an empty identity is not written."""
    from kolibri_cli.engine.model import Identity

    made = Golden(**golden_dict(id="new", model_sha256="", identity={"tokenizer_sha256": "ab" * 32,
                                                           "served_model": "qwen3-8b"}))
    old = Golden(**golden_dict())
    path = tmp_path / "g.jsonl"
    save_goldens(path, [made, old])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["identity"] == made.identity and "identity" not in lines[1]
    assert load_goldens(path) == [made, old]
    assert made.made_by == Identity(tokenizer_sha256="ab" * 32, served_model="qwen3-8b")
    assert old.made_by == Identity(model_sha256="b179" + "0" * 60)
    extra = write_lines(tmp_path / "x.jsonl", [golden_dict(identity={"future_key": "x",
                                                                     "fingerprint": "f"})])
    assert load_goldens(extra)[0].identity == {"fingerprint": "f"}  # unknown keys: ignored
    for bad in ([1], {"served_model": 3}):
        with pytest.raises(KolibriError, match=r"x.jsonl:1: 'identity' must be an object of"):
            load_goldens(write_lines(tmp_path / "x.jsonl", [golden_dict(identity=bad)]))


def test_blank_lines_are_skipped(tmp_path):
    path = write_lines(tmp_path / "g.jsonl", ["", golden_dict(), "   "])
    assert [g.id for g in load_goldens(path)] == ["code-1"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([golden_dict(), "{not json"], r"g.jsonl:2: not JSONL"),
        ([golden_dict(), "[1, 2]"], r"g.jsonl:2: expected a JSON object, got list"),
        ([{k: v for k, v in golden_dict().items() if k not in ("model", "chat")}],
         r"g.jsonl:1: missing field\(s\) chat, model"),
        ([golden_dict(), golden_dict(id="x", output_ids=[5, "6"])],
         r"g.jsonl:2: 'output_ids'\[1\] is '6'; token ids must be integers"),
        ([golden_dict(prompt_ids=[1, 2.5])], r"g.jsonl:1: 'prompt_ids'\[1\] is 2.5"),
        ([golden_dict(prompt_ids=[1, True])], r"'prompt_ids'\[1\] is True"),
        ([golden_dict(output_ids=[-3])], r"'output_ids'\[0\] is -3"),
        ([golden_dict(output_ids=[])], r"g.jsonl:1: 'output_ids' must be a non-empty list"),
        ([golden_dict(chat="yes")], r"g.jsonl:1: 'chat' must be a bool, got str"),
        ([golden_dict(reference="hf")], r"'reference' must be a dict"),
        ([golden_dict(id=[1])], r"g.jsonl:1: 'id' must be a string or an integer"),
        ([golden_dict(), "", golden_dict()], r"g.jsonl:3: duplicate golden id 'code-1' \(first"),
    ],
)  # fmt: skip
def test_validation_names_file_and_line(tmp_path, lines, message):
    path = write_lines(tmp_path / "g.jsonl", lines)
    with pytest.raises(KolibriError, match=message):
        load_goldens(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(KolibriError, match="nope.jsonl: file not found"):
        load_goldens(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(KolibriError, match="empty.jsonl: the file is empty"):
        load_goldens(tmp_path / "empty.jsonl")
    with pytest.raises(KolibriError, match="is a folder"):
        load_goldens(tmp_path)


def test_find_golden_files(tmp_path):
    (tmp_path / "m").mkdir()
    a = write_lines(tmp_path / "m" / "b.jsonl", [golden_dict()])
    b = write_lines(tmp_path / "m" / "a.jsonl", [golden_dict()])
    (tmp_path / "m" / "notes.txt").write_text("x")
    write_lines(tmp_path / "m" / "prompts.jsonl", [{"id": 1, "category": "c", "prompt": "x"}])
    assert find_golden_files([tmp_path / "m"]) == [b, a]  # prompt files are not goldens
    assert find_golden_files([a]) == [a]
    with pytest.raises(KolibriError, match="not found"):
        find_golden_files([tmp_path / "missing.jsonl"])


def test_read_prompts_jsonl_and_text(tmp_path):
    jsonl = write_lines(tmp_path / "p.jsonl", [
        {"id": "a", "category": "code", "prompt": "Write x."},
        {"id": 2, "category": "qa", "prompt": "Why?"},
    ])  # fmt: skip
    assert [(p.id, p.category, p.prompt) for p in read_prompts(jsonl)] == [
        ("a", "code", "Write x."), (2, "qa", "Why?")
    ]  # fmt: skip
    text = tmp_path / "p.txt"
    text.write_text("First prompt\n\nThird line prompt\n")
    assert [(p.id, p.category, p.prompt) for p in read_prompts(text)] == [
        (1, "text", "First prompt"), (3, "text", "Third line prompt")
    ]  # fmt: skip


def test_read_prompts_errors(tmp_path):
    bad = write_lines(
        tmp_path / "p.jsonl", [{"id": "a", "category": "c", "prompt": "x"}, {"id": "b"}]
    )
    with pytest.raises(KolibriError, match=r"p.jsonl:2: missing field\(s\) category, prompt"):
        read_prompts(bad)
    blank = write_lines(tmp_path / "q.jsonl", [{"id": "a", "category": "c", "prompt": "  "}])
    with pytest.raises(KolibriError, match=r"q.jsonl:1: 'prompt' is empty"):
        read_prompts(blank)
    turns = write_lines(tmp_path / "t.jsonl", [{"question_id": 1, "category": "c", "turns": []}])
    with pytest.raises(KolibriError, match=r"t.jsonl:1: 'turns' must be a non-empty list"):
        read_prompts(turns)
    ok = write_lines(tmp_path / "ok.jsonl", [{"id": 1, "category": "c", "prompt": "x"}])
    with pytest.raises(KolibriError, match=r"no prompts of category 'zzz'; it has \['c'\]"):
        read_prompts(ok, category="zzz")
    for nothing in ("", " , "):  # an empty filter chose every prompt
        with pytest.raises(KolibriError, match=r"names no category; .*ok.jsonl has \['c'\]"):
            read_prompts(ok, category=nothing)
    twins = write_lines(tmp_path / "d.jsonl", [{"id": "a", "category": "c", "prompt": "x"},
                                                {"id": "a", "category": "c", "prompt": "y"}])
    with pytest.raises(KolibriError, match=r"d.jsonl:2: duplicate prompt id 'a'"):
        read_prompts(twins)  # recorded, they were goldens the probe refuses


def test_spec_bench_format_in_a_temp_file(tmp_path):
    path = write_lines(tmp_path / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a post.", "Rewrite it."]},
        {"question_id": 82, "category": "summarization", "turns": ["Summarize: ..."]},
        {"question_id": 83, "category": "summarization", "turns": ["Summarize this: ..."]},
    ])  # fmt: skip
    prompts = read_prompts(path)
    assert [(p.id, p.category, p.prompt) for p in prompts][0] == (81, "writing", "Write a post.")
    assert [p.id for p in read_prompts(path, category="summarization")] == [82, 83]
    assert [p.id for p in read_prompts(path, category="summarization", limit=1)] == [82]
    assert [p.id for p in read_prompts(path, per_category=1)] == [81, 82]


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason="../shared/datasets/spec_bench is not present")
def test_spec_bench_question_file():
    prompts = read_prompts(SPEC_BENCH)
    assert len(prompts) == 480
    assert prompts[0].id == 81 and prompts[0].category == "writing"
    assert prompts[0].prompt.startswith("Compose an engaging travel blog post about a recent trip")
    summaries = read_prompts(SPEC_BENCH, category="summarization", limit=10)
    assert len(summaries) == 10 and {p.category for p in summaries} == {"summarization"}
    both = read_prompts(SPEC_BENCH, category="translation,summarization", per_category=10)
    assert [p.category for p in both].count("translation") == 10 and len(both) == 20


def test_the_float32_reference_checks_on_every_numeric_path_kolibri_chains_on_their_own():
    """The transformers float32 reference's chains are what every numeric path is held to:
    checked on the default (int16) path without --allow-model-mismatch; chains kolibri recorded
    on one numeric path are refused on another (unless allowed), naming the --quantize that
    matches."""
    from types import SimpleNamespace

    from kolibri_cli.engine.model import Identity
    from kolibri_cli.goldens.record import check_model_matches

    model = SimpleNamespace(name="m", numerics="int16", vocab_size=50_000, context=8192,
                            identity=Identity(model_sha256="b179" + "0" * 60), weights=[])
    reference = Golden(**golden_dict())
    check_model_matches(model, [reference], allow_mismatch=False)
    kolibri = {"engine": "kolibri", "engine_version": "kolibri 0.1.0"}
    own = Golden(**golden_dict(id="own", reference=kolibri | {"dtype": "int16"}))
    check_model_matches(model, [reference, own], allow_mismatch=False)
    other = Golden(**golden_dict(id="f32", reference=kolibri | {"dtype": "float32"}))
    with pytest.raises(KolibriError, match=r"recorded by kolibri on the float32 numeric path, "
                       r"the model runs int16 \(--quantize float32 matches it; pass "):
        check_model_matches(model, [reference, other], allow_mismatch=False)
    check_model_matches(model, [other], allow_mismatch=True)
    check_model_matches(replace_numerics(model, "float32"), [reference, other], False)
    served = SimpleNamespace(**(vars(model) | {"weights": None}))  # run by a server
    check_model_matches(served, [reference, own, other], allow_mismatch=False)
    bf16 = Golden(**golden_dict(id="bf16", reference={"engine": "transformers", "dtype": "bf16"}))
    with pytest.raises(KolibriError, match=r"by transformers on the bf16 numeric path, the model "
                       r"runs int16 \(pass --allow-model-mismatch"):  # no --quantize bf16 to name
        check_model_matches(model, [bf16], allow_mismatch=False)


def replace_numerics(model, numerics: str):
    from types import SimpleNamespace

    return SimpleNamespace(**(vars(model) | {"numerics": numerics}))


def test_the_transformers_reference_opens_the_model_as_stored():
    """Recording the reference opens the model on float32 (no repacking for a path it never
    runs); kolibri records on the path asked, None being the model's default."""
    from kolibri_cli.goldens.record import numerics_for

    assert numerics_for("transformers", None) == "float32"
    assert numerics_for("kolibri", None) is None
    assert numerics_for("kolibri", "int8") == "int8"


@pytest.mark.parametrize("margins, expected", [([0.5, 0.25, 1], 0.25), ([0.5, "y", 1], "'y'"),
                                               ([0.5, True], "True"), ("x", None),
                                               ([0.5], None)])
def test_a_reference_margin_is_a_number_or_one_error(monkeypatch, margins, expected):
    """`goldens check` formats the reference's margin where a chain diverges: a string there
    was an internal error (Unknown format code 'e'); a file's margin is checked where used."""
    from types import SimpleNamespace

    from kolibri_cli.goldens import record
    from kolibri_cli.goldens.chains import Golden

    monkeypatch.setattr(record, "generate_plain",
                        lambda *a, **k: SimpleNamespace(output_ids=[1, 9, 3]))
    golden = Golden("a", "c", "p", False, [5], [1, 2, 3], "m", "0" * 64,
                    {"top2_margins": margins}, where="g.jsonl:4")
    if isinstance(expected, str):
        with pytest.raises(KolibriError, match=rf"^g.jsonl:4: reference.top2_margins of golden "
                                               rf"'a' holds {expected}; margins are finite"):
            record.check_one(None, golden)
    else:
        result = record.check_one(None, golden)
        assert (result.index, result.reference_margin) == (1, expected)
