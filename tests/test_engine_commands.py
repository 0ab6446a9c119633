"""The probe's answer as a command: each engine's flags for the fastest setting, in the terminal
and the JSON, and the switch that turns drafting off above the crossover."""

import json
import shlex

from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.decode.proposers import LlamaCppOptions, make_proposer
from kolibri_cli.decode.proposers.commands import engine_commands


def _by_engine(commands) -> dict:
    return {c.engine: c for c in commands}


def test_vllm_setting_in_kolibri_and_vllm():
    c = _by_engine(engine_commands("vllm", 3, (2, 4)))
    assert list(c) == ["kolibri", "vLLM"]
    assert c["kolibri"].command == ("kolibri generate --spec --proposer vllm --k 3 --window 2-4 "
                                    "PROMPT")
    flag, config = shlex.split(c["vLLM"].command)
    assert flag == "--speculative-config" and json.loads(config) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4}
    assert c["vLLM"].off_above is None  # no crossover given


def test_the_off_switch_above_the_crossover_is_vllms_disable_by_batch_size():
    c = _by_engine(engine_commands("vllm", 3, (2, 4), crossover=8))
    flag, config = shlex.split(c["vLLM"].off_above)
    assert json.loads(config)["disable_by_batch_size"] == 8
    assert c["kolibri"].off_above is None


def test_llama_cpp_types_are_the_flags_the_measured_probe_starts_llama_server_with():
    options = LlamaCppOptions(min_hits=2)
    c = _by_engine(engine_commands("llamacpp-map-k4v", 10, (3, 3), options))
    assert shlex.split(c["llama-server"].command) == list(
        make_proposer("llamacpp-map-k4v", 10, (3, 3), llamacpp=options).server_args())
    assert "--min-hits 2" in c["kolibri"].command
    cache = _by_engine(engine_commands("llamacpp-cache", 5, (1, 4)))["llama-server"]
    assert cache.command is None and "fixed" in cache.note


def test_sglang_counts_the_root_among_its_draft_tokens():
    args = shlex.split(_by_engine(engine_commands("sglang", 12, (1, 6)))["SGLang"].command)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags == {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": "13",
                     "--speculative-ngram-min-match-window-size": "1",
                     "--speculative-ngram-max-match-window-size": "6"}


def test_sglang_s_default_k_is_sglangs_default_draft_tokens():
    """SGLang's ngram default is speculative_num_draft_tokens = 12 (server_args.py,
    _handle_ngram: "set to 12 by default for ngram speculative decoding"), and those 12 count
    the root, the last token already decoded (cpp_ngram/result.cpp fillResult: the draft's first
    token is last_token): 11 tree nodes, kolibri's k, so the default setting's command is
    SGLang's default."""
    from kolibri_cli.decode.proposers import default_settings

    k, window = default_settings("sglang")
    assert (k, window) == (11, (1, 12))
    args = shlex.split(_by_engine(engine_commands("sglang", k, window))["SGLang"].command)
    assert dict(zip(args[::2], args[1::2], strict=True))["--speculative-num-draft-tokens"] == "12"


def test_rules_no_other_engine_runs_are_kolibris_alone():
    for name in ("guard", "adaptive", "suffix-tree", "adaptive-tree"):
        assert [c.engine for c in engine_commands(name, 5, (1, 4))] == ["kolibri"]
    assert [c.engine for c in engine_commands("hf", 5, (2, 4))] == ["kolibri"]  # HF tries n=1
    assert "prompt_lookup_num_tokens=5, max_matching_ngram_size=4" in _by_engine(
        engine_commands("hf", 5, (1, 4)))["transformers"].command


def test_probe_prints_and_reports_the_command(tmp_path):
    from test_probe_cli import CHAINS

    # a command is printed whole, on one line, to paste (test_probe_cli's width test allows it)
    goldens = tmp_path / "g.jsonl"
    (_, _, prompt, output), = CHAINS[:1]
    goldens.write_text("".join(json.dumps(
        {"id": f"mix-{i}", "category": "code", "prompt": "p", "chat": True, "prompt_ids": prompt,
         "output_ids": output * 6, "model": "m", "model_sha256": "0" * 64, "reference": {}}
    ) + "\n" for i in range(6)))  # repetitive chains, enough for a verdict: it pays
    args = ["probe", "--goldens", str(goldens), "--k", "3", "--window", "1-2"]
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert doc["verdict"]["answer"] == "pays"
    commands = {c["engine"]: c for c in doc["verdict"]["commands"]}
    assert commands["kolibri"]["command"].startswith(
        "kolibri generate --spec --proposer vllm --k 3 --window 1-2")
    assert json.loads(shlex.split(commands["vLLM"]["command"])[1])["prompt_lookup_max"] == 2
    shown = CliRunner().invoke(app, args).stdout
    assert "turn it on with:" in shown and commands["vLLM"]["command"] in shown
