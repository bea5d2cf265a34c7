//! vLLM's gRPC service, `vllm.grpc.engine.VllmEngine` (the Shepherd Model Gateway's current
//! version of the protocol, see `proto/SOURCE.md`), with the standard health service
//! (`grpc.health.v1.Health`) and server reflection (v1 and v1alpha).
//!
//! The `VllmEngine` RPCs need `authorization: Bearer KEY` metadata when the server has an
//! API key (`UNAUTHENTICATED` otherwise) and answer `UNAVAILABLE` while the engine starts
//! (`startup_time`), except `HealthCheck`, which reports it. Health and reflection need no
//! key, as `/health` needs none.

pub mod codec;
pub mod convert;
pub mod pb;
pub mod service;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use tonic::service::Routes;
use tonic::Status;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::auth::authorized;
use crate::state::AppState;
use pb::vllm_engine_server::VllmEngineServer;

/// The service's full name, also its name in the health service.
pub const SERVICE: &str = "vllm.grpc.engine.VllmEngine";

/// The gRPC services of one server, and the health status they report.
#[derive(Clone)]
pub struct Grpc {
    router: axum::Router,
    health: HealthReporter,
    /// Set at shutdown, so the end of `startup_time` cannot report `SERVING` after it.
    stopping: Arc<tokio::sync::Mutex<bool>>,
}

impl std::fmt::Debug for Grpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grpc").finish_non_exhaustive()
    }
}

impl Grpc {
    /// The services over `state`; health reports `NOT_SERVING` until the engine is up
    /// (a task watches `startup_time`). A backend other than vLLM's (`served` false)
    /// answers every call `UNIMPLEMENTED`.
    pub async fn new(state: Arc<AppState>, served: bool) -> Self {
        let engine = VllmEngineServer::new(service::Engine::new(state.clone()))
            // Larger requests are RESOURCE_EXHAUSTED, as a larger HTTP body is a 413.
            .max_decoding_message_size(state.max_body_bytes)
            .max_encoding_message_size(usize::MAX);
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in ["", SERVICE] {
            health.set_service_status(name, ServingStatus::NotServing).await;
        }
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let v1 = reflection().build_v1().expect("the build's own descriptors");
        let v1alpha = reflection().build_v1alpha().expect("the build's own descriptors");
        let router = if !served {
            axum::Router::new().fallback(|| async {
                grpc_error(Status::unimplemented(
                    "this server simulates a backend without vLLM's gRPC service (vllm.grpc.engine.VllmEngine \
                     is served on the vllm backend)",
                ))
            })
        } else {
            Routes::new(engine)
                .add_service(health_service)
                .add_service(v1)
                .add_service(v1alpha)
                .into_axum_router()
                .layer(middleware::from_fn_with_state(state.clone(), gate))
        };
        let (reporter, stopping) = (health.clone(), Arc::new(tokio::sync::Mutex::new(false)));
        let (readiness, stopped) = (state.readiness, stopping.clone());
        tokio::spawn(async move {
            tokio::time::sleep(readiness.ready_in()).await;
            let stopped = stopped.lock().await;
            if !*stopped {
                for name in ["", SERVICE] {
                    reporter.set_service_status(name, ServingStatus::Serving).await;
                }
            }
        });
        Self { router, health, stopping }
    }

    /// The router of every gRPC service.
    pub fn router(&self) -> axum::Router {
        self.router.clone()
    }

    /// Reports `NOT_SERVING` from now on (the server is shutting down).
    pub async fn shutting_down(&self) {
        let mut stopping = self.stopping.lock().await;
        *stopping = true;
        for name in ["", SERVICE] {
            self.health.set_service_status(name, ServingStatus::NotServing).await;
        }
    }
}

/// API key and startup for the `VllmEngine` RPCs.
async fn gate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if let Some(method) = path.strip_prefix(&format!("/{SERVICE}/")) {
        if !authorized(state.api_key.as_ref(), request.headers()) {
            return grpc_error(Status::unauthenticated(
                "this server needs its API key: send metadata `authorization: Bearer KEY` (--api-key)",
            ));
        }
        if method != "HealthCheck" && !state.readiness.is_ready() {
            return grpc_error(Status::unavailable(state.readiness.starting_error().message));
        }
    }
    let response = next.run(request).await;
    too_large_as_resource_exhausted(response, state.max_body_bytes)
}

/// tonic answers a request message over the size limit `OUT_OF_RANGE`; gRPC's own servers
/// (and its status-code guide) answer `RESOURCE_EXHAUSTED`, which clients treat as "too big".
fn too_large_as_resource_exhausted(response: Response, limit: usize) -> Response {
    match Status::from_header_map(response.headers()) {
        Some(s)
            if s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large") =>
        {
            grpc_error(Status::resource_exhausted(format!(
                "request message too large: the limit is {limit} bytes (the server's request body limit); {}",
                s.message()
            )))
        }
        _ => response,
    }
}

fn grpc_error(status: Status) -> Response {
    status.into_http::<axum::body::Body>()
}
