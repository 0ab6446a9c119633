"""Golden chains (JSONL, one recorded generation a line, greedy or sampled) and the prompt files
they come from.

Scope: the file formats, their validation (errors name the file and line), atomic saving.
Non-goals: recording or checking goldens with a model (the goldens command does that).
Format: docs/goldens.md.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kolibri_cli.decode.sampling import Sampling
from kolibri_cli.engine.model import Identity
from kolibri_cli.errors import KolibriError
from kolibri_cli.store.atomic import write_text_atomic
from kolibri_cli.text import read_text_file, shown


def _shipped_root() -> Path:
    """The goldens shipped with kolibri: a wheel carries the repository's goldens/ inside the
    package (pyproject's package-dir); a checkout (an editable install) reads them in place."""
    in_wheel = Path(__file__).parent / "shipped"
    return in_wheel if in_wheel.is_dir() else Path(__file__).parents[2] / "goldens"


SHIPPED = _shipped_root()  # <model>/, prompts/, <engine>/<model>/: each holding <set>.jsonl
SHIPPED_GOLDENS = SHIPPED / "smollm2-135m-instruct"  # the default of `kolibri probe`
DEFAULT_CHAT = SHIPPED_GOLDENS / "chat.jsonl"
CHAT_PROMPTS = SHIPPED / "prompts" / "chat.jsonl"  # what DEFAULT_CHAT was recorded from

MAX_TOKEN_ID = 2**31 - 1  # ids are int32 in every tokenizer and kernel; vocabularies are far below

GOLDEN_FIELDS = (
    "id", "category", "prompt", "chat", "prompt_ids", "output_ids", "model", "model_sha256",
    "reference",
)  # fmt: skip


@dataclass
class Golden:
    """One recorded chain: the prompt's ids P and the output ids G (g1 from prefill), chosen
    greedily or sampled with the recorded parameters."""

    id: str | int  # unique within its file
    category: str  # e.g. "code", "summarization": the probe reports per category
    prompt: str  # the user text, before any chat template
    chat: bool  # True when the chat template was applied to get prompt_ids
    prompt_ids: list[int]  # P, exactly what the model saw
    output_ids: list[int]  # G, including eos when generation stopped on it
    model: str  # model name, e.g. "smollm2-135m-instruct"
    model_sha256: str  # checksum of the model file the chain was recorded from
    reference: dict = field(default_factory=dict)  # {"engine", "engine_version", "dtype", ...}
    eos_ids: list[int] = field(default_factory=list)  # the model's eos ids (optional in files)
    sampling: dict = field(default_factory=dict)  # Sampling.to_dict(); {} (or absent) = greedy
    identity: dict = field(default_factory=dict)  # Identity.to_dict(): a tokenizer's sha256, a
    # server's model name and fingerprint; {} (or absent) = only model_sha256 identifies it
    where: str = field(default="", compare=False, repr=False)  # "file:line" it was read from

    @property
    def sampler(self) -> Sampling:
        return Sampling.from_dict(self.sampling)

    @property
    def made_by(self) -> Identity:
        """What identifies the model that made the chain (engine.model.Identity)."""
        return Identity(model_sha256=self.model_sha256, **self.identity)

    @property
    def seed(self) -> int | None:
        """The sampling seed; None for a greedy or an unseeded chain."""
        return None if self.sampler.greedy or self.unseeded else self.sampler.seed

    @property
    def unseeded(self) -> bool:
        """Sampled with a seed nobody recorded (imported traffic whose request named none): a
        chain to count, not one any run can reproduce."""
        return "seed" not in self.sampling and not self.sampler.greedy


@dataclass(frozen=True)
class PromptSpec:
    """A prompt to record a golden from."""

    id: str | int
    category: str
    prompt: str


def load_goldens(path: str | Path) -> list[Golden]:
    """Every golden in the JSONL file `path`; a KolibriError naming file and line if any is bad."""
    path = Path(path)
    goldens, seen = [], {}
    for lineno, obj in _jsonl_objects(path):
        golden = golden_from(obj, f"{path}:{lineno}")
        key = str(golden.id)  # 1 and "1": one row name in a report
        if key in seen:
            raise KolibriError(
                f"{path}:{lineno}: duplicate golden id {shown(golden.id)} "
                f"(first on line {seen[key]})"
            )
        seen[key] = lineno
        goldens.append(golden)
    if not goldens:
        raise KolibriError(f"{path}: no goldens in the file (it is empty)")
    return goldens


def save_goldens(path: str | Path, goldens: list[Golden]) -> None:
    """Write `goldens` as JSONL, atomically (readers see the old file or the whole new one).
    Greedy chains carry no "sampling" key, as before sampling existed. Each line must pass the
    reader's own checks first (golden_from): nothing is written that kolibri would refuse."""
    write_text_atomic(path, "".join(_checked_line(g) for g in goldens))


def golden_line(golden: Golden) -> str:
    """One golden as its line of a golden file (newline included)."""
    return json.dumps(_golden_dict(golden), ensure_ascii=False, allow_nan=False) + "\n"


def _checked_line(golden: Golden) -> str:
    """golden_line, or a KolibriError naming the golden unless the reader would take it back."""
    where = f"golden {shown(golden.id)} (not written)"
    try:
        line = golden_line(golden)
        line.encode("utf-8")
    except UnicodeEncodeError:
        raise KolibriError(f"{where}: a text holds a lone surrogate (not valid Unicode)") from None
    except (ValueError, TypeError) as e:  # NaN or infinity; a value JSON has no form for
        raise KolibriError(f"{where}: {e}") from None
    golden_from(json.loads(line), where)
    return line


def _golden_dict(golden: Golden) -> dict:
    d = asdict(golden)
    del d["where"]
    for optional in ("sampling", "identity"):
        if not d[optional]:
            del d[optional]
    return d


def first_divergence(ours: list[int], golden: list[int]) -> int | None:
    """The first index where two chains differ (a shorter chain differs where it ends)."""
    for i, (a, b) in enumerate(zip(ours, golden, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(golden) else min(len(ours), len(golden))


def read_prompts(
    path: str | Path,
    category: str | None = None,
    limit: int | None = None,
    per_category: int | None = None,
) -> list[PromptSpec]:
    """Prompts from JSONL ({"id","category","prompt"} or Spec-Bench's {"question_id","category",
    "turns"}, first turn) or plain text (one prompt a line, id = line number, category "text").

    `category`: keep only these (comma-separated); `per_category`: at most N of each category;
    `limit`: at most N in all. File order is kept.
    """
    path = Path(path)
    prompts = _read_jsonl_prompts(path) if _looks_like_jsonl(path) else _read_text_prompts(path)
    if not prompts:
        raise KolibriError(f"{path}: no prompts in the file (it is empty)")
    return _select_prompts(prompts, category, limit, per_category, path)


def _select_prompts(prompts, category, limit, per_category, path) -> list[PromptSpec]:
    if category is not None:
        wanted = {c.strip() for c in category.split(",")} - {""}
        known = sorted({p.category for p in prompts})
        if not wanted:  # '' chose everything: a filter that names nothing is a mistake
            raise KolibriError(f"category {shown(category)} names no category; {path} has "
                               f"{shown(known, 200)}")
        prompts = [p for p in prompts if p.category in wanted]
        if not prompts:
            raise KolibriError(f"{path}: no prompts of category {shown(category)}; it has "
                               f"{shown(known, 200)}")
    if per_category is not None:
        counts: dict[str, int] = {}
        kept = []
        for p in prompts:
            counts[p.category] = counts.get(p.category, 0) + 1
            if counts[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    return prompts[:limit] if limit is not None else prompts


def _looks_like_jsonl(path: Path) -> bool:
    if path.suffix in (".jsonl", ".json"):
        return True
    first = next((line for line in _read_lines(path) if line.strip()), "")
    return first.lstrip().startswith("{")


def _read_text_prompts(path: Path) -> list[PromptSpec]:
    return [
        PromptSpec(id=lineno, category="text", prompt=line.rstrip("\r"))
        for lineno, line in enumerate(_read_lines(path), start=1)
        if line.strip()
    ]


def _read_jsonl_prompts(path: Path) -> list[PromptSpec]:
    prompts, seen = [], set()
    for lineno, obj in _jsonl_objects(path):
        prompt = _prompt_from(obj, f"{path}:{lineno}")
        if prompt.id in seen:  # a golden is named by its prompt's id: the probe refuses twins
            raise KolibriError(f"{path}:{lineno}: duplicate prompt id {shown(prompt.id)}; make "
                               "the ids unique")
        seen.add(prompt.id)
        prompts.append(prompt)
    return prompts


def _prompt_from(obj: dict, where: str) -> PromptSpec:
    if "turns" in obj:  # Spec-Bench question.jsonl: first turn only
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise KolibriError(f"{where}: 'turns' must be a non-empty list of strings")
        obj = {"id": obj.get("question_id"), "category": obj.get("category"), "prompt": turns[0]}
    _require(obj, ("id", "category", "prompt"), where)
    _check_id(obj["id"], where)
    _check_type(obj, "category", str, where)
    _check_type(obj, "prompt", str, where)
    _check_unicode(obj, ("id", "category", "prompt"), where)
    if not obj["prompt"].strip():
        raise KolibriError(f"{where}: 'prompt' is empty")
    return PromptSpec(id=obj["id"], category=obj["category"], prompt=obj["prompt"])


def kept_sampling(given: dict) -> dict:
    """Sampling parameters as a golden keeps them (Sampling.to_dict), checked; a sampled chain
    given no seed keeps none (unseeded), rather than seed 0, which no run used."""
    kept = Sampling.from_dict(given).to_dict()
    if "seed" not in given:
        kept.pop("seed", None)
    return kept


def golden_from(obj: dict, where: str) -> Golden:
    """The golden in a parsed JSON object; a KolibriError starting with `where` if it is bad."""
    _require(obj, GOLDEN_FIELDS, where)
    _check_id(obj["id"], where)
    for name in ("category", "prompt", "model", "model_sha256"):
        _check_type(obj, name, str, where)
    _check_unicode(obj, ("id", "category", "prompt", "model", "model_sha256"), where)
    _check_type(obj, "chat", bool, where)
    _check_type(obj, "reference", dict, where)
    for name in ("prompt_ids", "output_ids"):
        _check_token_ids(obj[name], name, where)
    eos_ids = obj.get("eos_ids", [])
    if eos_ids:
        _check_token_ids(eos_ids, "eos_ids", where)
    sampling = obj.get("sampling", {})
    if not isinstance(sampling, dict):
        raise KolibriError(f"{where}: 'sampling' must be an object, got {shown(sampling)}")
    try:
        sampling = kept_sampling(sampling)
    except KolibriError as e:
        raise KolibriError(f"{where}: {e}") from None
    return Golden(**{name: obj[name] for name in GOLDEN_FIELDS}, eos_ids=eos_ids,
                  sampling=sampling, identity=_identity(obj.get("identity", {}), where),
                  where=where)


def _identity(value, where: str) -> dict:
    """A golden's "identity": an object of strings; keys other than Identity's are ignored."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise KolibriError(f"{where}: 'identity' must be an object of strings, got "
                           f"{shown(value)}")
    return {key: value[key] for key in Identity.GOLDEN_KEYS if value.get(key)}


def _jsonl_objects(path: Path):
    """(line number, dict) for every non-blank line; KolibriError on anything that is not."""
    lines = _read_lines(path)
    if not any(line.strip() for line in lines):
        raise KolibriError(f"{path}: the file is empty")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise KolibriError(
                f"{path}:{lineno}: not JSONL (one JSON object a line): {e.msg}"
            ) from None
        except (ValueError, RecursionError):  # an integer of 4300+ digits; nesting too deep
            raise KolibriError(f"{path}:{lineno}: not JSONL (a number too long or nesting too "
                               "deep)") from None
        if not isinstance(obj, dict):
            raise KolibriError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def _read_lines(path: Path) -> list[str]:
    return read_text_file(path).split("\n")


def _require(obj: dict, names, where: str) -> None:
    missing = [name for name in names if name not in obj]
    if missing and ("messages" in obj or "request" in obj):  # a line of logged traffic
        raise KolibriError(f"{where}: logged chat traffic, not a golden chain: `kolibri goldens "
                           "import FILE -o goldens.jsonl` makes goldens of it (docs/goldens.md)")
    if missing:
        raise KolibriError(f"{where}: missing field(s) {', '.join(missing)}")


def _check_type(obj: dict, name: str, kind: type, where: str) -> None:
    if not isinstance(obj[name], kind):
        raise KolibriError(
            f"{where}: '{name}' must be a {kind.__name__}, got {type(obj[name]).__name__}"
        )


def _check_id(value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise KolibriError(f"{where}: 'id' must be a string or an integer, got {shown(value)}")


def _check_unicode(obj: dict, names, where: str) -> None:
    """JSON can spell a lone surrogate (\\ud800), which no UTF-8 file, terminal or tokenizer
    takes: refuse it here, naming the field."""
    for name in names:
        value = obj[name]
        if isinstance(value, str) and any("\ud800" <= ch <= "\udfff" for ch in value):
            raise KolibriError(f"{where}: '{name}' is not valid Unicode (a lone surrogate)")


def _check_token_ids(ids, name: str, where: str) -> None:
    if not isinstance(ids, list) or not ids:
        raise KolibriError(f"{where}: '{name}' must be a non-empty list of token ids")
    if set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) <= MAX_TOKEN_ID:
        return  # the common case, checked in C (a probe reads millions of chains)
    for i, tok in enumerate(ids):
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= MAX_TOKEN_ID:
            raise KolibriError(f"{where}: '{name}'[{i}] is {shown(tok)}; token ids must be "
                               f"integers in 0..{MAX_TOKEN_ID}")
