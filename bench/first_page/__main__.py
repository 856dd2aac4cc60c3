"""Seconds from a fresh clone to the demo's first page: ``git clone``, then ``make demo`` (a new
venv, the install, migrate, the demo user, daphne) until http://127.0.0.1:<port>/ answers.

    .venv/bin/python -m bench.first_page                       # clones this checkout's HEAD
    .venv/bin/python -m bench.first_page --overlay Makefile    # HEAD plus this file as it is here
    .venv/bin/python -m bench.first_page --no-pip-cache        # every package downloaded again

pip's cache (``pip cache dir``) makes the install warm or cold: the script says which it had.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.common import ROOT


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def pip_cache_files() -> int:
    found = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    cache = Path(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 and found.stdout else None
    return sum(1 for _ in cache.rglob("*")) if cache and cache.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--overlay", nargs="*", default=[], help="files copied from this checkout over the clone"
    )
    parser.add_argument("--no-pip-cache", action="store_true", help="PIP_NO_CACHE_DIR=1 for the install")
    parser.add_argument("--python", default="python3", help="the PYTHON make demo builds its venv with")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = "off" if args.no_pip_cache else f"{pip_cache_files()} files in pip's cache"
    workdir = Path(tempfile.mkdtemp(prefix="chamvi-first-page-"))
    clone = workdir / "clone"
    log = workdir / "make-demo.log"
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"} if args.no_pip_cache else dict(os.environ)
    for name in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV"):
        env.pop(name, None)
    started = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    for name in args.overlay:
        shutil.copy(ROOT / name, clone / name)
    with log.open("wb") as out:
        make = subprocess.Popen(
            ["make", "demo", f"PORT={port}", f"PYTHON={args.python}"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while not answers(f"http://127.0.0.1:{port}/"):
            if make.poll() is not None or time.monotonic() - started > args.timeout:
                raise SystemExit(f"make demo served nothing:\n{log.read_text()}")
            time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.wait(30)
    print(f"clone to the first page: {elapsed:.1f} s (pip cache: {cache}; overlay: {args.overlay or 'none'})")
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
