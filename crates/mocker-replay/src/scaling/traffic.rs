//! Traffic over a window of simulated time: what arrived, what completed and how fast,
//! what the router found cached, how many decode forwards ran.

use serde::Serialize;

/// One window's traffic (the snapshot's `traffic`), with the reference's keys in its order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TrafficStats {
    /// Window length, s.
    pub duration_s: f64,
    /// Requests that arrived in the window (offered load).
    pub num_req: u64,
    /// Mean input length of the completions.
    pub avg_isl: f64,
    /// Mean actual output length of the completions.
    pub avg_osl: f64,
    /// Mean TTFT of completions with a positive TTFT, ms.
    pub avg_ttft_ms: f64,
    /// Mean of completions' own mean ITL (those with more than one token), ms.
    pub avg_itl_ms: f64,
    /// Requests completed in the window (rejections excluded).
    pub shape_count: u64,
    /// Completions behind `avg_ttft_ms`.
    pub ttft_count: u64,
    /// Completions behind `avg_itl_ms`.
    pub itl_count: u64,
    /// Tokens per decode forward (1 without speculative decoding); `None` without forwards.
    pub avg_accept_length: Option<f64>,
    /// Mean of `overlap_blocks / isl_blocks` over KV-router placements in the window.
    pub avg_kv_hit_rate: f64,
    /// Placements behind `avg_kv_hit_rate`.
    pub hit_rate_count: u64,
    /// Request decode forwards in the window.
    pub accept_length_forward_count: u64,
}

/// Accumulates one window's traffic until it is drained.
#[derive(Debug, Clone, Default)]
pub struct TrafficWindow {
    start_ms: f64,
    arrivals: u64,
    completions: u64,
    isl: u64,
    osl: u64,
    ttft_ms: f64,
    ttft_count: u64,
    itl_ms: f64,
    itl_count: u64,
    hit_rate: f64,
    hit_rate_count: u64,
    accepted_tokens: u64,
    forwards: u64,
}

impl TrafficWindow {
    /// A request arrived.
    pub fn on_arrival(&mut self) {
        self.arrivals += 1;
    }

    /// A request completed with `isl` input and `osl` output tokens.
    pub fn on_completion(&mut self, isl: u32, osl: u32, ttft_ms: f64, mean_itl_ms: f64) {
        self.completions += 1;
        self.isl += u64::from(isl);
        self.osl += u64::from(osl);
        if ttft_ms > 0.0 {
            self.ttft_ms += ttft_ms;
            self.ttft_count += 1;
        }
        if osl > 1 && mean_itl_ms.is_finite() && mean_itl_ms >= 0.0 {
            self.itl_ms += mean_itl_ms;
            self.itl_count += 1;
        }
    }

    /// A KV router placed a request of `isl_blocks` blocks where it saw `overlap` cached.
    pub fn on_placement(&mut self, overlap_blocks: u32, isl_blocks: u32) {
        if isl_blocks == 0 {
            return;
        }
        self.hit_rate += f64::from(overlap_blocks) / f64::from(isl_blocks);
        self.hit_rate_count += 1;
    }

    /// A pass ran `forwards` decode forwards that produced `tokens` tokens.
    pub fn on_decode(&mut self, tokens: u64, forwards: u64) {
        if tokens == 0 || forwards == 0 {
            return;
        }
        self.accepted_tokens += tokens;
        self.forwards += forwards;
    }

    /// Whether anything was seen since the window started.
    pub fn has_observations(&self) -> bool {
        self.arrivals + self.completions + self.hit_rate_count + self.forwards > 0
    }

    /// The window up to `now_ms`; the next one starts there.
    pub fn drain(&mut self, now_ms: f64) -> TrafficStats {
        let mean = |sum: f64, n: u64| if n > 0 { sum / n as f64 } else { 0.0 };
        let stats = TrafficStats {
            duration_s: (now_ms - self.start_ms) / 1000.0,
            num_req: self.arrivals,
            avg_isl: mean(self.isl as f64, self.completions),
            avg_osl: mean(self.osl as f64, self.completions),
            avg_ttft_ms: mean(self.ttft_ms, self.ttft_count),
            avg_itl_ms: mean(self.itl_ms, self.itl_count),
            shape_count: self.completions,
            ttft_count: self.ttft_count,
            itl_count: self.itl_count,
            avg_accept_length: (self.forwards > 0)
                .then(|| self.accepted_tokens as f64 / self.forwards as f64),
            avg_kv_hit_rate: mean(self.hit_rate, self.hit_rate_count),
            hit_rate_count: self.hit_rate_count,
            accept_length_forward_count: self.forwards,
        };
        *self = Self { start_ms: now_ms, ..Self::default() };
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_averages_what_it_saw_and_starts_over() {
        let mut w = TrafficWindow::default();
        w.on_arrival();
        w.on_arrival();
        w.on_completion(100, 1, 0.0, f64::NAN);
        w.on_completion(300, 11, 20.0, 5.0);
        w.on_placement(3, 4);
        w.on_placement(1, 0);
        w.on_decode(10, 10);
        let s = w.drain(750.0);
        assert_eq!((s.duration_s, s.num_req, s.shape_count), (0.75, 2, 2));
        assert_eq!((s.avg_isl, s.avg_osl), (200.0, 6.0));
        assert_eq!((s.ttft_count, s.avg_ttft_ms, s.itl_count, s.avg_itl_ms), (1, 20.0, 1, 5.0));
        assert_eq!((s.hit_rate_count, s.avg_kv_hit_rate), (1, 0.75));
        assert_eq!((s.avg_accept_length, s.accept_length_forward_count), (Some(1.0), 10));
        let t = w.drain(1000.0);
        assert_eq!((t.duration_s, t.num_req, t.avg_accept_length), (0.25, 0, None));
    }
}
