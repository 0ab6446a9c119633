"""The completion APIs kolibri speaks, behind one call: token ids in, token ids out.

- `llama.cpp` (llama-server): POST /completion with the prompt as ids, `return_tokens`, `n_probs`
  for top-2 margins; `timings` gives the decode time and the draft counters `draft_n` /
  `draft_n_accepted` of speculative decoding.
- `vllm`: POST /v1/completions with the prompt as ids and `return_token_ids` (vLLM >= 0.10.2);
  draft counters from the Prometheus `/metrics` deltas around the request.
- `kolibri`: `kolibri serve`, asked as vLLM is, every sampling field sent explicitly (it fills
  the ones left out from the model's generation_config.json); draft counters and decode time
  are the request's own, in the answer's `timings`.
- `openai`: any OpenAI-compatible /v1/completions that answers text only: the prompt is sent as
  text, the answer re-tokenized with the local tokenizer and marked `retokenized` (BPE can split
  the text differently from what the server generated).
Decode time is the server's own figure where it reports one (llama.cpp's `timings`, on its
/v1/completions too), else the wall time of the request minus that of a 1-token request for the
same prompt (prefill and HTTP cost the same in both).
"""

import math
import re
import time
from dataclasses import dataclass, field

from kolibri_cli.decode.sampling import GREEDY, Sampling
from kolibri_cli.engines.answers import Answer, answer, completion_bytes
from kolibri_cli.engines.transport import Http
from kolibri_cli.errors import KolibriError

APIS = ("llama.cpp", "vllm", "kolibri", "openai")


def llamacpp_sampling(s: Sampling) -> dict:
    """llama.cpp's request fields for `s`: each filter set explicitly (its own defaults, top_k 40,
    top_p 0.95, min_p 0.05, would otherwise apply), the seed only when sampling."""
    if s.greedy:
        return {"temperature": 0.0, "repeat_penalty": s.repetition_penalty}
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
            "repeat_penalty": s.repetition_penalty, "seed": s.seed}


def openai_sampling(s: Sampling) -> dict:
    """OpenAI's fields (temperature, top_p, seed) plus vLLM's and SGLang's extensions (top_k,
    min_p, repetition_penalty), each only when it is on."""
    if s.greedy:
        body = {"temperature": 0.0}
    else:
        body = {"temperature": s.temperature, "seed": s.seed}
        body |= {} if s.top_p == 1 else {"top_p": s.top_p}
        body |= {} if s.top_k == 0 else {"top_k": s.top_k}
        body |= {} if s.min_p == 0 else {"min_p": s.min_p}
    return body | ({} if s.repetition_penalty == 1 else
                   {"repetition_penalty": s.repetition_penalty})


@dataclass
class Completion:
    """One request's answer."""

    output_ids: list[int]  # generated ids, including the eos id when generation stopped on it
    decode_s: float | None  # generation time after the first token (None: not measured)
    drafted: int | None = None  # the server's draft tokens for this request (None: not reported)
    accepted: int | None = None  # of them, accepted
    retokenized: bool = False  # ids re-derived from text with the local tokenizer
    top2_margins: list[float] = field(default_factory=list)  # logit margin of the top 2 per token
    finish_reason: str | None = None


class ServerApi:
    """Common to every API: the base URL, the model it serves, how to describe it."""

    api: str = ""

    def __init__(self, http: Http, tokenizer=None, eos_ids: tuple[int, ...] = (),
                 vocab: int | None = None):
        self.http = http
        self.tokenizer = tokenizer  # the local tokenizer: text APIs need it
        self.eos_ids = tuple(eos_ids)
        self.vocab = vocab  # the model's vocabulary size: returned ids must be below it
        self.local_version: str | None = None  # set when kolibri started the server itself

    @property
    def url(self) -> str:
        return self.http.where("")

    def describe(self) -> dict:
        """engine, version, served model; the URL unless kolibri started the server."""
        return {"engine": self.api} | ({} if self.local_version else {"url": self.url})

    def complete(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling = GREEDY,
                 margins: bool = False) -> Completion:
        raise NotImplementedError


