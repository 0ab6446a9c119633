"""Record golden chains with an engine — kolibri, the transformers float32 reference, or an
inference server (kolibri_cli.engines) — greedy or sampled, and check kolibri against them:
identical, or the first divergent index with both tokens and the reference's top-2 margin there
(a near-tie explains a divergence; a wide margin is a bug). A sampled chain's margin is between
the top-2 perturbed scores (decode/sampling.py).
"""

import math
from dataclasses import asdict, dataclass, replace

from kolibri_cli.callbacks import Ticks
from kolibri_cli.decode.generate import generate_plain
from kolibri_cli.decode.sampling import GREEDY, Sampling
from kolibri_cli.engine.weights import STORAGE
from kolibri_cli.engines import LOCAL, ServerApi, is_server, server_identity
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, PromptSpec, first_divergence
from kolibri_cli.text import shown

ENGINES = ("kolibri", "transformers")  # in-process; a server is passed as a ServerApi
NEAR_TIE = 1e-3  # a divergence at a reference margin below this is float rounding, not a bug


def check_engine(engine: str) -> bool:
    """Whether `engine` is a server (llama-servers started here or a URL); an unknown in-process
    engine is a KolibriError."""
    remote = is_server(engine)
    if not remote and engine not in ENGINES:
        raise KolibriError(f"unknown engine {engine!r}: {', '.join(ENGINES)}, {LOCAL} or a base "
                           "URL (http://host:port)")
    return remote


def capped(goldens: list[Golden], max_tokens: int) -> int:
    """How many chains the context capped below `max_tokens` (their reference records it)."""
    return sum(g.reference.get("max_tokens", max_tokens) < max_tokens for g in goldens)


def numerics_for(engine: str, quantize: str | None) -> str | None:
    """The numeric path the model is opened on to record with in-process `engine`: float32 for
    the transformers reference, which reads the folder's weights itself (kolibri's, memory-mapped
    as stored, serve the fit checks only; no repacking); kolibri runs `quantize` (None: the
    model's default)."""
    return "float32" if engine == "transformers" else quantize


def _engine(model, engine: str):
    """-> (run(prompt_ids, max_tokens, sampling) -> (output_ids, reference dict))."""
    if engine == "kolibri":
        def run(ids, n, sampling):
            r = generate_plain(model, ids, n, sampling=sampling)
            return r.output_ids, {"engine": "kolibri", "engine_version": _version(),
                                  "dtype": model.numerics, "max_tokens": n}
        return run
    if engine == "transformers":
        from kolibri_cli.goldens import reference

        ref = reference.load(model.path)  # float32 on the folder's weights, whatever path
        # `model` runs: its chains are the reference every path is held to

        def run(ids, n, sampling):
            chain = reference.generate(ref, ids, n, model.eos_ids, sampling)
            return chain.output_ids, {"engine": "transformers", "engine_version":
                                      chain.engine_version, "dtype": "float32", "max_tokens": n,
                                      "top2_margins": [round(m, 6) for m in chain.top2_margins]}
        return run
    raise KolibriError(f"unknown engine {engine!r} (kolibri or transformers)")


def _server(api: ServerApi):
    """The same for a server: its ids as returned, its own top-2 margins where it reports them,
    and how the chain was made (engine, version, URL, re-tokenized or not)."""
    about = api.describe()

    def run(ids, n, sampling):
        c = api.complete(ids, n, sampling, margins=True)
        ref = about | {"max_tokens": n}
        if c.retokenized:
            ref["retokenized"] = True
        if c.top2_margins:
            ref["top2_margins"] = c.top2_margins
        return c.output_ids, ref
    return run


def _version() -> str:
    from kolibri_cli import __version__

    return f"kolibri {__version__}"


