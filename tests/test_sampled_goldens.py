"""Sampled golden chains: the format records the sampling parameters (old files read as greedy),
`goldens record --seeds N` writes N chains per prompt, `goldens check` replays them, and the
transformers reference samples the same chains from its own logits."""

import json

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, load_goldens, save_goldens

SAMPLED = {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0,
           "repetition_penalty": 1.0, "seed": 3}
BASE = {"id": "a", "category": "qa", "prompt": "p", "chat": False, "prompt_ids": [1, 2],
        "output_ids": [3, 4], "model": "m", "model_sha256": "", "reference": {}}


def test_sampling_parameters_round_trip_and_old_files_read_as_greedy(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(BASE) + "\n" + json.dumps(BASE | {"id": "b",
                                                                 "sampling": SAMPLED}) + "\n")
    greedy, sampled = load_goldens(path)
    assert greedy.sampling == {} and greedy.sampler.greedy and greedy.seed is None
    assert sampled.sampling == SAMPLED and sampled.seed == 3
    save_goldens(tmp_path / "h.jsonl", [greedy, sampled])
    lines = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert "sampling" not in lines[0] and lines[1]["sampling"] == SAMPLED
    assert load_goldens(tmp_path / "h.jsonl") == [greedy, sampled]


@pytest.mark.parametrize("bad,message", [
    ({"temprature": 1}, "unknown sampling parameter"),
    ({"temperature": "hot"}, "must be a number"),
    ({"temperature": 0.7, "top_p": 3}, "top-p"),
    ([0.7], "must be an object"),
])
def test_bad_sampling_parameters_name_file_and_line(tmp_path, bad, message):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(BASE) + "\n" + json.dumps(BASE | {"id": "b", "sampling": bad}))
    with pytest.raises(KolibriError, match=f"g.jsonl:2: .*{message}"):
        load_goldens(path)


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "category": c, "prompt": p}) + "\n" for i, c, p in
                            [(1, "qa", "abc abc abc"), (2, "code", "for i in range(3):")]))
    return path


