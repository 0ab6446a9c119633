"""How faithful a numeric path is (`kolibri bench --fidelity`): the greedy goldens it reproduces
and its largest logit difference from the float32 path, on tiny models (both ways a path can
stand) and on the default model's default path, which must reproduce every shipped golden and
stay within 1e-2 of the float32 path's logits (the shipped goldens' smallest top-2 margin is
0.029)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import tiny_llama_tensors
from tiny_models import TINY, _Tok
from typer.testing import CliRunner

from kolibri_cli.bench.fidelity import (
    LOGIT_LAW,
    float32_reference,
    measure_fidelity,
    teacher_forced,
    tie_margin,
)
from kolibri_cli.cli import app
from kolibri_cli.decode.generate import generate_plain
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.goldens.record import NEAR_TIE


def _model(numerics: str):
    weights = random_weights(TINY, seed=3, scale=0.3, storage=numerics)
    return SimpleNamespace(transformer=Transformer(TINY, weights), eos_ids=(), tokenizer=_Tok(),
                           numerics=numerics)


def _goldens(model, n: int = 6) -> list[Golden]:
    """Greedy chains of `model`, as a recorder would keep them"""
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        prompt = [int(t) for t in rng.integers(1, 64, 8)]
        ids = generate_plain(model, prompt, 24).output_ids
        out.append(Golden(i, "tiny", "", False, prompt, ids, "tiny", ""))
    return out


def test_the_reference_is_the_float32_path_loaded_only_when_needed():
    loads = []

    def load():
        loads.append(1)
        return "float32 copy"

    f32, i16 = SimpleNamespace(numerics="float32"), SimpleNamespace(numerics="int16")
    assert float32_reference(f32, load) is f32 and loads == []
    assert float32_reference(i16, load) == "float32 copy" and loads == [1]


def test_the_float32_path_against_itself_is_exact():
    f32 = _model("float32")
    f = measure_fidelity(f32, f32, _goldens(f32))
    assert (f.numerics, f.goldens, f.reproduced, f.max_logit_diff) == ("float32", 6, 6, 0.0)


def test_another_path_is_measured_not_assumed():
    """q8_0 weights: logits differ from the float32 path's (the difference is the largest over
    every position of every golden, teacher-forced), and chains are counted one by one."""
    f32, q8 = _model("float32"), _model("q8_0")
    goldens = _goldens(f32)
    f = measure_fidelity(q8, f32, goldens)
    worst = max(float(np.abs(teacher_forced(q8, g) - teacher_forced(f32, g)).max())
                for g in goldens)
    assert f.numerics == "q8_0" and f.max_logit_diff == worst > 0
    assert f.at in {str(g.id) for g in goldens}
    same = sum(generate_plain(q8, g.prompt_ids, len(g.output_ids)).output_ids == g.output_ids
               for g in goldens)
    assert f.reproduced == same


def test_divergences_are_placed_and_classified_by_the_reference_margin():
    """A chain the path does not reproduce is reported with its step, both tokens and the
    reference's top-2 margin there; below the run's tie (here the float32 path against itself:
    NEAR_TIE) it is a near-tie, at or above it a fidelity failure, unrecorded apart. The JSON
    and the rendered table carry the same."""
    from kolibri_cli.cli.render import fidelity_table, out

    f32 = _model("float32")
    goldens = _goldens(f32, 4)
    for g, step, margin in ((goldens[1], 5, NEAR_TIE / 2), (goldens[2], 9, NEAR_TIE),
                            (goldens[3], 0, None)):
        g.output_ids[step] = (g.output_ids[step] + 1) % 64  # the reference chose otherwise
        if margin is not None:
            g.reference["top2_margins"] = [1.0] * step + [margin] + [1.0] * 30
    f = measure_fidelity(f32, f32, goldens)
    assert f.tie == NEAR_TIE and f.within_law
    assert (f.reproduced, f.at_near_tie, f.failures, f.unrecorded) == (1, 1, 1, 1)
    got = [(d.golden, d.step, d.margin, d.near_tie) for d in f.divergences]
    assert got == [("1", 5, NEAR_TIE / 2, True), ("2", 9, NEAR_TIE, False),
                   ("3", 0, None, False)]
    d = f.divergences[0]
    assert d.reference == goldens[1].output_ids[5] != d.ours
    j = json.loads(json.dumps(f.to_dict()))
    assert (j["at_near_tie"], j["failures"], j["unrecorded"], j["within_law"]) == (1, 1, 1, True)
    assert [r["near_tie"] for r in j["divergences"]] == [True, False, False]
    assert j["divergences"][1]["step"] == 9 and j["divergences"][1]["margin"] == NEAR_TIE
    with out.capture() as cap:
        out.print(fidelity_table(f))
    text = " ".join(cap.get().replace("│", " ").split())  # the cells' folded lines, joined
    assert "1 at a near-tie" in text and "1 above it" in text and "1 with no margin" in text
    assert "step 5" in text and "(at a near-tie)" in text
    assert text.count("a fidelity failure") == 1 and "not recorded" in text


def test_the_tie_is_twice_the_largest_logit_difference_never_below_the_floor():
    """Two logits each off by up to d move their margin by up to 2d."""
    assert tie_margin(0.0) == NEAR_TIE
    assert tie_margin(0.0101) == pytest.approx(0.0202)
    assert tie_margin(NEAR_TIE / 4) == NEAR_TIE


def test_teacher_forced_rows_are_the_chains_own_logits():
    """Row i of the one-forward replay is the logits that chose output i (argmax: greedy)"""
    f32 = _model("float32")
    g = _goldens(f32, 1)[0]
    assert list(teacher_forced(f32, g).argmax(axis=1)) == g.output_ids


@pytest.mark.model
def test_default_path_reproduces_every_shipped_golden(pulled_default, monkeypatch):
    """The default model on its default numeric path (int16 on a CPU with AVX2 and F16C): every
    shipped greedy golden, and logits within the law of the float32 path's (`kolibri bench
    --fidelity --json`)."""
    from kolibri_cli.engine.weights import default_numerics

    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    r = CliRunner().invoke(app, ["bench", "--fidelity", "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)
    assert f["numerics"] == default_numerics(("Q8_0", "Q4_1"))  # int16 with AVX2 and F16C
    assert f["goldens"] == 18 and f["reproduced"] == 18
    assert f["max_logit_diff"] <= LOGIT_LAW
    assert (f["max_logit_diff"] > 0) == (f["numerics"] != "float32")  # measured, not assumed


@pytest.mark.model
@pytest.mark.parametrize("path", ["int16", "float32"])
def test_the_other_path_reproduces_every_shipped_golden(pulled_default, monkeypatch, path):
    """int16 and float32 both reproduce every shipped golden, whichever is the default on this
    CPU (the default one is the test above): int16's logits within the law of the float32
    path's, float32's are its own reference."""
    from kolibri_cli.engine.weights import default_numerics

    if path == default_numerics(("Q8_0", "Q4_1")):
        pytest.skip(f"{path} is this CPU's default path: the test above ran it")
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    r = CliRunner().invoke(app, ["bench", "--fidelity", "--quantize", path, "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)
    assert f["numerics"] == path and f["goldens"] == 18 and f["reproduced"] == 18
    if path == "int16":  # float32's diff is against itself
        assert 0 < f["max_logit_diff"] <= LOGIT_LAW


def test_fidelity_needs_shipped_goldens(kolibri_home, tmp_path):
    from kolibri_cli.store import cache, synthetic

    path = tmp_path / "tiny.gguf"
    synthetic.write(path, n_layers=1, d=256, ff=512, heads=4, kv_heads=2, vocab=300,
                    context=256, types=lambda kind, layer, n: "Q4_1")
    cache.import_gguf(path, "tiny")
    r = CliRunner().invoke(app, ["bench", "--model", "tiny", "--fidelity"])
    assert r.exit_code == 1 and "no goldens ship" in r.stderr and r.stdout == ""


def _record(folder, tmp_path, *extra, name: str = "g.jsonl") -> object:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nwrite a list\nthe sea\n")
    out = tmp_path / name
    r = CliRunner().invoke(app, ["goldens", "record", "--engine", "kolibri", "-m", str(folder),
                                 "--raw", "-p", str(prompts), "-o", str(out), "-n", "12",
                                 "--temperature", "0", *extra])
    assert r.exit_code == 0, r.output
    return out


def test_fidelity_against_a_goldens_file(kolibri_home, tmp_path, tiny_llama_folder):
    """`--goldens FILE` replays that file's greedy chains instead of the shipped ones: the path
    that recorded them reproduces all with no logit difference; another path is measured."""
    folder = tiny_llama_folder()
    goldens = _record(folder, tmp_path)
    r = CliRunner().invoke(app, ["bench", "-m", str(folder), "--fidelity", "-g", str(goldens),
                                 "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)
    assert (f["goldens"], f["reproduced"], f["max_logit_diff"]) == (3, 3, 0.0)
    assert f["source"] == str(goldens) and f["references"] == ["kolibri"]
    r = CliRunner().invoke(app, ["bench", "-m", str(folder), "--fidelity", "-g", str(goldens),
                                 "--quantize", "q8_0", "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)
    assert f["numerics"] == "q8_0" and f["goldens"] == 3 and f["max_logit_diff"] > 0
    r = CliRunner().invoke(app, ["bench", "-m", str(folder), "--fidelity", "-g", str(goldens)])
    assert r.exit_code == 0 and "their greedy goldens reproduced" in r.stdout
    assert "recorded by kolibri" in r.stdout


def test_fidelity_goldens_file_errors(kolibri_home, tmp_path, tiny_llama_folder):
    folder = tiny_llama_folder()
    goldens = _record(folder, tmp_path)
    sampled = _record(folder, tmp_path, "--temperature", "0.8", "--seed", "1",
                      name="sampled.jsonl")
    for args, says in ((["-g", str(goldens)], "--goldens needs --fidelity"),
                       (["--fidelity", "-g", str(sampled)], "no greedy golden"),
                       (["--fidelity", "-g", str(tmp_path / "none.jsonl")], "none.jsonl")):
        r = CliRunner().invoke(app, ["bench", "-m", str(folder), *args])
        assert r.exit_code == 1 and says in r.stderr and r.stdout == "", (args, r.output)
    other = tiny_llama_folder(name="other", tensors=tiny_llama_tensors(seed=5))
    r = CliRunner().invoke(app, ["bench", "-m", str(other), "--fidelity", "-g", str(goldens)])
    assert r.exit_code == 1 and "another model" in r.stderr, r.output
