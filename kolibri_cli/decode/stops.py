"""When a generation stops: on an eos id, or once its text contains a stop string.

Checked after every token, in order, by both generators: a speculative pass that produces
several tokens at once is cut at the same token the plain generator stops on.
"""

from collections.abc import Sequence


class Stops:
    def __init__(self, eos_ids: Sequence[int], strings: Sequence[str], tokenizer):
        self.eos = set(eos_ids)
        self.strings = [s for s in strings if s]
        self.tokenizer = tokenizer
        self._checked = 0  # text length already searched for stop strings

    def reason(self, out: list[int]) -> str | None:
        """"eos" or "stop" if generation ends with the last token of `out`, else None."""
        if out[-1] in self.eos:
            return "eos"
        if not self.strings:
            return None
        text = self.tokenizer.decode(out)
        # a match must end in the new text; the margin covers replacement characters of an
        # incomplete UTF-8 sequence that the new token completed (the text then shrinks)
        tail = text[max(0, self._checked - max(map(len, self.strings)) - 8) :]
        self._checked = len(text)
        return "stop" if any(s in tail for s in self.strings) else None

    def text(self, out: list[int]) -> str:
        """The output's text, cut before the first stop string."""
        text = self.tokenizer.decode(out)
        cut = min((i for i in (text.find(s) for s in self.strings) if i >= 0), default=len(text))
        return text[:cut]
