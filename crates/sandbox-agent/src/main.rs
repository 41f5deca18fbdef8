//! The `sandbox-agent` binary: parses its flags and runs the agent (see the crate README).

use std::io::Write as _;
use std::process::ExitCode;

use sandbox_agent::config::{self, Command};

fn main() -> ExitCode {
    let command = config::parse(std::env::args_os().skip(1), |k| std::env::var_os(k));
    let mut config = match command {
        Ok(Command::Run(config)) => *config,
        Ok(Command::Relay(socket)) => return relay(&socket),
        Ok(Command::Help) => {
            let _ = std::io::stdout().write_all(config::usage().as_bytes());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            let _ = writeln!(
                std::io::stdout(),
                "sandbox-agent {}",
                env!("CARGO_PKG_VERSION")
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // Nothing useful can be done if stderr is closed; the exit status still tells.
            let _ = writeln!(
                std::io::stderr(),
                "sandbox-agent: {e}\n\n{}",
                config::usage()
            );
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &config.log_file {
        match sandbox_agent::log::Log::to_file(path.clone(), config.log_max_bytes) {
            Ok(log) => config.log = log,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "sandbox-agent: --log-file {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        }
    }
    if let Err(e) = sandbox_agent::sys::mark_inherited_close_on_exec() {
        config
            .log
            .line("warn", format_args!("listing inherited descriptors: {e}"));
    }
    // One thread: the agent's work is waiting on sockets, pipes and timers.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "sandbox-agent: starting the runtime: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    let log = config.log.clone();
    let services = sandbox_agent::mounted::builtin(&config);
    match runtime.block_on(sandbox_agent::run(config, services)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log.line("error", format_args!("{e}"));
            ExitCode::FAILURE
        }
    }
}

/// `sandbox-agent relay <socket>` (see `sandbox_agent::relay`): status 0 when the socket
/// closed, 1 with one line on stderr when the relay failed.
fn relay(socket: &std::path::Path) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "sandbox-agent relay: starting the runtime: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sandbox_agent::relay::run(socket)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "sandbox-agent relay: {e}");
            ExitCode::FAILURE
        }
    }
}