class LlamaCppApi(ServerApi):
    """llama.cpp's own /completion: ids in and out, timings and draft counters per request."""

    api = "llama.cpp"

    def props(self) -> Answer:
        return answer(self.http.get("/props"), self.http.where("/props"))

    def describe(self) -> dict:
        props = self.props()
        build = props.text("build_info") or ""
        model = props.text("model_alias") or props.text("model_path") or ""
        return super().describe() | {"engine": "llama-server",
                                     "engine_version": self.local_version
                                     or f"llama.cpp {build}".strip(),
                                     "dtype": props.text("model_ftype") or "",
                                     "served_model": model}

    def evaluate(self, prompt_ids) -> tuple[int, float]:
        """(tokens the server evaluated, ms it took) for `prompt_ids` after whatever prefix of
        them it holds in its prompt cache, up to and including the first token's sampling."""
        body = {"prompt": list(prompt_ids), "n_predict": 1, "cache_prompt": True,
                "temperature": 0.0}
        where = self.http.where("/completion")
        timings = answer(self.http.post("/completion", body,
                                        max_bytes=completion_bytes(len(body["prompt"]), 1)),
                         where).object("timings")
        if timings is None or not (timings.has("prompt_n") and timings.has("prompt_ms")):
            raise KolibriError(f"{where}: no prompt timings")
        return timings.count("prompt_n"), timings.ms("prompt_ms")

    def complete(self, prompt_ids, max_tokens, sampling=GREEDY, margins=False,
                 ignore_eos: bool = False) -> Completion:
        """`ignore_eos`: decode all `max_tokens` (timing requests; the ids are then not a chain
        the model would stop)."""
        body = {"prompt": list(prompt_ids), "n_predict": max_tokens, "return_tokens": True,
                "cache_prompt": False, **llamacpp_sampling(sampling)}
        if ignore_eos:
            body["ignore_eos"] = True
        if margins:
            body["n_probs"] = 2
        got = answer(self.http.post("/completion", body, max_bytes=completion_bytes(
            len(body["prompt"]), max_tokens)), self.http.where("/completion"))
        ids = got.ids("tokens", self.vocab, max_tokens)
        decode_s, drafted, accepted = _timings(got, len(ids))
        return Completion(
            output_ids=ids,
            decode_s=decode_s,
            drafted=drafted,
            accepted=accepted,
            top2_margins=_llamacpp_margins(got, len(ids)) if margins else [],
            finish_reason=got.text("stop_type"),
        )


