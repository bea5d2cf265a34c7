//! Lock-step waves of one worker's data-parallel ranks: every rank with work runs one
//! pass starting together, and the wave, with every token emitted in it, ends when the
//! slowest rank's pass does. Live and offline shells both step their ranks through this.

use crate::engine::Engine;

/// A worker's wave counter and which of its ranks took part in the last wave.
#[derive(Debug, Clone, Default)]
pub struct Waves {
    next_step: u64,
    stepped: Vec<bool>,
}

impl Waves {
    /// Waves of a group of `dp_size` ranks.
    pub fn new(dp_size: usize) -> Self {
        Self { next_step: 0, stepped: vec![false; dp_size] }
    }

    /// Runs one wave starting at `now_ns`: each rank `rank` names (its engine, and whether
    /// it may take part) steps if it has work, then every stepped rank's pass is stretched
    /// to the latest end. Returns the wave's end (`now_ns` when no rank had work); the
    /// engines' last passes hold the outputs, all stamped at that end. The counter that
    /// drives `prefill_schedule_interval` starts again once the whole group is drained.
    /// SGLang's `prefill_decode_interval` counts the group's rounds: after a wave in which
    /// any rank computed prefill, every rank (idle ones too) skips prefill for that many.
    pub fn step<T>(
        &mut self,
        ranks: &mut [T],
        now_ns: u64,
        mut rank: impl FnMut(&mut T) -> (&mut Engine, bool),
    ) -> u64 {
        debug_assert_eq!(ranks.len(), self.stepped.len());
        let mut end = now_ns;
        for (r, stepped) in ranks.iter_mut().zip(self.stepped.iter_mut()) {
            let (engine, eligible) = rank(r);
            *stepped = eligible && engine.has_work();
            if *stepped {
                engine.prepare_wave(self.next_step);
                end = end.max(engine.step(now_ns).end_ns);
            }
        }
        let mut drained = true;
        let mut prefilled = false;
        for (r, &stepped) in ranks.iter_mut().zip(self.stepped.iter()) {
            let (engine, _) = rank(r);
            if stepped {
                engine.stretch_last_pass(end);
                prefilled |= engine.last_pass_prefilled();
            }
            drained &= !engine.has_work();
        }
        if self.stepped.iter().any(|&s| s) {
            for (r, &stepped) in ranks.iter_mut().zip(self.stepped.iter()) {
                let (engine, eligible) = rank(r);
                if eligible {
                    engine.end_group_round(stepped, prefilled);
                }
            }
        }
        self.next_step = if drained { 0 } else { self.next_step + 1 };
        end
    }

    /// Whether rank `i` stepped in the last wave.
    pub fn stepped(&self, i: usize) -> bool {
        self.stepped[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineOptions, Request};

    fn rank(r: u32) -> Engine {
        Engine::new(EngineOptions { dp_rank: r, dp_size: 2, ..Default::default() }).expect("engine")
    }

    fn request(uuid: u128, len: u32, out: usize) -> Request {
        Request {
            uuid,
            tokens: (0..len).map(|t| t + (uuid as u32) * 100_000).collect(),
            max_output_tokens: out,
            ..Default::default()
        }
    }

    /// The reference's verified case: prompts of 2000 and 512 tokens on two ranks both get
    /// their first token at the 2000-token prefill's end (48.552296 ms), and both second
    /// tokens one 2001-token decode later.
    #[test]
    fn every_token_of_a_wave_ends_with_the_slowest_rank() {
        let mut ranks = vec![rank(0), rank(1)];
        ranks[0].submit(request(1, 2000, 3)).expect("submit");
        ranks[1].submit(request(2, 512, 3)).expect("submit");
        let mut waves = Waves::new(2);
        let end = waves.step(&mut ranks, 0, |e| (e, true));
        assert_eq!(end, 48_552_296);
        for r in &ranks {
            let pass = r.last_pass();
            assert_eq!(pass.end_ns, end);
            assert_eq!(pass.outputs[0].index, 0);
        }
        let end2 = waves.step(&mut ranks, end, |e| (e, true));
        let gaps: Vec<u64> =
            ranks.iter().map(|r| r.last_pass().all_outputs().next().expect("token").itl_ns).collect();
        assert_eq!(gaps, vec![end2 - end; 2], "both second tokens one wave later");
        // The slower rank sets the wave: rank 0's decode at 2001 tokens is the longer one.
        assert!((end2 - end).abs_diff(5_843_000) < 1_000, "wave {}", end2 - end);
    }

    /// A rank without work sits the wave out and is not stretched; a drained group restarts
    /// the wave counter.
    #[test]
    fn idle_ranks_sit_out() {
        let mut ranks = vec![rank(0), rank(1)];
        ranks[1].submit(request(2, 100, 1)).expect("submit");
        let mut waves = Waves::new(2);
        waves.step(&mut ranks, 0, |e| (e, true));
        assert!(!waves.stepped(0) && waves.stepped(1));
        assert_eq!(waves.next_step, 0, "drained after the only request finished");
        ranks[0].submit(request(3, 100, 5)).expect("submit");
        waves.step(&mut ranks, 100, |e| (e, false));
        assert!(!waves.stepped(0), "an ineligible rank never steps");
    }

    /// SGLang's `prefill_decode_interval` counts the group's rounds: a prefill on one rank
    /// holds back the other rank's prefill too, for that many waves.
    #[test]
    fn a_prefill_on_one_sglang_rank_defers_prefill_on_every_rank() {
        let sglang = |r: u32| {
            let config = crate::config::LaunchConfig::from_json_str(
                r#"{"engine": {"backend": "sglang", "prefill_decode_interval": 2}}"#,
            )
            .expect("config")
            .engine;
            Engine::new(EngineOptions { config, dp_rank: r, dp_size: 2, ..Default::default() })
                .expect("engine")
        };
        let mut ranks = vec![sglang(0), sglang(1)];
        ranks[0].submit(request(1, 500, 10)).expect("submit");
        let mut waves = Waves::new(2);
        let mut now = waves.step(&mut ranks, 0, |e| (e, true));
        assert!(ranks[0].last_pass_prefilled() && !waves.stepped(1));
        // Rank 1 gets a prompt now: it waits two group rounds although it prefilled nothing.
        ranks[1].submit(request(2, 500, 10)).expect("submit");
        for _ in 0..2 {
            now = waves.step(&mut ranks, now, |e| (e, true));
            assert!(waves.stepped(1) && !ranks[1].last_pass_prefilled(), "deferred");
        }
        waves.step(&mut ranks, now, |e| (e, true));
        assert!(ranks[1].last_pass_prefilled(), "admitted after the group's two rounds");
    }
}
