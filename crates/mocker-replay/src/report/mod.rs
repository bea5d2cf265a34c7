//! Replay report: distribution statistics, the `.summary` object and the AIPerf-style table.
//!
//! Kept separate from the event loop so the reference's report rules (key order, percentile
//! conventions, number formatting) live in one place and can be tested without running a
//! simulation.

pub mod plot;
pub mod stats;
pub mod summary;
pub mod table;

pub use stats::{DistSummary, ExactDistribution, SketchDistribution};
pub use summary::{GoodputInputs, Summary, SummaryInputs};
pub use table::{format_number, render_table};
