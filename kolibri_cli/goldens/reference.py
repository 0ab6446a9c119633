"""The float32 reference engine: transformers + torch over the same HF-layout folder.

A manual decoding loop (transformers' `generate()` was seen to flip near-ties) that also records,
per step, the margin between the top-2 scores — what explains a divergence when one occurs.
Scores are the logits (greedy) or kolibri's perturbed scores (sampled: the same filters and
position-keyed noise over the reference's own float32 logits).
Needs the optional extra `kolibri-cli[reference]`; `kolibri generate` never imports this module.
"""

import warnings
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.decode.sampling import GREEDY, Sampling, openai_penalized, penalized, perturbed
from kolibri_cli.engine import blockfile
from kolibri_cli.errors import KolibriError


@dataclass
class ReferenceChain:
    output_ids: list[int]
    top2_margins: list[float]  # logit[top1] - logit[top2] at each step
    engine_version: str


def load(folder: Path):
    try:
        import torch
        import transformers
    except ImportError:
        raise KolibriError(
            "the transformers engine needs torch and transformers: "
            "pip install 'kolibri-cli[reference]'"
        ) from None
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    if (Path(folder) / blockfile.NAME).is_file():
        return _from_blocks(Path(folder), torch, transformers)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def _from_blocks(folder: Path, torch, transformers):
    """A cache model: its blocks decoded to float32 (the values gguf's dequantize gives, which
    transformers' own GGUF loader gives too), loaded into the architecture of config.json."""
    config = transformers.AutoConfig.from_pretrained(str(folder))
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = {k: torch.from_numpy(v) for k, v in blockfile.float_tensors(
        folder / blockfile.NAME).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise KolibriError(f"{folder}: weights do not fit {config.architectures}: missing "
                           f"{missing[:3]}, unexpected {unexpected[:3]}")
    if "lm_head.weight" in missing:
        model.tie_weights()
    return model.eval()


def greedy(model, prompt_ids: list[int], max_tokens: int,
           eos_ids: tuple[int, ...]) -> ReferenceChain:
    return generate(model, prompt_ids, max_tokens, eos_ids, GREEDY)


def generate(model, prompt_ids: list[int], max_tokens: int, eos_ids: tuple[int, ...],
             sampling: Sampling) -> ReferenceChain:
    import torch
    import transformers

    out, margins = [], []
    r = model(torch.tensor([prompt_ids]), use_cache=True)
    while True:
        row = r.logits[0, -1].float().numpy()  # [V]
        scores = torch.from_numpy(_scores(row, prompt_ids + out, sampling, len(prompt_ids)))
        top2 = torch.topk(scores, 2)
        tok = int(top2.indices[0])
        out.append(tok)
        margins.append(min(float(top2.values[0] - top2.values[1]), 1e9))  # one kept token: inf
        if tok in eos_ids or len(out) >= max_tokens:
            break
        r = model(torch.tensor([[tok]]), past_key_values=r.past_key_values, use_cache=True)
    version = f"transformers {transformers.__version__}, torch {torch.__version__}"
    return ReferenceChain(out, margins, version)


def _scores(row, before: list[int], sampling: Sampling, prompt_len: int):
    """[V] what the token is the argmax of (ties: torch.topk and numpy argmax both pick the
    first index for the top-1)."""
    import numpy as np

    if sampling.greedy:
        return openai_penalized(penalized(row, np.array(before), sampling.repetition_penalty),
                                np.array(before[prompt_len:]), sampling)
    return perturbed(row, len(before), np.array(before), sampling, prompt_len)


def logits(model, ids: list[int]):
    """[L, V] float32 numpy logits of one full forward (for conformance tests)."""
    import torch

    return model(torch.tensor([ids])).logits[0].float().numpy()
