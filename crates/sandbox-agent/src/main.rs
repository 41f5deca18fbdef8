//! Placeholder binary `sandbox-agent`: this crate is not built yet (see its README).
//!
//! It exits with status 2 and says so, rather than pretending to work: a script or an operator
//! that runs it gets a clear answer instead of a silent success.

use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Nothing useful can be done if stderr is closed; the exit status still tells the truth.
    let _ = writeln!(std::io::stderr(), "sandbox-agent: not built yet");
    ExitCode::from(2)
}
