//! The bundled catalogue parses, agrees with the facts its entries state, and reads the
//! same from a real `config.json` on disk as from the bundle.

use std::path::Path;

use mocker_models::{find_gpu, find_model, gpus, load_model, models};

#[test]
fn every_model_parses_and_matches_its_stated_size() {
    for e in models() {
        let m = e.arch().unwrap_or_else(|err| panic!("{err}"));
        if let Some(b) = e.params_b {
            let got = m.parameters() / 1e9;
            // A multimodal card counts its vision tower (Gemma 3's SigLIP: 0.4 B), which
            // the language model simulated here does not have.
            let vision = if e.config_text().contains("vision_config") { 0.45 } else { 0.0 };
            assert!(
                (got / b - 1.0).abs() < 0.06 || (got < b && got > b - vision - 0.06 * b),
                "{}: {got:.2} B parameters computed, {b} B stated",
                e.id
            );
        }
        if let Some(b) = e.active_params_b {
            // Model cards count the input embedding in or out; either must agree.
            let got = m.active_parameters() / 1e9;
            let without_embedding = got - (m.vocab_size * m.hidden_size) as f64 / 1e9;
            let close = |x: f64| (x / b - 1.0).abs() < 0.08;
            assert!(
                close(got) || close(without_embedding),
                "{}: {got:.2} B active computed, {b} B stated",
                e.id
            );
        }
        assert!(m.num_heads % m.num_kv_heads == 0 && m.head_dim > 0, "{}", e.id);
    }
}

fn fixture(dir: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(dir).to_string_lossy().into_owned()
}

#[test]
fn a_real_config_on_disk_reads_as_its_catalogue_entry() {
    let cases = [
        ("meta-llama--Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
        ("mistralai--Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
        ("Qwen--Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"),
        ("deepseek-ai--DeepSeek-V3", "deepseek-ai/DeepSeek-V3"),
        ("openai--gpt-oss-20b", "openai/gpt-oss-20b"),
        ("meta-llama--Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Scout-17B-16E-Instruct"),
    ];
    for (dir, id) in cases {
        let from_disk = load_model(&fixture(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        let entry = find_model(id).unwrap_or_else(|| panic!("{id} is not in the catalogue"));
        assert_eq!(from_disk.arch, entry.arch().unwrap(), "{dir}");
        // The file itself (not only its directory) reads the same.
        let file = format!("{}/config.json", fixture(dir));
        assert_eq!(load_model(&file).unwrap().arch, from_disk.arch);
    }
}

#[test]
fn real_configs_give_their_published_facts() {
    let m = load_model(&fixture("mistralai--Mixtral-8x7B-v0.1")).unwrap().arch;
    let moe = m.moe.as_ref().unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.intermediate_size, moe.moe_layers), (8, 2, 14336, 32));
    // Mixtral 8x7B: 46.7 B parameters, 12.9 B active.
    assert!((m.parameters() / 1e9 - 46.7).abs() < 0.1 && (m.active_parameters() / 1e9 - 12.9).abs() < 0.1);
    let d = load_model(&fixture("deepseek-ai--DeepSeek-V3")).unwrap().arch;
    let mla = d.mla.as_ref().unwrap();
    assert_eq!((mla.kv_lora_rank, mla.qk_rope_head_dim), (512, 64));
    assert_eq!(d.kv_elements_per_token_layer(), 576);
    assert_eq!(d.moe.as_ref().unwrap().moe_layers, 58, "the first 3 of 61 layers are dense");
    assert_eq!(d.weight_precision, mocker_models::Precision::Fp8, "its quantization_config is fp8");
    let g = load_model(&fixture("openai--gpt-oss-20b")).unwrap().arch;
    assert_eq!((g.sliding_window, g.sliding_layers), (Some(128), 12), "alternating sliding layers");
    assert_eq!(
        g.moe.as_ref().unwrap().expert_precision,
        Some(mocker_models::Precision::Int4),
        "mxfp4 experts"
    );
}

#[test]
fn names_resolve_case_insensitively_with_or_without_organisation() {
    let e = find_model("META-LLAMA/llama-3.1-8b-instruct").unwrap();
    assert_eq!(e.id, "meta-llama/Llama-3.1-8B");
    assert_eq!(find_model("Llama-3.1-8B-Instruct").unwrap().id, e.id);
    assert!(find_model("no/such-model").is_none());
    assert_eq!(find_gpu("H100_SXM").unwrap().name, "h100");
    assert_eq!(find_gpu("a100").unwrap().name, "a100-80gb");
    assert!(find_gpu("tpu-v5").is_none());
}

#[test]
fn every_gpu_is_timed_by_measured_data_its_own_or_a_proxys() {
    for g in gpus() {
        let own = g.aic_system.as_deref().is_some_and(|s| mocker_models::catalogue::op_tables(s).is_some());
        let proxy = g.proxy.as_deref().and_then(find_gpu).and_then(|p| p.aic_system.as_deref());
        let borrowed = proxy.is_some_and(|s| mocker_models::catalogue::op_tables(s).is_some());
        assert!(own || borrowed, "{}: no operator data", g.name);
        assert!(
            g.memory_bytes > 1e10 && g.memory_bandwidth > 1e11 && g.flops.contains_key("bf16"),
            "{}",
            g.name
        );
    }
    for s in mocker_models::catalogue::op_systems() {
        mocker_models::catalogue::op_tables(s).unwrap().unwrap_or_else(|e| panic!("{e}"));
    }
}
