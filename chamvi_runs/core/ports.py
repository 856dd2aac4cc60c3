"""What the runtime needs from the world, as protocols: the store it writes and reads run state
through, the model it streams, and the broadcaster its events go out by. The Django store
(``chamvi_runs.store``, a module) satisfies ``Store``; mypy checks it (``runtime.engine``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from .branches import Node
from .records import Claim, Decided, StepRecord, Stored, WaitRequest
from .states import Status
from .types import AbortSignal, Message, ModelRequest, ModelTurn, OnDelta, Usage


class Model(Protocol):
    """A streaming Chat Completions model."""

    def stream(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        """Stream one completion. Errors are returned in ``ModelTurn.error``; an abort raises ``Aborted``."""
        ...


class Broadcaster(Protocol):
    """Best-effort delivery of a run's events to whoever watches it."""

    def publish(self, run_id: str, event: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...


class Store(Protocol):
    """Every write is fenced on the claim and says whether it applied (False / None: the claim is
    lost, or, for writes that keep a run going, a cancel was requested)."""

    # --- writes of an execution ---
    def claim(
        self, run_id: str, owner: str, lease_seconds: float, versions: Mapping[str, str] | None = ...
    ) -> Claim | None: ...

    def renew(self, claim: Claim, lease_seconds: float, *, usage: Usage = ...) -> bool: ...

    def renew_many(self, claims: Sequence[Claim], lease_seconds: float) -> set[str]: ...

    def start_model_call(self, claim: Claim) -> list[Any] | None: ...

    def record_listings(
        self, claim: Claim, listed: dict[str, Any], recorded: dict[str, Any] | None
    ) -> bool: ...

    def save_step(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        finish_reason: str = ...,
        usage: Usage = ...,
        consumed_inputs: Iterable[str] = ...,
        stored: Stored | None = ...,
    ) -> bool: ...

    def save_step_and_count(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        finish_reason: str = ...,
        usage: Usage = ...,
        consumed_inputs: Iterable[str] = ...,
        stored: Stored | None = ...,
    ) -> list[Any] | None: ...

    def save_and_settle(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        finish_reason: str,
        usage: Usage,
        consumed_inputs: Iterable[str],
        status: Status,
        output: Any = ...,
        error_code: str = ...,
        error_message: str = ...,
        unless_input: bool = ...,
        stored: Stored | None = ...,
    ) -> Any: ...

    def open_wait(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        waits: list[WaitRequest],
        usage: Usage = ...,
        consumed_inputs: Iterable[str] = ...,
        stored: Stored | None = ...,
    ) -> list[Any] | None: ...

    def back_to_waiting(self, claim: Claim) -> bool: ...

    def settle(
        self,
        claim: Claim,
        status: Status,
        *,
        output: Any = ...,
        error_code: str = ...,
        error_message: str = ...,
        close_history: str | None = ...,
        uncount_call: bool = ...,
    ) -> bool: ...

    # --- reads of an execution ---
    def run(self, run_id: str) -> Any: ...

    def ancestors(self, run: Any) -> tuple[list[str], str | None, str]: ...

    def checkpoint(self, run_id: str) -> tuple[list[Message], int] | None: ...

    def thread_nodes(self, thread: str, scope: str) -> list[Node]: ...

    def history(self, run_id: str, index: int | None = ...) -> tuple[list[Message], int] | None: ...

    def pending_inputs(self, run_id: str) -> list[Any]: ...

    def last_model_step(self, run_id: str, before: int | None = ...) -> Any | None: ...

    def waiting_at(self, run_id: str, model_step: int, position: int) -> bool: ...

    def decided_calls(self, run_id: str, model_step: int) -> dict[int, Decided]: ...

    def resumed_decision(self, run_id: str) -> Any | None: ...

    # --- the connection, between writes ---
    def hand_back(self) -> None: ...

    def cancels_among(self, run_ids: Collection[str]) -> set[str]: ...
