"""`mocker serve` over TLS (--ssl-certfile, --ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs)
through the openai SDK on an httpx client that trusts the test's CA. Driven by
crates/mocker/tests/serve_tls.rs; prints one JSON line.

usage:
  serve_tls.py basic BASE_URL API_KEY CA          streamed and plain requests; plain HTTP refused
  serve_tls.py limit BASE_URL API_KEY CA          handshake within the header timeout, connection limit
  serve_tls.py mtls BASE_URL API_KEY CA CERT KEY  a client certificate is required
  serve_tls.py optional BASE_URL API_KEY CA CERT KEY OTHER_CERT OTHER_KEY  --ssl-cert-reqs 1
  serve_tls.py pd FRONT_URL API_KEY CA DECODE_URL [CERT KEY]  a P/D deployment transfers KV over TLS
  serve_tls.py sglang PREFILL_URL DECODE_URL API_KEY CA BOOTSTRAP_PORT  bootstrap reads over TLS
"""

import json
import os
import socket
import ssl
import sys
import time
from urllib.parse import urlparse

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"


def context(ca, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def sdk(base, key, ctx):
    http = httpx.Client(verify=ctx, timeout=30)
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, http_client=http), http


def exercise(client):
    """A plain and a streamed completion and chat; returns what they produced."""
    done = client.completions.create(model=MODEL, prompt="tls carries every token", max_tokens=5)
    assert done.usage.completion_tokens == 5, done
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello over tls"}], max_completion_tokens=4
    )
    assert chat.usage.completion_tokens == 4 and chat.choices[0].message.content, chat
    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream over tls"}], max_completion_tokens=6,
        stream=True, stream_options={"include_usage": True},
    ):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
    assert usage is not None and usage.completion_tokens == 6, usage
    assert pieces, "no streamed content"
    streamed = 0
    for chunk in client.completions.create(model=MODEL, prompt="stream", max_tokens=3, stream=True):
        streamed += len(chunk.choices)
    assert streamed >= 3, streamed
    return {"completion": done.choices[0].text, "chat_chunks": len(pieces)}


def basic(base, key, ca):
    url = urlparse(base)
    assert url.scheme == "https", base
    client, http = sdk(base, key, context(ca))
    out = exercise(client)
    r = http.get(f"{base}/health")
    assert r.status_code == 200 and r.http_version == "HTTP/1.1", (r, r.http_version)
    # Plain HTTP to the TLS port: a JSON 400 saying so, and the connection closes.
    plain = httpx.post(f"http://{url.netloc}/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=10)
    assert plain.status_code == 400, plain
    assert "https" in plain.json()["error"]["message"], plain.text
    # A client that does not trust the CA fails the handshake.
    try:
        httpx.get(f"{base}/health", timeout=10)
        raise AssertionError("a client without the CA connected")
    except httpx.ConnectError as e:
        assert "CERTIFICATE_VERIFY_FAILED" in str(e), e
    # Garbage in place of a handshake: the server drops that connection, nothing else.
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(b"\x16\x03\x01\x00\x05hello-not-tls" * 4)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
    # ... and still serves.
    again = exercise(client)
    tokens = grpc_over_tls(url, key, ca)
    return {"ok": True, "first": out, "again": again, "grpc_tokens": tokens}


def grpc_over_tls(url, key, ca):
    """vLLM's gRPC service on the same TLS port: the client negotiates h2 by ALPN."""
    import grpc

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serve_grpc import stubs

    pb, pb_grpc = stubs()
    with open(ca, "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    with grpc.secure_channel(url.netloc, credentials) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        md = [("authorization", f"Bearer {key}")]
        assert stub.HealthCheck(pb.HealthCheckRequest(), metadata=md).healthy
        request = pb.GenerateRequest(
            request_id="tls-1", tokenized=pb.TokenizedInput(input_ids=[5, 6, 7, 8]), stream=True,
            sampling_params=pb.SamplingParams(max_tokens=4, ignore_eos=True),
        )
        tokens = [t for r in stub.Generate(request, metadata=md) if r.HasField("chunk") for t in r.chunk.token_ids]
        assert len(tokens) == 4, tokens
        return tokens


def tls_socket(url, ca):
    raw = socket.create_connection((url.hostname, url.port), timeout=10)
    return context(ca).wrap_socket(raw, server_hostname=url.hostname)


def limit(base, key, ca):
    """Run against --max-connections 1 --header-timeout-seconds 1."""
    url = urlparse(base)
    # A TLS connection holds the one slot: the next one is answered 503 after its handshake.
    held = tls_socket(url, ca)
    other = tls_socket(url, ca)
    other.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while chunk := other.recv(4096):
        answer += chunk
    other.close()
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"--max-connections" in answer, answer
    # The held connection sends nothing: it is closed after the header timeout.
    started = time.monotonic()
    assert held.recv(4096) == b""
    held_for = time.monotonic() - started
    assert held_for < 5, held_for
    held.close()
    # A connection that never starts its handshake is closed by the header timeout too...
    silent = socket.create_connection((url.hostname, url.port), timeout=10)
    started = time.monotonic()
    try:
        assert silent.recv(4096) == b""
    except ConnectionResetError:
        pass
    silent_for = time.monotonic() - started
    assert 0.5 < silent_for < 5, silent_for
    silent.close()
    # ... and the slot is free again. One request on one connection: with a one-second
    # header timeout, a runner that stalls between requests can have its idle keep-alive
    # connection closed, and the client's next connection can reach the accept loop
    # before the server task has given the closed one's slot back (a 503 that says
    # nothing about whether the slot was freed).
    client, _ = sdk(base, key, context(ca))
    done = client.completions.create(model=MODEL, prompt="the slot is free", max_tokens=3)
    assert done.usage.completion_tokens == 3, done
    return {"ok": True, "held_for": held_for, "silent_for": silent_for}


def mtls(base, key, ca, cert, cert_key):
    # Without a client certificate the handshake (TLS 1.3: the first read) fails.
    try:
        r = httpx.get(f"{base}/health", verify=context(ca), timeout=10)
        raise AssertionError(f"a client without a certificate was served: {r}")
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError) as e:
        refused = type(e).__name__
    client, _ = sdk(base, key, context(ca, cert, cert_key))
    out = exercise(client)
    return {"ok": True, "refused": refused, "served": out}


def optional(base, key, ca, cert, cert_key, other_cert, other_key):
    bare, _ = sdk(base, key, context(ca))
    exercise(bare)
    signed, _ = sdk(base, key, context(ca, cert, cert_key))
    exercise(signed)
    # A certificate the CA did not sign is checked and refused, not ignored.
    try:
        r = httpx.get(f"{base}/health", verify=context(ca, other_cert, other_key), timeout=10)
        raise AssertionError(f"a client with an unknown certificate was served: {r}")
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError) as e:
        refused = type(e).__name__
    return {"ok": True, "refused": refused}