def test_record_seeds_then_check_replays_them(tmp_path, tiny_llama_folder):
    folder = tiny_llama_folder()
    out = tmp_path / "sampled.jsonl"
    args = ["goldens", "record", "--prompts", str(_prompts(tmp_path)), "-o", str(out),
            "--engine", "kolibri", "--model", str(folder), "-n", "24", "--temperature", "0.7",
            "--top-p", "0.95", "--seed", "10", "--seeds", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    goldens = load_goldens(out)
    assert [g.id for g in goldens] == [f"{i}/seed{s}" for i in (1, 2) for s in (10, 11, 12)]
    assert [g.seed for g in goldens] == [10, 11, 12] * 2
    assert all(g.sampling["temperature"] == 0.7 and g.sampling["top_p"] == 0.95 for g in goldens)
    assert len({tuple(g.output_ids) for g in goldens}) == 6  # seeds give different chains
    check = CliRunner().invoke(app, ["goldens", "check", str(out), "--model", str(folder),
                                     "--json"])
    assert check.exit_code == 0, check.output
    assert all(r["identical"] for r in json.loads(check.stdout)["results"])
    # a chain replayed with another seed no longer matches: check does use the recorded seed
    bad = [Golden(**{**vars(g), "sampling": g.sampling | {"seed": 99}}) for g in goldens]
    save_goldens(out, bad)
    check = CliRunner().invoke(app, ["goldens", "check", str(out), "--model", str(folder),
                                     "--json"])
    assert not any(r["identical"] for r in json.loads(check.stdout)["results"])


def test_several_seeds_need_sampling(tmp_path, tiny_llama_folder):
    args = ["goldens", "record", "--prompts", str(_prompts(tmp_path)), "-o",
            str(tmp_path / "g.jsonl"), "--engine", "kolibri", "--model", str(tiny_llama_folder()),
            "--seeds", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "several seeds need sampling" in result.output
    assert not (tmp_path / "g.jsonl").exists()


@pytest.mark.reference
def test_the_reference_samples_the_same_chains(tmp_path, tiny_llama_folder):
    """transformers' float32 logits through kolibri's filters and noise give kolibri's sampled
    chains (or diverge only at a near-tie of the perturbed scores)."""
    folder = tiny_llama_folder()
    out = {}
    for engine in ("kolibri", "transformers"):
        out[engine] = tmp_path / f"{engine}.jsonl"
        args = ["goldens", "record", "--prompts", str(_prompts(tmp_path)), "-o",
                str(out[engine]), "--engine", engine, "--model", str(folder), "-n", "24",
                "--temperature", "1.0", "--top-k", "20", "--seed", "5", "--seeds", "2"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    ours, ref = load_goldens(out["kolibri"]), load_goldens(out["transformers"])
    assert [g.output_ids for g in ours] == [g.output_ids for g in ref]
    assert all(len(g.reference["top2_margins"]) == len(g.output_ids) for g in ref)
    check = CliRunner().invoke(app, ["goldens", "check", str(out["transformers"]), "--model",
                                     str(folder)])
    assert check.exit_code == 0, check.output


def test_seed_spread_is_mean_and_sd_over_seeds():
    """Two seeds with hand-countable chains: the spread is over per-seed figures, per category
    and overall; fewer than two seeds gives no spread."""
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.seeds import seed_spread

    def golden(gid, category, seed, output):
        sampling = SAMPLED | {"seed": seed}
        return Golden(gid, category, "p", False, [1, 2, 3, 4, 5], output, "m", "",
                      sampling=sampling)

    chains = [golden("a", "code", 1, [1, 2, 3, 9, 1, 2, 3, 4]),  # 7 steps, 3 passes
              golden("b", "code", 2, [1, 9, 9])]  # 2 steps, 2 passes
    run = simulate(chains, 3, (1, 2))
    ratios = [g.counts.ratio for g in run.goldens]
    spread = seed_spread(run)
    assert set(spread) == {"all", "code"}
    ratio = spread["all"]["ratio"]
    assert ratio.n == 2 and ratio.mean == pytest.approx(sum(ratios) / 2)
    assert ratio.sd == pytest.approx(abs(ratios[0] - ratios[1]) / 2 ** 0.5)
    assert seed_spread(simulate(chains[:1], 3, (1, 2))) is None


@pytest.mark.parametrize("gen,expected", [
    (None, {}),
    ({"eos_token_id": 2}, {"temperature": 0.0}),
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.9},
     {"temperature": 0.6, "top_k": 50, "top_p": 0.9, "min_p": 0.0}),
    ({"do_sample": False, "temperature": 0.6, "repetition_penalty": 1.1},
     {"temperature": 0.0, "repetition_penalty": 1.1}),
])
def test_generation_defaults_read_like_transformers(tmp_path, gen, expected):
    """Sampling only when do_sample; transformers' defaults (top_k 50) for what the file leaves
    out; no file means no defaults."""
    from kolibri_cli.engine.config import generation_defaults

    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    assert generation_defaults(tmp_path) == expected


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "not a valid generation config"),
    ('{"do_sample": true, "temperature": "hot"}', "temperature must be a finite number"),
])
def test_bad_generation_config_is_one_error(tmp_path, text, message):
    from kolibri_cli.engine.config import generation_defaults

    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(KolibriError, match=message):
        generation_defaults(tmp_path)


def test_probe_toml_sampling_keys(tmp_path):
    from kolibri_cli.probe.config import load_config

    toml = tmp_path / "p.toml"
    toml.write_text("temperature = 0.7\nseed = 3\ntop_k = 40\n")
    cfg = load_config(toml, {})
    assert cfg.sampling_overrides() == {"temperature": 0.7, "top_k": 40, "seed": 3}
    toml.write_text('temperature = "hot"\n')
    with pytest.raises(KolibriError, match="temperature must be a finite number"):
        load_config(toml, {})
    toml.write_text("seed = -1\n")
    with pytest.raises(KolibriError, match="seed must be a whole number >= 0"):
        load_config(toml, {})
