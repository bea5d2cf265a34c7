"""End-to-end checks of `mocker serve --engine-type sglang`'s gRPC service,
sglang.grpc.scheduler.SglangScheduler, with grpcio and stubs generated here from the vendored
proto (helpers from serve_grpc.py), plus the standard health service and server reflection.
Driven by crates/mocker/tests/serve_grpc.rs; prints one JSON line of results.

usage: serve_grpc_sglang.py suite GRPC_ADDR BASE_URL API_KEY [SECOND_GRPC_ADDR]
       (--max-model-len 512, --block-size 16, --embedding-dim 32, --speedup-ratio 1;
        SECOND_GRPC_ADDR: the --grpc-port listener)
"""

import json
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import serve_grpc
from serve_grpc import check, expect_error, gauge, metrics

pb, pbg = serve_grpc.stubs("sglang_scheduler")
SERVICE = "sglang.grpc.scheduler.SglangScheduler"
BAD = grpc.StatusCode.INVALID_ARGUMENT


def params(**kw):
    """What SMG's router sends when a request sets no sampling knobs (SGLang reads every
    field as sent, so a client sets them all), with `kw` over it."""
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    base.update(kw)
    return pb.SamplingParams(**base)


def generate(stub, md, ids, stream=False, rid="", **kw):
    request = pb.GenerateRequest(request_id=rid, stream=stream, tokenized=pb.TokenizedInput(input_ids=ids),
                                 sampling_params=params(**kw))
    return stub.Generate(request, metadata=md)


def usage(base):
    return gauge(metrics(base), "sglang:token_usage")


def wait_freed(base, stub, md, what, held):
    """SGLang's running gauge back to 0 and the token usage settled at no more than `held`
    (what was in use when the abort was sent) plus a page: the request stopped and holds no
    KV. SGLang's usage counts the radix tree's cached pages too, so what the request computed
    stays cached rather than dropping to 0."""
    deadline = time.time() + 5
    while time.time() < deadline:
        m = metrics(base)
        if gauge(m, "sglang:num_running_reqs") == 0:
            info = stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=md)
            check(info.active_requests == 0, f"{what}: active_requests {info.active_requests}")
            settled = gauge(m, "sglang:token_usage")
            check(settled <= held + 16 / 4096, f"{what}: usage {settled}, held {held}")
            time.sleep(0.3)
            check(usage(base) == settled, f"{what}: usage still changing after the abort")
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: running {gauge(m, 'sglang:num_running_reqs')}")


