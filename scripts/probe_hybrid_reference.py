#!/usr/bin/env python3
"""Probe the reference (ai-dynamo-runtime 1.6.1, module dynamo._core) on its hybrid-KV engine args:
kv_cache_groups / kv_cache_capacity_bytes, state_cache / prefix_match_unit, g3_offload under
native_host_offload, and the refusals around them. Prints one JSON line per case, with its inputs
(workload, engine args, replay options) and the reference's figures, so that they can be
regenerated and pinned in tests/fixtures/hybrid_reference.json. docs/hybrid-kv.md explains them.

Usage: python3 scripts/probe_hybrid_reference.py [--fixture tests/fixtures/hybrid_reference.json]
           [--only PREFIX]
The reference runs in the interpreter named by env MOCKER_DYNAMO_PYTHON, else in this one
(`pip install ai-dynamo-runtime==1.6.1` there). Every replay is small (at most a few hundred
requests, a second or less); the whole probe takes well under two minutes on 2 cores.
Not part of CI.
"""
import copy
import hashlib
import json
import os
import random
import tempfile

import reference_probe

# Headline figures kept from the reference's summary (all of them when present).
SUMMARY_KEYS = [
    "num_requests", "completed_requests", "total_input_tokens", "total_output_tokens",
    "committed_prefill_tokens", "duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
    "p99_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms", "prefix_cache_reused_ratio",
    "first_admission_prefix_cache_reused_ratio", "g3_offload",
]

BS = 16  # engine block_size of every case (tokens)
BASE = {"block_size": BS, "max_num_seqs": 32, "max_num_batched_tokens": 1024}

# --- workloads -----------------------------------------------------------------------------------
# "sessions": the reference's own synthetic generator: 40 sessions of 3 turns (120 requests),
# Poisson session starts at 1/s (seed 7), half of each 512-token prompt shared within 4 prefix
# groups, 500 ms between a turn's end and the next turn.
SESSIONS = {"kind": "synthetic", "input_tokens": 512, "output_tokens": 64, "request_count": 40,
            "request_rate": 1.0, "arrival_seed": 7, "turns_per_session": 3,
            "shared_prefix_ratio": 0.5, "num_prefix_groups": 4, "inter_turn_delay_ms": 500.0}


def mooncake_rows(seed, sessions, rate_per_s, groups, group_blocks, turns, first_new, next_new,
                  out_range, delay_ms):
    """Mooncake JSONL rows (trace_block_size 16): closed-loop sessions whose first turns arrive
    as a Poisson process; a session's prompt is its prefix group's shared blocks, then its own
    blocks, each later turn re-sending the whole history plus new blocks (a chat)."""
    rnd = random.Random(seed)
    rows, t, next_id = [], 0.0, 1_000_000
    for s in range(sessions):
        t += rnd.expovariate(rate_per_s) * 1000.0
        g = s % groups
        hist = [g * 1000 + i for i in range(group_blocks)]
        for turn in range(turns):
            n = rnd.randint(*(first_new if turn == 0 else next_new))
            hist = hist + list(range(next_id, next_id + n))
            next_id += n
            row = {"session_id": f"s{s}", "input_length": len(hist) * BS,
                   "output_length": rnd.randint(*out_range), "hash_ids": list(hist)}
            if turn == 0:
                row["timestamp"] = round(t, 3)
            else:
                row["delay"] = delay_ms
            rows.append(row)
    return rows


# "chat": 40 sessions x 3 turns, Poisson 2 sessions/s (seed 11), 4 prefix groups of 8 blocks
# (128 tokens), 8-24 own blocks on turn 1 and 4-12 more per later turn, outputs 16-64 tokens.
CHAT = {"kind": "mooncake", "trace_block_size": BS,
        "gen": dict(seed=11, sessions=40, rate_per_s=2.0, groups=4, group_blocks=8, turns=3,
                    first_new=(8, 24), next_new=(4, 12), out_range=(16, 64), delay_ms=300.0)}
# "deep": 60 single-turn requests, Poisson 4/s (seed 5), 16 prefix groups of 24 blocks (384
# tokens) + 2-6 own blocks: more distinct prefixes than a small G1 and G2 hold (for the G3 cases).
DEEP = {"kind": "mooncake", "trace_block_size": BS,
        "gen": dict(seed=5, sessions=60, rate_per_s=4.0, groups=16, group_blocks=24, turns=1,
                    first_new=(2, 6), next_new=(0, 0), out_range=(8, 32), delay_ms=0.0)}
SINGLE = {"kind": "synthetic", "input_tokens": 100, "output_tokens": 60, "request_count": 1,
          "replay_concurrency": 1}


def group(name, kind, layers, block_tokens, page_bytes, window=None):
    g = {"name": name, "kind": kind, "num_layers": layers, "block_size_tokens": block_tokens,
         "page_size_bytes": page_bytes}
    if window is not None:
        g["sliding_window"] = window
    return g


def eng(**kw):
    e = dict(BASE)
    e.update(kw)
    return {k: v for k, v in e.items() if v is not None}


FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
PAGE = 2048  # bytes of one 16-token page of a one-group model in the capacity-matched cases
NB = 192     # G1 blocks (or pages of PAGE bytes) for the KV-pressure cases


