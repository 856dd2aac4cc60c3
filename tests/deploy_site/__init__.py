"""Two releases of one site's agents, for the rolling deploy test (tests/system/test_rolling_deploy.py).

``tests.testapp.agents`` imports ``v1`` or ``v2`` as ``CHAMVI_TEST_DEPLOY`` says (``v1`` by default):
an old worker and a new one of the same site have the same agent names with different tools and
instructions, so different versions (SPEC §14). Never import both in one process: the second would
register the agents' names again.

Two environment variables let the test see what ran, in whichever process it ran:
``CHAMVI_TEST_DEPLOY_SINK`` (a file) gets one JSON line per execution of an effect tool, and
``CHAMVI_TEST_DEPLOY_RULES`` (a file) one per call of ``deploy-custom``'s ``on_version_change``."""

from __future__ import annotations

import json
import os
from typing import Any


def record(variable: str, entry: dict[str, Any]) -> None:
    """Append ``entry`` as a JSON line to the file ``$variable`` names (nothing when it is unset)."""
    path = os.environ.get(variable)
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(entry, sort_keys=True) + "\n")


def effect_ran(release: str, tool: str, ctx: Any, arguments: dict[str, Any]) -> None:
    """An effect tool of ``release`` executed (once per execution, whatever EffectRecord says)."""
    record(
        "CHAMVI_TEST_DEPLOY_SINK",
        {"release": release, "tool": tool, "run": ctx.run.pk, "key": ctx.idempotency_key, "args": arguments},
    )
