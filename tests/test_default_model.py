"""The default model end to end, on its default numeric path (int16 on a CPU with AVX2 and F16C,
else float32): kolibri's greedy chains equal the float32 transformers reference recorded in the
shipped goldens, speculative output equals plain output on every golden, and the real spec runs'
counts equal the probe's simulation. The float32 path's blocks equal float32 rows bitwise."""

import json
from pathlib import Path

import pytest
from conftest import LEAN
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.decode.generate import generate_spec
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.goldens.chains import DEFAULT_CHAT as CHAT
from kolibri_cli.goldens.chains import load_goldens
from kolibri_cli.goldens.record import check_one
from kolibri_cli.probe.simulate import simulate_chain

pytestmark = pytest.mark.model

GOLDENS = load_goldens(CHAT)
# "What is the capital of France?" through the chat template, greedy, transformers float32
FRANCE_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.fixture(scope="session")
def model(pulled_default):
    from kolibri_cli.store.models import open_model

    return open_model(str(pulled_default.path))


def default_path() -> str:
    from kolibri_cli.engine.weights import default_numerics

    return default_numerics(("Q8_0", "Q4_1"))  # on this CPU


def test_the_default_path_is_int16_where_it_runs(model):
    from kolibri_cli.engine import simd8

    assert model.numerics == default_path()
    assert model.numerics == ("int16" if simd8.TARGET_AVX2 and simd8.F16C else "float32")


def test_goldens_were_recorded_from_this_model(model):
    assert {g.model_sha256 for g in GOLDENS} == {model.sha256}
    assert {g.reference["engine"] for g in GOLDENS} == {"transformers"}


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: str(g.id))
def test_greedy_chain_equals_the_float32_reference(model, golden):
    """The plain chain, once per golden: identical over all tokens (not only explained by a
    reference near-tie), so the spec runs below may compare with the recorded chain."""
    result = check_one(model, golden)
    assert result.identical, result


SPEC_SETTINGS = [(5, (1, 4)), (8, (1, 4)), (3, (2, 2))]  # (k, window)


@pytest.mark.parametrize("i", range(3), ids=[f"k{k}-w{a}-{b}" for k, (a, b) in SPEC_SETTINGS])
def test_spec_equals_plain(model, i):
    """spec == plain on every golden, each at one setting: the spec chain equals the recorded
    chain, which the plain chain equals (test_greedy_chain_equals_the_float32_reference), and
    the spec run's counts equal the simulation's.

    Setting i runs on GOLDENS[i::3] (every category pair split, high- and low-acceptance chains
    in each third) rather than every golden at every setting: the settings share one code path,
    the verify pass over 1 + draft tokens that batch invariance makes equal to plain steps, and
    vary only the draft length (up to 5, 8, 3) and window. Each third exercises it, as asserted
    at the end: drafts of the full length k accepted, and drafts rejected."""
    k, window = SPEC_SETTINGS[i]
    full_length_accepted = rejected = 0
    for g in GOLDENS[i::3]:
        spec = generate_spec(model, g.prompt_ids, len(g.output_ids), NgramProposer(k, *window))
        assert spec.output_ids == g.output_ids, g.id
        sim = simulate_chain(g.prompt_ids, g.output_ids, NgramProposer(k, *window), k)
        stats = spec.spec_stats()
        assert (stats["verify_passes"], stats["drafts_proposed"], stats["drafts_accepted"]) == (
            sim.verify_passes, sim.drafts_proposed, sim.drafts_accepted), g.id
        full_length_accepted += (stats["accepted_per_position"] + [0] * k)[k - 1]
        rejected += stats["drafts_proposed"] - stats["drafts_accepted"]
    assert full_length_accepted > 0 and rejected > 0


