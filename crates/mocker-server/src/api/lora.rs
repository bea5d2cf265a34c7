//! vLLM's LoRA routes (`--enable-lora`): `POST /v1/load_lora_adapter` and
//! `POST /v1/unload_lora_adapter`; the registry they change is [`crate::lora`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::ApiError;
use crate::state::{body, AppState};

fn registry(state: &AppState, request: &Request) -> Result<(), ApiError> {
    match state.lora {
        Some(_) => Ok(()),
        None => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "no route {} {} (LoRA is off: start the server with --enable-lora)",
                request.method(),
                request.uri().path()
            ),
            param: None,
        }),
    }
}

fn parse_body<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("malformed request body: {e}")))
}

/// `POST /v1/load_lora_adapter` `{"lora_name", "lora_path", "load_inplace"?}`.
pub async fn load_lora_adapter(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    registry(&state, &request)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(default)]
        lora_name: String,
        #[serde(default)]
        lora_path: String,
        #[serde(default)]
        load_inplace: bool,
    }
    let b: Body = parse_body(&body(&state, request).await?)?;
    let lora = state.lora.as_ref().expect("checked above");
    if b.load_inplace && !b.lora_name.is_empty() && !b.lora_path.is_empty() {
        lora.load_in_place(&b.lora_name, &b.lora_path)?;
    } else {
        lora.load(&b.lora_name, &b.lora_path, None)?;
    }
    Ok((StatusCode::OK, format!("Success: LoRA adapter '{}' added successfully.", b.lora_name))
        .into_response())
}

/// `POST /v1/unload_lora_adapter` `{"lora_name", "lora_int_id"?}`. Requests already running
/// with the adapter finish with it.
pub async fn unload_lora_adapter(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    registry(&state, &request)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(default)]
        lora_name: String,
        lora_int_id: Option<u32>,
    }
    let b: Body = parse_body(&body(&state, request).await?)?;
    let lora = state.lora.as_ref().expect("checked above");
    if b.lora_name.is_empty() {
        return Err(match b.lora_int_id {
            None => ApiError::bad_request("either 'lora_name' and 'lora_int_id' needs to be provided."),
            // vLLM unloads by name; an id alone finds nothing there either.
            Some(_) => {
                ApiError::invalid_field("lora_name", "'lora_name' must be provided to unload an adapter.")
            }
        });
    }
    lora.unload(&b.lora_name)?;
    Ok((StatusCode::OK, format!("Success: LoRA adapter '{}' removed successfully.", b.lora_name))
        .into_response())
}
