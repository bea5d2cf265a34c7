//! Gates of agentic request graphs: a gated session's first turn is released at the
//! latest of its dependencies' trigger times plus their delays (and its `not_before_ms`),
//! once all of them have fired. Chains never come here (they are session turns), so plain
//! Mooncake replays carry no per-request cost for this.

use rustc_hash::FxHashMap;

use crate::options::ms_to_ns;
use crate::trace::{DepTrigger, Trace};

/// Index of a started session in the driver's table.
pub(crate) type SessionId = u32;

/// A dependent of one trace row: (gate index within a copy, trigger, delay in ns).
type Waiter = (u32, DepTrigger, u64);

#[derive(Debug, Clone, Copy)]
struct GateState {
    remaining: u32,
    due_ns: u64,
    failed: bool,
    /// The gated session once the feed has started it, and when.
    waiting: Option<(SessionId, u64)>,
}

/// Dependency bookkeeping of an agentic trace replay.
#[derive(Debug)]
pub(crate) struct Deps {
    waiters: FxHashMap<u32, Vec<Waiter>>,
    gate_sizes: Vec<u32>,
    states: FxHashMap<u64, GateState>,
    /// Gates that opened: (session, release time, whether every dependency succeeded).
    /// A failed upstream request fails its dependents instead of releasing them.
    pub(crate) opened: Vec<(SessionId, u64, bool)>,
}

impl Deps {
    /// The bookkeeping for `trace`, if it is agentic (delays divided by `speedup`).
    pub(crate) fn new(trace: &Trace, speedup: f64) -> Option<Self> {
        if !trace.format.is_agentic() {
            return None;
        }
        let mut waiters: FxHashMap<u32, Vec<Waiter>> = FxHashMap::default();
        for (g, gate) in trace.gates.iter().enumerate() {
            for d in &gate.deps {
                waiters.entry(d.line).or_default().push((
                    g as u32,
                    d.trigger,
                    ms_to_ns(d.delay_ms / speedup),
                ));
            }
        }
        let gate_sizes = trace.gates.iter().map(|g| g.deps.len() as u32).collect();
        Some(Self { waiters, gate_sizes, states: FxHashMap::default(), opened: Vec::new() })
    }

    fn state(&mut self, gate: u64) -> &mut GateState {
        let n = self.gate_sizes.len() as u64;
        let size = self.gate_sizes[(gate % n) as usize];
        self.states.entry(gate).or_insert(GateState {
            remaining: size,
            due_ns: 0,
            failed: false,
            waiting: None,
        })
    }

    /// Request `uuid` was dispatched or completed (`ok`: completed, not failed) at `t_ns`.
    pub(crate) fn fire(&mut self, uuid: u128, trigger: DepTrigger, t_ns: u64, ok: bool) {
        let (copy, line) = ((uuid >> 32) as u64, uuid as u32);
        let Some(ws) = self.waiters.get(&line) else { return };
        let n = self.gate_sizes.len() as u64;
        for (g, _, delay) in ws.clone().into_iter().filter(|w| w.1 == trigger) {
            let gate = copy * n + u64::from(g);
            let s = self.state(gate);
            s.remaining -= 1;
            if ok {
                s.due_ns = s.due_ns.max(t_ns + delay);
            } else {
                s.failed = true;
            }
            if s.remaining == 0 {
                if let Some((sid, start)) = s.waiting {
                    let s = self.states.remove(&gate).expect("present");
                    self.opened.push((sid, s.due_ns.max(start), !s.failed));
                }
            }
        }
    }

    /// The feed started gated session `sid` at `start_ns`.
    pub(crate) fn start(&mut self, gate: u64, sid: SessionId, start_ns: u64) {
        let s = self.state(gate);
        if s.remaining == 0 {
            let s = self.states.remove(&gate).expect("present");
            self.opened.push((sid, s.due_ns.max(start_ns), !s.failed));
        } else {
            s.waiting = Some((sid, start_ns));
        }
    }
}
