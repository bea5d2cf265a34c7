"""End-to-end checks of `mocker serve`'s gRPC service, vllm.grpc.engine.VllmEngine, with grpcio
and stubs generated here from the vendored proto (grpc_tools.protoc into a temporary directory),
plus the standard health service and server reflection. Driven by
crates/mocker/tests/serve_grpc.rs; prints one JSON line of results.

usage: serve_grpc.py suite   GRPC_ADDR BASE_URL API_KEY   (--max-model-len 512, --block-size 16,
                                                           --embedding-dim 32, --speedup-ratio 1)
       serve_grpc.py port    GRPC_ADDR BASE_URL API_KEY   (a separate --grpc-port)
       serve_grpc.py startup GRPC_ADDR BASE_URL API_KEY   (engine-args startup_time 8)
"""

import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PROTO_DIR = os.path.join(ROOT, "crates", "mocker-server", "proto")
SERVICE = "vllm.grpc.engine.VllmEngine"


def stubs(name="vllm_engine"):
    """A vendored proto (`name`.proto, with common.proto) compiled by grpc_tools.protoc,
    imported from a temporary dir."""
    out = tempfile.mkdtemp(prefix="mocker-grpc-")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
         f"--grpc_python_out={out}", f"{name}.proto", "common.proto"],
        check=True,
    )
    sys.path.insert(0, out)
    return importlib.import_module(f"{name}_pb2"), importlib.import_module(f"{name}_pb2_grpc")


pb, pbg = stubs()


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_error(fn, code, contains=""):
    try:
        result = fn()
        # A stream fails when read.
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    except grpc.RpcError as e:
        check(e.code() == code, f"expected {code}, got {e.code()}: {e.details()}")
        check(contains in (e.details() or ""), f"{contains!r} not in {e.details()!r}")
        return e.details()
    raise AssertionError(f"expected {code}, the call succeeded")