def metric(http, base, name):
    total = 0.0
    for family in text_string_to_metric_families(http.get(f"{base}/metrics").text):
        for s in family.samples:
            if s.name == name:
                total += s.value
    return total


def pd(front, key, ca, decode, cert=None, cert_key=None):
    assert front.startswith("https://") and decode.startswith("https://"), (front, decode)
    client, http = sdk(front, key, context(ca, cert, cert_key))
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert http.get(f"{front}/health").status_code == 200
    exercise(client)
    handoffs = metric(http, front, "mocker:pd_handoffs_total")
    recomputes = metric(http, decode, "mocker:kv_transfer_recomputes_total")
    # Every request's KV went from the prefill worker to the decode worker over the side
    # channel (https): none was computed again on the decode side.
    assert handoffs == 4, handoffs
    assert recomputes == 0, recomputes
    return {"ok": True, "handoffs": handoffs}


def sglang(prefill, decode, key, ca, port):
    import threading

    http = httpx.Client(verify=context(ca), timeout=30, headers={"Authorization": f"Bearer {key}"})
    # The bootstrap port speaks TLS only.
    host = urlparse(prefill).hostname
    plain = httpx.post(f"http://{host}:{port}/mocker/bootstrap/read", json={}, timeout=10)
    assert plain.status_code == 400 and "https" in plain.json()["error"]["message"], plain.text
    prompt = list(range(100, 165))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "bootstrap_host": host,
            "bootstrap_port": int(port), "bootstrap_room": 7}
    answers = {}

    def run(name, base, request):
        answers[name] = http.post(f"{base}/v1/completions", json=request)

    reader = threading.Thread(target=run, args=("decode", decode, body))
    reader.start()
    time.sleep(0.3)
    run("prefill", prefill, body)
    reader.join()
    assert answers["prefill"].status_code == 200, answers["prefill"].text
    d = answers["decode"]
    assert d.status_code == 200, d.text
    usage = d.json()["usage"]
    assert usage["completion_tokens"] == 5 and usage["prompt_tokens_details"]["cached_tokens"] == 65, usage
    assert metric(http, decode, "mocker:kv_transfer_recomputes_total") == 0
    return {"ok": True}


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    result = {"basic": basic, "limit": limit, "mtls": mtls, "optional": optional, "pd": pd, "sglang": sglang}[mode](*args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