def cases():
    full = group("full", "attention", 2, BS, PAGE)
    half_full = group("full", "attention", 1, BS, PAGE // 2)
    half_full_b = group("full_b", "attention", 1, BS, PAGE // 2)
    swa = group("swa", "attention", 1, BS, PAGE // 2, 128)
    cap = NB * PAGE
    nopc = dict(enable_prefix_caching=False)
    out = []

    def add(name, what, workload, engine, **replay):
        out.append({"case": name, "what": what, "workload": workload, "engine": engine,
                    "replay": replay})

    # A. one full-attention group against the plain engine of the same capacity
    for wl_name, wl in (("sessions", SESSIONS), ("chat", CHAT)):
        add(f"A1_plain_{wl_name}", "plain engine, prefix caching off, 192 blocks", wl,
            eng(num_gpu_blocks=NB, **nopc))
        add(f"A2_one_full_group_{wl_name}", "one full-attention group, 192 pages of capacity", wl,
            eng(num_gpu_blocks=NB, kv_cache_groups=[full], kv_cache_capacity_bytes=cap, **nopc))
        add(f"A3_one_full_group_ngb16_{wl_name}", "as A2 but num_gpu_blocks 16 (ignored)", wl,
            eng(num_gpu_blocks=16, kv_cache_groups=[full], kv_cache_capacity_bytes=cap, **nopc))
    add("A4_plain_roomy_chat", "plain engine, no KV pressure (100000 blocks)", CHAT,
        eng(num_gpu_blocks=100000, **nopc))
    add("A5_one_full_group_roomy_chat", "one full group, no KV pressure (100000 pages)", CHAT,
        eng(kv_cache_groups=[full], kv_cache_capacity_bytes=100000 * PAGE, **nopc))
    add("A6_plain_roomy_fixed_chat", "plain, no pressure, fixed timing 10/1 ms", CHAT,
        eng(num_gpu_blocks=100000, timing_model=FIXED, **nopc))
    add("A7_one_full_group_roomy_fixed_chat", "one full group, no pressure, fixed timing", CHAT,
        eng(kv_cache_groups=[full], kv_cache_capacity_bytes=100000 * PAGE, timing_model=FIXED,
            **nopc))

    # B. sliding window beside full attention (same bytes per token as A2: PAGE per 16 tokens)
    for wl_name, wl in (("sessions", SESSIONS), ("chat", CHAT)):
        add(f"B1_full_plus_swa128_{wl_name}", "full + sliding-window(128) groups, same bytes", wl,
            eng(num_gpu_blocks=NB, kv_cache_groups=[half_full, swa],
                kv_cache_capacity_bytes=cap, **nopc))
        add(f"B2_two_full_groups_{wl_name}", "two full groups of half the page: = A2", wl,
            eng(num_gpu_blocks=NB, kv_cache_groups=[half_full, half_full_b],
                kv_cache_capacity_bytes=cap, **nopc))
    add("B3_swa_window_huge_chat", "window larger than any context: = B2", CHAT,
        eng(num_gpu_blocks=NB, kv_cache_groups=[half_full, dict(swa, sliding_window=100000)],
            kv_cache_capacity_bytes=cap, **nopc))
    add("B4_swa_block32_chat", "sliding-window group with its own 32-token pages", CHAT,
        eng(num_gpu_blocks=NB, kv_cache_groups=[half_full,
                                                group("swa", "attention", 1, 32, PAGE, 128)],
            kv_cache_capacity_bytes=cap, **nopc))
    add("B5_resident_swa48", "one request, 100+60 tokens: pages held per step (telemetry)",
        SINGLE, eng(num_gpu_blocks=NB, timing_model=FIXED,
                    kv_cache_groups=[group("full", "attention", 1, BS, 1000),
                                     group("swa", "attention", 1, BS, 1, 48)],
                    kv_cache_capacity_bytes=10**7, **nopc),
        telemetry=True)
    # gpt-oss-120b-like geometry: 18 full + 18 window-128 layers, 8 KV heads x 64 dims, bf16:
    # one 16-token page of 18 layers = 18 * 16 * 2 * 8 * 64 * 2 = 589824 bytes.
    oss = 589824
    add("B6_resident_gptoss_like", "one 10000+8-token request on a gpt-oss-like geometry",
        {"kind": "synthetic", "input_tokens": 10000, "output_tokens": 8, "request_count": 1,
         "replay_concurrency": 1},
        eng(max_num_batched_tokens=16384, timing_model=FIXED,
            kv_cache_groups=[group("full", "attention", 18, BS, oss),
                             group("swa", "attention", 18, BS, oss, 128)],
            kv_cache_capacity_bytes=40 * 2**30, **nopc),
        telemetry=True)

    # C. convolution groups (a recurrent state modelled as pages of a short window)
    add("C1_conv_w4_b1_resident", "conv group, window 4, 1-token pages: pages per step",
        SINGLE, eng(num_gpu_blocks=NB, timing_model=FIXED,
                    kv_cache_groups=[group("conv", "convolution", 1, 1, 1, 4)],
                    kv_cache_capacity_bytes=10**7, **nopc),
        telemetry=True)
    add("C2_conv_w1_bigpage_resident", "conv group, window 1, 1M-token page: one page",
        SINGLE, eng(num_gpu_blocks=NB, timing_model=FIXED,
                    kv_cache_groups=[group("conv", "convolution", 1, 1 << 20, 1, 1)],
                    kv_cache_capacity_bytes=10**7, **nopc),
        telemetry=True)
    conv_state = group("state", "convolution", 24, 1 << 20, 8 * PAGE, 1)
    for wl_name, wl in (("sessions", SESSIONS), ("chat", CHAT)):
        add(f"C3_full_plus_state_{wl_name}", "full group + one 16 KiB state page per request",
            wl, eng(num_gpu_blocks=NB, kv_cache_groups=[full, conv_state],
                    kv_cache_capacity_bytes=cap, **nopc))

    add("C4_conv_as_window_chat", "B1 with the window group declared kind=convolution: = B1",
        CHAT, eng(num_gpu_blocks=NB, kv_cache_groups=[half_full, dict(swa, kind="convolution")],
                  kv_cache_capacity_bytes=cap, **nopc))

    # D. state_cache (shares num_gpu_blocks) and prefix_match_unit; prefix caching on
    kvb = 1024  # kv_cache_bytes_per_token: a 16-token block is 16 KiB
    for wl_name, wl in (("sessions", SESSIONS), ("chat", CHAT)):
        add(f"D0_plain_pc_{wl_name}", "plain engine, prefix caching on, 256 blocks", wl,
            eng(num_gpu_blocks=256))
        add(f"D0b_plain_pc_kvb_{wl_name}", "as D0 with kv_cache_bytes_per_token set", wl,
            eng(num_gpu_blocks=256, kv_cache_bytes_per_token=kvb))
        add(f"D1_state4_{wl_name}", "state of 64 KiB = 4 blocks per request", wl,
            eng(num_gpu_blocks=256, kv_cache_bytes_per_token=kvb,
                state_cache={"bytes_per_request": 65536}))
        add(f"D2_state16_{wl_name}", "state of 256 KiB - 1 = 16 blocks per request", wl,
            eng(num_gpu_blocks=256, kv_cache_bytes_per_token=kvb,
                state_cache={"bytes_per_request": 262143}))
        add(f"D3_state4_pmu4_{wl_name}", "D1 + prefix_match_unit 4", wl,
            eng(num_gpu_blocks=256, kv_cache_bytes_per_token=kvb,
                state_cache={"bytes_per_request": 65536}, prefix_match_unit=4))
        add(f"D4_state4_pmu16_{wl_name}", "D1 + prefix_match_unit 16 (= block_size)", wl,
            eng(num_gpu_blocks=256, kv_cache_bytes_per_token=kvb,
                state_cache={"bytes_per_request": 65536}, prefix_match_unit=16))
        add(f"D5_state4_nopc_{wl_name}", "D1 with prefix caching off", wl,
            eng(num_gpu_blocks=256, kv_cache_bytes_per_token=kvb,
                state_cache={"bytes_per_request": 65536}, enable_prefix_caching=False))
        add(f"D6_plain_nopc_{wl_name}", "plain, prefix caching off, 256 blocks", wl,
            eng(num_gpu_blocks=256, **nopc))
    add("D7_state4_roomy_chat", "state of 4 blocks, 100000 blocks (no pressure)", CHAT,
        eng(num_gpu_blocks=100000, kv_cache_bytes_per_token=kvb,
            state_cache={"bytes_per_request": 65536}))
    add("D8_plain_pc_roomy_chat", "plain, prefix caching on, 100000 blocks", CHAT,
        eng(num_gpu_blocks=100000))
    add("D9_state4_pmu4_roomy_chat", "D7 + prefix_match_unit 4", CHAT,
        eng(num_gpu_blocks=100000, kv_cache_bytes_per_token=kvb,
            state_cache={"bytes_per_request": 65536}, prefix_match_unit=4))
    # A chat whose prompts are not multiples of 16 tokens: pmu 4 can hit a partial block.
    odd = copy.deepcopy(CHAT)
    odd["trim_tokens"] = 7
    add("D10_plain_pc_roomy_oddchat", "plain, prefix caching, prompts 7 tokens short of a block",
        odd, eng(num_gpu_blocks=100000))
    add("D11_state4_roomy_oddchat", "state 4 blocks, odd prompts", odd,
        eng(num_gpu_blocks=100000, kv_cache_bytes_per_token=kvb,
            state_cache={"bytes_per_request": 65536}))
    add("D12_state4_pmu4_roomy_oddchat", "state 4 blocks + prefix_match_unit 4, odd prompts",
        odd, eng(num_gpu_blocks=100000, kv_cache_bytes_per_token=kvb,
                 state_cache={"bytes_per_request": 65536}, prefix_match_unit=4))
    add("D13_state4_pmu1_roomy_oddchat", "state 4 blocks + prefix_match_unit 1, odd prompts",
        odd, eng(num_gpu_blocks=100000, kv_cache_bytes_per_token=kvb,
                 state_cache={"bytes_per_request": 65536}, prefix_match_unit=1))
    # More shapes: chunked prompts (checkpoints at chunk ends), other units, states and
    # block sizes, FIFO preemption, MTP, no chunking, several workers, DP, the KV router,
    # KV events and max_model_len, each against the pressured or roomy chat or sessions.
    s4 = {"bytes_per_request": 65536}
    odd3 = copy.deepcopy(CHAT)
    odd3["trim_tokens"] = 3
    st = dict(kv_cache_bytes_per_token=kvb, state_cache=s4)
    add("D15_state4_budget256_chat", "D1 with 256-token passes", CHAT,
        eng(num_gpu_blocks=256, max_num_batched_tokens=256, **st))
    add("D16_state4_pmu4_budget256_oddchat", "pmu 4, 256-token passes, 400 blocks", odd,
        eng(num_gpu_blocks=400, max_num_batched_tokens=256, prefix_match_unit=4, **st))
    add("D17_state2_pmu2_pressure_oddchat3", "a 2-block state, pmu 2, prompts 3 short, 200 blocks",
        odd3, eng(num_gpu_blocks=200, kv_cache_bytes_per_token=kvb,
                  state_cache={"bytes_per_request": 20000}, prefix_match_unit=2))
    add("D18_state4_fifo_sessions", "D1 with FIFO preemption", SESSIONS,
        eng(num_gpu_blocks=256, preemption_mode="fifo", **st))
    add("D19_state4_mtp_chat", "D1 with aic_nextn 2", CHAT, eng(num_gpu_blocks=256, aic_nextn=2, **st))
    add("D20_state4_pmu4_nopc_oddchat", "pmu 4 with prefix caching off", odd,
        eng(num_gpu_blocks=256, prefix_match_unit=4, enable_prefix_caching=False, **st))
    add("D21_state3_bs32_pmu8_oddchat", "block 32, a 3-block state, pmu 8, 150 blocks", odd,
        eng(block_size=32, num_gpu_blocks=150, kv_cache_bytes_per_token=kvb,
            state_cache={"bytes_per_request": 98304}, prefix_match_unit=8))
    add("D22_state4_seqs4_chat", "4 sequences, 120 blocks", CHAT,
        eng(num_gpu_blocks=120, max_num_seqs=4, **st))
    add("D23_state4_pmu16_pressure_oddchat", "pmu 16, 180 blocks", odd,
        eng(num_gpu_blocks=180, prefix_match_unit=16, **st))
    add("D24_state4_nochunk_chat", "chunked prefill off, 2048-token passes", CHAT,
        eng(num_gpu_blocks=256, enable_chunked_prefill=False, max_num_batched_tokens=2048, **st))
    add("D25_state4_2workers_chat", "D1 on 2 workers, round robin", CHAT,
        eng(num_gpu_blocks=256, **st), num_workers=2)
    add("D26_state4_dp2_chat", "D1 with dp_size 2", CHAT, eng(num_gpu_blocks=256, **st), dp_size=2)
    add("D27_state4_kvrouter_chat", "D1 on 2 workers, KV router", CHAT,
        eng(num_gpu_blocks=256, **st), num_workers=2, router_mode="kv_router")
    add("D28_state4_events_sessions", "D1 with emit_kv_events", SESSIONS,
        eng(num_gpu_blocks=256, emit_kv_events=True, **st))
    add("D29_state4_maxlen_chat", "D1 with max_model_len 1000", CHAT,
        eng(num_gpu_blocks=256, max_model_len=1000, **st))
    add("D30_state4_pmu4_3workers_oddchat", "pmu 4 on 3 workers, round robin", odd,
        eng(num_gpu_blocks=256, prefix_match_unit=4, **st), num_workers=3)

    # E. G3 below the host tier; DEEP has 16 x 24-block prefixes, G1 96 and G2 64 blocks
    host = {"num_host_blocks": 64}
    g1 = dict(num_gpu_blocks=96, kv_cache_bytes_per_token=kvb)
    add("E0_g1_only_deep", "G1 96 blocks only", DEEP, eng(**g1))
    add("E1_host_only_deep", "G1 96 + host 64 blocks", DEEP, eng(native_host_offload=host, **g1))
    g3 = {"scope": "worker_local", "num_g3_blocks": 4096}
    add("E2_g3_default_deep", "+ G3 4096 blocks, default timing (0.1 ms, 10 GB/s)", DEEP,
        eng(native_host_offload=host, g3_offload=g3, **g1))
    add("E3_g3_latency50_deep", "G3 latency_to_first_byte_ms 50", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, latency_to_first_byte_ms=50.0), **g1))
    add("E4_g3_read_0p1gbps_deep", "G3 read_bandwidth_gbps 0.1", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, read_bandwidth_gbps=0.1), **g1))
    add("E5_g3_write_0p01gbps_deep", "G3 write_bandwidth_gbps 0.01 (writes land late)", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, write_bandwidth_gbps=0.01), **g1))
    add("E6_g3_small_deep", "G3 of only 32 blocks", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, num_g3_blocks=32), **g1))
    add("E7_g3_cluster_shared_deep", "G3 cluster_shared, one worker", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, scope="cluster_shared"), **g1))
    add("E8_g3_instant_deep", "G3 latency 0, bandwidths 0 (= unlimited)", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, latency_to_first_byte_ms=0.0,
                                                      read_bandwidth_gbps=0.0,
                                                      write_bandwidth_gbps=0.0), **g1))
    add("E9_g3_2workers_shared_deep", "2 workers round robin, cluster_shared G3", DEEP,
        eng(native_host_offload=host, g3_offload=dict(g3, scope="cluster_shared"), **g1),
        num_workers=2)
    add("E10_g3_2workers_local_deep", "2 workers round robin, worker_local G3", DEEP,
        eng(native_host_offload=host, g3_offload=g3, **g1), num_workers=2)
    add("E11_host_only_sessions", "sessions: G1 96 + host 64", SESSIONS,
        eng(native_host_offload=host, **g1))
    add("E12_g3_default_sessions", "sessions: + G3 4096 default", SESSIONS,
        eng(native_host_offload=host, g3_offload=g3, **g1))
    # E13: one prefix X (24 blocks) read back from G3 after 8 unrelated requests flushed G1 (48
    # blocks) and G2 (32): the last request's TTFT minus the fixed 10 ms prefill is the restore.
    x = list(range(100, 124))
    rows = [{"timestamp": 0, "input_length": 26 * BS, "output_length": 2, "hash_ids": x + [1, 2]}]
    rows += [{"timestamp": 1000 * (i + 1), "input_length": 26 * BS, "output_length": 2,
              "hash_ids": list(range(1000 + 100 * i, 1026 + 100 * i))} for i in range(8)]
    rows.append({"timestamp": 10000, "input_length": 26 * BS, "output_length": 2,
                 "hash_ids": x + [3, 4]})
    restore = {"kind": "rows", "trace_format": "mooncake", "trace_block_size": BS, "rows": rows}
    fixed_g1 = dict(num_gpu_blocks=48, kv_cache_bytes_per_token=kvb, timing_model=FIXED)
    add("E13_restore_host_only", "prefix gone from G1 and G2: recomputed", restore,
        eng(native_host_offload={"num_host_blocks": 32}, **fixed_g1), per_request=True)
    for lat, bw in ((0.0, 0.0), (0.0, 10.0), (0.1, 10.0), (5.0, 10.0), (5.0, 0.1), (50.0, 0.1)):
        add(f"E13_restore_g3_lat{lat}_bw{bw}",
            f"prefix read back from G3: latency {lat} ms, read {bw} GB/s", restore,
            eng(native_host_offload={"num_host_blocks": 32},
                g3_offload=dict(g3, latency_to_first_byte_ms=lat, read_bandwidth_gbps=bw),
                **fixed_g1), per_request=True)
    add("E13_restore_g3_h2d1_hostlat2", "G3 5 ms / 1 GB/s, host h2d 1 GB/s + 2 ms latency",
        restore, eng(native_host_offload={"num_host_blocks": 32, "h2d_bandwidth_gbps": 1.0,
                                          "latency_to_first_byte_ms": 2.0},
                     g3_offload=dict(g3, latency_to_first_byte_ms=5.0, read_bandwidth_gbps=1.0),
                     **fixed_g1), per_request=True)

    # D14: state-cache block accounting of one request (telemetry; 64 G1 blocks)
    for name, extra, isl in (("plain", {}, 100), ("state4", {"state_cache": {
            "bytes_per_request": 65536}}, 100), ("state4_nopc", {"state_cache": {
            "bytes_per_request": 65536}, "enable_prefix_caching": False}, 100),
            ("state4_pmu4", {"state_cache": {"bytes_per_request": 65536},
                             "prefix_match_unit": 4}, 100),
            ("state4_pmu4_isl103", {"state_cache": {"bytes_per_request": 65536},
                                    "prefix_match_unit": 4}, 103)):
        add(f"D14_resident_{name}", "one request, 40 output tokens: G1 blocks per step",
            {"kind": "synthetic", "input_tokens": isl, "output_tokens": 40,
             "request_count": 1, "replay_concurrency": 1},
            eng(num_gpu_blocks=64, kv_cache_bytes_per_token=kvb, timing_model=FIXED, **extra),
            telemetry=True)

    # F. trace options: agentic_lanes / execution_model (agentic Mooncake v2, 4 plays of two
    # requests, the second 100 ms after the first completes) and weka_nested_timestamp_basis.
    hdr = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": BS,
           "hash_id_scope": "local", "source": {"format": "probe", "digest": "probe"}}
    ag = [hdr]
    for p in range(4):
        b = 100 * p
        ag.append({"request_id": f"p{p}r0", "play_id": f"play{p}", "session_id": f"s{p}",
                   "model": "source-a", "input_length": 64, "output_length": 8,
                   "hash_ids": [b + 1, b + 2, b + 3, b + 4], "not_before_ms": 10.0 * p,
                   "dependencies": []})
        ag.append({"request_id": f"p{p}r1", "play_id": f"play{p}", "session_id": f"s{p}",
                   "model": "source-b", "input_length": 96, "output_length": 8,
                   "hash_ids": [b + 1, b + 2, b + 3, b + 4, b + 5, b + 6],
                   "not_before_ms": 10.0 * p + 5.0,
                   "dependencies": [{"request_id": f"p{p}r0", "trigger": "completion",
                                     "delay_ms": 100.0, "relation": "sequence"}]})
    agw = {"kind": "rows", "trace_format": "agentic_mooncake", "rows": ag}
    fe = eng(num_gpu_blocks=1000, timing_model=FIXED)
    add("F1_agentic_no_execution_model", "agentic trace without execution_model", agw, fe)
    add("F2_agentic_execution_model", "execution_model='target'", agw, fe,
        execution_model="target", per_request=True)
    add("F3_agentic_blank_execution_model", "execution_model='  '", agw, fe,
        execution_model="  ")
    for lanes in (1, 2, 4):
        add(f"F4_agentic_lanes{lanes}", f"agentic_lanes={lanes}", agw, fe,
            execution_model="target", agentic_lanes=lanes, per_request=True)
    add("F5_agentic_lanes0", "agentic_lanes=0", agw, fe, execution_model="target",
        agentic_lanes=0)
    add("F6_agentic_lanes_with_concurrency", "agentic_lanes with replay_concurrency", agw, fe,
        execution_model="target", agentic_lanes=1, replay_concurrency=2)
    mc = {"kind": "rows", "trace_format": "mooncake", "trace_block_size": BS,
          "rows": [{"timestamp": 0, "input_length": 64, "output_length": 4,
                    "hash_ids": [1, 2, 3, 4]}]}
    add("F7_lanes_on_mooncake", "agentic_lanes on a plain Mooncake trace", mc, fe,
        agentic_lanes=1)
    add("F8_execution_model_on_mooncake", "execution_model on a plain Mooncake trace", mc, fe,
        execution_model="target")
    add("F9_weka_basis_on_mooncake", "weka_nested_timestamp_basis on a Mooncake trace", mc, fe,
        weka_nested_timestamp_basis="absolute")
    add("F10_weka_basis_bad", "weka_nested_timestamp_basis='sometimes'", mc, fe,
        weka_nested_timestamp_basis="sometimes")

    def weka(marker_t, inner):
        return {"kind": "rows", "trace_format": "weka", "rows": [{
            "id": "trace1", "block_size": BS, "hash_id_scope": "local", "requests": [
                {"type": "n", "t": 0.0, "model": "m1", "in": 64, "out": 8,
                 "hash_ids": [1, 2, 3, 4]},
                {"type": "subagent", "t": marker_t, "agent_id": "a1",
                 "subagent_type": "general", "status": "completed", "requests": [
                     {"type": "n", "t": inner[0], "model": "m2", "in": 64, "out": 8,
                      "hash_ids": [1, 2, 5, 6]},
                     {"type": "n", "t": inner[1], "model": "m2", "in": 64, "out": 8,
                      "hash_ids": [1, 2, 5, 7]}]},
                {"type": "n", "t": 6.0, "model": "m1", "in": 80, "out": 8,
                 "hash_ids": [1, 2, 3, 4, 9]}]}]}
    for label, wk in (("after_marker", weka(1.0, (2.0, 3.0))),
                      ("before_marker", weka(2.0, (0.5, 1.5)))):
        for basis in (None, "auto", "absolute", "relative"):
            kw = {} if basis is None else {"weka_nested_timestamp_basis": basis}
            add(f"F11_weka_{label}_{basis or 'omitted'}",
                f"Weka subagent with nested t {label.replace('_', ' ')}, basis {basis}", wk, fe,
                execution_model="target", per_request=True, **kw)
    return out