def suite(addr, base, key, second=None):
    results = {}
    channel = grpc.insecure_channel(addr)
    stub = pbg.SglangSchedulerStub(channel)
    md = [("authorization", f"Bearer {key}")]
    expect_error(lambda: stub.GetModelInfo(pb.GetModelInfoRequest()), grpc.StatusCode.UNAUTHENTICATED,
                 "authorization")

    # Standard health and reflection name SGLang's service, not vLLM's.
    health = health_pb2_grpc.HealthStub(channel)
    for name in ["", SERVICE]:
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        check(status == health_pb2.HealthCheckResponse.SERVING, f"health {name!r}: {status}")
    expect_error(lambda: health.Check(health_pb2.HealthCheckRequest(service=serve_grpc.SERVICE)),
                 grpc.StatusCode.NOT_FOUND)
    r = stub.HealthCheck(pb.HealthCheckRequest(), metadata=md)
    check(r.healthy and r.message == "Health check passed", f"HealthCheck {r}")
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(refl.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ])))
    services = {s.name for s in answers[0].list_services_response.service}
    check(SERVICE in services and serve_grpc.SERVICE not in services, f"reflection services {services}")
    check(len(answers[1].file_descriptor_response.file_descriptor_proto) >= 1, "no file descriptors")
    results["reflection_services"] = sorted(services)
    # vLLM's service is the vllm backend's.
    vllm = serve_grpc.pbg.VllmEngineStub(channel)
    expect_error(lambda: vllm.GetModelInfo(serve_grpc.pb.GetModelInfoRequest(), metadata=md),
                 grpc.StatusCode.UNIMPLEMENTED, "served on the vllm backend")

    # Model, server and load info.
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md)
    check(info.model_path == "mocker-test" and info.served_model_name == "mocker-test", f"{info}")
    check(info.max_context_length == 512 and info.max_req_input_len == 511 and info.is_generation, f"{info}")
    check(info.vocab_size > 1000, f"vocab {info.vocab_size}")
    server = stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=md)
    check(server.server_type == "grpc" and server.active_requests == 0 and server.uptime_seconds > 0, f"{server}")
    check(server.max_total_num_tokens == 256 * 16 and server.start_time.seconds > 0, f"{server}")
    check(server.server_args.fields["context_length"].number_value == 512, f"{server.server_args}")
    loads = stub.GetLoads(pb.GetLoadsRequest(), metadata=md)
    check(loads.dp_rank_count == 1 and loads.loads[0].max_total_num_tokens == 4096, f"{loads}")
    check(loads.HasField("aggregate") and loads.loads[0].HasField("queues"), f"{loads}")
    expect_error(lambda: stub.GetLoads(pb.GetLoadsRequest(include=["memory"]), metadata=md), BAD, "include")

    # Streaming: a chunk a token with cumulative counts, then the complete repeating the last.
    prompt = list(range(1000, 1064))
    msgs = list(generate(stub, md, prompt, stream=True, rid="stream-1", max_new_tokens=24))
    check(all(m.request_id == "stream-1" for m in msgs), "request_id on every response")
    chunks = [m.chunk for m in msgs if m.HasField("chunk")]
    completes = [m.complete for m in msgs if m.HasField("complete")]
    check(len(chunks) == 24 and all(len(c.token_ids) == 1 for c in chunks), f"{len(chunks)} chunks")
    check([c.completion_tokens for c in chunks] == list(range(1, 25)), "cumulative completion_tokens")
    check(all(c.prompt_tokens == 64 for c in chunks), "prompt_tokens")
    check(len(completes) == 1 and msgs[-1].HasField("complete"), f"{completes}")
    c = completes[0]
    check(c.finish_reason == "length" and c.completion_tokens == 24, f"{c}")
    check(list(c.output_ids) == list(chunks[-1].token_ids), "complete repeats the last chunk")
    again = [m.chunk for m in generate(stub, md, prompt, stream=True, max_new_tokens=2) if m.HasField("chunk")]
    check(again[0].cached_tokens >= 48, f"cached_tokens {again[0].cached_tokens}")

    # Non-streaming: one complete with every token. (SGLang's protocol has no seed, so the
    # output differs per request: every token id a stop token ends it at the first.)
    c = [m.complete for m in generate(stub, md, [5, 6, 7], rid="plain", max_new_tokens=9)]
    check(len(c) == 1 and len(c[0].output_ids) == 9 and c[0].completion_tokens == 9, f"{c}")
    every = list(range(info.vocab_size))
    stopped = list(generate(stub, md, [5, 6, 7], max_new_tokens=9, stop_token_ids=every))[0].complete
    check(stopped.finish_reason == "stop" and len(stopped.output_ids) == 1, f"{stopped}")
    check(stopped.matched_token_id == stopped.output_ids[0], f"{stopped}")
    held = list(generate(stub, md, [5, 6, 7], max_new_tokens=9, stop_token_ids=every,
                         min_new_tokens=9))[0].complete
    # min_new_tokens holds the stop back to the 9th token.
    check(len(held.output_ids) == 9 and held.matched_token_id == held.output_ids[-1], f"{held}")
    both = [m.complete for m in generate(stub, md, [1, 2, 3], max_new_tokens=4, n=2)]
    check(sorted(x.index for x in both) == [0, 1] and all(len(x.output_ids) == 4 for x in both), f"{both}")
    # Without max_new_tokens (end of sequence ignored) the output runs to the context window.
    c = list(generate(stub, md, [1] * 500, ignore_eos=True))[0].complete
    check(c.completion_tokens == 12 and c.finish_reason == "length", f"context-bound: {c.completion_tokens}")

    # Abort mid-stream: success, the stream ends "abort", the KV freed; unknown ids not found.
    stream = generate(stub, md, list(range(2000, 2100)), stream=True, rid="to-abort", max_new_tokens=400)
    seen = []
    for msg in stream:
        seen.append(msg)
        if len(seen) == 3:
            held = usage(base)
            check(held > 0, "the running request holds KV")
            a = stub.Abort(pb.AbortRequest(request_id="to-abort", reason="test"), metadata=md)
            check(a.success and a.message == "Request to-abort aborted", f"{a}")
    check(seen[-1].HasField("complete") and seen[-1].complete.finish_reason == "abort", f"after abort: {seen[-1]}")
    check(len(seen) < 50, f"{len(seen)} messages after the abort")
    wait_freed(base, stub, md, "abort", held)
    a = stub.Abort(pb.AbortRequest(request_id="unknown-id"), metadata=md)
    check(not a.success and a.message == "Request unknown-id not found", f"{a}")
    results["abort_after_messages"] = len(seen)
    # A non-streaming request aborted: its complete carries the tokens so far.
    box = {}
    t = threading.Thread(target=lambda: box.update(r=list(generate(stub, md, [9] * 40, rid="quiet",
                                                                    max_new_tokens=400))))
    t.start()
    time.sleep(0.3)
    held = usage(base)
    check(stub.Abort(pb.AbortRequest(request_id="quiet"), metadata=md).success, "abort quiet")
    t.join(10)
    c = box["r"][0].complete
    check(c.finish_reason == "abort" and 0 < len(c.output_ids) < 400, f"{c.finish_reason} {len(c.output_ids)}")
    wait_freed(base, stub, md, "non-streaming abort", held)

    # Embed.
    e = stub.Embed(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[4, 5, 6])), metadata=md)
    check(e.embedding_dim == 32 and len(e.embedding) == 32 and e.prompt_tokens == 3, f"{e}")
    expect_error(lambda: stub.Embed(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[1]),
                                                    is_cross_encoder=True), metadata=md), BAD, "is_cross_encoder")

    # Refusals by name.
    expect_error(lambda: stub.Generate(pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1]),
                                                          sampling_params=pb.SamplingParams()), metadata=md),
                 BAD, "sampling_params.top_p")
    expect_error(lambda: generate(stub, md, [1], regex="a+"), BAD, "sampling_params.regex")
    expect_error(lambda: generate(stub, md, [1], logit_bias={"3": 1.0}), BAD, "sampling_params.logit_bias")
    expect_error(lambda: stub.Generate(pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1]),
                                                          sampling_params=params(), return_logprob=True),
                                       metadata=md), BAD, "return_logprob")
    expect_error(lambda: stub.Generate(pb.GenerateRequest(sampling_params=params()), metadata=md), BAD, "tokenized")
    expect_error(lambda: generate(stub, md, [1] * 600, max_new_tokens=1), BAD, "maximum context length")

    # Unknown field numbers, at the top and nested.
    raw = channel.unary_stream(f"/{SERVICE}/Generate", request_serializer=None,
                               response_deserializer=pb.GenerateResponse.FromString)
    good = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1, 2]),
                              sampling_params=params(max_new_tokens=1)).SerializeToString()
    check(len(list(raw(good, metadata=md))) == 1, "raw call of a valid message")
    expect_error(lambda: raw(good + bytes([0x98, 0x06, 0x01]), metadata=md), BAD,
                 "unknown field number 99: this server's sglang.grpc.scheduler protocol")
    nested = params(max_new_tokens=1).SerializeToString() + bytes([0xd0, 0x02, 0x01])  # field 42
    with_nested = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1])).SerializeToString() + \
        bytes([0x22, len(nested)]) + nested
    expect_error(lambda: raw(with_nested, metadata=md), BAD, "sampling_params: unknown field number 42")
    check(stub.HealthCheck(pb.HealthCheckRequest(), metadata=md).healthy, "healthy after bad input")

    # The --grpc-port listener serves the same service.
    if second:
        other = pbg.SglangSchedulerStub(grpc.insecure_channel(second))
        chunks = [m for m in generate(other, md, [1, 2, 3], stream=True, max_new_tokens=5) if m.HasField("chunk")]
        check(len(chunks) == 5, f"--grpc-port: {len(chunks)} chunks")
    results["ok"] = True
    return results


if __name__ == "__main__":
    mode, addr, base, key, *rest = sys.argv[1:]
    print(json.dumps({"suite": suite}[mode](addr, base, key, *rest)))
