"""Token ids in, text out, for a stream: incremental detokenization and stop strings. The one
detokenizer of `mtpspec generate` (printing) and `mtpspec serve` (streamed replies).

Each push decodes the whole output so far (tokens that only form a character together come
out right), and releases only text that cannot change any more: a trailing U+FFFD may be half
a character, and the last len(longest stop) - 1 characters may be the start of a stop string.
Released text is split back into per-token pieces, so a client can show which tokens were
accepted drafts and which the target's own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

REPLACEMENT = "\ufffd"  # what decode() shows for an incomplete UTF-8 sequence


@dataclass(frozen=True)
class Piece:
    text: str
    drafted: bool  # an accepted draft (True) or the target's own token (False)


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self._decode = decode  # token ids -> text, special tokens skipped
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._ends: list[int] = []  # _ends[i]: end of token i's text in _text (its start is _ends[i - 1])
        self._drafted: list[bool] = []
        self._text = ""
        self.released = 0  # characters of _text handed out so far
        self.stopped = False  # a stop string was found: the text ends before it

    @property
    def text(self) -> str:
        """All text released so far."""
        return self._text[: self.released]

    def push(self, ids: Sequence[int], drafted: Sequence[bool] | None = None, final: bool = False) -> list[Piece]:
        """Add one round's tokens (`drafted`: which were accepted drafts; None = none); return the
        newly released text as pieces. `final`: no more tokens will come, so release everything
        (up to a stop string)."""
        if self.stopped:
            return []
        for tok, d in zip(ids, drafted if drafted is not None else [False] * len(ids)):
            self._ids.append(int(tok))
            self._text = self._decode(self._ids)
            stable = len(self._text.rstrip(REPLACEMENT))
            self._ends.append(max(stable, self._ends[-1] if self._ends else 0))
            self._drafted.append(bool(d))
        if final and self._ends:
            self._ends[-1] = max(self._ends[-1], len(self._text))
        end = self._ends[-1] if self._ends else 0
        # Released text never holds a whole stop string (hold-back), so one starts at or after `released`.
        cuts = [i for i in (self._text.find(s, self.released, end) for s in self._stop) if i >= 0]
        if cuts:
            end, self.stopped = min(cuts), True
        elif not final:
            end = max(self.released, end - self._hold)
        pieces = self._pieces(self.released, end)
        self.released = end
        return pieces

    def _pieces(self, a: int, b: int) -> list[Piece]:
        """The text in [a, b), split at token boundaries."""
        out, start = [], 0
        for end, d in zip(self._ends, self._drafted):
            lo, hi = max(start, a), min(end, b)
            if lo < hi:
                out.append(Piece(self._text[lo:hi], d))
            start = end
        return out
