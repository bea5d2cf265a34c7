//! The bundled model catalogue (`data/models/`: real `config.json` files and an index with
//! their sources) and the bundled operator tables (`data/ops/`).

use serde::Deserialize;

use crate::arch::{parse_config, ArchError, ModelArch};
use crate::ops::{OpTables, OpsError};

include!(concat!(env!("OUT_DIR"), "/bundled_models.rs"));

/// One catalogue entry: a model architecture under its Hugging Face ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CatalogueEntry {
    /// The Hugging Face id the entry is listed under.
    pub id: String,
    /// Other ids with the same architecture (instruct/base variants).
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The `config.json` file in `data/models/`.
    pub config: String,
    /// Its `hf_quant_config.json`, where the model has one.
    #[serde(default)]
    pub quant_config: Option<String>,
    /// Where the config comes from.
    pub source: String,
    /// How the file was obtained (verbatim copy, or reconstructed from what).
    #[serde(default)]
    pub provenance: String,
    /// Total parameters the model card states, in billions.
    #[serde(default)]
    pub params_b: Option<f64>,
    /// Active parameters per token (MoE), in billions.
    #[serde(default)]
    pub active_params_b: Option<f64>,
}

impl CatalogueEntry {
    /// Every id this entry answers to.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.id.as_str()).chain(self.aliases.iter().map(String::as_str))
    }

    /// The bundled `config.json` text.
    pub fn config_text(&self) -> &'static str {
        bundled_file(&self.config).unwrap_or_default()
    }

    /// The architecture its config describes.
    pub fn arch(&self) -> Result<ModelArch, ArchError> {
        parse_config(self.config_text())
            .map_err(|e| ArchError(format!("{} ({}): {}", self.id, self.config, e.0)))
    }
}

fn bundled_file(name: &str) -> Option<&'static str> {
    MODEL_FILES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// Every catalogue entry.
pub fn models() -> &'static [CatalogueEntry] {
    static MODELS: std::sync::OnceLock<Vec<CatalogueEntry>> = std::sync::OnceLock::new();
    MODELS.get_or_init(|| {
        serde_json::from_str(include_str!("../data/models/catalogue.json"))
            .expect("data/models/catalogue.json is checked by tests")
    })
}

fn normalise(name: &str) -> String {
    name.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// The entry `name` denotes: a Hugging Face id or alias (case-insensitive), or one without
/// its organisation (`Llama-3.1-8B-Instruct`).
pub fn find_model(name: &str) -> Option<&'static CatalogueEntry> {
    let want = normalise(name);
    let short = |id: &str| normalise(id.rsplit('/').next().unwrap_or(id));
    models()
        .iter()
        .find(|e| e.names().any(|n| normalise(n) == want))
        .or_else(|| models().iter().find(|e| e.names().any(|n| short(n) == want)))
}

/// The ids users can give, one per entry.
pub fn model_names() -> Vec<&'static str> {
    models().iter().map(|e| e.id.as_str()).collect()
}

/// The operator tables measured on AIConfigurator system `system`.
pub fn op_tables(system: &str) -> Option<Result<OpTables, OpsError>> {
    let file = format!("{system}.json");
    OP_FILES.iter().find(|(n, _)| *n == file).map(|(_, text)| OpTables::parse(text))
}

/// The systems with bundled operator tables.
pub fn op_systems() -> Vec<&'static str> {
    OP_FILES.iter().map(|(n, _)| n.trim_end_matches(".json")).collect()
}
