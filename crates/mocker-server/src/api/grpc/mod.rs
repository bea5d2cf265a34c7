//! vLLM's gRPC service, `vllm.grpc.engine.VllmEngine`, on the vllm backend and SGLang's,
//! `sglang.grpc.scheduler.SglangScheduler`, on the sglang backend (the Shepherd Model
//! Gateway's current versions of the protocols, see `proto/SOURCE.md`), with the standard
//! health service (`grpc.health.v1.Health`) and server reflection (v1 and v1alpha), which
//! list the one service served. The other engine's service answers `UNIMPLEMENTED` naming
//! the backend that serves it.
//!
//! The engine RPCs need `authorization: Bearer KEY` metadata when the server has an
//! API key (`UNAUTHENTICATED` otherwise) and answer `UNAVAILABLE` while the engine starts
//! (`startup_time`), except `HealthCheck`, which reports it. Health and reflection need no
//! key, as `/health` needs none.

pub mod codec;
pub mod convert;
pub mod pb;
pub mod service;
pub mod sglang;
pub mod sglang_convert;
pub mod shared;

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
use pb::sglang::grpc::scheduler::sglang_scheduler_server::SglangSchedulerServer;
use pb::vllm_engine_server::VllmEngineServer;

/// vLLM's service's full name, also its name in the health service.
pub const SERVICE: &str = "vllm.grpc.engine.VllmEngine";

/// SGLang's service's full name, also its name in the health service.
pub const SGLANG_SERVICE: &str = "sglang.grpc.scheduler.SglangScheduler";

/// Which engine's gRPC service a server serves (its backend's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `vllm.grpc.engine.VllmEngine`.
    Vllm,
    /// `sglang.grpc.scheduler.SglangScheduler`.
    Sglang,
}

impl Service {
    /// The service's full name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => SERVICE,
            Self::Sglang => SGLANG_SERVICE,
        }
    }
}

/// The gRPC services of one server, and the health status they report.
#[derive(Clone)]
pub struct Grpc {
    router: axum::Router,
    health: HealthReporter,
    /// The service served, as the health service names it ("" too).
    names: [&'static str; 2],
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
    /// (a task watches `startup_time`). A backend without a simulated gRPC service
    /// (`served` None) answers every call `UNIMPLEMENTED`.
    pub async fn new(state: Arc<AppState>, served: Option<Service>) -> Self {
        let names = ["", served.map_or("", Service::name)];
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in names {
            health.set_service_status(name, ServingStatus::NotServing).await;
        }
        let descriptors = match served {
            Some(Service::Sglang) => pb::SGLANG_FILE_DESCRIPTOR_SET,
            _ => pb::FILE_DESCRIPTOR_SET,
        };
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(descriptors)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let v1 = reflection().build_v1().expect("the build's own descriptors");
        let v1alpha = reflection().build_v1alpha().expect("the build's own descriptors");
        // Larger requests are RESOURCE_EXHAUSTED, as a larger HTTP body is a 413.
        let limit = state.max_body_bytes;
        let routes = match served {
            None => {
                return Self::unserved(
                    health,
                    names,
                    "this server simulates a backend without a gRPC service \
                     (vllm.grpc.engine.VllmEngine is served on the vllm backend, \
                     sglang.grpc.scheduler.SglangScheduler on the sglang backend)",
                )
            }
            Some(Service::Vllm) => Routes::new(
                VllmEngineServer::new(service::Engine::new(state.clone()))
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(usize::MAX),
            ),
            Some(Service::Sglang) => Routes::new(
                SglangSchedulerServer::new(sglang::Scheduler::new(state.clone()))
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(usize::MAX),
            ),
        };
        let (own, other, other_backend) = match served {
            Some(Service::Sglang) => ("sglang", SERVICE, "vllm"),
            _ => ("vllm", SGLANG_SERVICE, "sglang"),
        };
        let message = format!(
            "{other} is not served by this server, which simulates the {own} backend and serves {} \
             ({other} is served on the {other_backend} backend)",
            names[1]
        );
        let router = routes
            .add_service(health_service)
            .add_service(v1)
            .add_service(v1alpha)
            .into_axum_router()
            .route(
                &format!("/{other}/{{method}}"),
                axum::routing::any(move || {
                    let message = message.clone();
                    async move { grpc_error(Status::unimplemented(message)) }
                }),
            )
            .layer(middleware::from_fn_with_state((state.clone(), names[1]), gate));
        let (reporter, stopping) = (health.clone(), Arc::new(tokio::sync::Mutex::new(false)));
        let (readiness, stopped) = (state.readiness, stopping.clone());
        tokio::spawn(async move {
            tokio::time::sleep(readiness.ready_in()).await;
            let stopped = stopped.lock().await;
            if !*stopped {
                for name in names {
                    reporter.set_service_status(name, ServingStatus::Serving).await;
                }
            }
        });
        Self { router, health, names, stopping }
    }

    fn unserved(health: HealthReporter, names: [&'static str; 2], message: &'static str) -> Self {
        let router =
            axum::Router::new().fallback(move || async move { grpc_error(Status::unimplemented(message)) });
        Self { router, health, names, stopping: Arc::default() }
    }

    /// The router of every gRPC service.
    pub fn router(&self) -> axum::Router {
        self.router.clone()
    }

    /// Reports `NOT_SERVING` from now on (the server is shutting down).
    pub async fn shutting_down(&self) {
        let mut stopping = self.stopping.lock().await;
        *stopping = true;
        for name in self.names {
            self.health.set_service_status(name, ServingStatus::NotServing).await;
        }
    }
}

/// API key and startup for the served engine service's RPCs.
async fn gate(
    State((state, service)): State<(Arc<AppState>, &'static str)>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if let Some(method) = path.strip_prefix(&format!("/{service}/")) {
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
