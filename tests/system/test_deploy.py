"""Deployment defaults of the bundled project: with DEBUG off it refuses to start on the demo's
public SECRET_KEY (sessions, CSRF tokens and password resets are signed with it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from project.settings import DEMO_SECRET_KEY
from tests.support.processes import ROOT

pytestmark = pytest.mark.timeout(120)


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py check`` of the bundled project, in embedded mode, with only ``env`` set."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDIS_URL", "DATABASE_URL"))}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_debug_off_needs_a_secret_key_of_its_own():
    for key in (None, DEMO_SECRET_KEY):
        result = _check(DJANGO_DEBUG="0", **({"DJANGO_SECRET_KEY": key} if key else {}))
        assert result.returncode != 0, result.stdout
        assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr, result.stderr

    result = _check(DJANGO_DEBUG="0", DJANGO_SECRET_KEY="a-long-random-key-only-this-site-knows-5f2c9e")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout
    # The demo, with DEBUG on by default, still starts with nothing configured.
    assert _check().returncode == 0