def metrics(base):
    text = httpx.get(f"{base}/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def gauge(m, name):
    return sum(v for k, v in m.items() if k.split("{")[0] == name)


def wait_idle(base, stub, md, what):
    """Running requests back to 0 and KV usage 0 (the request's blocks freed)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        m = metrics(base)
        if gauge(m, "vllm:num_requests_running") == 0 and gauge(m, "vllm:kv_cache_usage_perc") == 0:
            info = stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=md)
            check(info.active_requests == 0, f"{what}: active_requests {info.active_requests}")
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: running {gauge(m, 'vllm:num_requests_running')}, "
                         f"kv usage {gauge(m, 'vllm:kv_cache_usage_perc')}")


def generate(stub, md, ids=None, text=None, stream=False, rid="", **params):
    kw = {"request_id": rid, "stream": stream, "sampling_params": pb.SamplingParams(**params)}
    if text is not None:
        kw["text"] = text
    else:
        kw["tokenized"] = pb.TokenizedInput(input_ids=ids)
    return stub.Generate(pb.GenerateRequest(**kw), metadata=md)


def suite(addr, base, key):
    results = {}
    channel = grpc.insecure_channel(addr)
    stub = pbg.VllmEngineStub(channel)
    md = [("authorization", f"Bearer {key}")]

    # API key.
    expect_error(lambda: stub.GetModelInfo(pb.GetModelInfoRequest()), grpc.StatusCode.UNAUTHENTICATED,
                 "authorization")
    expect_error(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=[("authorization", "Bearer no")]),
                 grpc.StatusCode.UNAUTHENTICATED)

    # Standard health service (no key needed, as /health).
    health = health_pb2_grpc.HealthStub(channel)
    for name in ["", SERVICE]:
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        check(status == health_pb2.HealthCheckResponse.SERVING, f"health {name!r}: {status}")
    expect_error(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope")), grpc.StatusCode.NOT_FOUND)
    r = stub.HealthCheck(pb.HealthCheckRequest(), metadata=md)
    check(r.healthy and r.message == "Health", f"HealthCheck {r}")

    # Reflection lists the services and serves the file descriptors.
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(refl.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ])))
    services = {s.name for s in answers[0].list_services_response.service}
    check({SERVICE, "grpc.health.v1.Health"} <= services, f"reflection services {services}")
    check("sglang.grpc.scheduler.SglangScheduler" not in services, f"reflection services {services}")
    # SGLang's service is the sglang backend's.
    other = channel.unary_unary("/sglang.grpc.scheduler.SglangScheduler/HealthCheck", request_serializer=None,
                                response_deserializer=None)
    expect_error(lambda: other(b"", metadata=md), grpc.StatusCode.UNIMPLEMENTED, "served on the sglang backend")
    files = answers[1].file_descriptor_response.file_descriptor_proto
    check(len(files) >= 1, "reflection returned no file descriptors")
    results["reflection_services"] = sorted(services)

    # Model and server info.
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md)
    check(info.model_path == "mocker-test" and info.served_model_name == "mocker-test", f"{info}")
    check(info.max_context_length == 512 and info.max_req_input_len == 512 and info.is_generation, f"{info}")
    check(info.vocab_size > 1000, f"vocab {info.vocab_size}")
    server = stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=md)
    check(server.server_type == "vllm-grpc" and server.active_requests == 0, f"{server}")
    check(server.uptime_seconds > 0 and server.data_parallel_size == 1 and server.kv_connector == "", f"{server}")
    loads = stub.GetLoads(pb.GetLoadsRequest(), metadata=md)
    check(loads.dp_rank_count == 1 and len(loads.loads) == 1 and loads.timestamp.endswith("Z"), f"{loads}")
    expect_error(lambda: stub.GetLoads(pb.GetLoadsRequest(dp_rank=3), metadata=md),
                 grpc.StatusCode.INVALID_ARGUMENT, "dp_rank")

    # Streaming: one chunk a token at the engine's pace, then the complete.
    prompt = list(range(1000, 1064))
    t0 = time.time()
    chunks, completes, times = [], [], []
    for msg in generate(stub, md, ids=prompt, stream=True, rid="stream-1", max_tokens=24):
        times.append(time.time() - t0)
        kind = msg.WhichOneof("response")
        (chunks if kind == "chunk" else completes).append(getattr(msg, kind))
    check(len(chunks) == 24 and all(len(c.token_ids) == 1 and c.completion_tokens == 1 for c in chunks),
          f"{len(chunks)} chunks")
    check(all(c.prompt_tokens == 64 for c in chunks), "prompt_tokens")
    check(len(completes) == 1 and completes[0].finish_reason == "length", f"{completes}")
    check(list(completes[0].output_ids) == list(chunks[-1].token_ids), "complete repeats the last delta")
    spread = times[len(chunks) - 1] - times[0]
    check(spread > 0.02, f"tokens arrived within {spread:.4f} s: not paced")
    results["stream_spread_s"] = round(spread, 4)
    # The same prompt again: its full blocks come from the prefix cache.
    again = [m.chunk for m in generate(stub, md, ids=prompt, stream=True, max_tokens=2) if m.HasField("chunk")]
    check(again[0].cached_tokens >= 48, f"cached_tokens {again[0].cached_tokens}")
    results["cached_tokens"] = again[0].cached_tokens

    # Non-streaming: one complete with every token.
    msgs = list(generate(stub, md, ids=[5, 6, 7], max_tokens=9, seed=7))
    check(len(msgs) == 1 and msgs[0].HasField("complete"), f"{msgs}")
    c = msgs[0].complete
    check(len(c.output_ids) == 9 and c.completion_tokens == 9 and c.finish_reason == "length", f"{c}")
    # Seeded output repeats; a stop token id ends it there, as in the HTTP path.
    same = list(generate(stub, md, ids=[5, 6, 7], max_tokens=9, seed=7))[0].complete
    check(list(same.output_ids) == list(c.output_ids), "seeded output differs")
    stop_at = c.output_ids[4]
    first = list(c.output_ids).index(stop_at)
    stopped = list(generate(stub, md, ids=[5, 6, 7], max_tokens=9, seed=7, stop_token_ids=[stop_at]))[0].complete
    check(stopped.finish_reason == "stop" and stopped.matched_token_id == stop_at, f"{stopped}")
    check(list(stopped.output_ids) == list(c.output_ids)[:first + 1], f"{stopped.output_ids}")
    # min_tokens holds the stop back.
    held = list(generate(stub, md, ids=[5, 6, 7], max_tokens=9, seed=7, stop_token_ids=[stop_at],
                         min_tokens=9))[0].complete
    check(held.finish_reason == "length" and len(held.output_ids) == 9, f"{held}")

    # n = 2: one complete per index.
    both = [m.complete for m in generate(stub, md, ids=[1, 2, 3], max_tokens=4, n=2)]
    check(sorted(x.index for x in both) == [0, 1] and all(len(x.output_ids) == 4 for x in both), f"{both}")

    # Text input is tokenized by the server's tokenizer.
    text = "the quick brown fox jumps over the lazy dog"
    counted = httpx.post(f"{base}/tokenize", json={"prompt": text}, headers={"Authorization": f"Bearer {key}"})
    want = counted.json()["count"]
    c = list(generate(stub, md, text=text, max_tokens=3))[0].complete
    check(c.prompt_tokens == want, f"text prompt {c.prompt_tokens} tokens, /tokenize says {want}")

    # Without max_tokens (and the model's end of sequence ignored) the output runs to the context.
    c = list(generate(stub, md, ids=[1] * 500, ignore_eos=True))[0].complete
    check(c.completion_tokens == 12 and c.finish_reason == "length", f"context-bound: {c.completion_tokens}")

    # Abort mid-stream: the stream ends "abort", the KV is freed, the metrics back to idle.
    stream = generate(stub, md, ids=list(range(2000, 2100)), stream=True, rid="to-abort", max_tokens=400)
    seen = []
    for msg in stream:
        seen.append(msg)
        if len(seen) == 3:
            stub.Abort(pb.AbortRequest(request_ids=["to-abort", "unknown-id"]), metadata=md)
    last = seen[-1]
    check(last.HasField("complete") and last.complete.finish_reason == "abort", f"after abort: {last}")
    check(len(seen) < 50, f"{len(seen)} messages after the abort")
    wait_idle(base, stub, md, "abort")
    results["abort_after_messages"] = len(seen)

    # Abort of a non-streaming request: the complete carries the tokens so far.
    box = {}
    t = threading.Thread(target=lambda: box.update(r=list(generate(stub, md, ids=[9] * 40, rid="quiet",
                                                                    max_tokens=400))))
    t.start()
    time.sleep(0.3)
    stub.Abort(pb.AbortRequest(request_ids=["quiet"]), metadata=md)
    t.join(10)
    c = box["r"][0].complete
    check(c.finish_reason == "abort" and 0 < len(c.output_ids) < 400, f"{c.finish_reason} {len(c.output_ids)}")
    wait_idle(base, stub, md, "non-streaming abort")

    # The client cancelling its stream cancels the request.
    call = generate(stub, md, ids=list(range(3000, 3100)), stream=True, max_tokens=400)
    for i, _ in enumerate(call):
        if i == 3:
            call.cancel()
            break
    wait_idle(base, stub, md, "client cancel")

    # Embed: a prefill through the engine, a vector of --embedding-dim.
    e = stub.Embed(pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=[4, 5, 6])), metadata=md)
    check(e.embedding_dim == 32 and len(e.embedding) == 32 and e.prompt_tokens == 3, f"{e}")
    norm = sum(x * x for x in e.embedding) ** 0.5
    check(abs(norm - 1) < 1e-4, f"norm {norm}")
    expect_error(lambda: stub.Embed(pb.EmbedRequest(request_id="e"), metadata=md),
                 grpc.StatusCode.INVALID_ARGUMENT, "tokenized")

    # Fields mocker does not simulate are refused by name.
    bad = grpc.StatusCode.INVALID_ARGUMENT
    expect_error(lambda: generate(stub, md, ids=[1], logprobs=2), bad, "sampling_params.logprobs")
    expect_error(lambda: generate(stub, md, ids=[1], logit_bias={3: 1.0}), bad, "sampling_params.logit_bias")
    expect_error(lambda: generate(stub, md, ids=[1], regex="a+"), bad, "sampling_params.regex")
    expect_error(lambda: stub.Generate(pb.GenerateRequest(
        tokenized=pb.TokenizedInput(input_ids=[1]), kv_transfer_params_json='{"do_remote_decode": true}'),
        metadata=md), bad, "kv_transfer_params_json")
    expect_error(lambda: stub.Generate(pb.GenerateRequest(
        tokenized=pb.TokenizedInput(input_ids=[1]), data_parallel_rank=0), metadata=md), bad, "data_parallel_rank")
    expect_error(lambda: generate(stub, md, ids=[1] * 600, max_tokens=1), bad, "maximum context length")

    # Raw bytes: an unknown field number, malformed bytes, an oversized message.
    raw = channel.unary_stream(f"/{SERVICE}/Generate", request_serializer=None,
                               response_deserializer=pb.GenerateResponse.FromString)
    good = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1, 2]),
                              sampling_params=pb.SamplingParams(max_tokens=1)).SerializeToString()
    check(len(list(raw(good, metadata=md))) == 1, "raw call of a valid message")
    expect_error(lambda: raw(good + bytes([0x98, 0x06, 0x01]), metadata=md), bad, "unknown field number 99")
    nested = pb.SamplingParams(max_tokens=1).SerializeToString() + bytes([0xd0, 0x02, 0x01])  # field 42
    with_nested = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1])).SerializeToString() + \
        bytes([0x22, len(nested)]) + nested
    expect_error(lambda: raw(with_nested, metadata=md), bad, "sampling_params: unknown field number 42")
    expect_error(lambda: raw(b"\x0a\xff\xff", metadata=md), bad, "malformed")
    raw_info = channel.unary_unary(f"/{SERVICE}/GetModelInfo", request_serializer=None,
                                   response_deserializer=pb.GetModelInfoResponse.FromString)
    expect_error(lambda: raw_info(b"\x08\x01", metadata=md), bad, "unknown field number 1")
    expect_error(lambda: generate(stub, md, text="a" * (33 << 20)), grpc.StatusCode.RESOURCE_EXHAUSTED)
    # The server is still up and serving both protocols.
    check(stub.HealthCheck(pb.HealthCheckRequest(), metadata=md).healthy, "healthy after bad input")
    models = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"})
    check(models.status_code == 200 and models.json()["data"][0]["id"] == "mocker-test", "HTTP on the same port")
    results["ok"] = True
    return results


def port(addr, base, key):
    """A separate --grpc-port serves the same engine; the HTTP port still serves gRPC too."""
    md = [("authorization", f"Bearer {key}")]
    out = {}
    for where in [addr, base.removeprefix("http://")]:
        stub = pbg.VllmEngineStub(grpc.insecure_channel(where))
        msgs = [m.chunk for m in generate(stub, md, ids=[1, 2, 3], stream=True, max_tokens=5) if m.HasField("chunk")]
        check(len(msgs) == 5, f"{where}: {len(msgs)} chunks")
        out[where] = len(msgs)
    return {"ok": True, "counts": out}


def startup(addr, base, key):
    """During startup_time: health NOT_SERVING, HealthCheck unhealthy, RPCs UNAVAILABLE; then up."""
    channel = grpc.insecure_channel(addr)
    stub = pbg.VllmEngineStub(channel)
    md = [("authorization", f"Bearer {key}")]
    health = health_pb2_grpc.HealthStub(channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=SERVICE)).status
    check(status == health_pb2.HealthCheckResponse.NOT_SERVING, f"starting: {status}")
    r = stub.HealthCheck(pb.HealthCheckRequest(), metadata=md)
    check(not r.healthy, f"starting: {r}")
    expect_error(lambda: generate(stub, md, ids=[1], max_tokens=1), grpc.StatusCode.UNAVAILABLE, "starting")
    deadline = time.time() + 20
    while health.Check(health_pb2.HealthCheckRequest(service="")).status != health_pb2.HealthCheckResponse.SERVING:
        check(time.time() < deadline, "never SERVING")
        time.sleep(0.1)
    check(len(list(generate(stub, md, ids=[1], max_tokens=1))) == 1, "generate once up")
    return {"ok": True}


if __name__ == "__main__":
    mode, addr, base, key = sys.argv[1:5]
    print(json.dumps({"suite": suite, "port": port, "startup": startup}[mode](addr, base, key)))
