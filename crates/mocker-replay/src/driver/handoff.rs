//! Disaggregated prefill/decode in the offline loop (the reference's offline disagg
//! replay): a request is prefilled on a prefill worker, which keeps its KV held; at the
//! prefill's end the decode router picks a decode worker, which reserves the prompt's
//! blocks; after the modelled transfer the destination is activated (it decodes from the
//! prompt length, its prompt counted as computed) and the source releases its KV.
//!
//! Each decode worker serves its handoffs in order, trying the oldest waiting one at
//! moments the reference does: when a handoff reaches it idle, as each of its passes
//! ends, and as each transfer into it is applied (one that lands mid-pass is applied as
//! that pass ends). An oldest handoff that found no room is tried again only once a
//! request there finished, was preempted (SGLang: retracted) or let go (the engine's
//! capacity generation). Untimed transfers land right after the reservations made with
//! them, so reservations made at one instant all see the pool before any of them is
//! applied; timed ones that end together land in the order their handoffs opened.
//!
//! SGLang hands off destination first, as the reference orders it: an arriving request is
//! routed to a decode worker, which reserves its prompt pages (at once when it is idle,
//! else one waiting reservation as each of its passes ends and one as each transfer into
//! it ends); only then is the request routed to and prefilled on a prefill worker, and the
//! transfer runs from the prefill's end.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use mocker_core::config::{Backend, EngineConfig};
use mocker_core::scheduler::vllm::ReserveError;
use mocker_core::transfer::KvTransfer;
use mocker_core::{Engine, Request, SeqKey};

use super::{Sim, SlotOwner};
use crate::collector::RecordId;
use crate::deps::SessionId;
use crate::options::ms_to_ns;
use crate::request_log::PoolKind;
use crate::router::{RouteId, RouteRequest, Router};

/// Index of a live handoff in [`Disagg`].
pub(super) type HandoffId = u32;

/// One request between its prefill and its activation on a decode worker.
struct Handoff {
    /// The request as the decode worker gets it (its whole output).
    request: Request,
    record: RecordId,
    session: SessionId,
    prefill_worker: usize,
    /// The held request on the prefill worker.
    source: SeqKey,
    /// Decode worker (index into the driver's workers) and its router handle.
    decode_worker: usize,
    route: RouteId,
    /// When the prefill ended and the source started holding the KV.
    held_ns: u64,
    /// The reservation on the decode worker and the prompt tokens it must receive.
    destination: SeqKey,
    transferable: u32,
    /// Opening order: simultaneous transfers land in it (the reference's handoff ids
    /// are allocated in arrival order and break its transfer-completion ties).
    ordinal: u64,
}

/// The decode pool's side of a disaggregated replay.
pub(super) struct Disagg {
    /// Each decode worker's index among the driver's workers, by its id in the pool (a
    /// scaled pool's new workers are appended after every other).
    pub(super) members: Vec<usize>,
    /// Router of the decode pool (indices within the pool).
    pub(super) router: Router,
    /// The prefill side's transfer settings, which set the delay (as in the reference).
    transfer: KvTransfer,
    /// Reserve on the decode worker before the prefill (SGLang's order).
    pub(super) destination_first: bool,
    handoffs: Vec<Option<Handoff>>,
    free: Vec<HandoffId>,
    /// Transfers in flight: (end, the handoff's ordinal, handoff).
    due: BinaryHeap<Reverse<(u64, u64, HandoffId)>>,
    /// Handoffs opened so far.
    opened: u64,
    /// Per decode worker, handoffs waiting to be reserved (for a pass end, or for
    /// room), oldest first.
    inbox: Vec<VecDeque<HandoffId>>,
    /// Per decode worker, transfers that landed during its pass in flight; the reference
    /// applies them as that pass ends.
    landed: Vec<Vec<HandoffId>>,
    /// Decode workers whose pass ended with transfers landed during it, in order.
    pass_ended: Vec<usize>,
    /// Per decode worker, the engine's capacity generation when its oldest waiting
    /// handoff last found no room: it is tried again only once that changes (a request
    /// there finished, was preempted or let go), as the reference gates its retries.
    blocked_at: Vec<Option<u64>>,
    /// Source first: reservations whose transfer takes no time, to activate in order once
    /// the reservations made with them are (as the reference's action queue orders them).
    untimed: VecDeque<HandoffId>,
    /// Scratch for `deliver`: handoffs whose prefill ended (`true`) or was rejected.
    pub(super) started: Vec<(HandoffId, bool)>,
    /// Handoffs waiting for a decode worker (a scaled decode pool at zero), in order.
    pub(super) parked: VecDeque<HandoffId>,
}

