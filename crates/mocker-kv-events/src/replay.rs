//! The replay service: its own thread owns the ROUTER socket and answers gap-recovery
//! requests from the buffer of published batches, each client independently.
//!
//! A request `[identity, empty, start_seq u64 BE]` queues a replay of every batch buffered
//! from `start_seq` up to the newest one at request time. Replays are sent a few messages
//! per client per round, without ever blocking: the ROUTER reports a client whose outbound
//! queue (`REPLAY_SNDHWM` messages in libzmq) is full, and that client is simply skipped
//! until it reads. So a slow or stuck client only delays its own replays, and the memory it
//! can hold is its libzmq queue plus a few integers. Limits, all per publisher:
//!
//! * `MAX_REQUESTS_PER_CLIENT` replays queued per client; further requests are ignored;
//! * `MAX_CLIENTS` clients with queued replays; requests from further clients are ignored;
//! * a client that takes nothing for `STALL_TIMEOUT` loses its queued replays (it gets no end
//!   marker and must ask again);
//! * a batch evicted from the buffer while a client's replay is pending is skipped, as if
//!   the client had asked later: the client sees the sequence jump.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Sequence value of the replay end marker: -1 as a big-endian i64, as vLLM sends it.
pub const REPLAY_END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Messages libzmq queues for one replay client before the ROUTER reports it full.
pub(crate) const REPLAY_SNDHWM: i32 = 128;

/// Replays queued per client; more requests from it are ignored until one completes.
const MAX_REQUESTS_PER_CLIENT: usize = 8;

/// Clients with queued replays at once; requests from others are ignored meanwhile.
const MAX_CLIENTS: usize = 64;

/// A client that accepts no message for this long loses its queued replays.
const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Messages sent to one client before the next client's turn.
const QUANTUM: usize = 64;

/// Requests read per round, so a flood of requests cannot starve the replies.
const MAX_REQUESTS_PER_ROUND: usize = 1024;

/// How often clients that were full are tried again.
const RETRY_TICK_MS: i64 = 1;

/// The last published batches, oldest first; shared by the publishing and replay threads.
pub(crate) struct ReplayBuffer {
    entries: VecDeque<(u64, Bytes)>,
    capacity: usize,
}

/// The buffer both threads use.
pub(crate) type SharedBuffer = Arc<Mutex<ReplayBuffer>>;

impl ReplayBuffer {
    pub fn new(capacity: usize) -> Self {
        Self { entries: VecDeque::with_capacity(capacity.min(1 << 16)), capacity }
    }

    pub fn push(&mut self, seq: u64, payload: Bytes) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((seq, payload));
    }

    /// The sequence number after the newest buffered batch (0 when empty).
    fn end(&self) -> u64 {
        self.entries.back().map_or(0, |(s, _)| s + 1)
    }

    /// Appends to `out` at most `max` buffered batches with `start <= seq < end`, in order.
    fn copy_range(&self, start: u64, end: u64, max: usize, out: &mut Vec<(u64, Bytes)>) {
        let first = self.entries.partition_point(|(s, _)| *s < start);
        out.extend(self.entries.range(first..).take_while(|(s, _)| *s < end).take(max).cloned());
    }
}

/// One pending replay: batches `next..end` still to send, then the end marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Job {
    next: u64,
    end: u64,
}

/// A client with queued replays.
struct Client {
    identity: Vec<u8>,
    jobs: VecDeque<Job>,
    /// When the client last accepted a message (or asked, if it has accepted none yet).
    last_progress: Instant,
}

/// What happened to one client in one round.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// Its quantum went out and more is queued.
    MoreToSend,
    /// Everything queued went out.
    Done,
    /// Its queue in libzmq is full.
    Full,
    /// It is gone (disconnected) or timed out: forget it.
    Drop,
}

/// The replay thread's state.
pub(crate) struct ReplayService {
    router: zmq::Socket,
    stop: zmq::Socket,
    buffer: SharedBuffer,
    clients: Vec<Client>,
    scratch: Vec<(u64, Bytes)>,
}

impl ReplayService {
    /// `router` is bound; a message on `stop` ends [`Self::run`].
    pub fn new(router: zmq::Socket, stop: zmq::Socket, buffer: SharedBuffer) -> Self {
        Self { router, stop, buffer, clients: Vec::new(), scratch: Vec::with_capacity(QUANTUM) }
    }

    /// Serves until told to stop (or the context goes away).
    pub fn run(mut self) {
        let mut timeout = -1;
        loop {
            let mut items = [self.router.as_poll_item(zmq::POLLIN), self.stop.as_poll_item(zmq::POLLIN)];
            if zmq::poll(&mut items, timeout).is_err() || items[1].is_readable() {
                return;
            }
            if items[0].is_readable() && !self.read_requests() {
                return;
            }
            let busy = self.pump();
            // Go straight on while some client can take more; tick while some are full;
            // sleep until a request comes when nothing is queued.
            timeout = if busy {
                0
            } else if self.clients.is_empty() {
                -1
            } else {
                RETRY_TICK_MS
            };
        }
    }