def record(model, prompts: list[PromptSpec], engine: "str | ServerApi", max_tokens: int,
           chat: bool, step: Ticks | None = None, sampling: Sampling = GREEDY,
           seeds: int = 1) -> list[Golden]:
    """One chain per prompt, or with `seeds` > 1 (sampled), one per prompt and seed: seeds
    sampling.seed, +1, ..., ids suffixed "/seed<N>". A server samples with its own rule, so
    its sampled chains repeat only on the same server and seed."""
    run = _server(engine) if isinstance(engine, ServerApi) else _engine(model, engine)
    identity = model.identity
    if isinstance(engine, ServerApi):  # the server made the output ids
        identity = identity.merged(server_identity(engine))
    encoded = [(p, _fitting_ids(model, p, chat)) for p in prompts]  # all checked before any run
    runs = [(p, ids, s) for p, ids in encoded for s in _seeded(sampling, seeds)]
    goldens = []
    for i, (p, ids, s) in enumerate(runs):
        room = max_tokens if model.context is None else model.context - len(ids)
        output_ids, ref = run(ids, min(max_tokens, room), s)
        gid = p.id if seeds == 1 else f"{p.id}/seed{s.seed}"
        goldens.append(Golden(gid, p.category, p.prompt, chat, ids, output_ids, model.name,
                              identity.model_sha256, ref, list(model.eos_ids), s.to_dict(),
                              identity.to_dict()))
        check_fits(model, goldens[-1])  # a server's ids: in the vocabulary and the context
        if step:
            step(i + 1, len(runs))
    return goldens


def _fitting_ids(model, prompt: PromptSpec, chat: bool) -> list[int]:
    """The prompt's ids, leaving the context room for one new token (a golden must replay in
    it; each chain's max_tokens is capped to the room left, as its reference records)."""
    ids = model.tokenizer.encode_prompt(prompt.prompt, chat=chat)
    context = model.context
    if context is not None and len(ids) >= context:
        raise KolibriError(f"prompt {shown(prompt.id)} is {len(ids)} tokens; the context of "
                           f"{model.name} is {context}: shorten it or leave it out")
    return ids


def _seeded(sampling: Sampling, seeds: int) -> list[Sampling]:
    if seeds < 1 or (seeds > 1 and sampling.greedy):
        raise KolibriError(f"--seeds {seeds}: several seeds need sampling (--temperature > 0)")
    return [replace(sampling, seed=(sampling.seed + i) % 2**64) for i in range(seeds)]


@dataclass
class CheckResult:
    id: str | int
    identical: bool
    tokens: int  # golden output length
    index: int | None = None  # first divergent output index
    ours: int | None = None
    reference: int | None = None
    reference_margin: float | None = None  # top-2 logit margin of the reference there

    @property
    def explained(self) -> bool:
        """Identical, or diverged at a reference near-tie."""
        m = self.reference_margin
        return self.identical or (m is not None and m < NEAR_TIE)

    def to_dict(self) -> dict:
        return asdict(self) | {"explained": self.explained}


def check_replayable(goldens: list[Golden]) -> None:
    """Every golden can be generated again: greedy, or sampled with its seed."""
    for g in goldens:
        if g.unseeded:
            raise KolibriError(
                f"golden {g.id!r}{' (' + g.where + ')' if g.where else ''} was sampled without "
                "a recorded seed: no run can reproduce its tokens, so it cannot be checked (the "
                "probe still counts it, outside the spread over seeds)")


def check_one(model, golden: Golden) -> CheckResult:
    """Replay the golden with its own sampling parameters (greedy when it has none)."""
    ours = generate_plain(model, golden.prompt_ids, len(golden.output_ids),
                          sampling=golden.sampler).output_ids
    ref = golden.output_ids
    i = first_divergence(ours, ref)
    if i is None:
        return CheckResult(golden.id, True, len(ref))
    margins = golden.reference.get("top2_margins") or []
    at = lambda ids: ids[i] if i < len(ids) else None  # noqa: E731
    return CheckResult(golden.id, False, len(ref), i, at(ours), at(ref),
                       _margin(golden, at(margins) if isinstance(margins, list) else None))


