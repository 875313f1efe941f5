"""rig/transport/fast.py against a scripted HTTP/1.1 server (raw asyncio streams, so every byte,
split and misbehaviour is the test's choice): keep-alive, chunked bodies, SSE split anywhere,
Connection: close, status errors, broken answers, timeouts, cancellation, stream cuts, the
connection bound. The wave engine on it against the fake vLLM is covered by tests/workload/test_engine.py
(parametrized over CLIENTS)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from rig.transport import fast
from rig.transport.endpoint import Endpoint
from rig.transport.fast import FastTransport
from rig.transport.records import classify

MODEL = "tiny"
KTP = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e", "remote_request_id": "p-1"}

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict], Awaitable[None]]


@dataclass
class Seen:
    connections: int = 0
    requests: list[dict] = field(default_factory=list)
    eofs: int = 0  # connections the client closed (EOF while the server waited for a request)
    open_now: int = 0
    open_max: int = 0


async def _read_request(reader: asyncio.StreamReader) -> dict | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    body = json.loads(await reader.readexactly(int(headers["content-length"])))
    return {"line": lines[0], "headers": headers, "body": body}


async def serve(handler: Handler, seen: Seen, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, Endpoint]:
    """A server that calls ``handler`` for each request; the handler writes the answer and may
    close the writer (then the connection ends)."""

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        seen.open_now += 1
        seen.open_max = max(seen.open_max, seen.open_now)
        try:
            while not writer.is_closing():
                req = await _read_request(reader)
                if req is None:
                    seen.eofs += 1
                    return
                seen.requests.append(req)
                await handler(reader, writer, req)
        except ConnectionError:
            seen.eofs += 1
        finally:
            seen.open_now -= 1
            writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    return server, Endpoint("prefill", f"{'https' if tls else 'http'}://127.0.0.1:{port}")


async def until_client_goes(reader: asyncio.StreamReader) -> None:
    """Answer nothing more; return when the client closes the connection (at most 30 s)."""
    await asyncio.wait_for(reader.read(), 30)


def completion(tokens: list[int], ktp: dict | None = None) -> bytes:
    body = {"choices": [{"index": 0, "text": "x" * len(tokens), "token_ids": tokens, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}}
    if ktp is not None:
        body["kv_transfer_params"] = ktp
    return json.dumps(body).encode()


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


def chunked(parts: list[bytes], status: str = "200 OK", ctype: str = "text/event-stream") -> list[bytes]:
    out = [f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()]
    out += [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts]
    return out + [b"0\r\n\r\n"]


def sse(tokens: list[int], done: bool = True) -> list[bytes]:
    events = [{"choices": [{"index": 0, "text": "x", "token_ids": [t],
                            "finish_reason": "length" if i == len(tokens) - 1 else None}]}
              for i, t in enumerate(tokens)]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}})
    out = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return out + ([b"data: [DONE]\n\n"] if done else [])


def run(coro):
    return asyncio.run(coro)


async def with_server(handler: Handler, body: Callable[[FastTransport, Endpoint, Seen], Awaitable[None]],
                      timeout_s: float = 5.0, max_connections: int = 8, tls: ssl.SSLContext | None = None) -> Seen:
    seen = Seen()
    server, ep = await serve(handler, seen, tls)
    tr = FastTransport(MODEL, timeout_s, max_connections)
    try:
        await body(tr, ep, seen)
    finally:
        await tr.aclose()
        server.close()
        await server.wait_closed()
    return seen


async def eventually(cond: Callable[[], bool], within_s: float = 2.0) -> None:
    for _ in range(int(within_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    assert cond()


# ------------------------------------------------------------------------------- happy paths


def test_keep_alive_reuses_one_connection_and_sends_the_rig_bodies():
    async def handler(reader, writer, req):
        writer.write(answer(completion([5], KTP)))

    async def body(tr, ep, seen):
        for i in range(5):
            hop = await tr.prefill(ep, [1, 2, i])
            assert hop.status == 200 and hop.error is None and hop.kv_transfer_params == KTP
            assert hop.token_ids == [5] and hop.latency_s > 0 and classify(hop) == "ok"

    seen = run(with_server(handler, body))
    assert seen.connections == 1 and len(seen.requests) == 5
    req = seen.requests[-1]
    assert req["line"] == "POST /v1/completions HTTP/1.1"
    assert req["headers"]["content-type"] == "application/json"
    b = req["body"]
    assert b["prompt"] == [1, 2, 4] and b["max_tokens"] == 1 and b["model"] == MODEL
    assert b["kv_transfer_params"]["do_remote_decode"] is True and b["temperature"] == 0


def test_chunked_json_answer_split_anywhere():
    async def handler(reader, writer, req):
        raw = completion([7, 8, 9])
        for part in chunked([raw[:10], raw[10:11], raw[11:]], ctype="application/json"):
            for i in range(0, len(part), 7):  # 7-byte TCP writes across chunk boundaries
                writer.write(part[i:i + 7])
                await writer.drain()

    async def body(tr, ep, seen):
        hop = await tr.decode(ep, [1], 3, KTP, stream=False)
        assert hop.error is None and hop.token_ids == [7, 8, 9] and hop.usage["completion_tokens"] == 3
        assert seen.requests[0]["body"]["kv_transfer_params"] == KTP and "stream" not in seen.requests[0]["body"]

    run(with_server(handler, body))


def test_sse_stream_split_at_every_byte_then_the_connection_is_reused():
    async def handler(reader, writer, req):
        if not req["body"].get("stream"):
            writer.write(answer(completion([1])))
            return
        for part in chunked(sse([11, 12, 13])):
            for i in range(len(part)):
                writer.write(part[i:i + 1])
                await writer.drain()

    async def body(tr, ep, seen):
        hop = await tr.decode(ep, [1, 2], 3, KTP, stream=True)
        assert hop.error is None and hop.status == 200
        assert hop.token_ids == [11, 12, 13] and hop.finish_reason == "length"
        assert hop.usage == {"prompt_tokens": 3, "completion_tokens": 3} and 0 <= hop.ttft_s <= hop.latency_s
        sent = seen.requests[0]["body"]
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
        assert (await tr.direct(ep, [1], 1)).token_ids == [1]

    seen = run(with_server(handler, body))
    assert seen.connections == 1 and len(seen.requests) == 2


def test_connection_close_answer_is_not_reused():
    async def handler(reader, writer, req):
        writer.write(answer(completion([3]), extra="Connection: close\r\n"))
        await writer.drain()
        writer.close()

    async def body(tr, ep, seen):
        for _ in range(3):
            assert (await tr.direct(ep, [1], 1)).token_ids == [3]

    assert run(with_server(handler, body)).connections == 3


def test_idle_connections_older_than_keepalive_are_not_reused(monkeypatch):
    monkeypatch.setattr(fast, "KEEPALIVE_S", 0.0)

    async def handler(reader, writer, req):
        writer.write(answer(completion([3])))

    async def body(tr, ep, seen):
        for _ in range(3):
            assert (await tr.direct(ep, [1], 1)).error is None
        await eventually(lambda: seen.eofs == 2)  # the stale ones were closed by the client

    assert run(with_server(handler, body)).connections == 3


def test_connection_the_server_closed_while_idle_is_not_used():
    async def handler(reader, writer, req):  # keep-alive answer, then the server closes anyway
        writer.write(answer(completion([3])))
        await writer.drain()
        writer.close()

    async def body(tr, ep, seen):
        assert (await tr.direct(ep, [1], 1)).error is None
        # the client has seen the close: no idle connection of the target is open any more
        (target,) = tr._targets.values()
        await eventually(lambda: all(c.closed for c in target.idle))
        hop = await tr.direct(ep, [1], 1)
        assert hop.error is None and hop.token_ids == [3]

    assert run(with_server(handler, body)).connections == 2


# ------------------------------------------------------------------------------- error classes


@pytest.mark.parametrize("stream", [False, True])
def test_status_error_carries_vllms_message_and_keeps_the_connection(stream):
    async def handler(reader, writer, req):
        err = json.dumps({"error": {"message": "EngineCore encountered an issue", "code": 500}}).encode()
        writer.write(answer(err, status="500 Internal Server Error"))

    async def body(tr, ep, seen):
        for _ in range(2):
            hop = await tr.decode(ep, [1], 4, KTP, stream=stream)
            assert hop.status == 500 and hop.error == "HTTP 500: EngineCore encountered an issue"
            assert classify(hop) == "http_error" and not hop.token_ids

    assert run(with_server(handler, body)).connections == 1


def test_server_closing_mid_answer_is_a_connection_error():
    async def handler(reader, writer, req):
        writer.write(answer(completion([1, 2, 3]))[:-5])
        await writer.drain()
        writer.close()

    async def body(tr, ep, seen):
        hop = await tr.prefill(ep, [1])
        assert hop.error.startswith("connection error: ConnectionError: server closed the connection")
        assert classify(hop) == "connection_error" and hop.status is None

    run(with_server(handler, body))


def test_an_answer_that_is_not_http_is_a_connection_error():
    async def handler(reader, writer, req):
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    async def body(tr, ep, seen):
        hop = await tr.prefill(ep, [1])
        assert hop.error.startswith("connection error:") and "not HTTP/1.1" in hop.error

    run(with_server(handler, body))


def test_a_200_that_is_not_json_is_a_connection_error():
    async def handler(reader, writer, req):
        writer.write(answer(b"<html>proxy</html>"))

    async def body(tr, ep, seen):
        hop = await tr.prefill(ep, [1])
        assert hop.status == 200 and hop.error.startswith("connection error: answer is not JSON")

    run(with_server(handler, body))


def test_bad_sse_chunk_is_a_connection_error_and_closes():
    async def handler(reader, writer, req):
        for part in chunked(sse([1])[:1] + [b"data: {not json\n\n"]):
            writer.write(part)

    async def body(tr, ep, seen):
        hop = await tr.decode(ep, [1], 4, KTP, stream=True)
        assert hop.error.startswith("connection error: bad SSE chunk") and hop.token_ids == [1]
        await eventually(lambda: seen.eofs == 1)

    run(with_server(handler, body))


def test_connection_refused_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def body():
        tr = FastTransport(MODEL, 5, 4)
        hop = await tr.prefill(Endpoint("prefill", f"http://127.0.0.1:{port}"), [1])
        await tr.aclose()
        return hop

    hop = run(body())
    assert hop.error.startswith("connection error: ConnectionRefusedError") and classify(hop) == "connection_error"


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory) -> tuple[str, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1 (openssl's CLI) and a server context using it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return str(cert), ctx


def test_https_with_a_trusted_certificate(tls_cert, monkeypatch):
    cert, ctx = tls_cert
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # the client trusts what the system trusts, plus this

    async def handler(reader, writer, req):
        writer.write(answer(completion([6], KTP)))

    async def body(tr, ep, seen):
        assert ep.url.startswith("https://")
        for _ in range(2):
            hop = await tr.prefill(ep, [1])
            assert hop.error is None and hop.kv_transfer_params == KTP

    assert run(with_server(handler, body, tls=ctx)).connections == 1


def test_https_with_an_untrusted_certificate_is_a_connection_error(tls_cert, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    _, ctx = tls_cert

    async def handler(reader, writer, req):
        writer.write(answer(completion([6], KTP)))

    async def body(tr, ep, seen):
        hop = await tr.prefill(ep, [1])
        assert hop.error.startswith("connection error: SSLCertVerificationError") and hop.status is None

    run(with_server(handler, body, tls=ctx))


def test_a_url_that_is_not_http_is_refused_naming_it():
    async def body():
        tr = FastTransport(MODEL, 5, 4)
        try:
            await tr.prefill(Endpoint("prefill", "unix:///run/vllm.sock"), [1])
        finally:
            await tr.aclose()

    with pytest.raises(ValueError, match="unix:///run/vllm.sock.*expected http://HOST:PORT or https://HOST:PORT"):
        run(body())


# ------------------------------------------------------------------------------- time and cancellation


@pytest.mark.parametrize("stream", [False, True])
def test_timeout_covers_the_whole_hop_and_drops_the_connection(stream):
    async def handler(reader, writer, req):  # headers and one token, then silence
        parts = chunked(sse([1, 2, 3]))
        writer.write(parts[0] + parts[1])
        await until_client_goes(reader)

    async def body(tr, ep, seen):
        t = asyncio.get_running_loop().time()
        hop = await tr.decode(ep, [1], 3, KTP, stream=stream)
        assert 0.3 <= asyncio.get_running_loop().time() - t < 2
        assert hop.error == "timeout: no complete answer within 0.3 s" and classify(hop) == "timeout"
        await eventually(lambda: seen.open_now == 0)  # the server saw the client go

    run(with_server(handler, body, timeout_s=0.3))


def test_cancelling_the_hop_closes_its_connection_and_propagates():
    async def handler(reader, writer, req):
        if req["body"]["prompt"] == [0]:
            await until_client_goes(reader)  # never answers: the client cancels
        writer.write(answer(completion([4], KTP)))

    async def body(tr, ep, seen):
        task = asyncio.ensure_future(tr.prefill(ep, [0]))
        await eventually(lambda: len(seen.requests) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: seen.open_now == 0)  # vLLM would abort the request here
        hop = await tr.prefill(ep, [1])  # the transport is still usable, on a fresh connection
        assert hop.error is None and hop.kv_transfer_params == KTP

    assert run(with_server(handler, body)).connections == 2


def test_stop_after_tokens_cuts_the_stream_and_closes_the_connection():
    async def handler(reader, writer, req):
        parts = chunked(sse([1, 2, 3, 4]))
        writer.write(b"".join(parts[:2]))  # headers + the first token
        await until_client_goes(reader)

    async def body(tr, ep, seen):
        hop = await tr.decode(ep, [1], 4, KTP, stream=True, stop_after_tokens=1)
        assert hop.error is None and hop.status == 200 and hop.latency_s < 1
        assert hop.token_ids == [1] and hop.finish_reason == "cancelled" and hop.ttft_s is not None
        await eventually(lambda: seen.open_now == 0)

    run(with_server(handler, body))


def test_stop_after_does_not_cut_a_stream_that_finished():
    async def handler(reader, writer, req):
        for part in chunked(sse([9])):
            writer.write(part)

    async def body(tr, ep, seen):
        hop = await tr.decode(ep, [1], 1, KTP, stream=True, stop_after_tokens=1)
        assert hop.token_ids == [9] and hop.finish_reason == "length"

    run(with_server(handler, body))


def test_max_connections_bounds_the_exchanges_in_flight():
    async def handler(reader, writer, req):
        await asyncio.sleep(0.05)
        writer.write(answer(completion([2])))

    async def body(tr, ep, seen):
        hops = await asyncio.gather(*(tr.direct(ep, [i], 1) for i in range(8)))
        assert all(h.error is None for h in hops)

    seen = run(with_server(handler, body, max_connections=2))
    assert seen.open_max == 2 and len(seen.requests) == 8