def test_generate_json_on_the_default_model(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    result = CliRunner().invoke(app, ["generate", "--json", "What is the capital of France?"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output_ids"] == FRANCE_IDS
    assert doc["text"] == "The capital of France is Paris."
    assert doc["mode"] == "plain" and doc["stats"]["new_tokens"] == len(FRANCE_IDS)
    assert doc["numerics"] == default_path()  # the numeric path that ran
    assert doc["stats"]["forward_passes"] == len(FRANCE_IDS)


def test_generate_spec_json_on_the_default_model(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    # --costs default: the guard starts cold (its calibration drafts) and keeps no timings in
    # the home the session's other tests share
    args = ["generate", "--json", "--spec", "--k", "3", "--window", "2", "-n", "40",
            "--costs", "default", "Repeat exactly: one two three, one two three, one two three"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["mode"] == "spec" and doc["k"] == 3 and doc["window"] == [2, 2]
    assert doc["proposer"] == "guard"  # the default of --spec
    stats = doc["stats"]
    assert stats["drafts_accepted"] > 0
    assert sum(stats["accepted_per_position"]) == stats["drafts_accepted"]
    assert stats["verify_passes"] == stats["forward_passes"] - 1


def test_measured_probe_counts_equal_simulation_on_smoke_goldens(pulled_default, monkeypatch):
    """`kolibri probe --measure`: the real spec run's counts equal the simulated ones, spec ==
    plain, and the model's plain chain equals the golden (no timing is asserted)."""
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    goldens = CHAT
    args = ["probe", "--goldens", str(goldens), "--limit", "3", "--max-tokens", "48",
            "--measure", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["runs"][0]
    measured = run["measured"]
    assert measured["spec_equals_plain"] and measured["counts_match_simulation"]
    for sim, real in zip(run["goldens"], measured["goldens"], strict=True):
        assert real["first_divergence"] is None
        assert (real["verify_passes"], real["drafts_proposed"], real["drafts_accepted"]) == (
            sim["verify_passes"], sim["drafts_proposed"], sim["drafts_accepted"])
    assert set(measured["costs"]) == {"1", "2", "3", "4", "5", "6"}


# ---------------------------------------------------------------- the default model's blocks


@pytest.fixture(scope="session")
def float32_model(pulled_default):
    from kolibri_cli.store.models import open_model

    return open_model(str(pulled_default.path), numerics="float32", kernels=LEAN)


@pytest.fixture(scope="session")
def float32_twin(float32_model):
    """The default model on the float32 path: its Q4_1/Q8_0 blocks decoded once (the floats
    gguf's dequantize gives), stored as float32 rows."""
    from kolibri_cli.engine import blockfile
    from kolibri_cli.engine.kernel import Transformer
    from kolibri_cli.engine.weights import layout

    model = float32_model
    tensors = blockfile.float_tensors(model.path / blockfile.NAME)
    return Transformer(model.config, layout(model.config, tensors))


def test_runs_from_its_gguf_blocks(float32_model, model):
    assert float32_model.weights.storage() == {"Q4_1": 120, "Q8_0": 1}
    assert float32_model.weights.nbytes_per_token() < 120e6  # 538 MB as float32
    if model.numerics == "int16":  # the GGUF's blocks repacked, no more bytes read
        assert model.weights.storage() == {"Q4_1x16": 120, "Q8_0x16": 1}
        assert model.weights.nbytes_per_token() <= float32_model.weights.nbytes_per_token()


def test_blocks_equal_the_float32_path(float32_model, float32_twin):
    """Every L 1..16 after a prefix, and a 300-token prompt cut at random points: bitwise."""
    import numpy as np

    model, blocks = float32_model, float32_model.transformer
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, 300)
    want = float32_twin.forward(ids, 0, float32_twin.new_cache(300))
    cache = blocks.new_cache(300)
    assert np.array_equal(blocks.forward(ids, 0, cache), want)
    for n in range(1, 17):
        cache.length = 40
        assert np.array_equal(blocks.forward(ids[40:40 + n], 40, cache), want[40:40 + n]), n
    cuts = [0, *sorted(rng.choice(np.arange(1, 300), 6, replace=False).tolist()), 300]
    got = [blocks.forward(ids[a:b], a, cache) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert np.array_equal(np.concatenate(got), want)


# not beside CHAT: the probe reads every golden shipped there, and these are another numeric path
Q8_0_GOLDENS = Path(__file__).parent / "data" / "chat.q8_0.jsonl"


@pytest.fixture(scope="session")
def q8_0_model(pulled_default):
    from kolibri_cli.store.models import open_model

    return open_model(str(pulled_default.path), numerics="q8_0", kernels=LEAN)


def test_q8_0_path_equals_its_own_goldens(q8_0_model):
    """--quantize q8_0 is a numeric path of its own: its goldens were recorded by kolibri on it
    (`kolibri goldens record --engine kolibri --quantize q8_0`), and it reproduces them."""
    goldens = load_goldens(Q8_0_GOLDENS)
    assert {g.reference["dtype"] for g in goldens} == {"q8_0"}
    assert q8_0_model.weights.storage() == {"Q8_0": 121}
    for g in goldens:
        assert check_one(q8_0_model, g).identical, g.id