class OpenAiApi(ServerApi):
    """/v1/completions; the model id is the server's first (or the one given)."""

    api = "openai"

    def __init__(self, http: Http, tokenizer=None, eos_ids=(), served_model: str | None = None,
                 vocab: int | None = None):
        super().__init__(http, tokenizer, eos_ids, vocab)
        self._served_model = served_model

    @property
    def served_model(self) -> str:
        if self._served_model is None:
            where = self.http.where("/v1/models")
            models = answer(self.http.get("/v1/models"), where).objects("data")
            if not models or not models[0].has("id"):
                raise KolibriError(f"{where}: no model listed; pass --served-model")
            self._served_model = models[0].text("id")
        return self._served_model

    def describe(self) -> dict:
        return super().describe() | {"served_model": self.served_model}

    def complete(self, prompt_ids, max_tokens, sampling=GREEDY, margins=False) -> Completion:
        if self.tokenizer is None:
            raise KolibriError("a text-only server needs the model's tokenizer (--model)")
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        elapsed, got = self._post(prompt, max_tokens, sampling, tokens=len(prompt_ids))
        choice = self._choice(got)
        if not isinstance(choice.get("text"), str):
            raise KolibriError(f"{self.http.where('/v1/completions')}: the answer has no text")
        ids = self.tokenizer.encode(choice.text("text", limit=None), add_special_tokens=False)
        finish = choice.text("finish_reason")
        if finish == "stop" and self.eos_ids:  # stopped on eos: the text does not show it
            ids.append(self.eos_ids[0])
        if not ids:
            raise KolibriError(f"{self.http.where('/v1/completions')}: the answer is empty (no "
                               f"text, finish_reason {finish!r}): no tokens to use")
        decode_s, drafted, accepted = self._decode_time(got, elapsed, prompt, sampling, len(ids))
        return Completion(ids, decode_s, drafted, accepted, retokenized=True,
                          finish_reason=finish)

    def _decode_time(self, got: Answer, elapsed: float, prompt, sampling: Sampling, n: int):
        """(decode seconds, drafted, accepted): llama.cpp's `timings` when the answer has them,
        else the wall time minus that of a 1-token request for the same prompt."""
        timings = got.object("timings")
        if timings is not None and timings.has("predicted_ms"):
            decode_s, drafted, accepted = _timings(got, n)
            return decode_s, drafted or 0, accepted or 0
        first, _ = self._post(prompt, 1, sampling)
        return max(elapsed - first, 0.0), None, None

    def _post(self, prompt, max_tokens: int, sampling: Sampling, extra: dict | None = None,
              tokens: int = 0) -> tuple[float, Answer]:
        body = {"model": self.served_model, "prompt": prompt, "max_tokens": max_tokens,
                **self.sampling_fields(sampling), **(extra or {})}
        t0 = time.perf_counter()
        got = self.http.post("/v1/completions", body,
                             max_bytes=completion_bytes(tokens or len(prompt), max_tokens))
        return time.perf_counter() - t0, answer(got, self.http.where("/v1/completions"))

    def sampling_fields(self, sampling: Sampling) -> dict:
        return openai_sampling(sampling)

    def _choice(self, got: Answer) -> Answer:
        choices = got.objects("choices")
        if not choices:
            raise KolibriError(f"{self.http.where('/v1/completions')}: the answer has no choices")
        return choices[0]


VLLM_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


class VllmApi(OpenAiApi):
    """vLLM's /v1/completions with token ids; draft counters from /metrics."""

    api = "vllm"

    def describe(self) -> dict:
        version = answer(self.http.get("/version"), self.http.where("/version")).text(
            "version") or ""
        return super().describe() | {"engine": "vllm", "engine_version": f"vLLM {version}"}

    def complete(self, prompt_ids, max_tokens, sampling=GREEDY, margins=False) -> Completion:
        before = self._counters()
        elapsed, got = self._post(list(prompt_ids), max_tokens, sampling,
                                  {"return_token_ids": True})
        after = self._counters()
        choice = self._choice(got)
        if "token_ids" not in choice.value:
            raise KolibriError(f"{self.http.where('/v1/completions')}: no token_ids in the answer "
                               "(vLLM >= 0.10.2 returns them); --engine-api openai re-tokenizes "
                               "the text instead")
        ids = choice.ids("token_ids", self.vocab, max_tokens)
        decode_s, drafted, accepted = self._decode_time(got, elapsed, list(prompt_ids),
                                                        sampling, len(ids))
        if before is not None and after is not None:
            drafted, accepted = after[0] - before[0], after[1] - before[1]
            if not 0 <= accepted <= drafted:
                raise KolibriError(f"{self.http.where('/metrics')}: the draft counters moved by "
                                   f"{drafted} drafted, {accepted} accepted during one request; "
                                   "expected 0 <= accepted <= drafted")
        return Completion(ids, decode_s, drafted, accepted,
                          finish_reason=choice.text("finish_reason"))

    def _counters(self) -> tuple[int, int] | None:
        """(draft tokens, accepted tokens) so far, or None when the server exports neither."""
        try:
            text = self.http.get_text("/metrics", timeout=10)
        except KolibriError:
            return None
        values = [_metric_sum(text, name) for name in (VLLM_DRAFTED, VLLM_ACCEPTED)]
        if None in values:
            return None
        bad = next((v for v in values if not (math.isfinite(v) and 0 <= v < 2**63)), None)
        if bad is not None:
            raise KolibriError(f"{self.http.where('/metrics')}: a draft counter is {bad!r}; "
                               "expected a finite count >= 0")
        return int(values[0]), int(values[1])


