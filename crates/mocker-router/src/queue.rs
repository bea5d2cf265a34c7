//! Requests the KV router holds back while every worker is busy, in policy order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::QueuePolicy;

struct Entry<T> {
    score: f64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    /// Max-heap on score; equal scores leave in arrival order.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then(o.seq.cmp(&self.seq))
    }
}

/// A priority queue of held requests.
pub struct RouterQueue<T> {
    policy: QueuePolicy,
    heap: BinaryHeap<Entry<T>>,
    seq: u64,
}

impl<T> std::fmt::Debug for RouterQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RouterQueue({:?}, {} held)", self.policy, self.heap.len())
    }
}

impl<T> RouterQueue<T> {
    /// An empty queue.
    pub fn new(policy: QueuePolicy) -> Self {
        Self { policy, heap: BinaryHeap::new(), seq: 0 }
    }

    /// Holds `item`, which arrived at `arrival_s` with `isl` prompt tokens of which
    /// `best_cached` are cached on some worker.
    pub fn push(&mut self, item: T, arrival_s: f64, isl: usize, best_cached: usize) {
        let score = match self.policy {
            QueuePolicy::Fcfs => -arrival_s,
            QueuePolicy::Lcfs => arrival_s,
            // Smith's rule: shortest remaining prefill first.
            QueuePolicy::Wspt => 1.0 / (isl.saturating_sub(best_cached).max(1) as f64),
        };
        self.seq += 1;
        self.heap.push(Entry { score, seq: self.seq, item });
    }

    /// Takes the head.
    pub fn pop(&mut self) -> Option<T> {
        self.heap.pop().map(|e| e.item)
    }

    /// Held requests.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(policy: QueuePolicy) -> Vec<char> {
        let mut q = RouterQueue::new(policy);
        q.push('a', 1.0, 5000, 0);
        q.push('b', 2.0, 100, 0);
        q.push('c', 3.0, 5000, 4900);
        q.push('d', 3.0, 800, 0);
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn policies_order_the_queue() {
        assert_eq!(order(QueuePolicy::Fcfs), vec!['a', 'b', 'c', 'd']);
        assert_eq!(order(QueuePolicy::Lcfs), vec!['c', 'd', 'b', 'a']);
        assert_eq!(order(QueuePolicy::Wspt), vec!['b', 'c', 'd', 'a']);
    }
}
