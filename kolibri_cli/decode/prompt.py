"""A prompt's ids for one generation: through the model's chat template (unless raw) or as the
bare text, and the new tokens that still fit the context.
Non-goals: multi-turn prompts (decode/chat.py), reading the prompt (cli/).
"""

from collections.abc import Callable

from kolibri_cli.errors import KolibriError


def prompt_ids(model, text: str, raw: bool, max_tokens: int, system: str | None = None,
               note: Callable[[str], None] = lambda line: None) -> tuple[list[int], int]:
    """(ids, max_tokens): a prompt that fills the context is refused; max_tokens is capped to
    what is left (said through `note`)."""
    chat = not raw and model.tokenizer.chat_template is not None
    if system is not None and not chat:
        raise KolibriError("--system needs the model's chat template (drop --raw)")
    ids = model.tokenizer.encode_prompt(text, chat=chat, system=system)
    context = model.config.max_position_embeddings
    if len(ids) >= context:
        raise KolibriError(f"the prompt is {len(ids)} tokens; the model's context is {context}")
    if len(ids) + max_tokens > context:
        max_tokens = context - len(ids)
        note(f"note: --max-tokens capped to {max_tokens} by the context ({context})")
    return ids, max_tokens