class KolibriApi(VllmApi):
    """`kolibri serve`: vLLM's fields; the request's own counters and decode time (`timings`)."""

    api = "kolibri"

    def describe(self) -> dict:
        version = answer(self.http.get("/version"), self.http.where("/version")).text(
            "version") or ""
        return OpenAiApi.describe(self) | {"engine": "kolibri serve",
                                           "engine_version": f"kolibri {version}"}

    def sampling_fields(self, sampling: Sampling) -> dict:
        return {"temperature": 0.0} if sampling.greedy else {
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "seed": sampling.seed} | {
            "repetition_penalty": sampling.repetition_penalty}

    def _counters(self) -> None:
        return None  # each answer carries its own: no /metrics deltas (other traffic in them)


def _metric_sum(text: str, name: str) -> float | None:
    """Sum of a Prometheus counter over its label sets, or None if absent."""
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})?\s+([0-9.eE+-]+)$", text, re.M)
    try:
        return sum(float(v) for v in values) if values else None
    except ValueError:  # "1-2", "e": a number only in the pattern's eyes
        return float("nan")


def _timings(got: Answer, n: int) -> tuple[float | None, int | None, int | None]:
    """(decode seconds, drafted, accepted) from llama.cpp's `timings` (None: not reported). A
    decode of n > 1 tokens takes time; one token (from prefill) may report 0 ms."""
    timings = got.object("timings")
    if timings is None or not timings.value:
        return None, None, None
    decode_ms = timings.ms("predicted_ms", positive=n > 1)
    drafted, accepted = timings.count("draft_n") or 0, timings.count("draft_n_accepted") or 0
    if accepted > drafted:
        raise KolibriError(f"{got.where}: timings.draft_n_accepted ({accepted}) is more than "
                           f"timings.draft_n ({drafted})")
    return None if decode_ms is None else decode_ms / 1000.0, drafted, accepted


def _llamacpp_margins(got: Answer, n: int) -> list[float]:
    """log p1 - log p2 per generated token (= the top-2 logit margin); [] if not reported for
    every token (llama-server leaves them out for tokens accepted from a draft)."""
    margins = []
    for entry in got.objects("completion_probabilities"):
        top = entry.objects("top_logprobs")
        if len(top) < 2:
            return []
        margins.append(round(top[0].number("logprob") - top[1].number("logprob"), 6)
                       if top[0].has("logprob") and top[1].has("logprob") else math.nan)
    return margins if len(margins) == n and all(map(math.isfinite, margins)) else []


def detect_api(http: Http) -> str:
    """llama.cpp answers /props, vLLM /version (and `kolibri serve`, naming itself there);
    anything else is treated as text-only."""
    for path, api, key in (("/props", "llama.cpp", "default_generation_settings"),
                           ("/version", "vllm", "version")):
        try:
            got = http.get(path, timeout=10)
        except KolibriError as e:
            if "HTTP 404" in str(e) or "not JSON" in str(e):
                continue
            raise
        if isinstance(got, dict) and key in got:
            return "kolibri" if got.get("engine") == "kolibri" else api
    return "openai"


def connect(url: str, api: str | None = None, tokenizer=None, eos_ids=(), timeout: float = 600.0,
            served_model: str | None = None, vocab: int | None = None) -> ServerApi:
    """A client for the server at `url`; `api` (llama.cpp, vllm, openai) skips detection;
    `vocab`: the model's vocabulary size (ids the server returns must be below it)."""
    if not re.match(r"^https?://", url):
        raise KolibriError(f"engine URL {url!r} must start with http:// or https://")
    http = Http(url.rstrip("/"), timeout=timeout)
    api = api or detect_api(http)
    if api == "llama.cpp":
        return LlamaCppApi(http, tokenizer, eos_ids, vocab)
    if api == "vllm":
        return VllmApi(http, tokenizer, eos_ids, served_model, vocab)
    if api == "kolibri":
        return KolibriApi(http, tokenizer, eos_ids, served_model, vocab)
    if api == "openai":
        return OpenAiApi(http, tokenizer, eos_ids, served_model, vocab)
    raise KolibriError(f"unknown --engine-api {api!r}: use one of {', '.join(APIS)}")
