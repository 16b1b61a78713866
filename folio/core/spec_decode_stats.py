"""SpecDecodeStats: how many drafts were verified and how many of them the target accepted.

Counted by the scheduler at each verified step, as vLLM's spec_decode counters: one "draft"
per request-step that verified drafts, its draft tokens, the accepted ones, and the accepted
count at each draft position (position i counts the steps whose first i + 1 drafts were all
accepted), from which the acceptance rate per position and the mean accepted length follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafts_per_position: list[int] = field(default_factory=list)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One request-step that verified num_drafted drafts and accepted the first num_accepted."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafts")
        if num_drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        grow = num_drafted - len(self.drafts_per_position)
        if grow > 0:
            self.drafts_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for i in range(num_drafted):
            self.drafts_per_position[i] += 1
            self.accepted_per_position[i] += i < num_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify step: accepted drafts plus the target's own token."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def acceptance_rate_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafts_per_position)]

    def summary(self) -> str:
        rates = ", ".join(f"{r:.2f}" for r in self.acceptance_rate_per_position())
        return (
            f"drafts {self.num_drafts}, draft tokens {self.num_draft_tokens}, accepted "
            f"{self.num_accepted_tokens} ({self.acceptance_rate:.1%}), mean accepted length "
            f"{self.mean_accepted_length:.2f}, per position [{rates}]"
        )
