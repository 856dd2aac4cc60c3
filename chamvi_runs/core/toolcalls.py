"""Assemble streamed tool-call deltas into whole calls.

Providers differ: some omit ``index``, some repeat index 0 for every call, some
send the id only on the first fragment. A fragment that carries a new id starts a
new call even when its index is taken; a fragment without id or index continues
the latest call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .types import ToolCall


@dataclass
class _Partial:
    id: str | None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallAccumulator:
    def __init__(self) -> None:
        self._calls: list[_Partial] = []
        self._by_index: dict[int, _Partial] = {}

    def add(self, index: int | None, call_id: str | None, name: str | None, arguments: str | None) -> None:
        partial = self._find(index, call_id)
        if partial is None:
            partial = _Partial(id=call_id)
            self._calls.append(partial)
        if call_id and not partial.id:
            partial.id = call_id
        if index is not None:
            self._by_index[index] = partial
        # Names arrive whole in practice; some servers repeat the whole name on every fragment. Only an
        # exact repeat is dropped: a name streamed in pieces ("ad" + "d") still assembles.
        if name and name != partial.name:
            partial.name += name
        if arguments:
            partial.arguments.append(arguments)

    def _find(self, index: int | None, call_id: str | None) -> _Partial | None:
        if call_id:
            for partial in self._calls:
                if partial.id == call_id:
                    return partial
            if (
                index is not None
                and index in self._by_index
                and self._by_index[index].id not in (None, call_id)
            ):
                return None
            if index is not None and index in self._by_index and self._by_index[index].id is None:
                return self._by_index[index]
            return None
        if index is not None and index in self._by_index:
            return self._by_index[index]
        if index is None and self._calls:
            return self._calls[-1]
        return None

    def calls(self, id_prefix: str) -> list[ToolCall]:
        """The assembled calls; a call without an id gets ``<id_prefix><n>`` so results can answer it."""
        return [
            ToolCall(
                id=partial.id or f"{id_prefix}{n}",
                name=partial.name,
                arguments="".join(partial.arguments),
            )
            for n, partial in enumerate(self._calls)
        ]