    /// Reads the waiting requests (a bounded number); false when the socket is unusable.
    fn read_requests(&mut self) -> bool {
        for _ in 0..MAX_REQUESTS_PER_ROUND {
            match self.recv_request() {
                Ok(Some((identity, start))) => self.enqueue(identity, start),
                Ok(None) => {}
                Err(zmq::Error::EAGAIN) => return true,
                Err(zmq::Error::EINTR) => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// One message off the ROUTER, frame by frame so a message of many frames costs
    /// nothing to skip: `Some` for a well-formed request, `None` for anything else (ignored,
    /// as vLLM does; the delimiter's content is not checked, as in vLLM).
    fn recv_request(&self) -> zmq::Result<Option<(Vec<u8>, u64)>> {
        let identity = self.router.recv_bytes(zmq::DONTWAIT)?;
        let mut frames = 1;
        let mut start = None;
        while self.router.get_rcvmore()? {
            let frame = self.router.recv_msg(0)?;
            frames += 1;
            if frames == 3 {
                start = <[u8; 8]>::try_from(&frame[..]).ok().map(u64::from_be_bytes);
            }
        }
        Ok(start.filter(|_| frames == 3).map(|s| (identity, s)))
    }

    fn enqueue(&mut self, identity: Vec<u8>, start: u64) {
        let end = self.buffer.lock().expect("replay buffer lock").end();
        let job = Job { next: start, end };
        if let Some(client) = self.clients.iter_mut().find(|c| c.identity == identity) {
            if client.jobs.len() < MAX_REQUESTS_PER_CLIENT {
                client.jobs.push_back(job);
            }
        } else if self.clients.len() < MAX_CLIENTS {
            let jobs = VecDeque::from([job]);
            self.clients.push(Client { identity, jobs, last_progress: Instant::now() });
        }
    }

    /// Gives every client a turn; true when some client has more it could take now.
    fn pump(&mut self) -> bool {
        let mut busy = false;
        let mut i = 0;
        while i < self.clients.len() {
            match self.turn(i) {
                Turn::MoreToSend => {
                    busy = true;
                    i += 1;
                }
                Turn::Full => i += 1,
                Turn::Done | Turn::Drop => {
                    self.clients.swap_remove(i);
                }
            }
        }
        busy
    }

    /// Sends up to a quantum of client `i`'s replays.
    fn turn(&mut self, i: usize) -> Turn {
        let Self { router, buffer, clients, scratch, .. } = self;
        let client = &mut clients[i];
        let mut sent = 0;
        while let Some(job) = client.jobs.front_mut() {
            if sent == QUANTUM {
                return Turn::MoreToSend;
            }
            scratch.clear();
            buffer.lock().expect("replay buffer lock").copy_range(job.next, job.end, QUANTUM - sent, scratch);
            if scratch.is_empty() {
                match send(router, &client.identity, &REPLAY_END_SEQ, &[]) {
                    Sent::Yes => {
                        client.jobs.pop_front();
                        client.last_progress = Instant::now();
                        sent += 1;
                        continue;
                    }
                    Sent::Full => break,
                    Sent::Gone => return Turn::Drop,
                }
            }
            let mut full = false;
            for (seq, payload) in scratch.iter() {
                match send(router, &client.identity, &seq.to_be_bytes(), payload) {
                    Sent::Yes => {
                        job.next = seq + 1;
                        client.last_progress = Instant::now();
                        sent += 1;
                    }
                    Sent::Full => {
                        full = true;
                        break;
                    }
                    Sent::Gone => return Turn::Drop,
                }
            }
            if full {
                break;
            }
        }
        if client.jobs.is_empty() {
            Turn::Done
        } else if client.last_progress.elapsed() > STALL_TIMEOUT {
            Turn::Drop
        } else {
            Turn::Full
        }
    }
}

/// Whether a reply went out.
enum Sent {
    Yes,
    /// The client's queue is full: try again later.
    Full,
    /// The client disconnected (or the socket is closing).
    Gone,
}

/// Sends `[identity, empty, seq, payload]` without blocking. The ROUTER is mandatory, so a
/// full or unknown client is reported at the identity frame, before anything is queued.
fn send(router: &zmq::Socket, identity: &[u8], seq: &[u8], payload: &[u8]) -> Sent {
    let frames: [&[u8]; 4] = [identity, &[], seq, payload];
    match router.send_multipart(frames, zmq::DONTWAIT) {
        Ok(()) => Sent::Yes,
        Err(zmq::Error::EAGAIN) => Sent::Full,
        Err(_) => Sent::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_buffer_keeps_the_last_batches_and_copies_a_range() {
        let mut b = ReplayBuffer::new(3);
        assert_eq!(b.end(), 0);
        for s in 0..5u64 {
            b.push(s, Bytes::from(vec![s as u8]));
        }
        assert_eq!(b.end(), 5);
        let seqs = |start, end, max| {
            let mut out = Vec::new();
            b.copy_range(start, end, max, &mut out);
            out.into_iter().map(|(s, _)| s).collect::<Vec<_>>()
        };
        assert_eq!(seqs(0, 5, 10), vec![2, 3, 4]);
        assert_eq!(seqs(3, 5, 10), vec![3, 4]);
        assert_eq!(seqs(0, 4, 10), vec![2, 3], "nothing past the end at request time");
        assert_eq!(seqs(0, 5, 2), vec![2, 3], "at most max");
        assert_eq!(seqs(5, 9, 10), Vec::<u64>::new());
        let mut out = Vec::new();
        b.copy_range(4, 5, 1, &mut out);
        assert_eq!(out[0].1, Bytes::from(vec![4u8]));
    }
}
