"""The hop clients never reuse a connection vLLM may be closing.

vLLM's uvicorn closes an idle keep-alive connection after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s,
vllm/envs.py); aiohttp's pool keeps one 15 s by default and httpx's 5 s, so a request sent after an
idle gap could pick a connection at the moment the server drops it and fail before vLLM saw it
("ClientOSError: Can not write request body", the first request of a wave round). The server here
makes that race certain: a request on a connection idle for longer than IDLE_S is answered by
resetting the connection. A client whose keep-alive bound is below IDLE_S opens a fresh one.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from rig.transport.client import AiohttpTransport, HttpxTransport
from rig.transport.fast import KEEPALIVE_S

IDLE_S = KEEPALIVE_S + 1.0  # the server's bound in this test: above the clients', as vLLM's 5 s is
BODY = b'{"ok": true}'
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection; reset it when a request comes after IDLE_S idle."""
    last = time.monotonic()
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        if time.monotonic() - last > IDLE_S:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
            writer.transport.abort()
            return
        writer.write(ANSWER)
        await writer.drain()
        last = time.monotonic()


async def _two_posts_apart(post) -> list[int]:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        first = await post(f"http://127.0.0.1:{port}/v1/completions")
        await asyncio.sleep(IDLE_S + 0.5)  # the idle gap between two wave rounds
        second = await post(f"http://127.0.0.1:{port}/v1/completions")
        return [first, second]
    finally:
        server.close()


@pytest.mark.parametrize("cls", [AiohttpTransport, HttpxTransport])
def test_a_request_after_an_idle_gap_longer_than_the_servers_keepalive_is_answered(cls):
    async def run() -> list[int]:
        t = cls("m")
        try:
            if isinstance(t, AiohttpTransport):
                async def post(url: str) -> int:
                    async with t.session.post(url, data=b"{}") as r:
                        await r.read()
                        return r.status
            else:
                async def post(url: str) -> int:
                    return (await t.http.post(url, content=b"{}")).status_code
            return await _two_posts_apart(post)
        finally:
            await t.aclose()

    assert asyncio.run(run()) == [200, 200]


def test_the_clients_keepalive_bound_is_below_vllms():
    assert KEEPALIVE_S < 5.0  # vllm/envs.py VLLM_HTTP_TIMEOUT_KEEP_ALIVE default