impl Disagg {
    /// A decode pool of `workers` engines placed after `first_decode` prefill workers.
    pub(super) fn new(first_decode: usize, workers: usize, router: Router, prefill: &EngineConfig) -> Self {
        Self {
            members: (first_decode..first_decode + workers).collect(),
            router,
            transfer: KvTransfer::from_config(prefill),
            destination_first: prefill.backend == Backend::Sglang,
            handoffs: Vec::new(),
            free: Vec::new(),
            due: BinaryHeap::new(),
            opened: 0,
            inbox: vec![VecDeque::new(); workers],
            landed: vec![Vec::new(); workers],
            pass_ended: Vec::new(),
            blocked_at: vec![None; workers],
            untimed: VecDeque::new(),
            started: Vec::new(),
            parked: VecDeque::new(),
        }
    }

    /// Handoffs waiting to be reserved on decode worker `i`.
    pub(super) fn inbox_len(&self, i: usize) -> usize {
        self.inbox[i].len()
    }

    /// Whether no handoff waits to be reserved on decode worker `i` (its id in the pool).
    pub(super) fn inbox_empty(&self, i: usize) -> bool {
        self.inbox[i].is_empty()
    }

    /// Whether no handoff waits for, or has landed on, decode worker `i` (a draining
    /// worker with one is not done).
    pub(super) fn idle(&self, i: usize) -> bool {
        self.inbox[i].is_empty() && self.landed[i].is_empty()
    }

    /// A new decode worker (driver index `w`) joins the pool; returns its id there.
    pub(super) fn add_worker(&mut self, w: usize) -> usize {
        self.members.push(w);
        self.inbox.push(VecDeque::new());
        self.landed.push(Vec::new());
        self.blocked_at.push(None);
        self.members.len() - 1
    }

    /// Whether no pass end of decode worker `i` (its id in the pool), running `engine`,
    /// could reserve a waiting handoff: none waits, or the oldest found no room and no
    /// request of the worker has finished since (which ends a steady run anyway).
    pub(super) fn inbox_settled(&self, i: usize, engine: &Engine) -> bool {
        self.inbox[i].is_empty() || self.head_blocked(i, engine.capacity_generation())
    }

    /// Whether decode worker `i`'s oldest waiting handoff found no room at capacity
    /// `generation`.
    fn head_blocked(&self, i: usize, generation: u64) -> bool {
        self.blocked_at[i] == Some(generation)
    }

    /// When the next transfer ends.
    pub(super) fn next_due(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Tracks a request just submitted for prefill as `source` on `prefill_worker`.
    pub(super) fn open(
        &mut self,
        request: Request,
        record: RecordId,
        session: SessionId,
        prefill_worker: usize,
        source: SeqKey,
    ) -> HandoffId {
        let h = Handoff {
            request,
            record,
            session,
            prefill_worker,
            source,
            decode_worker: 0,
            route: 0,
            held_ns: 0,
            destination: SeqKey(0),
            transferable: 0,
            ordinal: self.opened,
        };
        self.opened += 1;
        match self.free.pop() {
            Some(id) => {
                self.handoffs[id as usize] = Some(h);
                id
            }
            None => {
                self.handoffs.push(Some(h));
                (self.handoffs.len() - 1) as HandoffId
            }
        }
    }

    /// Destination first: the prefill of `h` was submitted as `source` on `prefill_worker`.
    pub(super) fn set_source(&mut self, h: HandoffId, prefill_worker: usize, source: SeqKey) {
        let handoff = self.get_mut(h);
        handoff.prefill_worker = prefill_worker;
        handoff.source = source;
    }

    fn get(&self, h: HandoffId) -> &Handoff {
        self.handoffs[h as usize].as_ref().expect("live handoff")
    }

    fn get_mut(&mut self, h: HandoffId) -> &mut Handoff {
        self.handoffs[h as usize].as_mut().expect("live handoff")
    }

    fn close(&mut self, h: HandoffId) -> Handoff {
        self.free.push(h);
        self.handoffs[h as usize].take().expect("live handoff")
    }
}

impl Sim {
    fn disagg(&mut self) -> &mut Disagg {
        self.disagg.as_mut().expect("a disaggregated replay")
    }

