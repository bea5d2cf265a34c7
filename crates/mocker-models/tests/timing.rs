//! Pass timing from the architecture: KV capacity as vLLM sizes it, operation prices that
//! grow with the work, and every catalogue model running a small replay on several GPUs.

use mocker_core::config::{LaunchConfig, TimingModelConfig};
use mocker_core::timing::{DecodeShape, PrefillShape, TimingModel};
use mocker_models::{find_gpu, find_model, models, resolve_launch, Placement, Precision, Pricer};
use mocker_replay::workload::SyntheticWorkload;
use mocker_replay::{run_replay, Cluster, Hooks, ReplayOptions, Workload};

fn launch(model: &str, gpu: &str, tp: usize) -> LaunchConfig {
    let mut l = LaunchConfig::default();
    l.hardware.model = Some(model.into());
    l.hardware.gpu = Some(gpu.into());
    l.tensor_parallel_size = tp;
    l
}

#[test]
fn kv_capacity_equals_a_hand_computation() {
    // Llama-3.1-8B, one H100 (80 GiB), vLLM, gpu_memory_utilization 0.9, 16-token blocks,
    // vLLM's H100 defaults of 8192 batched tokens and 1024 sequences:
    //   usable      0.9 x 85,899,345,920                                   = 77,309,411,328
    //   weights     8,029,995,008 parameters x 2 bytes                     = 16,059,990,016
    //   activations 8192 x (3 x 14336 + 4 x 4096) x 2 + 1024 x 128256 x 8 =  2,023,751,680
    //   runtime     1 GiB                                                  =  1,073,741,824
    //   KV          58,151,927,808 bytes / (131,072 bytes a token x 16)    = 27,729 blocks
    let mut l = launch("meta-llama/Llama-3.1-8B-Instruct", "h100", 1);
    l.engine.block_size = 16;
    let r = resolve_launch(&mut l).unwrap().unwrap();
    assert_eq!(r.weight_bytes_per_gpu, 16_059_990_016.0);
    assert_eq!(r.kv_bytes_per_token_per_gpu, 131_072.0);
    assert_eq!((l.engine.max_num_seqs, l.engine.max_num_batched_tokens), (1024, 8192));
    assert_eq!(l.engine.num_gpu_blocks, 27_729);
    // The P/D transfer size follows from it: every GPU's shard of a token's KV.
    assert_eq!(l.engine.kv_transfer_bytes_per_token, Some(131_072.0));
    // Two GPUs: half the weights and half of each token's KV on each.
    let mut tp2 = launch("meta-llama/Llama-3.1-8B-Instruct", "h100", 2);
    tp2.engine.block_size = 16;
    resolve_launch(&mut tp2).unwrap();
    assert!(tp2.engine.num_gpu_blocks > 2 * l.engine.num_gpu_blocks);
    assert_eq!(tp2.engine.kv_transfer_bytes_per_token, Some(131_072.0));
    // fp8 KV halves a token's bytes.
    let mut fp8 = launch("meta-llama/Llama-3.1-8B-Instruct", "h100", 1);
    fp8.engine.block_size = 16;
    fp8.hardware.kv_cache_dtype = Some("fp8".into());
    assert_eq!(resolve_launch(&mut fp8).unwrap().unwrap().kv_bytes_per_token_per_gpu, 65_536.0);
    // Smaller parts and A100s get vLLM's smaller batch; limits given in engine args stay.
    let mut a100 = launch("meta-llama/Llama-3.1-8B-Instruct", "a100-80gb", 1);
    resolve_launch(&mut a100).unwrap();
    assert_eq!((a100.engine.max_num_seqs, a100.engine.max_num_batched_tokens), (256, 2048));
    let mut kept =
        LaunchConfig::from_json_str(r#"{"max_num_seqs": 7, "model": "meta-llama/Llama-3.1-8B"}"#).unwrap();
    resolve_launch(&mut kept).unwrap();
    assert_eq!((kept.engine.max_num_seqs, kept.engine.max_num_batched_tokens), (7, 8192));
    // Given blocks win.
    let mut given = launch("meta-llama/Llama-3.1-8B-Instruct", "h100", 1);
    given.engine.num_gpu_blocks = 77;
    given.num_gpu_blocks_is_explicit = true;
    resolve_launch(&mut given).unwrap();
    assert_eq!(given.engine.num_gpu_blocks, 77);
}

#[test]
fn keys_that_cannot_apply_are_refused_by_name() {
    let refuse = |mut l: LaunchConfig, key: &str, words: &str| {
        let e = resolve_launch(&mut l).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(e.to_string().contains(words), "{e}");
    };
    refuse(launch("no/such-model", "h100", 1), "model", "meta-llama/Llama-3.1-8B");
    refuse(launch("meta-llama/Llama-3.1-8B", "tpu-v5", 1), "gpu", "a100-80gb");
    refuse(launch("meta-llama/Llama-3.1-8B", "h100", 3), "tensor_parallel_size", "32 attention heads");
    let mut ep = launch("meta-llama/Llama-3.1-8B", "h100", 1);
    ep.hardware.enable_expert_parallel = true;
    refuse(ep, "enable_expert_parallel", "no experts");
    let mut q = launch("meta-llama/Llama-3.1-8B", "h100", 1);
    q.hardware.quantization = Some("squeezellm".into());
    refuse(q, "quantization", "fp8");
    let mut kv = launch("meta-llama/Llama-3.1-8B", "h100", 1);
    kv.hardware.kv_cache_dtype = Some("int3".into());
    refuse(kv, "kv_cache_dtype", "fp8_e5m2");
    // 405 B in bf16 does not fit one GPU.
    refuse(launch("meta-llama/Llama-3.1-405B", "h100", 1), "gpu_memory_utilization", "no room");
    let mut gpu_only = LaunchConfig::default();
    gpu_only.hardware.gpu = Some("h100".into());
    refuse(gpu_only, "gpu", "--model");
    let mut two = launch("meta-llama/Llama-3.1-8B", "h100", 1);
    two.engine.timing_model = TimingModelConfig::Fixed { prefill_ms: 1.0, decode_ms: 1.0 };
    refuse(two, "model", "one timing source");
}

fn pricer_for(model: &str, gpu: &str, tp: usize, f: impl FnOnce(&Pricer<'_>)) {
    let m = find_model(model).unwrap().arch().unwrap();
    let g = find_gpu(gpu).unwrap();
    let system = g.aic_system.clone().unwrap();
    let ops = mocker_models::catalogue::op_tables(&system).unwrap().unwrap();
    let place = Placement {
        tp,
        expert_parallel: false,
        weights: Precision::Bf16,
        experts: Precision::Bf16,
        kv: Precision::Bf16,
    };
    f(&Pricer::new(&m, g, &ops, place));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    #[test]
    fn prices_grow_with_tokens_and_context(a in 1u32..100_000, b in 1u32..100_000, p in 0u32..100_000) {
        let (lo, hi) = (f64::from(a.min(b)), f64::from(a.max(b)));
        for (model, gpu, tp) in [("meta-llama/Llama-3.1-8B", "h100", 1), ("mistralai/Mixtral-8x7B-v0.1", "h100", 2),
                                 ("Qwen/Qwen3-32B", "l40s", 4), ("deepseek-ai/DeepSeek-V3", "b200", 8)] {
            pricer_for(model, gpu, tp, |x| {
                assert!(x.linear(lo) <= x.linear(hi) + 1e-9, "{model} linear {lo} {hi}");
                assert!(x.logits(lo.min(16384.0)) <= x.logits(hi.min(16384.0)) + 1e-9, "{model} logits");
                assert!(x.generation_attention(8.0, lo) <= x.generation_attention(8.0, hi) + 1e-9, "{model} decode ctx");
                assert!(x.generation_attention(lo.min(4096.0), 2048.0) <= x.generation_attention(hi.min(4096.0), 2048.0) + 1e-9, "{model} decode batch");
                let pf = f64::from(p);
                assert!(x.context_attention(1.0, lo, pf) <= x.context_attention(1.0, hi, pf) + 1e-9, "{model} prefill new");
                assert!(x.context_attention(1.0, 512.0, lo) <= x.context_attention(1.0, 512.0, hi) + 1e-9, "{model} prefill prefix");
            });
        }
    }
}

#[test]
fn passes_grow_with_their_work_and_a_mixed_pass_shares_its_weights() {
    let mut l = launch("meta-llama/Llama-3.1-8B", "h100", 1);
    resolve_launch(&mut l).unwrap();
    let TimingModelConfig::Architecture { timing: Some(t), .. } = &l.engine.timing_model else { panic!() };
    let p = |isl, prefix| t.prefill_ms(PrefillShape { batch: 1, mean_isl: isl, mean_prefix: prefix });
    let d = |batch, ctx| {
        t.decode_ms(DecodeShape { batch, active_kv_tokens: batch * ctx, total_kv_tokens: 1 << 20 })
    };
    assert!(p(1024, 0) < p(2048, 0) && p(2048, 1024) < p(4096, 1024));
    assert!(p(2048, 1024) < p(2048, 0), "a cached prefix saves most of the work");
    assert!(d(1, 1024) < d(64, 1024) && d(64, 1024) < d(64, 8192));
    let (pp, dd) = t.mixed_ms(
        PrefillShape { batch: 1, mean_isl: 512, mean_prefix: 0 },
        DecodeShape { batch: 32, active_kv_tokens: 32 * 2048, total_kv_tokens: 1 << 20 },
    );
    assert!(pp + dd < p(512, 0) + d(32, 2048), "the batch reads the weights once");
    // Llama-3.1-8B on an H100 decodes one token in 5-10 ms (about 16 GB of weights at
    // 3.35 TB/s, plus overhead), and prefills 1024 tokens in 15-40 ms.
    assert!((5.0..10.0).contains(&d(1, 1024)), "{}", d(1, 1024));
    assert!((15.0..40.0).contains(&p(1024, 0)), "{}", p(1024, 0));
}

/// The smallest power-of-two TP (up to 8) at which the model's weights take under 80% of
/// the GPU's memory, if any, dividing its heads.
fn fitting_tp(model: &mocker_models::ModelArch, gpu: &mocker_models::GpuSpec) -> Option<usize> {
    [1, 2, 4, 8].into_iter().find(|&tp| {
        let place = Placement {
            tp,
            expert_parallel: false,
            weights: model.weight_precision,
            experts: model.moe.as_ref().and_then(|m| m.expert_precision).unwrap_or(model.weight_precision),
            kv: Precision::Bf16,
        };
        model.num_heads.is_multiple_of(tp) && place.weight_bytes_per_gpu(model) < 0.8 * gpu.memory_bytes
    })
}

#[test]
fn every_catalogue_model_replays_on_several_gpus() {
    let workload =
        SyntheticWorkload { input_tokens: 600, output_tokens: 40, request_count: 12, ..Default::default() };
    let mut ran = 0;
    for entry in models() {
        let arch = entry.arch().unwrap();
        for gpu in ["h100", "a100-80gb", "l40s", "b200", "mi300x"] {
            let Some(tp) = fitting_tp(&arch, find_gpu(gpu).unwrap()) else { continue };
            let mut l = launch(&entry.id, gpu, tp);
            resolve_launch(&mut l).unwrap_or_else(|e| panic!("{} on {gpu} TP{tp}: {e}", entry.id));
            let options = ReplayOptions {
                cluster: Cluster::aggregated(l, 1),
                workload: Workload::Synthetic(workload.clone()),
                ..Default::default()
            };
            let out = run_replay(&options, Hooks::default()).unwrap_or_else(|e| panic!("{}: {e}", entry.id));
            let s = &out.summary;
            assert_eq!(s.completed_requests, 12, "{} on {gpu}", entry.id);
            assert!(s.ttft_ms.mean > 0.0 && s.ttft_ms.mean.is_finite(), "{} on {gpu}", entry.id);
            ran += 1;
        }
    }
    assert!(ran >= models().len() * 3, "only {ran} model x GPU pairs ran");
}
