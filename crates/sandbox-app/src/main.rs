//! `sandbox`: the service and its command line.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sandbox_app::config::ServiceConfig;

#[derive(Parser, Debug)]
#[command(
    name = "sandbox",
    version,
    about = "Persistent, isolated sandboxes for AI-agent sessions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the service (config file, then SANDBOX_* environment overrides).
    Serve {
        /// A TOML config file.
        #[arg(long, env = "SANDBOX_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check the backend and the store, explain each fix; non-zero exit when something is wrong.
    Doctor {
        /// A TOML config file.
        #[arg(long, env = "SANDBOX_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let env: BTreeMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::Serve { config } => {
            let config = match ServiceConfig::load(config.as_deref(), &env) {
                Ok(c) => c,
                Err(e) => return fail(&format!("config: {e}")),
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => return fail(&format!("cannot start the runtime: {e}")),
            };
            match runtime.block_on(sandbox_app::serve::serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Doctor { config } => {
            let config = match ServiceConfig::load(config.as_deref(), &env) {
                Ok(c) => c,
                Err(e) => {
                    return fail(&format!(
                        "config: {e}\n       fix: correct the config file or the SANDBOX_* variable it names"
                    ));
                }
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => return fail(&format!("cannot start the runtime: {e}")),
            };
            let checks = runtime.block_on(sandbox_app::doctor::run(&config));
            // The report is the command's output.
            let _ = write!(
                std::io::stdout(),
                "{}",
                sandbox_app::doctor::render(&checks)
            );
            if checks.iter().all(|c| c.ok) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Structured logs on stderr: `RUST_LOG` filters (default `info`), `SANDBOX_LOG_FORMAT=json`
/// switches to one JSON object per line.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if std::env::var("SANDBOX_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn fail(message: &str) -> ExitCode {
    // The one place the CLI reports a fatal error to its user.
    let _ = writeln!(std::io::stderr(), "sandbox: {message}");
    ExitCode::FAILURE
}