def _margin(golden: Golden, value) -> float | None:
    """A reference margin as a number (the file's text, checked: a report formats it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        where = f"{golden.where}: " if golden.where else ""
        raise KolibriError(f"{where}reference.top2_margins of golden {golden.id!r} holds "
                           f"{shown(value)}; margins are finite numbers")
    return float(value)


def check_model_matches(model, goldens: list[Golden], allow_mismatch: bool) -> None:
    """The goldens were recorded from this model — the same weights, or where those are not known
    the same tokenizer, served model and fingerprint, each compared where both sides know it —
    and, when kolibri recorded them, on the numeric path kolibri runs the model on (a model
    opened without weights runs elsewhere: a server's numerics are its own), unless allowed
    otherwise; and every one fits it whatever: ids inside its vocabulary, prompt + output inside
    its context. The transformers float32 reference's chains are the reference of every numeric
    path (the fidelity law, docs/bench.md): they are checked on any."""
    runs_here = model.numerics is not None and model.weights is not None  # not a server's
    other = [g for g in goldens if runs_here and not is_reference(g)
             and g.reference.get("engine", "kolibri") in ENGINES
             and g.reference.get("dtype", "float32") != model.numerics]  # servers: their own
    if other and not allow_mismatch:
        dtype, engine = (other[0].reference.get(k, v) for k, v in (("dtype", "float32"),
                                                                    ("engine", "kolibri")))
        matches = f"--quantize {dtype} matches it; " if dtype in STORAGE else ""
        raise KolibriError(
            f"golden {other[0].id!r} was recorded by {engine} on the {dtype} numeric path, the "
            f"model runs {model.numerics} ({matches}pass --allow-model-mismatch to proceed "
            "anyway)")
    if not allow_mismatch and any(g.model_sha256 or g.identity for g in goldens):
        ours = model.identity  # a folder's weights are read for it: only when there is a match
        for g in goldens:
            if key := g.made_by.conflict(ours):
                raise KolibriError(_mismatch(g, key, getattr(g.made_by, key), model.name,
                                             getattr(ours, key)))
    for g in goldens:
        check_fits(model, g)


def is_reference(golden: Golden) -> bool:
    """A chain of the transformers float32 reference: what every numeric path is held to."""
    ref = golden.reference
    return ref.get("engine") == "transformers" and ref.get("dtype", "float32") == "float32"


def _mismatch(golden: Golden, key: str, theirs: str, name: str, ours: str) -> str:
    if key == "model_sha256":
        return (f"golden {shown(golden.id)} was recorded from model {shown(golden.model)} "
                f"(sha256 {shown(theirs[:12])}…), not {name} (sha256 {ours[:12]}…); pass "
                "--allow-model-mismatch to proceed anyway")
    label = {"tokenizer_sha256": "tokenizer sha256", "served_model": "served model",
             "fingerprint": "server fingerprint"}[key]
    short = (lambda v: v[:12] + "…") if key == "tokenizer_sha256" else (lambda v: v)
    return (f"golden {shown(golden.id)} was recorded with {label} {shown(short(theirs))}, not "
            f"{shown(short(ours))} ({name}); pass --allow-model-mismatch to proceed anyway")


def check_fits(model, golden: Golden) -> None:
    vocab, context = model.vocab_size, model.context
    where = f"{golden.where} (golden {shown(golden.id)})" if golden.where else \
        f"golden {shown(golden.id)}"
    for name in ("prompt_ids", "output_ids") if vocab is not None else ():
        ids = getattr(golden, name)
        bad = next((i for i, t in enumerate(ids) if t >= vocab), None)
        if bad is not None:
            raise KolibriError(f"{where}: {name}[{bad}] = {ids[bad]} is outside the vocabulary "
                               f"of {model.name} (0..{vocab - 1}); the golden was recorded with "
                               "another tokenizer")
    need = len(golden.prompt_ids) + len(golden.output_ids)
    if context is not None and need > context:
        raise KolibriError(f"{where}: prompt and output take {need} positions, more than the "
                           f"context of {model.name} ({context})")
