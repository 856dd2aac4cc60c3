"""Budgets: counted across every execution of a run (approval pauses and recoveries included)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    max_steps: int | None = 20
    """Model calls across all executions of the run."""
    max_tokens: int | None = None
    """Input plus output tokens across all executions."""
    timeout_ms: int | None = None
    """Wall time of one execution; every execution gets the full timeout again."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens", "timeout_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"Budget.{name} must be a positive int or None, not {value!r}")

    def steps_exhausted(self, model_calls: int) -> bool:
        return self.max_steps is not None and model_calls >= self.max_steps

    def tokens_exhausted(self, tokens: int) -> bool:
        return self.max_tokens is not None and tokens >= self.max_tokens

    def deadline(self, started_monotonic: float) -> float | None:
        return None if self.timeout_ms is None else started_monotonic + self.timeout_ms / 1000