    /// The prefills in `started` ended at `t` (or were rejected): route each to a decode
    /// worker and reserve there.
    pub(super) fn start_handoffs(&mut self, mut started: Vec<(HandoffId, bool)>, t: u64) {
        for &(h, prefilled) in &started {
            if self.disagg().destination_first {
                self.source_done(h, prefilled, t);
                continue;
            }
            if !prefilled {
                self.disagg().close(h);
                continue;
            }
            self.disagg().get_mut(h).held_ns = t;
            self.send_to_decode(h, t);
        }
        started.clear();
        self.disagg().started = started;
        // Only now do the untimed transfers land: every reservation above saw the pool
        // without them (the reference queues each activation behind them).
        self.activate_untimed(t);
    }

    /// Source first: the prefill of `h` is held; a decode worker reserves for it (or it
    /// waits for one, while a scaled decode pool has none).
    fn send_to_decode(&mut self, h: HandoffId, t: u64) {
        if !self.disagg().router.can_place() {
            self.disagg().parked.push_back(h);
            return;
        }
        let (w, i) = self.route_decode(h, t);
        // Reservations are served in order: an idle worker tries its oldest waiting
        // one now; a busy one as its pass ends (a steady run is cut back to that).
        self.disagg().inbox[i].push_back(h);
        if self.telemetry.is_some() {
            self.publish_gauges(w);
        }
        if self.workers[w].busy {
            self.interrupt_run(w, t);
        } else {
            self.reserve_head(w, t);
        }
        self.mark_dirty(w);
    }

    /// A decode worker became ready at `t`: the handoffs waiting for one go on, in order.
    pub(super) fn unpark_handoffs(&mut self, t: u64) {
        while self.disagg().router.can_place() {
            let Some(h) = self.disagg().parked.pop_front() else { break };
            if self.disagg().destination_first {
                self.route_destination(h, t);
            } else {
                self.send_to_decode(h, t);
            }
        }
        self.activate_untimed(t);
    }

    /// Activates, in order, the reservations made at `t` whose transfer takes no time;
    /// each activation retries its worker's oldest waiting handoff, which may add more.
    fn activate_untimed(&mut self, t: u64) {
        while let Some(h) = self.disagg().untimed.pop_front() {
            self.activate(h, t);
        }
    }

    /// Decode worker `w` tries its oldest waiting handoff at `t` (unless that found no
    /// room and the worker has given none back since).
    fn reserve_head(&mut self, w: usize, t: u64) {
        let i = self.workers[w].pool_id;
        let d = self.disagg();
        let Some(&h) = d.inbox[i].front() else { return };
        let engine = &self.workers[w].engine;
        let generation = engine.capacity_generation();
        if engine.batch_full() {
            // The reference reserves nothing while the batch is at max_num_seqs.
            self.disagg().blocked_at[i] = Some(generation);
            return;
        }
        if self.disagg().head_blocked(i, generation) {
            return;
        }
        let reserved = self.reserve(h, t);
        let d = self.disagg();
        if reserved {
            d.inbox[i].pop_front();
        }
        d.blocked_at[i] = (!reserved).then_some(generation);
    }

