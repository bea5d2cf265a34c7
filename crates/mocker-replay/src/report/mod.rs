//! Replay report: distribution statistics, the `.summary` object, the AIPerf-style table and
//! the description of what ran.
//!
//! Kept separate from the event loop so the reference's report rules (key order, percentile
//! conventions, number formatting) live in one place and can be tested without running a
//! simulation.

pub mod plot;
pub mod run;
pub mod stats;
pub mod summary;
pub mod table;
pub mod workers;

pub use run::{
    AgenticFacts, KvCapacity, KvGroupsFacts, KvSource, PoolFacts, ProfileFacts, RunDescription, StateFacts,
    TimingSource, Topology,
};
pub use stats::{DistSummary, ExactDistribution, SketchDistribution};
pub use summary::{GoodputInputs, GroupPeak, Summary, SummaryInputs};
pub use table::{format_number, render_table};
pub use workers::WorkerCounts;
