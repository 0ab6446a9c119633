"""A proposer setting as the command or config that turns it on in each engine that runs the
same rule: kolibri itself, vLLM (`--speculative-config`), llama.cpp's llama-server
(`--spec-type`), SGLang (`--speculative-algorithm NGRAM`), transformers (`generate` keywords);
and the switch that turns drafting off above a concurrency, where the engine has one.

Only exact mappings: a proposer another engine does not run (the guard, adaptive, the tree
proposers but SGLang's) gets kolibri's command alone. Non-goals: the engines' other flags (the
model, ports, threads), checking that an installed engine version takes them.
"""

import json
import shlex
from dataclasses import dataclass

from kolibri_cli.decode.proposers.settings import LlamaCppOptions, format_window
from kolibri_cli.errors import KolibriError


@dataclass(frozen=True)
class EngineCommand:
    engine: str  # "kolibri", "vLLM", "llama-server", "SGLang", "transformers"
    command: str | None  # to paste: the flags (or keywords) that turn the setting on; None:
    # the engine has the rule but not at this setting (`note` says why)
    off_above: str | None = None  # turns drafting off above the crossover; None: no such switch
    note: str | None = None  # where the engine's rule differs from what was probed

    def to_json(self) -> dict:
        return {"engine": self.engine, "command": self.command, "off_above": self.off_above,
                "note": self.note}


def engine_commands(proposer: str, k: int, window: tuple[int, int],
                    options: LlamaCppOptions | None = None, cross_request: bool = False,
                    crossover: int | None = None) -> list[EngineCommand]:
    """The commands that run `proposer` at (k, window) in each engine that has its rule, kolibri
    first; `crossover`: the concurrency above which drafting stops paying (None: not probed, or
    it pays at every concurrency asked for)."""
    options = options or LlamaCppOptions()
    out = [_kolibri(proposer, k, window, options)]
    if proposer == "vllm":
        out.append(_vllm({"method": "ngram", "num_speculative_tokens": k,
                          "prompt_lookup_min": window[0], "prompt_lookup_max": window[1]},
                         crossover))
    elif proposer == "suffix":
        note = None if cross_request else (
            "vLLM's suffix method also drafts from earlier requests' answers: probe with "
            "--cross-request to price that")
        out.append(_vllm({"method": "suffix", "num_speculative_tokens": k}, crossover, note))
    elif proposer.startswith("llamacpp-"):
        out.append(_llama_server(proposer, k, window, options))
    elif proposer == "sglang":
        out.append(EngineCommand("SGLang", shlex.join([
            "--speculative-algorithm", "NGRAM",
            # SGLang counts the tree's root (the last token) among the draft tokens
            "--speculative-num-draft-tokens", str(k + 1),
            "--speculative-ngram-min-match-window-size", str(window[0]),
            "--speculative-ngram-max-match-window-size", str(window[1])])))
    elif proposer == "hf" and window[0] == 1:  # transformers always tries down to n = 1
        out.append(EngineCommand("transformers", f"model.generate(..., prompt_lookup_num_tokens="
                                                 f"{k}, max_matching_ngram_size={window[1]})"))
    return out


def _kolibri(proposer: str, k: int, window: tuple[int, int], options: LlamaCppOptions
             ) -> EngineCommand:
    args = ["kolibri", "generate", "--spec", "--proposer", proposer, "--k", str(k),
            "--window", format_window(window)]
    given = {"--min-hits": options.min_hits, "--n-min": options.n_min,
             "--lookup-cache-static": options.lookup_cache_static,
             "--lookup-cache-dynamic": options.lookup_cache_dynamic}
    if proposer.startswith("llamacpp-"):
        args += [x for flag, value in given.items() if value is not None
                 for x in (flag, str(value))]
    return EngineCommand("kolibri", shlex.join(args) + " PROMPT")


def _vllm(config: dict, crossover: int | None, note: str | None = None) -> EngineCommand:
    on = "--speculative-config " + shlex.quote(json.dumps(config))
    off = None
    if crossover is not None:  # no drafting while more than `crossover` requests run
        off = "--speculative-config " + shlex.quote(json.dumps(
            config | {"disable_by_batch_size": crossover}))
    return EngineCommand("vLLM", on, off, note)


def _llama_server(proposer: str, k: int, window: tuple[int, int], options: LlamaCppOptions
                  ) -> EngineCommand:
    from kolibri_cli.decode.proposers import make_proposer

    try:
        args = make_proposer(proposer, k, window, llamacpp=options).server_args()
    except KolibriError as e:  # a setting llama-server cannot take (ngram-cache's fixed 8)
        return EngineCommand("llama-server", None, note=str(e))
    return EngineCommand("llama-server", shlex.join(args))
