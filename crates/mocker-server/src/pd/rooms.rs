//! SGLang's bootstrap rooms on a prefill server: where a finished prefill's held KV meets
//! the decode server that reads it. Either side may come first (SGLang's decode side
//! usually does: its router sends the request to both servers at once); each waits for the
//! other at most the session timeout (the reference's `handoff_session_timeout_ms`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use super::Held;

/// A held prefill handed to its reader, with where to report the transfer's end (ms).
pub(super) type Handover = (Held, oneshot::Sender<f64>);

enum Room {
    /// A finished prefill waits for its reader.
    Held { serial: u64, held: Held, done: oneshot::Sender<f64> },
    /// A reader waits for its prefill.
    Awaited(oneshot::Sender<Handover>),
}

/// The rooms of one prefill server.
pub(super) struct Rooms {
    /// How long either side waits for the other.
    pub(super) timeout: Duration,
    table: Mutex<FxHashMap<u64, Room>>,
    serial: AtomicU64,
}

/// What [`Rooms::take`] found.
pub(super) enum Taken {
    /// The prefill was there.
    Ready(Handover),
    /// The reader waits for it here.
    Wait(oneshot::Receiver<Handover>),
}

impl Rooms {
    pub(super) fn new(timeout: Duration) -> Self {
        Self { timeout, table: Mutex::default(), serial: AtomicU64::new(1) }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, Room>> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a prefill already holds its KV in `room` (a second prefill for the same room
    /// is refused before it runs; [`Self::deliver`] refuses one that raced past this).
    pub(super) fn is_held(&self, room: u64) -> bool {
        matches!(self.table().get(&room), Some(Room::Held { .. }))
    }

    /// A finished prefill puts its KV in `room`: to the reader waiting there, or to wait
    /// for one. Returns where the transfer's end is reported and the entry's serial (for
    /// [`Self::withdraw`]); `Err(held)` when another prefill already holds the room.
    pub(super) fn deliver(&self, room: u64, held: Held) -> Result<(oneshot::Receiver<f64>, u64), Held> {
        let (done, finished) = oneshot::channel();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let mut table = self.table();
        let mut handover = (held, done);
        match table.remove(&room) {
            Some(Room::Awaited(reader)) => match reader.send(handover) {
                Ok(()) => return Ok((finished, serial)),
                // The reader gave up: the KV waits for the next one.
                Err(back) => handover = back,
            },
            Some(other @ Room::Held { .. }) => {
                table.insert(room, other);
                return Err(handover.0);
            }
            None => {}
        }
        let (held, done) = handover;
        table.insert(room, Room::Held { serial, held, done });
        Ok((finished, serial))
    }

    /// The prefill of `room` for a reader: at once, or a receiver to wait on.
    pub(super) fn take(&self, room: u64) -> Result<Taken, &'static str> {
        let mut table = self.table();
        match table.remove(&room) {
            Some(Room::Held { held, done, .. }) => Ok(Taken::Ready((held, done))),
            Some(Room::Awaited(other)) if !other.is_closed() => {
                table.insert(room, Room::Awaited(other));
                Err("another decode request already waits in this bootstrap room")
            }
            _ => {
                let (tx, rx) = oneshot::channel();
                table.insert(room, Room::Awaited(tx));
                Ok(Taken::Wait(rx))
            }
        }
    }

    /// Removes a reader that stopped waiting, if it is still the room's.
    pub(super) fn forget_reader(&self, room: u64) {
        let mut table = self.table();
        if matches!(table.get(&room), Some(Room::Awaited(r)) if r.is_closed()) {
            table.remove(&room);
        }
    }

    /// Takes back the held prefill `serial` of `room` if no reader took it (its wait timed
    /// out or its client left): the caller frees its KV.
    pub(super) fn withdraw(&self, room: u64, serial: u64) -> Option<Held> {
        let mut table = self.table();
        match table.remove(&room) {
            Some(Room::Held { serial: s, held, .. }) if s == serial => Some(held),
            Some(other) => {
                table.insert(room, other);
                None
            }
            None => None,
        }
    }
}

/// Frees a prefill's held KV if it is still in its room when the prefill stops waiting
/// (timed out, or its client went away).
pub(super) struct Withdraw {
    pub(super) pd: Arc<super::PdState>,
    pub(super) room: u64,
    pub(super) serial: u64,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(rooms) = self.pd.rooms.as_ref() else { return };
        if let Some(held) = rooms.withdraw(self.room, self.serial) {
            eprintln!("kv transfer: no decode server read bootstrap room {}; its KV is freed", self.room);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = held.control.release_source().await;
                });
            }
        }
    }
}