def refusals():
    """(name, engine args, replay options) that the reference refuses (or, marked, accepts)."""
    G = [group("full", "attention", 2, BS, 1024)]
    gb = {"block_size": BS, "num_gpu_blocks": 64, "enable_prefix_caching": False,
          "kv_cache_groups": G, "kv_cache_capacity_bytes": 65536}
    sc = {"block_size": BS, "num_gpu_blocks": 64, "kv_cache_bytes_per_token": 64,
          "state_cache": {"bytes_per_request": 4096}}
    ho = {"block_size": BS, "num_gpu_blocks": 64, "kv_cache_bytes_per_token": 64,
          "native_host_offload": {"num_host_blocks": 32}}
    g3 = {"scope": "worker_local", "num_g3_blocks": 128}

    def w(d, **k):
        d = copy.deepcopy(d)
        d.update(k)
        return {a: b for a, b in d.items() if b is not None}

    def g(**k):
        return w(gb, kv_cache_groups=[dict(group("a", "attention", 1, BS, 10), **k)])

    return [
        ("groups_ok", gb, {}),
        ("groups_prefix_caching_true", w(gb, enable_prefix_caching=True), {}),
        ("groups_prefix_caching_default", w(gb, enable_prefix_caching=None), {}),
        ("capacity_without_groups", {"block_size": BS, "kv_cache_capacity_bytes": 65536}, {}),
        ("capacity_with_empty_groups", w(gb, kv_cache_groups=[]), {}),
        ("groups_without_capacity", w(gb, kv_cache_capacity_bytes=None), {}),
        ("groups_capacity_zero", w(gb, kv_cache_capacity_bytes=0), {}),
        ("groups_num_gpu_blocks_zero", w(gb, num_gpu_blocks=0), {}),
        ("groups_num_gpu_blocks_omitted_ok", w(gb, num_gpu_blocks=None), {}),
        ("groups_capacity_2p53", w(gb, kv_cache_capacity_bytes=2**53), {}),
        ("groups_capacity_over_2p53", w(gb, kv_cache_capacity_bytes=2**53 + 1), {}),
        ("conv_without_window", g(kind="convolution"), {}),
        ("window_zero", g(sliding_window=0), {}),
        ("window_null_ok", g(sliding_window=None), {}),
        ("group_blank_name", g(name="  "), {}),
        ("group_zero_layers", g(num_layers=0), {}),
        ("group_zero_block_tokens", g(block_size_tokens=0), {}),
        ("group_zero_page", g(page_size_bytes=0), {}),
        ("group_page_over_2p53", g(page_size_bytes=2**53 + 1), {}),
        ("group_duplicate_name", w(gb, kv_cache_groups=G + G), {}),
        ("group_unknown_kind", g(kind="mamba"), {}),
        ("group_unknown_field", g(dtype="fp8"), {}),
        ("group_missing_page", w(gb, kv_cache_groups=[{"name": "a", "kind": "attention",
                                                         "num_layers": 1,
                                                         "block_size_tokens": BS}]), {}),
        ("groups_backend_sglang", w(gb, backend="sglang"), {}),
        ("groups_backend_trtllm", w(gb, backend="trtllm"), {}),
        ("groups_worker_prefill", w(gb, worker_type="prefill"), {}),
        ("groups_kv_cache_bytes_per_token", w(gb, kv_cache_bytes_per_token=64), {}),
        ("groups_kv_transfer_bytes", w(gb, kv_transfer_bytes_per_token=64), {}),
        ("groups_kv_transfer_bandwidth", w(gb, kv_transfer_bandwidth=10.0), {}),
        ("groups_emit_kv_events", w(gb, emit_kv_events=True), {}),
        ("groups_mtp", w(gb, aic_nextn=2), {}),
        ("groups_host_offload", w(gb, native_host_offload={"num_host_blocks": 32}), {}),
        ("groups_with_state_cache", w(gb, kv_cache_bytes_per_token=64,
                                      state_cache={"bytes_per_request": 100}), {}),
        ("groups_dp2_ok", gb, {"dp_size": 2}),
        ("groups_kv_router", gb, {"num_workers": 2, "router_mode": "kv_router"}),
        ("groups_online_ok", gb, {"replay_mode": "online"}),
        ("groups_prompt_never_fits", w(gb, kv_cache_capacity_bytes=16 * 1024), {"isl": 512}),
        ("groups_chunk_exceeds_pool",
         w(gb, kv_cache_groups=[group("swa", "attention", 1, BS, 1024, 64)],
           kv_cache_capacity_bytes=40 * 1024), {"isl": 1000}),
        ("state_ok", sc, {}),
        ("state_no_num_gpu_blocks", w(sc, num_gpu_blocks=None), {}),
        ("state_no_block_size", w(sc, block_size=None), {}),
        ("state_no_kv_cache_bytes_per_token", w(sc, kv_cache_bytes_per_token=None), {}),
        ("state_bytes_zero", w(sc, state_cache={"bytes_per_request": 0}), {}),
        ("state_unknown_field", w(sc, state_cache={"bytes_per_request": 10, "x": 1}), {}),
        ("state_pool_too_small", w(sc, num_gpu_blocks=4), {}),
        ("state_pool_minimum_ok", w(sc, num_gpu_blocks=5), {}),
        ("state_block_size_1", w(sc, block_size=1), {}),
        ("state_backend_sglang", w(sc, backend="sglang"), {}),
        ("state_backend_trtllm", w(sc, backend="trtllm"), {}),
        ("state_worker_prefill", w(sc, worker_type="prefill"), {}),
        ("state_host_offload", w(sc, native_host_offload={"num_host_blocks": 32}), {}),
        ("state_g3", w(sc, native_host_offload={"num_host_blocks": 32}, g3_offload=g3), {}),
        ("state_kv_transfer_bytes", w(sc, kv_transfer_bytes_per_token=64), {}),
        ("state_kv_transfer_bandwidth", w(sc, kv_transfer_bandwidth=1.0), {}),
        ("state_timing_mode_destination_missing",
         w(sc, kv_transfer_timing_mode="destination_missing"), {}),
        ("state_timing_mode_full_prompt_ok", w(sc, kv_transfer_timing_mode="full_prompt"), {}),
        ("state_mtp_ok", w(sc, aic_nextn=2), {}),
        ("state_prefix_caching_off_ok", w(sc, enable_prefix_caching=False), {}),
        ("state_emit_kv_events_ok", w(sc, emit_kv_events=True), {}),
        ("state_dp2_ok", sc, {"dp_size": 2}),
        ("pmu_ok", w(sc, prefix_match_unit=4), {}),
        ("pmu_equal_block_ok", w(sc, prefix_match_unit=BS), {}),
        ("pmu_not_divisor", w(sc, prefix_match_unit=5), {}),
        ("pmu_zero", w(sc, prefix_match_unit=0), {}),
        ("pmu_larger_than_block", w(sc, prefix_match_unit=2 * BS), {}),
        ("pmu_without_state", {"block_size": BS, "prefix_match_unit": 4}, {}),
        ("pmu_with_groups", w(gb, prefix_match_unit=4), {}),
        ("pmu_with_kv_events", w(sc, prefix_match_unit=4, emit_kv_events=True), {}),
        ("pmu_with_mtp", w(sc, prefix_match_unit=4, aic_nextn=2), {}),
        ("host_ok", ho, {}),
        ("g3_ok", w(ho, g3_offload=g3), {}),
        ("g3_cluster_shared_ok", w(ho, g3_offload=dict(g3, scope="cluster_shared")), {}),
        ("g3_without_host", {"block_size": BS, "g3_offload": g3}, {}),
        ("g3_missing_scope", w(ho, g3_offload={"num_g3_blocks": 128}), {}),
        ("g3_scope_dp_rank_local", w(ho, g3_offload=dict(g3, scope="dp_rank_local")), {}),
        ("g3_missing_num_g3_blocks", w(ho, g3_offload={"scope": "worker_local"}), {}),
        ("g3_zero_blocks", w(ho, g3_offload=dict(g3, num_g3_blocks=0)), {}),
        ("g3_negative_latency", w(ho, g3_offload=dict(g3, latency_to_first_byte_ms=-1.0)), {}),
        ("g3_negative_read_bw", w(ho, g3_offload=dict(g3, read_bandwidth_gbps=-1.0)), {}),
        ("g3_unknown_field", w(ho, g3_offload=dict(g3, bandwidth=1.0)), {}),
        ("g3_worker_prefill", w(ho, worker_type="prefill", g3_offload=g3), {}),
        ("g3_worker_decode", w(ho, worker_type="decode", g3_offload=g3), {}),
        ("g3_dp2", w(ho, g3_offload=g3), {"dp_size": 2}),
        ("g3_disaggregated", w(ho, g3_offload=g3), {"disagg": True}),
        ("g3_online", w(ho, g3_offload=g3), {"replay_mode": "online"}),
        ("g3_kv_router_2workers_ok", w(ho, g3_offload=g3),
         {"num_workers": 2, "router_mode": "kv_router"}),
        ("host_prefix_caching_off", w(ho, enable_prefix_caching=False), {}),
        ("host_no_kv_cache_bytes_per_token", w(ho, kv_cache_bytes_per_token=None), {}),
        ("host_backend_sglang", w(ho, backend="sglang"), {}),
        ("host_scope_worker_local",
         w(ho, native_host_offload={"num_host_blocks": 32, "scope": "worker_local"}), {}),
        ("host_cluster_shared_no_layout",
         w(ho, native_host_offload={"num_host_blocks": 32, "scope": "cluster_shared"}), {}),
        ("host_zero_blocks", w(ho, native_host_offload={"num_host_blocks": 0}), {}),
        ("host_mtp", w(ho, aic_nextn=2), {}),
    ]


