//! `mocker profiles`: the bundled timing profiles, with what each was measured for.

use crate::UsageError;

/// Prints one line per bundled profile: name, model, GPU system, backend, TP.
pub fn list() -> Result<(), UsageError> {
    for name in mocker_profiles::bundled_names() {
        let profile = mocker_profiles::bundled(name)
            .expect("listed names exist")
            .map_err(|e| UsageError(format!("bundled profile {name}: {e}")))?;
        match profile.meta {
            Some(m) => println!("{name}\t{}\t{}\t{}\ttp{}", m.model, m.system, m.backend, m.tp),
            None => println!("{name}\t(Dynamo planner table; no memory facts)"),
        }
    }
    Ok(())
}
