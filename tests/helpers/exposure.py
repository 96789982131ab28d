"""What a running command exposes, watched from outside as another process of the same user could:
the TCP ports its processes listen on, their command lines (``ps``), the Spark secrets of its
applications (read from their credentials files while they exist); and, once it has ended, which of
its files hold a secret (tests/integration/test_monitoring.py)."""

from __future__ import annotations

import ipaddress
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from raydp_llm.engines.spark_security import COOKIE, secret_dir


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address mapped into IPv6 (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


@dataclass
class Listener:
    ip: str
    port: int
    process: str  # its command line, shortened


@dataclass
class Watch:
    """Polls the process ``pid`` and all it starts every ``every_s`` until it ends (``start``, then
    ``join``)."""

    pid: int
    every_s: float = 0.2
    listeners: dict[tuple[str, int], Listener] = field(default_factory=dict)
    command_lines: set[str] = field(default_factory=set)  # every process's on this machine
    spark_secrets: set[str] = field(default_factory=set)
    # credentials files there before the command (another command's): not its own
    earlier: set[Path] = field(default_factory=lambda: set(secret_dir().glob("spark-*.creds")))
    _thread: threading.Thread | None = None

    def start(self) -> Watch:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout_s: float = 600) -> None:
        self._thread.join(timeout_s)

    def _poll(self) -> None:
        while psutil.pid_exists(self.pid) and psutil.Process(self.pid).status() != "zombie":
            self._look()
            time.sleep(self.every_s)

    def _look(self) -> None:
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in tree:
            try:
                name = " ".join(proc.cmdline())[:120]
                for conn in proc.net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN:
                        key = (conn.laddr.ip, conn.laddr.port)
                        self.listeners[key] = Listener(*key, name)
            except psutil.Error:  # ended meanwhile
                continue
        for proc in psutil.process_iter(["cmdline"]):
            self.command_lines.add(" ".join(proc.info["cmdline"] or []))
        for creds in set(secret_dir().glob("spark-*.creds")) - self.earlier:
            try:
                self.spark_secrets.add(spark_secret_of(creds.read_bytes()))
            except (OSError, ValueError):  # removed meanwhile, or being written
                continue

    def credentials_left(self) -> list[Path]:
        """The command's credentials files still there."""
        return sorted(set(secret_dir().glob("spark-*.creds")) - self.earlier)

    def wide(self) -> list[Listener]:
        """The listeners seen on an address other machines can reach."""
        return [lst for lst in self.listeners.values() if not is_loopback(lst.ip)]


def spark_secret_of(credentials: bytes) -> str:
    """The secret in a credentials file of spark_security.py."""
    _, found, rest = credentials.partition(COOKIE)
    if not found or not rest or len(rest) != rest[0] + 1:
        raise ValueError("not a complete credentials file")
    return rest[1:].decode()


def files_holding(roots: list[Path], needles: dict[str, str]) -> list[str]:
    """``path: name`` for each file under ``roots`` holding one of ``needles`` (name → text)."""
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if not path.is_file():
                continue
            data = path.read_bytes()
            found += [f"{path}: {name}" for name, text in needles.items()
                      if text.encode() in data]
    return found
