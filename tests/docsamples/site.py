"""A new ``django-admin startproject`` site built from the README's snippets, in a tmp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docsamples import block, shell_commands

BIN = Path(sys.executable).parent


def site_env() -> dict[str, str]:
    """This process's environment without the suite's settings and services: the new site has its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHAMVI_", "OPENAI_"))}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def command_args(command: str) -> list[str]:
    """A README command line as arguments, with ``python`` and ``django-admin`` from this venv."""
    args = command.split()
    if args[0] == "python":
        args[0] = sys.executable
    elif args[0] in ("django-admin", "daphne"):
        args[0] = str(BIN / args[0])
    return args


def create_site(root: Path, env: dict[str, str], settings: str = "readme-settings-embedded") -> Path:
    """The README's startproject commands, then each snippet where the README puts it; returns the
    project directory. ``settings`` names the settings snippet appended to mysite/settings.py."""
    cwd = root
    for command in shell_commands("readme-startproject"):
        if command.startswith("pip install"):
            continue  # this venv has the package already
        if command.startswith("cd "):
            cwd = cwd / command.split()[1]
            continue
        run(command_args(command), cwd, env)
    path = cwd / "mysite" / "settings.py"
    # A brand-new site: the README's LOGIN_URL line follows either settings snippet.
    path.write_text(path.read_text() + "\n" + block(settings) + "\n" + block("readme-settings-login"))
    (cwd / "myapp" / "agents.py").write_text(block("readme-agents"))
    (cwd / "myapp" / "scripted.py").write_text(block("readme-scripted"))
    (cwd / "mysite" / "urls.py").write_text(block("readme-urls"))
    (cwd / "mysite" / "asgi.py").write_text(block("readme-asgi"))
    return cwd


def check_clean(cwd: Path, env: dict[str, str]) -> None:
    """``manage.py check``: no error and no warning at all."""
    checked = run([sys.executable, "manage.py", "check", "--fail-level", "WARNING"], cwd, env)
    assert "no issues" in checked.stdout, checked.stdout + checked.stderr
