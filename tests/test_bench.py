"""The bench chain's prompt: ordinary token ids only, for any tokenizer."""

from types import SimpleNamespace

from kolibri_cli.bench.chain import BENCH_PROMPT_TOKENS, bench_prompt
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.tokenizer import Tokenizer


def test_bench_prompt_draws_no_special_added_or_padding_ids(tiny_llama_folder):
    """The tiny tokenizer has 259 tokens, 3 of them special, and the embedding 1000 rows (like
    Llama 3 / Qwen2 checkpoints whose embedding is padded past the vocabulary)."""
    folder = tiny_llama_folder()
    tokenizer = Tokenizer(folder)
    config = ModelConfig.from_file(folder / "config.json")
    assert tokenizer.vocab_size == 259 and config.vocab_size == 1000
    ids = bench_prompt(SimpleNamespace(tokenizer=tokenizer, config=config))
    assert len(set(ids)) == BENCH_PROMPT_TOKENS
    assert all(3 <= i < 259 for i in ids)