    /// Routes handoff `h` to a decode worker at `t` (recorded on the request and the
    /// handoff); returns the worker's index among all workers and within the decode pool.
    fn route_decode(&mut self, h: HandoffId, t: u64) -> (usize, usize) {
        self.apply_lagged(t);
        let d = self.disagg();
        // Field by field: the router is borrowed mutably beside the request.
        let r = &d.handoffs[h as usize].as_ref().expect("live handoff").request;
        let hashes = r.block_hashes.as_ref().map_or(&[][..], |x| &x.sequence[..]);
        let shareable = r.shareable_blocks.unwrap_or(hashes.len());
        let p = d.router.route(RouteRequest { isl: r.prompt_len(), hashes, shareable });
        let w = d.members[p.worker];
        let record = d.get(h).record;
        let overlap = (p.overlap_blocks, p.best_overlap_blocks);
        self.collector.on_routed(record, PoolKind::Decode, p.worker, overlap, t);
        let handoff = self.disagg().get_mut(h);
        handoff.decode_worker = w;
        handoff.route = p.id;
        (w, p.worker)
    }

    /// Reserves handoff `h`'s prompt blocks on its decode worker at `t` and starts the
    /// transfer; false when the worker has no room yet (it retries as blocks free up). A
    /// prompt the worker could never hold is rejected.
    fn reserve(&mut self, h: HandoffId, t: u64) -> bool {
        let d = self.disagg.as_mut().expect("a disaggregated replay");
        let handoff = d.get(h);
        let w = handoff.decode_worker;
        let worker = &mut self.workers[w];
        // A request the worker could never decode to its end is refused up front (an
        // aggregated engine rejects it at admission), not left to preempt itself forever.
        let r = &handoff.request;
        let peak_blocks = (r.prompt_len() + r.max_output_tokens.max(1) - 1).div_ceil(self.block_size);
        let capacity = worker.engine.kv_capacity_blocks();
        let reserved = if peak_blocks > capacity {
            Err(ReserveError::Unfit(r.uuid))
        } else {
            worker.engine.reserve(decode_leg(&handoff.request, self.block_size))
        };
        if reserved.is_ok() && self.telemetry.is_some() {
            self.publish_gauges(w);
        }
        let d = self.disagg.as_mut().expect("a disaggregated replay");
        let handoff = d.get(h);
        let worker = &mut self.workers[w];
        match reserved {
            Ok(res) => {
                let slot = res.key.0 as usize;
                if worker.owners.len() <= slot {
                    worker.owners.resize(slot + 1, SlotOwner::default());
                }
                worker.owners[slot] = SlotOwner {
                    record: handoff.record,
                    session: handoff.session,
                    route: handoff.route,
                    prefilling: true,
                    handoff: h,
                };
                let delay =
                    d.transfer.delay_ms(handoff.request.prompt_len(), Some(res.transferable_prompt_tokens));
                let (record, held_ns) = (handoff.record, handoff.held_ns);
                let destination_first = d.destination_first;
                let handoff = d.get_mut(h);
                let ordinal = handoff.ordinal;
                handoff.destination = res.key;
                handoff.transferable = res.transferable_prompt_tokens as u32;
                self.collector.on_handoff_reserved(record, self.workers[w].pool_id, held_ns, t);
                if destination_first {
                    // Now the prompt can be prefilled; the transfer starts at its end.
                    let (session, request) = (handoff.session, handoff.request.clone());
                    self.place_request(session, record, request, Some(h), t);
                    return true;
                }
                match delay.map(ms_to_ns) {
                    Some(ns) if ns > 0 => d.due.push(Reverse((t + ns, ordinal, h))),
                    // Its caller activates it, after the reservations made with it.
                    _ => d.untimed.push_back(h),
                }
                true
            }
            Err(ReserveError::NoCapacity { needed, .. }) if needed <= capacity => false,
            Err(_) => {
                // It can never fit there: the request ends, and its source lets go.
                let handoff = d.close(h);
                d.router.free(handoff.route);
                let uuid = handoff.request.uuid;
                if !d.destination_first {
                    self.workers[handoff.prefill_worker].engine.release_held(handoff.source, uuid);
                    self.mark_dirty(handoff.prefill_worker);
                    if self.telemetry.is_some() && !self.workers[handoff.prefill_worker].busy {
                        self.publish_gauges(handoff.prefill_worker);
                    }
                }
                self.collector.on_rejected(handoff.record, t);
                self.ended.push((handoff.session, uuid, true));
                true
            }
        }
    }

