"""Request fields of `mocker serve` through the openai SDK: token-faithful text (re-encoded
client-side with the `tokenizers` package), seed, stop / stop_token_ids / min_tokens /
include_stop_str_in_output (with the stopped request's KV freed), echo, chat's default
output length, and the 400s naming each field mocker does not simulate. Driven by
crates/mocker/tests/serve_e2e.rs; prints one JSON line of results.

usage: serve_fields.py BASE_URL API_KEY TOKENIZER_JSON MAX_MODEL_LEN
"""

import json
import sys
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

MODEL = "mocker-test"


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

    # Chat without an output length runs to the end of the context, as vLLM does.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
    assert r.usage.completion_tokens == max_model_len - r.usage.prompt_tokens, r.usage
    assert r.choices[0].finish_reason == "length"
    r = client.completions.create(model=MODEL, prompt=prompt)
    assert r.usage.completion_tokens == 16

    # ignore_eos is accepted (the simulated model never samples EOS either way).
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 9

    # What mocker does not simulate is refused, naming the field; the harmless values pass.
    msgs = [{"role": "user", "content": prompt}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    refused = {
        "logprobs": lambda: client.chat.completions.create(model=MODEL, messages=msgs, logprobs=True, top_logprobs=2),
        "top_logprobs": lambda: client.chat.completions.create(model=MODEL, messages=msgs, top_logprobs=2),
        "tools": lambda: client.chat.completions.create(model=MODEL, messages=msgs, tools=tools),
        "response_format": lambda: client.chat.completions.create(
            model=MODEL, messages=msgs, response_format={"type": "json_object"}
        ),
        "n": lambda: client.chat.completions.create(model=MODEL, messages=msgs, n=2),
        "messages[0].content[1]": lambda: client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ]}],
        ),
        "suffix": lambda: client.completions.create(model=MODEL, prompt=prompt, suffix="end"),
        "stop": lambda: client.completions.create(model=MODEL, prompt=prompt, extra_body={"stop": 5}),
    }
    for param, call in refused.items():
        expect_400(param, call)
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
