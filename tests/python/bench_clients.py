"""The real benchmark clients (aiperf, guidellm, inference-perf) against `mocker serve`, each
run as its own program from its own venv, with its report parsed and checked. Driven by
crates/mocker/tests/serve_bench_clients.rs, which starts the server on 127.0.0.1; prints one
JSON line of results (the measured numbers and `ok`).

usage: bench_clients.py aiperf EXE BASE_URL API_KEY CLIENT_TOKENIZER ENDPOINT SAME_TOKENIZER WORKDIR
       bench_clients.py guidellm EXE BASE_URL API_KEY CLIENT_TOKENIZER ENDPOINT WORKDIR
       bench_clients.py inference-perf EXE BASE_URL API_KEY CLIENT_TOKENIZER WORKDIR

ENDPOINT is `chat` or `completions`. CLIENT_TOKENIZER is a local Hugging Face tokenizer folder
the client counts tokens with (nothing is downloaded). SAME_TOKENIZER (`yes`/`no`) says whether
the server tokenizes with that same tokenizer, so that its prompt counts must agree with the
client's as well.

Every client counts output tokens by re-tokenizing the streamed text (aiperf without
--use-server-token-count, inference-perf by default; for guidellm, which takes the server's
usage, the text is re-tokenized here), so the checks hold only if mocker's text is
token-faithful to the tokenizer it serves with.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

MODEL = "mocker-test"
REQUESTS = 40
ISL = 128
OSL = 64
# The tokenizer is a local folder; nothing is to be fetched from a hub. aiperf 0.13.0 is run
# without these: in offline mode it looks a local path up as a hub repo id and fails.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run(cmd, log, offline=True):
    """Runs a client; its output goes to `log`, which is shown when it fails."""
    env = dict(os.environ, **(OFFLINE if offline else {}))
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=600)
    text = Path(log).read_text(errors="replace")
    assert proc.returncode == 0, f"{cmd[0]} exited {proc.returncode}:\n{text[-6000:]}"
    return text


def check_chat_prompt_counts(counts):
    """On chat the server counts the ChatML-rendered prompt: the client's ISL plus one fixed
    overhead of template tokens, the same for every request when both sides tokenize alike."""
    assert len(set(counts)) == 1, f"server prompt counts vary: {sorted(set(counts))}"
    assert ISL < counts[0] <= ISL + 16, counts[0]


def aiperf(exe, base, key, tokenizer, endpoint, same_tokenizer, workdir):
    out = Path(workdir) / f"aiperf-{endpoint}"
    cmd = [
        exe, "profile",
        "--model", MODEL,
        "--url", base,
        "--api-key", key,
        "--endpoint-type", endpoint,
        "--streaming",
        "--tokenizer", tokenizer,
        "--isl", str(ISL), "--isl-stddev", "0",
        "--osl", str(OSL), "--osl-stddev", "0",
        "--request-count", str(REQUESTS),
        "--concurrency", "8",
        "--random-seed", "7",
        "--output-artifact-dir", str(out),
        "--ui-type", "none",
        "--no-gpu-telemetry",
    ]  # fmt: skip
    console = run(cmd, Path(workdir) / f"aiperf-{endpoint}.log", offline=False)
    logs = "".join(p.read_text(errors="replace") for p in out.glob("logs/*.log"))
    report = json.loads((out / "profile_export_aiperf.json").read_text())

    assert report["error_summary"] == [], report["error_summary"]
    assert report["request_count"]["avg"] == REQUESTS, report["request_count"]
    assert report.get("request_error_rate", {}).get("avg", 0) == 0, report.get("request_error_rate")
    assert not report["was_cancelled"], "run cancelled"
    osl = report["output_sequence_length"]
    assert osl["count"] == REQUESTS, osl
    assert abs(osl["avg"] - OSL) <= 0.01 * OSL, f"average OSL {osl['avg']} vs --osl {OSL}"
    assert report["osl_mismatch_count"]["avg"] == 0, report["osl_mismatch_count"]
    for text in (console, logs):
        assert "OSL mismatch" not in text, [l for l in text.splitlines() if "OSL mismatch" in l][:5]
    # The client's re-tokenized count against the server's usage.completion_tokens.
    completion_diff = report["usage_completion_tokens_diff_pct"]
    assert completion_diff["avg"] <= 1.0, completion_diff
    isl = report["input_sequence_length"]
    assert isl["avg"] == ISL, isl
    prompt_diff = report["usage_prompt_tokens_diff_pct"]
    if same_tokenizer and endpoint == "completions":
        assert prompt_diff["max"] == 0, f"server counts the prompts differently: {prompt_diff}"
    elif same_tokenizer:
        assert prompt_diff["min"] == prompt_diff["max"] and 0 < prompt_diff["avg"] <= 100 * 16 / ISL, prompt_diff
    return {
        "client": "aiperf",
        "endpoint": endpoint,
        "requests": report["request_count"]["avg"],
        "osl_avg": osl["avg"],
        "osl_min": osl["min"],
        "osl_max": osl["max"],
        "osl_mismatch_count": report["osl_mismatch_count"]["avg"],
        "usage_completion_tokens_diff_pct_avg": completion_diff["avg"],
        "usage_prompt_tokens_diff_pct_avg": prompt_diff["avg"],
    }


def guidellm(exe, base, key, tokenizer, endpoint, workdir):
    from tokenizers import Tokenizer

    out = Path(workdir) / f"guidellm-{endpoint}"
    out.mkdir(parents=True, exist_ok=True)
    path = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}[endpoint]
    scenario = {
        "spec": {
            "backend": {"kind": "openai_http", "target": base, "model": MODEL, "api_key": key, "request_format": path},
            "profile": {"kind": "concurrent", "streams": [4]},
            "data": [{"kind": "synthetic_text", "prompt_tokens": ISL, "output_tokens": OSL}],
            "tokenizer": {"kind": "hf_auto", "model": tokenizer},
            "constraints": [{"kind": "max_requests", "count": REQUESTS}],
            "outputs": [{"kind": "json", "path": str(out / "benchmarks.json")}],
        }
    }
    (out / "scenario.json").write_text(json.dumps(scenario, indent=1))
    run([exe, "run", "-c", str(out / "scenario.json"), "--disable-console-interactive"], Path(workdir) / f"guidellm-{endpoint}.log")
    bench = json.loads((out / "benchmarks.json").read_text())["benchmarks"]
    assert len(bench) == 1, len(bench)
    totals = bench[0]["metrics"]["request_totals"]
    assert totals == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}, totals
    done = bench[0]["requests"]["successful"]
    assert len(done) == REQUESTS, len(done)
    outputs = [r["output_tokens"] for r in done]
    assert outputs == [OSL] * REQUESTS, f"output tokens per request: {outputs}"
    # guidellm takes the counts from usage; re-tokenize what it received with its tokenizer.
    tok = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    recounted = [len(tok.encode(r["output"], add_special_tokens=False).ids) for r in done]
    assert recounted == [OSL] * REQUESTS, f"re-tokenized output lengths: {recounted}"
    assert [r["info"]["timings"]["token_iterations"] for r in done] == [OSL] * REQUESTS, "one streamed chunk per token"
    prompts = [r["prompt_tokens"] for r in done]
    if endpoint == "completions":
        assert prompts == [ISL] * REQUESTS, f"server prompt counts: {prompts}"
    else:
        check_chat_prompt_counts(prompts)
    return {
        "client": "guidellm",
        "endpoint": endpoint,
        "successful": totals["successful"],
        "errored": totals["errored"],
        "output_tokens_each": sorted(set(outputs)),
        "retokenized_each": sorted(set(recounted)),
        "prompt_tokens_each": sorted(set(prompts)),
    }


def inference_perf(exe, base, key, tokenizer, workdir):
    out = Path(workdir) / "inference-perf"
    out.mkdir(parents=True, exist_ok=True)
    fixed = lambda n: {"min": n, "max": n, "mean": n, "std_dev": 0, "total_count": REQUESTS, "type": "fixed"}
    config = {
        # inference-perf's random prompts (token ids drawn from the vocabulary) exist for
        # the completions API only.
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "random", "input_distribution": fixed(ISL), "output_distribution": fixed(OSL)},
        "load": {
            "type": "concurrent",
            "stages": [{"num_requests": REQUESTS, "concurrency_level": 4}],
            "num_workers": 1,
            "request_timeout": 60,
            "base_seed": 7,
        },
        "server": {"type": "vllm", "model_name": MODEL, "base_url": base, "api_key": key, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": tokenizer},
        "report": {
            "request_lifecycle": {"summary": True, "per_stage": False, "per_request": False},
            "prometheus": {"summary": False, "per_stage": False},
        },
        "storage": {"local_storage": {"path": str(out / "reports")}},
    }
    (out / "config.yml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    run([exe, "-c", str(out / "config.yml")], Path(workdir) / "inference-perf.log")
    summary = json.loads((out / "reports" / "summary_lifecycle_metrics.json").read_text())
    ok, failed = summary["successes"], summary["failures"]
    assert failed["count"] == 0, failed
    assert ok["count"] == REQUESTS, ok["count"]
    # output_len: the client's re-tokenized count; output_tokens: the server's usage.
    out_len, out_usage = ok["output_len"], ok["output_tokens"]
    assert out_len["min"] == out_len["max"] == OSL, out_len
    assert out_usage["min"] == out_usage["max"] == OSL, out_usage
    assert ok["token_count_mismatches"] == 0, ok["token_count_mismatches"]
    assert ok["client_fallback_requests"] == {"prompt": 0, "output": 0}, ok["client_fallback_requests"]
    prompt = ok["prompt_tokens"]
    assert prompt["min"] == prompt["max"] == ISL, prompt
    return {
        "client": "inference-perf",
        "successes": ok["count"],
        "failures": failed["count"],
        "output_len_mean": out_len["mean"],
        "server_output_tokens_mean": out_usage["mean"],
        "token_count_mismatches": ok["token_count_mismatches"],
        "prompt_tokens_mean": prompt["mean"],
    }


def main():
    client, args = sys.argv[1], sys.argv[2:]
    if client == "aiperf":
        exe, base, key, tokenizer, endpoint, same, workdir = args
        result = aiperf(exe, base, key, tokenizer, endpoint, same == "yes", workdir)
    elif client == "guidellm":
        exe, base, key, tokenizer, endpoint, workdir = args
        result = guidellm(exe, base, key, tokenizer, endpoint, workdir)
    elif client == "inference-perf":
        exe, base, key, tokenizer, workdir = args
        result = inference_perf(exe, base, key, tokenizer, workdir)
    else:
        raise SystemExit(f"unknown client {client}")
    result["ok"] = True
    print(json.dumps(result))


if __name__ == "__main__":
    main()
