//! `--agentic-lanes N`: closed-loop playback of a request graph's plays, as the reference's
//! agentic lanes replay them. N lanes each run one play (trajectory) at a time; the first N
//! plays start at time 0, and when a play's last request ends its lane takes up the next
//! pending play (in [`Trace::plays`] order, whichever lane frees first) at that instant.
//! A play started at `S` keeps its authored timing relative to its earliest root: a
//! request the file holds until `not_before_ms` is held until
//! `S + (not_before_ms - root not_before_ms)`, and its dependencies' delays are unchanged.
//!
//! Sessions of a play are taken from the feed up front (a lane replay is of an agentic
//! trace, whose plays are small) and released into the replay when their play starts.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::feed::{PlannedSession, SessionFeed};
use crate::options::ms_to_ns;
use crate::trace::Trace;

/// Lane state of a replay.
#[derive(Debug)]
pub(crate) struct Lanes {
    /// Each row's play (index in lane order), by line.
    play_of_line: FxHashMap<u32, u32>,
    /// Requests of each play that have not ended.
    remaining: Vec<u32>,
    /// Sessions of each play that has not started.
    held: Vec<Vec<PlannedSession>>,
    /// The next play a free lane takes up.
    next: usize,
    /// Sessions of started plays, by (arrival, workload order); `slots` holds them.
    due: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<PlannedSession>>,
    speedup: f64,
}

impl Lanes {
    /// `lanes` lanes over `trace`'s plays (checked by [`Trace::plays`] beforehand), with
    /// every session taken from `feed`; the first plays start at 0.
    pub(crate) fn new(trace: &Trace, lanes: usize, feed: &mut SessionFeed, speedup: f64) -> Self {
        let plays = trace.plays().unwrap_or_default();
        let mut play_of_line = FxHashMap::default();
        for (p, play) in plays.iter().enumerate() {
            for &line in &play.lines {
                play_of_line.insert(line, p as u32);
            }
        }
        let mut held = vec![Vec::new(); plays.len()];
        while let Some(s) = feed.start_session() {
            let p = s.turns.front().and_then(|t| play_of_line.get(&(t.uuid as u32)));
            held[*p.expect("every row of a request graph is in a play") as usize].push(s);
        }
        let mut this = Self {
            play_of_line,
            remaining: plays.iter().map(|p| p.lines.len() as u32).collect(),
            held,
            next: 0,
            due: BinaryHeap::new(),
            slots: Vec::new(),
            speedup,
        };
        while this.next < lanes.min(plays.len()) {
            this.start_next(0);
        }
        this
    }

    /// Starts the next pending play at `start_ns`.
    fn start_next(&mut self, start_ns: u64) {
        let sessions = std::mem::take(&mut self.held[self.next]);
        self.next += 1;
        // Times below are on the feed's clock (ms, normalised, before the speedup).
        let root = sessions
            .iter()
            .filter(|s| s.gate.is_none())
            .filter_map(|s| s.arrival_ms)
            .min_by(f64::total_cmp)
            .unwrap_or(0.0);
        let start_ms = start_ns as f64 / 1e6 * self.speedup;
        for mut s in sessions {
            let offset = (s.arrival_ms.unwrap_or(root) - root).max(0.0);
            let at = start_ns + ms_to_ns(offset / self.speedup);
            for t in &mut s.turns {
                if let Some(nb) = t.not_before_ms.as_mut() {
                    *nb = start_ms + (*nb - root);
                }
            }
            s.arrival_ms = Some(start_ms + offset);
            self.due.push(Reverse((at, s.order, self.slots.len())));
            self.slots.push(Some(s));
        }
    }

    /// When the earliest session of a started play arrives.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((t, _, _))| *t)
    }

    /// A session of a started play due by `now`, with its arrival.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(PlannedSession, u64)> {
        let &Reverse((t, _, slot)) = self.due.peek()?;
        if t > now {
            return None;
        }
        self.due.pop();
        Some((self.slots[slot].take().expect("each slot is released once"), t))
    }

    /// Request `uuid` ended (completed, rejected or failed) at `t_ns`: the lane of a play
    /// whose last request this was takes up the next play.
    pub(crate) fn ended(&mut self, uuid: u128, t_ns: u64) {
        let Some(&p) = self.play_of_line.get(&(uuid as u32)) else { return };
        let left = &mut self.remaining[p as usize];
        *left -= 1;
        if *left == 0 && self.next < self.held.len() {
            self.start_next(t_ns);
        }
    }

    /// Whether every play has started and released its sessions.
    pub(crate) fn idle(&self) -> bool {
        self.next == self.held.len() && self.due.is_empty()
    }
}
