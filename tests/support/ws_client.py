"""A small websocket client (RFC 6455 over asyncio streams) for tests against a real daphne. It
answers daphne's pings as a browser does, and can stop reading like a stalled browser tab. (autobahn
cannot serve: daphne in INSTALLED_APPS binds it to Twisted for the whole process.)"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA


@dataclass(frozen=True)
class Closed:
    code: int | None


class Socket:
    """One websocket to ``ws://127.0.0.1:<port><path>`` with a session cookie."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.inbox: asyncio.Queue[dict[str, Any] | Closed] = asyncio.Queue()
        self.closed: Closed | None = None
        self.reading = asyncio.Event()
        self.reading.set()
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, port: int, path: str, cookie: str, timeout: float = 30) -> Socket:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        # A page of the site: the Origin is the one the Host names, as a browser sends it.
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: http://127.0.0.1:{port}\r\nCookie: {cookie}\r\n\r\n"
            ).encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            writer.close()
            raise ConnectionError(f"handshake refused: {status!r}")
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while True:
                await self.reading.wait()
                opcode, payload = await self._frame()
                if opcode == TEXT:
                    self.inbox.put_nowait(json.loads(payload))
                elif opcode == PING:
                    self._write(PONG, payload)
                elif opcode == CLOSE:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                    self._write(CLOSE, payload[:2])
                    self._closed(code)
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self._closed(None)

    async def _frame(self) -> tuple[int, bytes]:
        """The next message (fragments joined): its opcode and payload. Servers do not mask."""
        opcode, parts = 0, []
        while True:
            first, second = await self.reader.readexactly(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", await self.reader.readexactly(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
            parts.append(await self.reader.readexactly(length))
            opcode = opcode or first & 0x0F
            if first & 0x80:
                return opcode, b"".join(parts)

    def _write(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(b ^ mask[n % 4] for n, b in enumerate(payload))
        self.writer.write(header + mask + masked)

    def _closed(self, code: int | None) -> None:
        if self.closed is None:
            self.closed = Closed(code)
            self.inbox.put_nowait(self.closed)

    async def receive(self, timeout: float) -> dict[str, Any]:
        item = await asyncio.wait_for(self.inbox.get(), timeout)
        if isinstance(item, Closed):
            raise AssertionError(f"the server closed the socket: {item}")
        return item

    async def until(self, type_: str, timeout: float) -> list[dict[str, Any]]:
        """Every message up to and including the first of ``type_``; ``timeout`` for each."""
        received: list[dict[str, Any]] = []
        while not received or received[-1].get("type") != type_:
            received.append(await self.receive(timeout))
        return received

    async def quiet_for(self, seconds: float) -> list[dict[str, Any] | Closed]:
        """Wait ``seconds``; whatever arrived meanwhile (a close included)."""
        await asyncio.sleep(seconds)
        arrived = []
        while not self.inbox.empty():
            arrived.append(self.inbox.get_nowait())
        return arrived

    def send(self, message: dict[str, Any]) -> None:
        self._write(TEXT, json.dumps(message).encode())

    def pause(self) -> None:
        """Stop reading: what the server sends piles up in the TCP buffers, then in daphne."""
        self.reading.clear()

    def resume(self) -> None:
        self.reading.set()

    async def close(self) -> None:
        if self.closed is None:
            self._write(CLOSE, struct.pack("!H", 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.task, 5)
        self.task.cancel()
        self.writer.close()
