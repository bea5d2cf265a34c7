//! `mocker serve`: flags to engine configuration and server options, one server per worker
//! on consecutive ports, stopped by SIGINT or SIGTERM. Layered: the flags (`args`), what
//! they configure (`options`), running the servers (`run`).

mod args;
mod options;
mod run;

pub use args::ServeArgs;
pub use run::run;
