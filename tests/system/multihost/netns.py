"""Hosts on one machine: network namespaces joined by veth pairs to two switches (Linux bridges in a
namespace of their own), with addresses of our own. Nothing outside the namespaces this module makes
is ever addressed.

Two networks, as a data centre has them: ``data`` (PostgreSQL + Redis, the web host, the workers,
and this test process as ``ctl``) and ``model`` (the workers and ``ctl``, which serves the scripted
model). A worker can so lose the database without losing the model, which is what a partition
between an application host and its database looks like.

``unplug`` takes a host's cable out of the data switch: its interface stays up and keeps its routes,
so packets to the database are dropped in silence, and its TCP connections hang and retransmit,
instead of failing at once. ``plug`` puts the cable back, and the same connections carry on.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

NETWORKS = ("data", "model")
# 10.213.<k>.0/24 and 10.214.<k>.0/24: <k> is picked free on this machine, so two test runs (a
# session's and its CI's) never share a subnet.
FIRST_OCTETS = {"data": "10.213", "model": "10.214"}


def available() -> str | None:
    """Why this machine cannot build the hosts, if it cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "iproute2 (ip) and util-linux (unshare) are needed"
    return None


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> int:
    taken = ip("-4", "route", "show", "table", "all")
    names = set(ip("netns", "list").split())
    for k in random.sample(range(20, 250), 230):
        if all(f"{FIRST_OCTETS[n]}.{k}." not in taken for n in NETWORKS) and f"chv{k}-lan" not in names:
            return k
    raise RuntimeError("no free 10.213.x.0/24 subnet left for the test hosts")


@dataclass
class Host:
    name: str
    namespace: str
    addresses: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, argv: Sequence[str], hostname: str | None = None) -> list[str]:
        """``argv`` run on this host: in its namespace, and with its own hostname (a UTS namespace
        of its own), so that a worker's claim owner names the host it runs on."""
        inner = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname or self.name]
        return ["ip", "netns", "exec", self.namespace, *inner, *argv]

    def start(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, log: Path
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.command(argv), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        return process

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float,
    ) -> str:
        done = subprocess.run(
            self.command(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.name}: {' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)


class Lan:
    """The switches and the hosts. Use as a context manager: leaving it kills every process the
    hosts started and deletes every namespace (their interfaces go with them)."""

    def __init__(self) -> None:
        self.k = _free_subnet()
        self.lan = f"chv{self.k}-lan"
        self.hosts: dict[str, Host] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix=f"chamvi-multihost-{self.k}-"))
        self.workdir.chmod(0o755)
        self.ctl: dict[str, str] = {}

    def address(self, network: str, last: int) -> str:
        return f"{FIRST_OCTETS[network]}.{self.k}.{last}"

    def __enter__(self) -> Lan:
        try:
            ip("netns", "add", self.lan)
            for network in NETWORKS:
                bridge = f"br-{network}"
                ip("-n", self.lan, "link", "add", bridge, "type", "bridge")
                ip("-n", self.lan, "link", "set", bridge, "up")
                # This process is a host too: the test's controller, which also serves the model.
                outside = f"chv{self.k}{network[0]}"
                ip(
                    "link",
                    "add",
                    outside,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"{network[0]}-ctl",
                    "netns",
                    self.lan,
                )
                ip("-n", self.lan, "link", "set", f"{network[0]}-ctl", "master", bridge, "up")
                self.ctl[network] = self.address(network, 1)
                ip("addr", "add", f"{self.ctl[network]}/24", "dev", outside)
                ip("link", "set", outside, "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def add_host(self, name: str, last: int, networks: Sequence[str]) -> Host:
        namespace = f"chv{self.k}-{name}"
        ip("netns", "add", namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        addresses = {}
        for number, network in enumerate(networks):
            port = f"{network[0]}-{name}"
            device = f"eth{number}"
            ip(
                "-n",
                self.lan,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                device,
                "netns",
                namespace,
            )
            ip("-n", self.lan, "link", "set", port, "master", f"br-{network}", "up")
            addresses[network] = self.address(network, last)
            ip("-n", namespace, "addr", "add", f"{addresses[network]}/24", "dev", device)
            ip("-n", namespace, "link", "set", device, "up")
        host = Host(name, namespace, addresses)
        self.hosts[name] = host
        return host

    def unplug(self, host: Host, network: str = "data") -> None:
        ip("-n", self.lan, "link", "set", f"{network[0]}-{host.name}", "nomaster")

    def plug(self, host: Host, network: str = "data") -> None:
        ip("-n", self.lan, "link", "set", f"{network[0]}-{host.name}", "master", f"br-{network}")

    def __exit__(self, *exc: object) -> None:
        for host in self.hosts.values():
            host.stop()
        for namespace in [*(h.namespace for h in self.hosts.values()), self.lan]:
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", namespace)
        shutil.rmtree(self.workdir, ignore_errors=True)
