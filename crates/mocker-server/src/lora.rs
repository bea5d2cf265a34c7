//! LoRA adapters as vLLM serves them (`--enable-lora`): the adapters loaded at start
//! (`--lora-modules`) and at run time (`POST /v1/load_lora_adapter`,
//! `POST /v1/unload_lora_adapter`), listed by `/v1/models` and picked by a request's `model`.
//!
//! The simulation has no weights, so loading an adapter registers its name and path; what
//! an adapter changes is scheduling and caching, in the core: at most `--max-loras`
//! adapters in one batch (requests of others wait), no prefix sharing across adapters, and
//! KV events that carry the adapter's id and name. As vLLM, each load gets a fresh
//! `lora_int_id` from 1, and the same name loaded again hashes its blocks the same way.

use std::sync::{Arc, RwLock};

use axum::http::StatusCode;
use mocker_core::LoraRef;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;

/// An adapter named on the command line (`--lora-modules`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    /// The name requests put in `model`.
    pub name: String,
    /// Where vLLM would read its weights from (reported as the model card's `root`).
    pub path: String,
    /// The model it adapts (the card's `parent`); the served model when absent.
    pub base_model_name: Option<String>,
}

impl LoraModule {
    /// Parses one `--lora-modules` value as vLLM does: `name=path`, or a JSON object
    /// `{"name": ..., "path": ..., "base_model_name": ...}`.
    pub fn parse(value: &str) -> Result<Self, String> {
        let module = if value.trim_start().starts_with('{') {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Json {
                name: String,
                path: String,
                base_model_name: Option<String>,
            }
            let j: Json = serde_json::from_str(value).map_err(|e| {
                format!("--lora-modules: expected name=path or a JSON object with name, path and optional base_model_name ({e})")
            })?;
            Self { name: j.name, path: j.path, base_model_name: j.base_model_name }
        } else {
            let (name, path) = value
                .split_once('=')
                .ok_or_else(|| format!("--lora-modules: expected name=path, got {value:?}"))?;
            Self { name: name.to_string(), path: path.to_string(), base_model_name: None }
        };
        if module.name.is_empty() || module.path.is_empty() {
            return Err(format!("--lora-modules: name and path must not be empty, got {value:?}"));
        }
        Ok(module)
    }
}

/// LoRA serving options (`--enable-lora` and the flags that go with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraOptions {
    /// Most adapters in one batch (`--max-loras`, vLLM's default 1).
    pub max_loras: usize,
    /// Adapters loaded at start.
    pub modules: Vec<LoraModule>,
}

impl Default for LoraOptions {
    fn default() -> Self {
        Self { max_loras: 1, modules: Vec::new() }
    }
}

#[derive(Debug)]
struct Loaded {
    lora: LoraRef,
    path: String,
    parent: Option<String>,
}

#[derive(Debug, Default)]
struct Adapters {
    /// In load order, as `/v1/models` lists them.
    loaded: Vec<Loaded>,
    next_id: u32,
}

/// The adapters this server serves.
#[derive(Debug)]
pub struct LoraRegistry {
    max_loras: usize,
    base_model: String,
    adapters: RwLock<Adapters>,
}

/// Longest adapter name, bytes: it is echoed in every stream chunk and `/v1/models`.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest adapter path, bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most adapters registered at once: each is listed by `/v1/models` and searched per
/// request. vLLM bounds the adapters it caches, not those it lists; a fixed cap keeps a
/// client from growing the registry without end.
pub const MAX_ADAPTERS: usize = 1024;

/// Refuses a name or path past its bound, naming the field.
fn check_sizes(name: &str, path: &str) -> Result<(), ApiError> {
    for (field, value, max) in [("lora_name", name, MAX_NAME_BYTES), ("lora_path", path, MAX_PATH_BYTES)] {
        if value.len() > max {
            return Err(ApiError::invalid_field(
                field,
                format!("{field}: at most {max} bytes, got {}", value.len()),
            ));
        }
    }
    Ok(())
}

impl LoraRegistry {
    /// A registry holding `options.modules`; a module named like the served model or twice
    /// is refused.
    pub fn new(options: &LoraOptions, base_model: &str) -> Result<Self, String> {
        if options.max_loras == 0 {
            return Err("--max-loras: must be at least 1, got 0".into());
        }
        let registry = Self {
            max_loras: options.max_loras,
            base_model: base_model.to_string(),
            adapters: Default::default(),
        };
        for m in &options.modules {
            registry
                .load(&m.name, &m.path, m.base_model_name.clone())
                .map_err(|e| format!("--lora-modules: {}", e.message))?;
        }
        Ok(registry)
    }

    /// Most adapters in one batch.
    pub fn max_loras(&self) -> usize {
        self.max_loras
    }

    /// The adapter a request's `model` names, if it names one.
    pub fn resolve(&self, model: &str) -> Option<LoraRef> {
        let a = self.adapters.read().expect("lora registry");
        a.loaded.iter().find(|l| &*l.lora.name == model).map(|l| l.lora.clone())
    }

