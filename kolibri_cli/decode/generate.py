"""The two generators — plain greedy and n-gram speculative — on the one forward kernel.

Speculation never changes the text: a draft token is accepted only if it equals the target's
argmax at its position, and the kernel is batch-invariant, so both generators emit the same ids.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.decode.proposers import draft

OnTokens = Callable[[list[int]], None]  # called with the ids each step adds


@dataclass
class VerifyPass:
    pos: int  # output index of the first token this pass produces
    drafted: int  # drafts run through the pass
    accepted: int  # drafts equal to the target's argmax (longest prefix)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # includes the eos token when generation stopped on it
    text: str
    prefill_s: float
    decode_s: float
    forward_passes: int  # prefill included
    mode: str = "plain"
    passes: list[VerifyPass] = field(default_factory=list)  # spec only, one per verify pass
    proposer_s: float = 0.0

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first (which prefill produces) per second of decoding."""
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def counted(self) -> list[tuple[int, int]]:
        """(drafted, accepted) per pass, counting only drafts aimed at positions before the final
        token — the probe's definition, so a simulation over this chain gives the same counts.
        Drafts past the end (verified, then cut by eos) cost time but are not counted."""
        last = len(self.output_ids) - 1
        return [(min(p.drafted, last - p.pos), min(p.accepted, last - p.pos)) for p in self.passes]

    def to_dict(self, model_name: str) -> dict:
        """The `kolibri generate --json` object."""
        stats = {
            "prompt_tokens": len(self.prompt_ids),
            "new_tokens": self.new_tokens,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "forward_passes": self.forward_passes,
        }
        if self.mode == "spec":
            stats |= self.spec_stats() | {"proposer_s": self.proposer_s}
        return {"model": model_name, "mode": self.mode, "prompt_ids": self.prompt_ids,
                "output_ids": self.output_ids, "text": self.text, "stats": stats}

    def spec_stats(self) -> dict:
        counted = self.counted()
        drafted = sum(d for d, _ in counted)
        accepted = sum(a for _, a in counted)
        width = max((d for d, _ in counted), default=0)
        return {
            "verify_passes": len(self.passes),
            "drafts_proposed": drafted,
            "drafts_accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_position": [sum(a > i for _, a in counted) for i in range(width)],
            "drafted_per_position": [sum(d > i for d, _ in counted) for i in range(width)],
        }


def _emit(on_tokens: OnTokens | None, ids: list[int]) -> None:
    if on_tokens is not None:
        on_tokens(ids)


def _argmax(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1)  # [L, V] -> [L]; first index wins ties, like torch


def _prefill(tf, prompt_ids: Sequence[int], max_tokens: int):
    cache = tf.new_cache(len(prompt_ids) + max_tokens)
    t0 = time.perf_counter()
    first = int(_argmax(tf.forward(prompt_ids, 0, cache))[-1])
    return cache, first, time.perf_counter() - t0


def generate_plain(model, prompt_ids: Sequence[int], max_tokens: int,
                   on_tokens: OnTokens | None = None) -> GenerationResult:
    tf, eos = model.transformer, set(model.eos_ids)
    cache, tok, prefill_s = _prefill(tf, prompt_ids, max_tokens)
    out = [tok]
    _emit(on_tokens, [tok])
    t0 = time.perf_counter()
    while tok not in eos and len(out) < max_tokens:
        tok = int(_argmax(tf.forward([tok], len(prompt_ids) + len(out) - 1, cache))[0])
        out.append(tok)
        _emit(on_tokens, [tok])
    decode_s = time.perf_counter() - t0
    return GenerationResult(list(prompt_ids), out, model.tokenizer.decode(out), prefill_s,
                            decode_s, forward_passes=len(out))


def _verify(tf, last: int, drafts: list[int], pos: int, cache) -> tuple[int, list[int]]:
    """Run [last, d1..dj] in one forward; return (accepted, the tokens this pass produces)."""
    target = _argmax(tf.forward([last, *drafts], pos, cache))  # [j + 1]
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    cache.length = pos + a + 1  # roll back: rejected drafts' K/V are simply overwritten later
    return a, [*drafts[:a], int(target[a])]


def generate_spec(model, prompt_ids: Sequence[int], max_tokens: int, proposer,
                  on_tokens: OnTokens | None = None) -> GenerationResult:
    tf, eos = model.transformer, set(model.eos_ids)
    cache, tok, prefill_s = _prefill(tf, prompt_ids, max_tokens)
    context = np.empty(len(prompt_ids) + max_tokens, dtype=np.int64)
    context[: len(prompt_ids)] = prompt_ids
    n_ctx, out, passes, proposer_s = len(prompt_ids), [tok], [], 0.0
    context[n_ctx] = tok
    _emit(on_tokens, [tok])
    t0 = time.perf_counter()
    while out[-1] not in eos and len(out) < max_tokens:
        tp = time.perf_counter()
        drafts = draft(proposer, context[: n_ctx + len(out)], max_tokens - len(out) - 1)
        proposer_s += time.perf_counter() - tp
        a, new = _verify(tf, out[-1], drafts, n_ctx + len(out) - 1, cache)
        new = _cut_at_eos(new, eos)
        passes.append(VerifyPass(len(out), len(drafts), a))
        context[n_ctx + len(out) : n_ctx + len(out) + len(new)] = new
        out += new
        proposer_s += _observe(proposer, context[: n_ctx + len(out)], len(drafts), a,
                               final=out[-1] in eos or len(out) >= max_tokens, produced=len(new))
        _emit(on_tokens, new)
    decode_s = time.perf_counter() - t0
    return GenerationResult(list(prompt_ids), out, model.tokenizer.decode(out), prefill_s,
                            decode_s, forward_passes=1 + len(passes),
                            mode="spec", passes=passes, proposer_s=proposer_s)


def _observe(proposer, context, drafted: int, accepted: int, final: bool, produced: int) -> float:
    """Tell a stateful proposer how the pass went — the same call the probe simulation makes —
    and return the seconds it took (proposer time). On the final pass, drafts aimed past the last
    token are not counted (GenerationResult.counted), exactly as in the simulation, which caps
    drafts at the chain's end and so never proposes them."""
    if not hasattr(proposer, "observe"):
        return 0.0
    t0, last = time.perf_counter(), produced - 1 if final else drafted
    proposer.observe(context, min(drafted, last), min(accepted, last))
    return time.perf_counter() - t0


def _cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens
