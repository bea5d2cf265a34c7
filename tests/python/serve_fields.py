"""Request fields of `mocker serve` through the openai SDK: token-faithful text (re-encoded
client-side with the `tokenizers` package), seed, stop / stop_token_ids / min_tokens /
include_stop_str_in_output (with the stopped request's KV freed), echo, chat's default
output length, logprobs, n (sharing the prompt's KV), response_format, tools, images, and
the 400s naming each field mocker does not simulate. Driven by
crates/mocker/tests/serve_e2e.rs; prints one JSON line of results.

usage: serve_fields.py BASE_URL API_KEY TOKENIZER_JSON MAX_MODEL_LEN IMAGE_TOKENS
"""

import json
import sys
import time

import httpx
import jsonschema
import openai
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

MODEL = "mocker-test"
IMAGE_TOKENS = int(sys.argv[5]) if len(sys.argv) > 5 else 256


def sample(base, name, **labels):
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def expect_400(param, fn):
    try:
        fn()
    except openai.BadRequestError as e:
        got = e.response.json()["error"]["param"]
        assert got == param, (got, param, e.message)
        return e.message
    raise AssertionError(f"{param}: expected HTTP 400")


def streamed_text(stream, field):
    text, finish, stop_reason = "", None, None
    for chunk in stream:
        for c in chunk.choices:
            text += (c.delta.content if field == "chat" else c.text) or ""
            if c.finish_reason:
                finish = c.finish_reason
                stop_reason = getattr(c, "stop_reason", None) or (c.model_extra or {}).get("stop_reason")
    return text, finish, stop_reason


PERSON = {
    "$defs": {"pet": {"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog", "fish"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
    }, "required": ["kind", "age"], "additionalProperties": False}},
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "full name"},
        "height": {"type": "number", "minimum": 1.2, "maximum": 2.2},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}},
        "alive": {"type": "boolean"},
        "spouse": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["name", "height", "tags", "pets", "alive"],
    "additionalProperties": False,
}


def count(tok, text):
    return len(tok.encode(text, add_special_tokens=False).ids)


def check_chat_logprobs(content, entries, k):
    assert "".join(e.token for e in entries) == content, (content, entries[:3])
    for e in entries:
        assert e.logprob <= 0 and bytes(e.bytes) == e.token.encode()
        tops = e.top_logprobs
        assert len(tops) == k
        values = [t.logprob for t in tops]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values), values
        if k:
            assert any(t.token == e.token and t.logprob == e.logprob for t in tops), e
            assert len({t.token for t in tops}) == k


def fields_beyond_text(client, base, tok, prompt, results):
    msgs = [{"role": "user", "content": prompt}]

    # logprobs (chat): one entry per generated token, well-formed, seeded -> identical,
    # streamed -> the same entries spread over the chunks.
    def chat_lp(**kw):
        return client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=12, seed=21, logprobs=True, top_logprobs=3, **kw
        )

    r = chat_lp()
    c = r.choices[0]
    assert len(c.logprobs.content) == r.usage.completion_tokens == 12
    check_chat_logprobs(c.message.content, c.logprobs.content, 3)
    assert chat_lp().choices[0].logprobs == c.logprobs
    streamed = []
    for chunk in chat_lp(stream=True):
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                streamed.extend(ch.logprobs.content)
    assert streamed == c.logprobs.content
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, logprobs=True)
    check_chat_logprobs(r.choices[0].message.content, r.choices[0].logprobs.content, 0)

    # logprobs (completions): the four columns line up with the text.
    def cmpl_lp(**kw):
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, seed=22, logprobs=2, **kw)

    r = cmpl_lp()
    c = r.choices[0]
    lp = c.logprobs
    assert "".join(lp.tokens) == c.text and len(lp.tokens) == 10
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert v <= 0 and len(top) == 2 and top[t] == v and all(x <= 0 for x in top.values()), top
    s_tokens, s_values = [], []
    for chunk in cmpl_lp(stream=True):
        for ch in chunk.choices:
            if ch.logprobs:
                s_tokens += ch.logprobs.tokens
                s_values += ch.logprobs.token_logprobs
    assert (s_tokens, s_values) == (lp.tokens, lp.token_logprobs)
    results["logprobs_sample"] = lp.token_logprobs[:3]

    # n: n choices indexed 0..n-1, each its own text of max_tokens tokens, usage summing them;
    # streamed chunks tagged by index.
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 3
    assert all(count(tok, c.text) == 8 and c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 24
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, n=3, seed=5)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    texts, finishes, usage = {}, {}, None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=6, n=4, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(texts) == [0, 1, 2, 3] and finishes == {i: "length" for i in range(4)}, finishes
    assert all(count(tok, t) == 6 for t in texts.values()) and usage.completion_tokens == 24
    # The n children share the prompt's KV: n - 1 of them hit its full blocks in the prefix
    # cache, exactly what one later request with the (now cached) prompt hits.
    # (A fresh prompt: nothing of it is cached yet.)
    long_prompt = f"run {time.time_ns()} " + " ".join(f"shared{i}" for i in range(120))
    hits = lambda: sample(base, "vllm:prefix_cache_hits_total")
    h0 = hits()
    client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=2, n=4)
    h1 = hits()
    client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=2)
    one = hits() - h1
    assert one > 0 and h1 - h0 == 3 * one, (h1 - h0, one)
    results["n_shared_hits"] = h1 - h0

    # response_format: valid JSON (matching the schema), token-faithful, finish "stop";
    # seeded -> same JSON; too few tokens -> the truncated text with finish "length".
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=200, response_format={"type": "json_object"}
    )
    c = r.choices[0]
    assert isinstance(json.loads(c.message.content), dict) and c.finish_reason == "stop"
    assert count(tok, c.message.content) == r.usage.completion_tokens
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    docs = []
    for seed in range(8):
        r = client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=300, seed=seed, response_format=fmt
        )
        c = r.choices[0]
        doc = json.loads(c.message.content)
        jsonschema.validate(doc, PERSON)
        assert c.finish_reason == "stop" and count(tok, c.message.content) == r.usage.completion_tokens
        docs.append(c.message.content)
    assert len(set(docs)) == 8
    seeded = lambda **kw: client.chat.completions.create(
        model=MODEL, messages=msgs, seed=3, response_format=fmt, **kw
    )
    full = seeded(max_tokens=300).choices[0].message.content
    assert seeded(max_tokens=300).choices[0].message.content == full
    short = seeded(max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    assert full.startswith(short.choices[0].message.content)
    text, finish, _ = streamed_text(seeded(max_tokens=300, stream=True), "chat")
    assert (text, finish) == (full, "stop")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=300, extra_body={"response_format": fmt})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    results["json_sample"] = full

    # tools: required / named always call, with schema-valid arguments; none never; auto
    # calls on some seeds and not on others; streamed as tool_call deltas.
    weather = {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
    ]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    tmsgs = [{"role": "user", "content": "what is the weather in paris"}]

    def tool_call(choice, **kw):
        r = client.chat.completions.create(model=MODEL, messages=tmsgs, tools=tools, tool_choice=choice, **kw)
        c = r.choices[0]
        if c.finish_reason != "tool_calls":
            assert not c.message.tool_calls
            return None
        assert c.message.content is None and len(c.message.tool_calls) == 1
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        return call.function.name

    assert tool_call("required") in schemas
    named = {"type": "function", "function": {"name": "get_time"}}
    assert {tool_call(named, seed=s) for s in range(5)} == {"get_time"}
    assert tool_call("none") is None
    auto = [tool_call("auto", seed=s) for s in range(24)]
    assert any(a is None for a in auto) and any(a is not None for a in auto), auto
    assert auto == [tool_call("auto", seed=s) for s in range(24)]
    calls, finish = {}, None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=tmsgs, tools=tools, tool_choice=named, stream=True, seed=1
    ):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
                entry["id"] = entry["id"] or d.id
                entry["name"] = entry["name"] or (d.function.name if d.function else None)
                entry["args"] += (d.function.arguments or "") if d.function else ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0] and calls[0]["name"] == "get_time"
    jsonschema.validate(json.loads(calls[0]["args"]), schemas["get_time"])
    results["tool_args"] = calls[0]["args"]

    # Images: each image_url part counts --image-tokens prompt tokens (ids hashed from the
    # URL), so a repeated image hits the prefix cache and a different one does not.
    def with_image(url, text="describe it"):
        return client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}])

    plain = client.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "describe it"}]
    )
    a = with_image("data:image/png;base64,AAAA")
    assert a.usage.prompt_tokens == plain.usage.prompt_tokens + IMAGE_TOKENS, (a.usage, plain.usage)
    a2 = with_image("data:image/png;base64,AAAA", "describe it again")
    b = with_image("data:image/png;base64,BBBB", "describe it again")
    hit = lambda r: r.usage.prompt_tokens_details.cached_tokens
    assert hit(a2) >= IMAGE_TOKENS // 2 and hit(b) < hit(a2), (hit(a2), hit(b))
    two = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/b.png", "detail": "low"}},
        {"type": "text", "text": "describe it"}]}])
    assert two.usage.prompt_tokens == plain.usage.prompt_tokens + 2 * IMAGE_TOKENS
    # /tokenize counts a chat's images the same way.
    counted = httpx.post(f"{base}/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "describe it"}]}]}).json()
    assert counted["count"] == a.usage.prompt_tokens, (counted["count"], a.usage)
    results["image_cached"] = [hit(a2), hit(b)]


def main(base, key, tokenizer_path, max_model_len):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    tok = Tokenizer.from_file(tokenizer_path)
    tok.no_padding()
    tok.no_truncation()
    results = {}
    prompt = "simulated engines answer every request with plausible words"

    # Token-faithful: the client's re-encoding of the text gives exactly the reported count
    # and ids, streamed or not, chat or completions.
    for max_tokens in (1, 7, 200):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens)
        ids = tok.encode(r.choices[0].text, add_special_tokens=False).ids
        assert len(ids) == r.usage.completion_tokens == max_tokens, (len(ids), r.usage, r.choices[0].text)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True
        )
        text, finish, _ = streamed_text(stream, "chat")
        assert finish == "length"
        assert len(tok.encode(text, add_special_tokens=False).ids) == max_tokens, text

    # seed: same seed and prompt, same text (chat and completions); no seed, new text.
    def completion(**kw):
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, **kw).choices[0].text

    a, b = completion(seed=11), completion(seed=11)
    assert a == b, (a, b)
    assert completion(seed=12) != a
    assert completion() != completion()
    chat = lambda **kw: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=24, **kw
    ).choices[0].message.content
    assert chat(seed=5) == chat(seed=5) != chat(seed=6)
    results["seeded_text"] = a

    # stop: a word from the middle of a seeded output ends the output just before it
    # (finish_reason "stop", stop_reason the string), streamed or not; the engine request
    # is cancelled there, so its KV is freed and the stop is counted.
    long = client.completions.create(model=MODEL, prompt=prompt, max_tokens=300, seed=3).choices[0].text
    words = long.split(" ")[1:]
    word = words[10]
    cut = long.index(" " + word)
    before = sample(base, "vllm:request_success_total", finished_reason="stop")
    gen_before = sample(base, "vllm:generation_tokens_total")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=300, seed=3, stop=[" " + word, "zzzz"])
    c = r.choices[0]
    assert (c.text, c.finish_reason, c.model_extra["stop_reason"]) == (long[:cut], "stop", " " + word), c
    assert r.usage.completion_tokens == len(tok.encode(long[:cut], add_special_tokens=False).ids) + 1, r.usage
    deadline = time.time() + 3
    while sample(base, "vllm:num_requests_running") or sample(base, "vllm:kv_cache_usage_perc"):
        assert time.time() < deadline, "stopped request still holds KV"
        time.sleep(0.02)
    assert sample(base, "vllm:request_success_total", finished_reason="stop") == before + 1
    # Far fewer than max_tokens were generated: the engine stopped at the stop.
    assert sample(base, "vllm:generation_tokens_total") - gen_before < 300 // 2
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=300, seed=3, stop=" " + word, stream=True
    )
    assert streamed_text(stream, "completions") == (long[:cut], "stop", " " + word)
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=300, seed=3, stop=[" " + word],
        extra_body={"include_stop_str_in_output": True},
    )
    assert r.choices[0].text == long[: cut + len(word) + 1]
    # A stop string split across tokens ("ab" + " cd" -> "b c") still matches.
    split = words[4][-1] + " " + words[5][0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=300, seed=3, stop=split)
    assert r.choices[0].text == long[: long.index(split)], (split, r.choices[0].text)

    # stop_token_ids: the id of that word (client-side) ends the output there; min_tokens
    # keeps an earlier occurrence from stopping.
    word_id = tok.encode(" " + word, add_special_tokens=False).ids[0]
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=300, seed=4
    )
    chat_long = r.choices[0].message.content
    chat_ids = tok.encode(chat_long, add_special_tokens=False).ids
    stop_id = chat_ids[6]
    first = chat_ids.index(stop_id)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=300, seed=4,
        extra_body={"stop_token_ids": [stop_id]},
    )
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == stop_id, c
    assert tok.encode(c.message.content, add_special_tokens=False).ids == chat_ids[:first]
    assert r.usage.completion_tokens == first + 1
    later = [i for i, t in enumerate(chat_ids) if t == stop_id and i > first]
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=300, seed=4,
        extra_body={"stop_token_ids": [stop_id], "min_tokens": first + 2},
    )
    expect_len = later[0] if later else 300
    assert r.usage.completion_tokens == (later[0] + 1 if later else 300), (r.usage, later)
    assert tok.encode(r.choices[0].message.content, add_special_tokens=False).ids == chat_ids[:expect_len]
    results["stop_word"], results["stop_token"] = word, stop_id
    del word_id

    # echo: the prompt leads the text; the count is still the generated tokens.
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, echo=True, seed=1)
    assert r.choices[0].text == prompt + completion(seed=1)[: len(r.choices[0].text) - len(prompt)]
    assert r.choices[0].text.startswith(prompt) and r.usage.completion_tokens == 5
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, echo=True, seed=1, stream=True)
    assert streamed_text(stream, "completions")[0] == r.choices[0].text

    # Chat without an output length ends at a simulated end-of-sequence ("stop"), or at the
    # end of the context ("length") when the drawn length does not fit; with ignore_eos it
    # runs to the end of the context, as vLLM does.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
    room = max_model_len - r.usage.prompt_tokens
    assert 1 <= r.usage.completion_tokens <= room, r.usage
    assert r.choices[0].finish_reason == ("stop" if r.usage.completion_tokens < room else "length"), r
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == max_model_len - r.usage.prompt_tokens, r.usage
    assert r.choices[0].finish_reason == "length"
    r = client.completions.create(model=MODEL, prompt=prompt)
    assert r.usage.completion_tokens == 16

    # ignore_eos with an explicit length: exactly that length (an explicit length ends there
    # with or without it).
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 9

    fields_beyond_text(client, base, tok, prompt, results)

    # What mocker does not simulate is refused, naming the field; the harmless values pass.
    msgs = [{"role": "user", "content": prompt}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    refused = {
        "top_logprobs": lambda: client.chat.completions.create(model=MODEL, messages=msgs, top_logprobs=2),
        "logprobs": lambda: client.completions.create(model=MODEL, prompt=prompt, logprobs=21),
        "n": lambda: client.chat.completions.create(model=MODEL, messages=msgs, n=129),
        "response_format": lambda: client.chat.completions.create(
            model=MODEL, messages=msgs, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "string", "format": "date-time"}}}
        ),
        "tools[0]": lambda: client.chat.completions.create(model=MODEL, messages=msgs, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]),
        "tool_choice": lambda: client.chat.completions.create(
            model=MODEL, messages=msgs, tools=tools, tool_choice={"type": "function", "function": {"name": "g"}}
        ),
        "messages[0].content[1]": lambda: client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ]}],
        ),
        "suffix": lambda: client.completions.create(model=MODEL, prompt=prompt, suffix="end"),
        "stop": lambda: client.completions.create(model=MODEL, prompt=prompt, extra_body={"stop": 5}),
    }
    for param, call in refused.items():
        message = expect_400(param, call)
        if param == "response_format":
            assert "format" in message, message
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=2, logprobs=False, tools=tools, tool_choice="none",
        response_format={"type": "text"}, stop=None, n=1,
    )
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls
    results["refused"] = sorted(refused)
    results["ok"] = True
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
