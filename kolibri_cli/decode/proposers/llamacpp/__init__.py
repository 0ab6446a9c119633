"""llama.cpp's draftless n-gram speculative types (llama-server's `--spec-type ngram-*`):
`simple` (stateless), and the stateful `map-k`, `map-k4v`, `mod`, `cache` in `types`."""

from kolibri_cli.decode.proposers.llamacpp.simple import LlamaCppSimpleProposer
from kolibri_cli.decode.proposers.llamacpp.types import (
    LlamaCppCacheProposer,
    LlamaCppMapK4vProposer,
    LlamaCppMapKProposer,
    LlamaCppModProposer,
)

# Upstream defaults (common/common.h; ngram-cache's fixed 8 in common/speculative.cpp) as
# kolibri's (k, window): k = m, window max = n.
LLAMACPP_DEFAULTS = {
    "llamacpp-simple": (48, (12, 12)),
    "llamacpp-map-k": (48, (12, 12)),
    "llamacpp-map-k4v": (48, (12, 12)),
    "llamacpp-mod": (64, (24, 24)),
    "llamacpp-cache": (8, (1, 4)),
}

__all__ = ["LLAMACPP_DEFAULTS", "LlamaCppCacheProposer", "LlamaCppMapK4vProposer",
           "LlamaCppMapKProposer", "LlamaCppModProposer", "LlamaCppSimpleProposer"]