    /// The transfer of `h` ended at `t`: the decode worker takes the request (it samples
    /// its first token once a pass admits it) and the prefill worker frees the held KV.
    fn activate(&mut self, h: HandoffId, t: u64) {
        let handoff = self.disagg().close(h);
        let uuid = handoff.request.uuid;
        let w = handoff.decode_worker;
        self.interrupt_run(w, t);
        let activated = self.workers[w].engine.activate(handoff.destination, uuid);
        debug_assert!(activated.is_some(), "a reserved destination activates");
        let released = self.workers[handoff.prefill_worker].engine.release_held(handoff.source, uuid);
        debug_assert!(released, "the source held its KV until now");
        if self.telemetry.is_some() {
            // Both engines took a command; a busy source's release shows as its pass ends.
            self.publish_gauges(w);
            if !self.workers[handoff.prefill_worker].busy {
                self.publish_gauges(handoff.prefill_worker);
            }
        }
        // Source first, the reference logs the release as the prefill worker's pass in
        // flight ends, if it is busy. Its pass was scheduled already: freeing the blocks
        // now changes no figure (they join the LRU after that pass's own), only the log.
        let mut freed = t;
        let source_first = !self.disagg().destination_first;
        let source = &self.workers[handoff.prefill_worker];
        if source_first && source.busy {
            freed = source.engine.last_pass().end_ns.max(t);
        }
        self.collector.on_handoff_activated(handoff.record, t, freed);
        if !source_first {
            // SGLang's destination joins the batch as its next pass starts; the reference
            // reports that admission as reusing nothing (its KV came by transfer).
            self.collector.on_decode_admitted(handoff.record, 0, t);
        }
        self.mark_dirty(handoff.prefill_worker);
        self.mark_dirty(w);
        // The reference retries a waiting reservation as a transfer lands.
        self.reserve_front(w, t);
    }

    /// Destination first: request `h` (just opened) arrived at `t`. It is routed to a
    /// decode worker, which reserves its prompt at once when idle; otherwise it waits for
    /// the end of one of that worker's passes (the reference reserves only between them).
    pub(super) fn route_destination(&mut self, h: HandoffId, t: u64) {
        if !self.disagg().router.can_place() {
            self.disagg().parked.push_back(h);
            return;
        }
        let (w, i) = self.route_decode(h, t);
        self.disagg().inbox[i].push_back(h);
        let worker = &self.workers[w];
        if !worker.busy && !worker.engine.has_work() {
            self.reserve_front(w, t);
        } else {
            // Its pass ends are events now: a steady run is cut back.
            self.interrupt_run(w, t);
        }
    }

    /// Decode worker `w` tries its oldest waiting reservation at `t` (as a pass of it
    /// ends, a transfer into it lands, or a request reaches it idle).
    pub(super) fn reserve_front(&mut self, w: usize, t: u64) {
        self.reserve_head(w, t);
        if !self.ended.is_empty() {
            self.end_requests(t);
        }
    }

    /// Destination first: the prefill of `h` ended at `t` (or was rejected, which cancels
    /// the reservation); the transfer starts now.
    fn source_done(&mut self, h: HandoffId, prefilled: bool, t: u64) {
        if !prefilled {
            let handoff = self.disagg().close(h);
            let w = handoff.decode_worker;
            self.workers[w].engine.cancel_key(handoff.destination, handoff.request.uuid);
            if self.telemetry.is_some() {
                self.publish_gauges(w);
            }
            self.disagg().router.free(handoff.route);
            self.mark_dirty(w);
            return;
        }
        let d = self.disagg();
        let handoff = d.get_mut(h);
        handoff.held_ns = t;
        let (record, prompt, transferable, ordinal) =
            (handoff.record, handoff.request.prompt_len(), handoff.transferable as usize, handoff.ordinal);
        let delay = d.transfer.delay_ms(prompt, Some(transferable));
        self.collector.on_handoff_held(record, t);
        match delay.map(ms_to_ns) {
            Some(ns) if ns > 0 => self.disagg().due.push(Reverse((t + ns, ordinal, h))),
            _ => self.land(h, t),
        }
    }

