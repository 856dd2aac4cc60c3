"""The README's ``myapp`` (agents.py and scripted.py, taken from README.md) as modules of this
process. Its ``support`` agent takes the place of the demo's agent of that name while installed."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

from tests.docsamples import block, load_module


def install() -> None:
    """Register the README's agent for good (a process of its own, e.g. a pytest subprocess)."""
    from chamvi_runs.agents.agent import registry

    package = types.ModuleType("myapp")
    package.__path__ = []
    sys.modules["myapp"] = package
    registry.unregister("support")
    package.agents = load_module("myapp.agents", block("readme-agents"))  # type: ignore[attr-defined]
    package.scripted = load_module("myapp.scripted", block("readme-scripted"))  # type: ignore[attr-defined]


@contextmanager
def installed() -> Iterator[types.ModuleType]:
    """The README's myapp while the block runs; the demo's agent and modules come back after."""
    from chamvi_runs.agents.agent import registry

    before = dict(registry._agents)
    modules = {name: sys.modules.get(name) for name in ("myapp", "myapp.agents", "myapp.scripted")}
    try:
        install()
        yield sys.modules["myapp"]
    finally:
        with registry._lock:
            registry._agents.clear()
            registry._agents.update(before)
        for name, module in modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