# --- running (inside the reference's interpreter) -------------------------------------------------
def write_trace(tmp, wl):
    rows = mooncake_rows(**wl["gen"])
    trim = wl.get("trim_tokens", 0)
    key = hashlib.sha1(json.dumps(wl, sort_keys=True).encode()).hexdigest()[:12]
    path = os.path.join(tmp, f"trace_{key}.jsonl")
    with open(path, "w") as f:
        for r in rows:
            r = dict(r, input_length=r["input_length"] - trim)
            f.write(json.dumps(r) + "\n")
    return path, len(rows)


def replay(c, tmp, wl, engine, rp):
    args = {"extra_engine_args": {"engine": engine, "dp_size": rp.get("dp_size", 1)},
            "num_workers": rp.get("num_workers", 1),
            "router_mode": rp.get("router_mode", "round_robin"),
            "replay_mode": rp.get("replay_mode", "offline")}
    if rp.get("telemetry"):
        args.update(capture_telemetry=True, telemetry_sample_interval_ms=1.0)
    if rp.get("per_request") and wl["kind"] == "synthetic":
        args["capture_per_request"] = True
    if wl["kind"] == "synthetic":
        load = {k: wl[k] for k in ("request_rate", "arrival_seed", "turns_per_session",
                                   "shared_prefix_ratio", "num_prefix_groups",
                                   "inter_turn_delay_ms", "replay_concurrency") if k in wl}
        return c.run_mocker_synthetic_trace_replay(wl["input_tokens"], wl["output_tokens"],
                                                   wl["request_count"], **load, **args)
    if rp.get("per_request"):
        args["capture_per_request"] = True
    for k in ("execution_model", "agentic_lanes", "weka_nested_timestamp_basis",
              "replay_concurrency"):
        if k in rp:
            args[k] = rp[k]
    if wl["kind"] == "rows":
        key = hashlib.sha1(json.dumps(wl, sort_keys=True).encode()).hexdigest()[:12]
        path = os.path.join(tmp, f"rows_{key}.jsonl")
        with open(path, "w") as f:
            for row in wl["rows"]:
                f.write(json.dumps(row) + "\n")
        kw = {"trace_format": wl.get("trace_format", "mooncake")}
        if "trace_block_size" in wl:
            kw["trace_block_size"] = wl["trace_block_size"]
        return c.run_mocker_trace_replay([path], **kw, **args)
    path, _ = write_trace(tmp, wl)
    return c.run_mocker_trace_replay([path], trace_block_size=wl["trace_block_size"], **args)