    /// The transfer of `h` ended at `t`: activate it, or (its decode worker mid-pass) as
    /// that pass ends.
    fn land(&mut self, h: HandoffId, t: u64) {
        let d = self.disagg.as_mut().expect("a disaggregated replay");
        let w = d.get(h).decode_worker;
        if self.workers[w].busy {
            d.landed[self.workers[w].pool_id].push(h);
            // That pass's end is an event now: a steady run is cut back.
            self.interrupt_run(w, t);
        } else {
            self.activate(h, t);
            self.activate_untimed(t);
        }
    }

    /// Decode worker `w`'s pass ended at `t`. It retries its oldest waiting reservation;
    /// the transfers that landed during the pass are applied once every pass ending at
    /// `t` has (`activate_due`), as the reference orders them.
    pub(super) fn decode_pass_ended(&mut self, w: usize, t: u64) {
        self.reserve_front(w, t);
        self.activate_untimed(t);
        let i = self.workers[w].pool_id;
        let d = self.disagg();
        if !d.landed[i].is_empty() {
            d.pass_ended.push(w);
        }
    }

    /// Applies the transfers that landed during passes that have ended.
    fn activate_landed(&mut self, t: u64) -> bool {
        let Some(d) = self.disagg.as_mut() else { return false };
        if d.pass_ended.is_empty() {
            return false;
        }
        let ended = std::mem::take(&mut d.pass_ended);
        for &w in &ended {
            let i = self.workers[w].pool_id;
            let landed = std::mem::take(&mut self.disagg().landed[i]);
            for &h in &landed {
                self.activate(h, t);
                self.activate_untimed(t);
            }
        }
        true
    }

    /// Activates the destinations whose transfers end by `now`; whether any did.
    pub(super) fn activate_due(&mut self, now: u64) -> bool {
        let mut any = self.activate_landed(now);
        while let Some(d) = self.disagg.as_mut() {
            match d.due.peek() {
                Some(&Reverse((t, _, h))) if t <= now => {
                    d.due.pop();
                    self.land(h, now);
                    any = true;
                }
                _ => break,
            }
        }
        if !self.ended.is_empty() {
            self.end_requests(now);
        }
        any
    }
}

/// `hashes` in a vector with room for `blocks` in all, the most its engine grows it to
/// (an exact-size copy would be copied again by the engine's first reserve).
fn with_room(hashes: &[u64], blocks: usize) -> Vec<u64> {
    let mut v = Vec::with_capacity(blocks.max(hashes.len()));
    v.extend_from_slice(hashes);
    v
}

/// The prefill leg of a disaggregated `request`: one output token, and the prompt's
/// local hashes moved out of `request`, which stays the decode leg (decode engines record
/// no KV events, so only the prefill one reads them).
pub(super) fn prefill_leg(request: &mut Request, block_size: usize) -> Request {
    let blocks = (request.prompt_len() + 1).div_ceil(block_size);
    let block_hashes = request.block_hashes.as_mut().map(|h| mocker_core::hashing::PromptHashes {
        sequence: with_room(&h.sequence, blocks),
        local: std::mem::take(&mut h.local),
    });
    Request { max_output_tokens: 1, block_hashes, ..leg_without_hashes(request) }
}

/// The copy of the decode leg `request` a decode worker reserves with: sequence hashes
/// only, with room for the blocks its output fills.
fn decode_leg(request: &Request, block_size: usize) -> Request {
    let blocks = (request.prompt_len() + request.max_output_tokens).div_ceil(block_size);
    let block_hashes = request.block_hashes.as_ref().map(|h| mocker_core::hashing::PromptHashes {
        sequence: with_room(&h.sequence, blocks),
        local: Vec::new(),
    });
    Request { block_hashes, ..leg_without_hashes(request) }
}

/// `request` without its hashes (field by field, so a new field is not forgotten).
fn leg_without_hashes(request: &Request) -> Request {
    Request {
        uuid: request.uuid,
        tokens: request.tokens.clone(),
        max_output_tokens: request.max_output_tokens,
        output_token_ids: request.output_token_ids.clone(),
        block_hashes: None,
        shareable_blocks: request.shareable_blocks,
        prompt_len: request.prompt_len,
        lora: request.lora.clone(),
    }
}
