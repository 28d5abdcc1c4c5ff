"""What one decode run measured, and the one way to add runs together.

`DecodeStats` is filled by the decode loop; the benchmark and the acceptance tables sum many
runs with `DecodeStats.merge` instead of keeping their own counters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def _add(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum of two count lists of possibly different lengths (runs with other k)."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0  # including the prefill
    rounds: int = 0  # draft + verify rounds after the prefill
    num_draft_tokens: int = 0  # most drafts per round (k)
    accept_hist: list[int] = field(default_factory=list)  # accept_hist[n]: rounds that accepted n drafts
    # per draft position i: rounds in which draft i was checked (all before it accepted and the
    # round drafted that far; near max_new_tokens rounds draft fewer), and in which it passed
    pos_checked: list[int] = field(default_factory=list)
    pos_passed: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    # The acceptance rule the run decoded under (`AcceptanceConfig.label`): "exact", or a relaxed
    # rule with its parameters, whose output is not the target's own; "mixed" for merged runs of several.
    acceptance: str = "exact"

    @classmethod
    def empty(cls, num_draft_tokens: int, acceptance: str = "exact") -> DecodeStats:
        """Counters sized for k drafts per round, so every position shows up even at zero."""
        k = num_draft_tokens
        return cls(num_draft_tokens=k, accept_hist=[0] * (k + 1), pos_checked=[0] * k, pos_passed=[0] * k,
                   acceptance=acceptance)

    @property
    def mean_accepted(self) -> float:
        """Tokens produced per verify forward, the target's own token included (1.0 = no gain)."""
        if not self.rounds:
            return 1.0
        return sum((n + 1) * c for n, c in enumerate(self.accept_hist)) / self.rounds

    @property
    def position_acceptance(self) -> list[float]:
        """Conditional acceptance rate of draft position i (0-based): passed / checked."""
        return [p / c if c else 0.0 for p, c in zip(self.pos_passed, self.pos_checked)]

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.draft_s + self.verify_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.total_s if self.total_s else None

    def record_round(self, checked: int, accepted: int) -> None:
        """Count one verify round that checked `checked` drafts and accepted the first `accepted`."""
        self.rounds += 1
        self.accept_hist = _add(self.accept_hist, [0] * accepted + [1])
        n = min(accepted + 1, checked)  # drafts actually compared: up to and including the first miss
        self.pos_checked = _add(self.pos_checked, [1] * n)
        self.pos_passed = _add(self.pos_passed, [1] * accepted)

    @classmethod
    def merge(cls, runs: Iterable[DecodeStats]) -> DecodeStats:
        """One DecodeStats over many runs: counts, histograms and times summed; the acceptance rule
        of the runs that decoded anything if they share one, else "mixed"."""
        out = cls()
        rules = set()
        for s in runs:
            if s.target_forwards:
                rules.add(s.acceptance)
            out.new_tokens += s.new_tokens
            out.target_forwards += s.target_forwards
            out.rounds += s.rounds
            out.num_draft_tokens = max(out.num_draft_tokens, s.num_draft_tokens)
            out.accept_hist = _add(out.accept_hist, s.accept_hist)
            out.pos_checked = _add(out.pos_checked, s.pos_checked)
            out.pos_passed = _add(out.pos_passed, s.pos_passed)
            out.prefill_s += s.prefill_s
            out.draft_s += s.draft_s
            out.verify_s += s.verify_s
        out.acceptance = rules.pop() if len(rules) == 1 else "mixed" if rules else "exact"
        return out

    def to_dict(self) -> dict[str, Any]:
        tps = self.tokens_per_s
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "rounds": self.rounds,
            "num_draft_tokens": self.num_draft_tokens,
            "mean_accepted": round(self.mean_accepted, 4),
            "accept_hist": self.accept_hist,
            "position_acceptance": [round(r, 4) for r in self.position_acceptance],
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "tokens_per_s": round(tps, 2) if tps else None,
            "acceptance": self.acceptance,
            "exact": self.acceptance == "exact",
        }
