//! The per-rank routing table: client id -> route. A route is the shared record of one
//! submission (client id, fresh scheduler id, lifecycle state); the actor's slot table
//! holds the output sender, so the hot delivery path never touches this map.

use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use tokio::sync::watch;
use uuid::Uuid;

use crate::error::LiveError;

/// Where a submission is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteState {
    /// Registered, not yet applied by the actor.
    Submitting,
    /// Held by the core.
    Active,
    /// Finished, cancelled, rejected or shut down.
    Closed,
}

/// One submission.
#[derive(Debug)]
pub(crate) struct Route {
    pub client_id: Uuid,
    /// The id the core sees: fresh per submission, never the client id.
    pub sched_id: u128,
    pub state: watch::Sender<RouteState>,
    /// Set by the actor when the stream's buffer was full and the request was cut short.
    pub overflowed: AtomicBool,
}

impl Route {
    pub fn new(client_id: Uuid, sched_id: u128) -> Arc<Self> {
        Arc::new(Self {
            client_id,
            sched_id,
            state: watch::Sender::new(RouteState::Submitting),
            overflowed: AtomicBool::new(false),
        })
    }

    pub fn set(&self, s: RouteState) {
        self.state.send_replace(s);
    }

    pub fn get(&self) -> RouteState {
        *self.state.borrow()
    }

    /// Waits until the actor applied (or dropped) the submission; true when active.
    pub async fn wait_for_admission(&self) -> bool {
        let mut rx = self.state.subscribe();
        let active = match rx.wait_for(|s| *s != RouteState::Submitting).await {
            Ok(s) => *s == RouteState::Active,
            Err(_) => false,
        };
        active
    }
}

/// What a rank shares between its handles and the actor.
#[derive(Debug, Default)]
pub(crate) struct RankShared {
    routes: Mutex<FxHashMap<Uuid, Arc<Route>>>,
    /// Cleared when the rank is retired or the group stops.
    pub running: AtomicBool,
    /// A rank-level failure (e.g. the admission receiver closed), reported by `shutdown`.
    pub failure: Mutex<Option<crate::error::LiveError>>,
    /// Handoff lifecycle routes.
    pub handoffs: Mutex<crate::handoff::HandoffTable>,
    /// Requests cancelled because their reader let the output buffer overflow.
    pub overflow_cancellations: AtomicU64,
}

impl RankShared {
    pub fn new() -> Arc<Self> {
        Arc::new(Self { running: AtomicBool::new(true), ..Default::default() })
    }

    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Registers a route; an active route with the same client id is left untouched.
    pub fn insert(&self, route: Arc<Route>) -> Result<(), LiveError> {
        let mut map = self.routes.lock().expect("route table");
        match map.entry(route.client_id) {
            Entry::Occupied(_) => Err(LiveError::AlreadyActive(route.client_id)),
            Entry::Vacant(v) => {
                v.insert(route);
                Ok(())
            }
        }
    }

    /// Closes `route` and removes it if it is still the registered one (identity check, so
    /// a replacement with the same client id is never touched).
    pub fn remove(&self, route: &Arc<Route>) {
        route.set(RouteState::Closed);
        let mut map = self.routes.lock().expect("route table");
        if map.get(&route.client_id).is_some_and(|r| Arc::ptr_eq(r, route)) {
            map.remove(&route.client_id);
        }
    }

    pub fn get(&self, client_id: &Uuid) -> Option<Arc<Route>> {
        self.routes.lock().expect("route table").get(client_id).cloned()
    }

    pub fn len(&self) -> usize {
        self.routes.lock().expect("route table").len()
    }

    /// Stops the rank: no new routes, every route closed.
    pub fn stop(&self) {
        self.running.store(false, Ordering::Release);
        let drained: Vec<_> = self.routes.lock().expect("route table").drain().collect();
        for (_, r) in drained {
            r.set(RouteState::Closed);
        }
        self.handoffs.lock().expect("handoffs").close_all();
    }

    pub fn fail(&self, e: LiveError) {
        self.failure.lock().expect("failure").get_or_insert(e);
    }
}