def resident_trace(result):
    """Change points of the worker's KV occupancy (telemetry sampled every simulated ms):
    [t_ms, active_blocks, inactive_blocks, kv_cache_used_bytes (grouped engines only)]."""
    points, last = [], None
    for s in result.telemetry["samples"]:
        m = s["decode_scheduler_metrics"][0]
        v = (m["active_blocks"], m["inactive_blocks"], m.get("kv_cache_used_bytes"))
        if v != last:
            points.append([s["sampled_at_ms"], *v])
            last = v
    return points


def expected_pages(groups, prompt, output, chunk):
    """Pages per group a lone request holds after each pass, from the rule in docs/hybrid-kv.md:
    a pass computing tokens (before, after] holds, per group, pages
    [first, ceil(after / block)) with first = 0, or (before - (window - 1)) // block (floored
    at 0) for a windowed group."""
    def held(before, after):
        out = []
        for g in groups:
            b = g["block_size_tokens"]
            w = g.get("sliding_window")
            first = 0 if w is None else max(0, before - (w - 1)) // b
            out.append(-(-after // b) - first)
        return out
    steps, done = [], 0
    while done < prompt:
        nxt = min(prompt, done + chunk)
        steps.append(held(done, nxt))
        done = nxt
    for i in range(output - 1):
        steps.append(held(prompt + i, prompt + i + 1))
    return steps


def summarize(s):
    return {k: s[k] for k in SUMMARY_KEYS if k in s}


def run_child(only):
    import dynamo._core as c
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases():
            if only and not case["case"].startswith(only):
                continue
            rec = dict(case)
            try:
                r = replay(c, tmp, case["workload"], case["engine"], case["replay"])
                rec["result"] = summarize(r.summary)
                if case["replay"].get("per_request"):
                    rec["per_request"] = [
                        [x["arrival_time_ms"], x["ttft_ms"], x["reused_input_tokens"],
                         x.get("first_admission_host_reused_input_tokens")]
                        for x in sorted(r.per_request, key=lambda x: x["arrival_time_ms"])]
                if case["replay"].get("telemetry"):
                    rec["resident"] = resident_trace(r)
                    wl, e = case["workload"], case["engine"]
                if case["replay"].get("telemetry") and "kv_cache_groups" in case["engine"]:
                    steps = expected_pages(e["kv_cache_groups"], wl["input_tokens"],
                                           wl["output_tokens"], e["max_num_batched_tokens"])
                    pages = [sum(x) for x in steps]
                    bytes_ = [sum(n * g["page_size_bytes"]
                                  for n, g in zip(x, e["kv_cache_groups"])) for x in steps]
                    rec["expected_pages_per_pass"] = steps
                    seen = [p[1] for p in rec["resident"] if p[1]]
                    dedup = [v for i, v in enumerate(pages) if i == 0 or v != pages[i - 1]]
                    rec["formula_matches_telemetry"] = (
                        seen == dedup
                        and [p[3] for p in rec["resident"] if p[1]]
                        == [v for i, v in enumerate(bytes_) if i == 0 or v != bytes_[i - 1]])
            except Exception as ex:  # noqa: BLE001 - a refusal is a finding
                rec["error"] = f"{type(ex).__name__}: {ex}"
            print(json.dumps(rec), flush=True)
        if only and not "refusal".startswith(only) and not only.startswith("refusal"):
            return
        for name, e, rp in refusals():
            rec = {"case": f"refusal_{name}", "engine": e, "replay": rp}
            try:
                c._normalize_mocker_config({"engine": e, "dp_size": rp.get("dp_size", 1)})
                rec["normalize"] = "ok"
            except Exception as ex:  # noqa: BLE001
                rec["normalize"] = f"{type(ex).__name__}: {ex}"
            if rec["normalize"] == "ok":
                try:
                    isl = rp.get("isl", 64)
                    if rp.get("disagg"):
                        pre = dict(e, worker_type="prefill")
                        dec = {k: v for k, v in e.items() if k != "g3_offload"}
                        dec["worker_type"] = "decode"
                        r = c.run_mocker_synthetic_trace_replay(
                            isl, 4, 2, prefill_engine_args={"engine": pre},
                            decode_engine_args={"engine": dec}, replay_concurrency=2)
                    else:
                        r = c.run_mocker_synthetic_trace_replay(
                            isl, 4, 2, extra_engine_args={"engine": e,
                                                          "dp_size": rp.get("dp_size", 1)},
                            num_workers=rp.get("num_workers", 1),
                            router_mode=rp.get("router_mode", "round_robin"),
                            replay_mode=rp.get("replay_mode", "offline"), replay_concurrency=2)
                    s = r.summary if hasattr(r, "summary") else r
                    rec["replay_result"] = f"ok: completed {s.get('completed_requests')} of 2"
                except Exception as ex:  # noqa: BLE001
                    rec["replay_result"] = f"{type(ex).__name__}: {ex}"
            print(json.dumps(rec), flush=True)


def main():
    reference_probe.main(__file__, __doc__.split("\n")[0], run_child,
                         "Each case: inputs (workload, engine args under 'engine', replay options) "
                     "and the reference's summary figures ('result'), or its error. "
                     "Workloads of kind 'mooncake' are generated by mooncake_rows() in the "
                     "script from 'gen' (trim_tokens shortens every prompt). Refusal cases "
                     "record _normalize_mocker_config's verdict and, when it accepts, a "
                     "2-request replay's. See docs/hybrid-kv.md.")


if __name__ == "__main__":
    main()