    /// See the route of the same name in [`crate::api::lora`].
    pub fn load(&self, name: &str, path: &str, parent: Option<String>) -> Result<(), ApiError> {
        if name.is_empty() || path.is_empty() {
            return Err(ApiError::bad_request("Both 'lora_name' and 'lora_path' must be provided."));
        }
        check_sizes(name, path)?;
        if name == self.base_model {
            return Err(ApiError::invalid_field(
                "lora_name",
                format!("The lora adapter name '{name}' is the served model's name."),
            ));
        }
        let mut a = self.adapters.write().expect("lora registry");
        if a.loaded.iter().any(|l| &*l.lora.name == name) {
            return Err(ApiError::bad_request(format!(
                "The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
            )));
        }
        if a.loaded.len() >= MAX_ADAPTERS {
            return Err(ApiError::invalid_field(
                "lora_name",
                format!("lora_name: {MAX_ADAPTERS} adapters are loaded, the most this server holds; unload one first"),
            ));
        }
        a.next_id += 1;
        let lora = LoraRef { id: a.next_id, name: Arc::from(name) };
        a.loaded.push(Loaded { lora, path: path.to_string(), parent });
        Ok(())
    }

    /// See the route of the same name in [`crate::api::lora`].
    pub fn load_in_place(&self, name: &str, path: &str) -> Result<(), ApiError> {
        check_sizes(name, path)?;
        {
            let mut a = self.adapters.write().expect("lora registry");
            if let Some(l) = a.loaded.iter_mut().find(|l| &*l.lora.name == name) {
                l.path = path.to_string();
                return Ok(());
            }
        }
        self.load(name, path, None)
    }

    /// See the route of the same name in [`crate::api::lora`].
    pub fn unload(&self, name: &str) -> Result<(), ApiError> {
        let mut a = self.adapters.write().expect("lora registry");
        match a.loaded.iter().position(|l| &*l.lora.name == name) {
            Some(i) => {
                a.loaded.remove(i);
                Ok(())
            }
            None => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("The lora adapter '{name}' cannot be found."),
                param: Some("lora_name".into()),
            }),
        }
    }

    /// Model cards of the loaded adapters, as vLLM lists them after the base model.
    pub fn model_cards(&self, created: u64) -> Vec<Value> {
        let a = self.adapters.read().expect("lora registry");
        a.loaded
            .iter()
            .map(|l| {
                json!({
                    "id": &*l.lora.name,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": l.path,
                    "parent": l.parent.as_deref().unwrap_or(&self.base_model),
                    "max_model_len": null,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(modules: &[&str]) -> Result<LoraRegistry, String> {
        let modules = modules.iter().map(|m| LoraModule::parse(m)).collect::<Result<Vec<_>, _>>()?;
        LoraRegistry::new(&LoraOptions { max_loras: 2, modules }, "base")
    }

    #[test]
    fn modules_parse_in_both_of_vllms_forms() {
        assert_eq!(
            LoraModule::parse("sql=/adapters/sql").unwrap(),
            LoraModule { name: "sql".into(), path: "/adapters/sql".into(), base_model_name: None }
        );
        let j =
            LoraModule::parse(r#"{"name": "chat", "path": "/a/chat", "base_model_name": "llama"}"#).unwrap();
        assert_eq!(j.base_model_name.as_deref(), Some("llama"));
        for bad in ["sql", "=/p", "sql=", r#"{"name": "x"}"#, r#"{"name": "x", "path": "p", "rank": 8}"#] {
            assert!(LoraModule::parse(bad).unwrap_err().starts_with("--lora-modules"), "{bad}");
        }
    }

    #[test]
    fn names_paths_and_the_adapter_count_are_bounded() {
        let options = LoraOptions { max_loras: 1, modules: Vec::new() };
        let r = LoraRegistry::new(&options, "base").unwrap();
        let long_name = "n".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(r.load(&long_name, "/p", None).unwrap_err().param.as_deref(), Some("lora_name"));
        let long_path = "p".repeat(MAX_PATH_BYTES + 1);
        assert_eq!(r.load("a", &long_path, None).unwrap_err().param.as_deref(), Some("lora_path"));
        assert_eq!(r.load_in_place("a", &long_path).unwrap_err().param.as_deref(), Some("lora_path"));
        for i in 0..MAX_ADAPTERS {
            r.load(&format!("a{i}"), "/p", None).unwrap();
        }
        let e = r.load("one-more", "/p", None).unwrap_err();
        assert!(e.message.contains("unload one first"), "{e:?}");
        r.unload("a0").unwrap();
        r.load("one-more", "/p", None).unwrap();
    }

    #[test]
    fn loads_get_fresh_ids_and_names_stay_unique() {
        let r = registry(&["a=/p/a", "b=/p/b"]).unwrap();
        assert_eq!(r.resolve("a").unwrap().id, 1);
        assert_eq!(r.resolve("b").unwrap().id, 2);
        assert!(r.resolve("base").is_none());
        assert_eq!(r.load("a", "/q", None).unwrap_err().status, StatusCode::BAD_REQUEST);
        r.unload("a").unwrap();
        assert!(r.resolve("a").is_none());
        assert_eq!(r.unload("a").unwrap_err().status, StatusCode::NOT_FOUND);
        r.load("a", "/p/a2", None).unwrap();
        assert_eq!(r.resolve("a").unwrap().id, 3);
        let cards = r.model_cards(0);
        assert_eq!(cards.iter().map(|c| c["id"].as_str().unwrap()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(cards[1]["root"], "/p/a2");
        assert_eq!(cards[1]["parent"], "base");
        assert!(registry(&["a=/x", "a=/y"]).unwrap_err().contains("already been loaded"));
        assert!(registry(&["base=/x"]).unwrap_err().contains("served model"));
        assert!(LoraRegistry::new(&LoraOptions { max_loras: 0, modules: vec![] }, "m").is_err());
    }
}
