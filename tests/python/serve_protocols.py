"""`mocker serve`'s other protocols: Anthropic's Messages API (/v1/messages,
/v1/messages/count_tokens) through the anthropic SDK, vLLM's tokens-in/tokens-out route
(/inference/v1/generate) and its pooling routes (/rerank, /score, /pooling) through httpx, and
bad input on each (a clear 4xx, the server serving on). Driven by
crates/mocker/tests/serve_protocols.rs, which starts the server with --max-model-len 512
--image-tokens 100 --enable-sleep-mode; prints one JSON line of results.

usage: serve_protocols.py BASE_URL API_KEY
"""

import json
import sys

import anthropic
import httpx
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"
IMAGE_TOKENS = 100
MAX_MODEL_LEN = 512
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def sample(base, name):
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            if s.name == name:
                total += s.value
    return total


def chat_count(http, base, messages):
    """Prompt tokens of chat `messages` as /tokenize counts them."""
    r = http.post(f"{base}/tokenize", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def sse_events(text):
    """(event name, data) pairs of an Anthropic event stream."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def sse_data(text):
    """The JSON payloads of an OpenAI-style `data:` stream, and whether it ended with [DONE]."""
    frames = [f[len("data: "):] for f in text.split("\n\n") if f.startswith("data: ")]
    done = bool(frames) and frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames if f != "[DONE]"], done


def anthropic_error(r, status, needle):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "error" and needle in body["error"]["message"], body
    return body


def check_messages(base, key, http):
    client = anthropic.Anthropic(base_url=base, auth_token=key, max_retries=0)
    system = "You answer briefly."
    question = "What is the tallest mountain in the world?"
    expected = chat_count(http, base, [{"role": "system", "content": system}, {"role": "user", "content": question}])

    prompts_before = sample(base, "vllm:prompt_tokens_total")
    m = client.messages.create(model=MODEL, max_tokens=8, system=system,
                               messages=[{"role": "user", "content": question}])
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL, m
    assert m.id.startswith("chatcmpl-"), m.id
    assert [b.type for b in m.content] == ["text"] and m.content[0].text, m.content
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None, m
    assert m.usage.output_tokens == 8 and m.usage.input_tokens == expected, (m.usage, expected)
    # The request fed the engine's metrics like a chat request.
    assert sample(base, "vllm:prompt_tokens_total") - prompts_before == expected

    counted = client.messages.count_tokens(model=MODEL, system=system,
                                           messages=[{"role": "user", "content": question}])
    assert counted.input_tokens == expected, (counted, expected)

    # Streamed: the SDK assembles the events into the same message shape.
    with client.messages.stream(model=MODEL, max_tokens=6, system=system,
                                messages=[{"role": "user", "content": question}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.usage.output_tokens == 6 and final.usage.input_tokens == expected, final.usage
    assert final.stop_reason == "max_tokens" and final.content[0].type == "text", final
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds

    # The raw event sequence, exactly.
    raw = http.post(f"{base}/v1/messages", json={
        "model": MODEL, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": question}]})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream"), raw.text
    events = sse_events(raw.text)
    names = [n for n, _ in events]
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * 3 + [
        "content_block_stop", "message_delta", "message_stop"], names
    assert all(d["type"] == n for n, d in events), events
    start = events[0][1]["message"]
    assert (start["type"], start["role"], start["content"]) == ("message", "assistant", []), start
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert events[6][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}, events[6]
    assert events[6][1]["usage"]["output_tokens"] == 3, events[6]

    # stop_sequences: the output ends before the first match, which stop_sequence names.
    stops = ["e", "a"]
    s = client.messages.create(model=MODEL, max_tokens=200, stop_sequences=stops,
                               messages=[{"role": "user", "content": question}])
    assert s.stop_reason == "stop_sequence" and s.stop_sequence in stops, s
    out = "".join(b.text for b in s.content)
    assert "e" not in out and "a" not in out, out
    with client.messages.stream(model=MODEL, max_tokens=200, stop_sequences=stops,
                                messages=[{"role": "user", "content": question}]) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence in stops, streamed

    # An image block counts as the chat path's image: --image-tokens ids more.
    with_image = client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": question}]}])
    image_count = chat_count(http, base, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "text", "text": question}]}])
    assert with_image.usage.input_tokens == image_count, (with_image.usage, image_count)
    assert image_count >= IMAGE_TOKENS

    # Tools: a forced call comes back as a tool_use block whose input fits the schema.
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    t = client.messages.create(model=MODEL, max_tokens=100, tools=tools, tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert t.stop_reason == "tool_use" and t.content[-1].type == "tool_use", t
    call = t.content[-1]
    assert call.name == "get_weather" and isinstance(call.input["city"], str), call
    with client.messages.stream(model=MODEL, max_tokens=100, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather in Paris?"}]) as stream:
        tool_final = stream.get_final_message()
    assert tool_final.stop_reason == "tool_use" and isinstance(tool_final.content[-1].input["city"], str), tool_final
    # The call and its result go back as the next turn.
    follow = client.messages.create(model=MODEL, max_tokens=2, tools=tools, tool_choice={"type": "none"}, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}])
    assert follow.stop_reason == "max_tokens" and follow.content[0].type == "text", follow

    # Bad input: Anthropic-shaped 4xx naming the field, through the SDK and raw.
    try:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                               thinking={"type": "enabled", "budget_tokens": 1024})
        raise AssertionError("thinking accepted")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error" and "thinking" in e.body["error"]["message"], e.body
    try:
        client.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("unknown model accepted")
    except anthropic.NotFoundError as e:
        assert "nope" in e.body["error"]["message"], e.body
    anthropic_error(http.post(f"{base}/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
                    400, "max_tokens")
    anthropic_error(http.post(f"{base}/v1/messages", content=b"{not json",
                              headers={"content-type": "application/json"}), 400, "malformed JSON")
    anthropic_error(http.post(f"{base}/v1/messages", json={"model": MODEL, "max_tokens": 4, "top_x": 1,
                                                         "messages": [{"role": "user", "content": "x"}]}), 400, "top_x")
    anthropic_error(http.post(f"{base}/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]}), 400, "document")
    anthropic_error(http.post(f"{base}/v1/messages", json={"model": MODEL, "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "x"}] * 4097}),
                    400, "at most 4096 messages")
    anthropic_error(http.post(f"{base}/v1/messages", json={"model": MODEL, "max_tokens": 600,
                                                         "messages": [{"role": "user", "content": "x"}]}),
                    400, "maximum context length")
    anthropic_error(http.post(f"{base}/v1/messages/count_tokens", json={"model": MODEL, "messages": []}),
                    400, "messages")
    big = http.post(f"{base}/v1/messages", content=b"x" * (33 << 20), headers={"content-type": "application/json"})
    assert big.status_code == 413, big.status_code
    # The API key is a bearer token, as vLLM reads it (this SDK sends its api_key as one);
    # a bare x-api-key header is not, as in vLLM.
    by_key = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0).messages.create(
        model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert by_key.usage.output_tokens == 1
    bare = httpx.post(f"{base}/v1/messages", headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                      json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
    assert bare.status_code == 401, bare.text
    ok = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "still there?"}])
    assert ok.usage.output_tokens == 2
    return {"messages_input_tokens": expected, "stop_sequence": s.stop_sequence, "tool": call.input}


def check_generate(base, key, http):
    url = f"{base}/inference/v1/generate"
    ids = http.post(f"{base}/tokenize", json={"prompt": "the quick brown fox jumps over the lazy dog"}).json()["tokens"]
    vocab_ok = lambda out: http.post(f"{base}/detokenize", json={"tokens": out}).status_code == 200

    r = http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 6, "seed": 7}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"].startswith("generate-tokens-"), body
    assert set(body) == {"request_id", "choices", "prompt_logprobs", "kv_transfer_params"}, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 6, choice
    assert vocab_ok(choice["token_ids"])
    again = http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 6, "seed": 7}},
                      headers={"x-request-id": "abc"}).json()
    assert again["choices"][0]["token_ids"] == choice["token_ids"], "the same seed gives the same ids"
    assert again["request_id"] == "generate-tokens-abc", again

    # stop_token_ids act as on /v1/completions: the output ends at (and with) the stop token.
    long = http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 30, "seed": 3}}).json()
    out = long["choices"][0]["token_ids"]
    stop = out[5]
    stopped = http.post(url, json={"token_ids": ids, "sampling_params": {
        "max_tokens": 30, "seed": 3, "stop_token_ids": [stop]}}).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["token_ids"] == out[:out.index(stop) + 1], (stopped, out)

    n2 = http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 2, "n": 2}}).json()
    assert sorted(c["index"] for c in n2["choices"]) == [0, 1], n2

    # Streamed: delta ids, the finish on the last, the usage frame when asked, [DONE].
    prompts_before = sample(base, "vllm:prompt_tokens_total")
    s = http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 5}, "stream": True,
                             "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream"), s.text
    frames, done = sse_data(s.text)
    assert done, s.text
    content = [f for f in frames if f["choices"]]
    streamed = [t for f in content for t in f["choices"][0]["token_ids"]]
    assert len(streamed) == 5 and vocab_ok(streamed), frames
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert all(f["choices"][0]["finish_reason"] is None for f in content[:-1]), content
    assert all(f["request_id"].startswith("generate-tokens-") and f["usage"] for f in content), content
    usage = frames[-1]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == len(ids), usage
    assert usage["usage"]["completion_tokens"] == 5, usage
    assert sample(base, "vllm:prompt_tokens_total") - prompts_before == len(ids)
    plain, done = sse_data(http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 2},
                                                "stream": True}).text)
    assert done and all(f["choices"] and f["usage"] is None for f in plain), plain

    # Bad input: 400 naming the field; the context window; the key.
    def refused(body, param, status=400, **kw):
        r = http.post(url, json=body, **kw) if body is not None else http.post(url, **kw)
        assert r.status_code == status, (r.status_code, r.text)
        if param:
            assert r.json()["error"]["param"] == param, (r.text, param)

    sp = {"max_tokens": 2}
    refused({"sampling_params": sp}, "token_ids")
    refused({"token_ids": [1, -1], "sampling_params": sp}, "token_ids")
    refused({"token_ids": ids}, "sampling_params")
    refused({"token_ids": ids, "sampling_params": sp, "prompt": "x"}, "prompt")
    refused({"token_ids": ids, "sampling_params": {"logit_bias": {"5": 1.0}}}, "sampling_params.logit_bias")
    refused({"token_ids": ids, "sampling_params": {"structured_outputs": {"json": {}}}}, "sampling_params.structured_outputs")
    refused({"token_ids": ids, "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens")
    refused({"token_ids": ids, "sampling_params": sp, "kv_transfer_params": {"do_remote_decode": True}},
            "kv_transfer_params")
    refused({"token_ids": ids, "sampling_params": {"max_tokens": MAX_MODEL_LEN}}, "max_tokens")
    refused({"token_ids": [1] * MAX_MODEL_LEN, "sampling_params": sp}, "prompt")
    refused(None, None, content=b"[1,2", headers={"content-type": "application/json"})
    assert httpx.post(url, json={"token_ids": ids, "sampling_params": sp}).status_code == 401
    ok = http.post(url, json={"token_ids": ids, "sampling_params": {"max_tokens": 1}})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) == 1
    return {"generate_ids": choice["token_ids"]}


def check_pooling(base, key, http):
    count = lambda text, special=True: len(http.post(f"{base}/tokenize", json={
        "prompt": text, "add_special_tokens": special}).json()["tokens"])
    query, docs = "capital of france", ["paris is the capital of france", "bananas are yellow", "capital of france"]
    pair_tokens = sum(count(query) + count(d, False) for d in docs)
    queries_before = sample(base, "vllm:prefix_cache_queries_total")
    r = http.post(f"{base}/rerank", json={"model": MODEL, "query": query, "documents": docs, "top_n": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("score-") and body["model"] == MODEL, body
    assert body["usage"] == {"prompt_tokens": pair_tokens, "total_tokens": pair_tokens}, (body["usage"], pair_tokens)
    results = body["results"]
    assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"], results
    # The query scores 1 against itself: the pseudo-score is (1 + cos) / 2 of the texts' vectors.
    assert results[0]["index"] == 2 and abs(results[0]["relevance_score"] - 1.0) < 1e-6, results
    assert results[0]["document"] == {"text": docs[2], "multi_modal": None}, results
    # Every pair went through the engine (its prompt was looked up in the prefix cache).
    assert sample(base, "vllm:prefix_cache_queries_total") >= queries_before + pair_tokens
    for path in ["/v1/rerank", "/v2/rerank"]:
        again = http.post(f"{base}{path}", json={"query": query, "documents": docs}).json()
        assert [x["index"] for x in again["results"]][:2] == [x["index"] for x in results], again
        assert len(again["results"]) == 3

    s = http.post(f"{base}/score", json={"model": MODEL, "queries": query, "documents": docs}).json()
    assert s["object"] == "list" and [d["object"] for d in s["data"]] == ["score"] * 3, s
    assert [d["index"] for d in s["data"]] == [0, 1, 2], s
    by_index = {x["index"]: x["relevance_score"] for x in again["results"]}
    assert all(abs(d["score"] - by_index[d["index"]]) < 1e-9 for d in s["data"]), (s, by_index)
    assert s["usage"]["prompt_tokens"] == pair_tokens and s["usage"]["completion_tokens"] == 0, s
    legacy = http.post(f"{base}/v1/score", json={"text_1": ["a", "b"], "text_2": ["a", "c"]}).json()
    assert len(legacy["data"]) == 2 and abs(legacy["data"][0]["score"] - 1.0) < 1e-6, legacy

    p = http.post(f"{base}/pooling", json={"model": MODEL, "input": ["hello world", "second input"]}).json()
    assert [d["object"] for d in p["data"]] == ["pooling", "pooling"] and p["id"].startswith("pool-"), p
    assert p["usage"]["prompt_tokens"] == count("hello world") + count("second input"), p
    emb = http.post(f"{base}/v1/embeddings", json={"model": MODEL, "input": "hello world"}).json()
    assert p["data"][0]["data"] == emb["data"][0]["embedding"], "pooling embeds as /v1/embeddings does"

    def refused(path, body, param, status=400):
        r = http.post(f"{base}{path}", json=body)
        assert r.status_code == status, (path, r.status_code, r.text)
        if param:
            assert r.json()["error"]["param"] == param, (path, r.text)

    refused("/rerank", {"query": query, "documents": docs, "return_documents": True}, "return_documents")
    refused("/rerank", {"documents": docs}, "query")
    refused("/rerank", {"query": query, "documents": []}, "documents")
    refused("/rerank", {"query": query, "documents": ["d"] * 2049}, "documents")
    refused("/rerank", {"query": query, "documents": ["word " * 600]}, "documents")
    refused("/rerank", {"model": "nope", "query": query, "documents": docs}, "model", 404)
    refused("/score", {"queries": ["a", "b"], "documents": ["a", "b", "c"]}, "documents")
    refused("/score", {"queries": "a"}, "documents")
    refused("/pooling", {"input": "x", "task": "token_classify"}, "task")
    refused("/pooling", {"input": "x", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens")
    refused("/pooling", {"input": []}, "input")
    bad_json = http.post(f"{base}/score", content=b"{", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "malformed JSON" in bad_json.text, bad_json.text
    for path in ["/rerank", "/score", "/pooling"]:
        assert httpx.post(f"{base}{path}", json={}).status_code == 401, path
    ok = http.post(f"{base}/rerank", json={"query": "q", "documents": ["d"]})
    assert ok.status_code == 200
    return {"rerank": results}


def check_sleep(base, http):
    assert http.post(f"{base}/sleep?level=1").status_code == 200
    for path, body in [("/inference/v1/generate", {"token_ids": [1], "sampling_params": {}}),
                       ("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
                       ("/rerank", {"query": "q", "documents": ["d"]}), ("/pooling", {"input": "x"})]:
        r = http.post(f"{base}{path}", json=body)
        assert r.status_code == 503, (path, r.status_code, r.text)
    assert http.post(f"{base}/wake_up").status_code == 200
    for path, body in [("/inference/v1/generate", {"token_ids": [1], "sampling_params": {}}),
                       ("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})]:
        r = http.post(f"{base}{path}", json=body, headers={"x-return-error": "429"})
        assert r.status_code == 429, (path, r.status_code, r.text)


def main():
    base, key = sys.argv[1], sys.argv[2]
    http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    result = {}
    result.update(check_messages(base, key, http))
    result.update(check_generate(base, key, http))
    result.update(check_pooling(base, key, http))
    check_sleep(base, http)
    result["ok"] = True
    print(json.dumps(result))


if __name__ == "__main__":
    main()
