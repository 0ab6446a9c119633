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


class TextDeltas:
    """The output's text as ids arrive, in pieces safe to show: an incomplete UTF-8 sequence and
    any tail that could begin a stop string are held back until the next ids (or `finish`), and
    nothing from a stop string on is ever given. The pieces join to `Stops.text`."""

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self.tokenizer, self.ids, self.given = tokenizer, [], 0
        self.stops = [s for s in stops if s]

    def add(self, new_ids: Sequence[int]) -> str:
        """The text the new ids make showable (often "", never a piece taken back later)."""
        self.ids += new_ids
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        return self._take(text[: len(text) - self._held(text)])

    def finish(self) -> str:
        """Whatever is left: the generation has ended."""
        return self._take(self._text())

    def _take(self, text: str) -> str:
        if len(text) <= self.given:
            return ""
        piece, self.given = text[self.given :], len(text)
        return piece

    def _text(self) -> str:
        text = self.tokenizer.decode(self.ids)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return text[: min(cuts)] if cuts else text

    def _held(self, text: str) -> int:
        """Length of the longest tail of `text` that begins some stop string."""
        return max((n for s in self.stops for n in range(1, len(s))
                    if text.endswith(s[:n])), default=0)
