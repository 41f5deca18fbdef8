//! `sandbox-agent`: the in-sandbox daemon that speaks envd (see the README for its status).
//!
//! The library holds everything the binary runs, so tests can drive the agent in-process:
//! [`server::Agent`] answers requests, [`server::serve`] accepts connections, [`run`] is the
//! whole binary (PID 1 duties included).

pub mod config;
pub mod connect;
pub mod extension;
pub mod files;
pub mod fs;
pub mod log;
pub mod metrics;
pub mod mounted;
pub mod pid1;
pub mod process;
pub mod relay;
pub mod server;
pub mod sys;
pub mod tunnel;
pub mod users;
pub mod version;

use std::sync::Arc;

use crate::config::Config;
use crate::server::{Agent, Services};

/// Runs the agent until SIGTERM or SIGINT: becomes the subreaper, starts the reaper, serves
/// on `config.listen` (when `config.listen_tcp`) and on `config.listen_unix` (when set), and on
/// a stop signal forwards SIGTERM to every process group, waits up
/// to the grace period, then returns.
pub async fn run(config: Config, services: Services) -> std::io::Result<()> {
    pid1::become_subreaper(&config.log);
    let children = pid1::Children::new(config.reap_orphans);
    let reaper = pid1::start_reaper(Arc::clone(&children))?;
    let listener = match config.listen_tcp {
        true => Some(tokio::net::TcpListener::bind(config.listen).await?),
        false => None,
    };
    let unix = config
        .listen_unix
        .as_deref()
        .map(server::bind_unix)
        .transpose()?;
    let grace = config.shutdown_grace;
    let mut places = Vec::new();
    if let Some(l) = &listener {
        places.push(l.local_addr()?.to_string());
    }
    if let Some(path) = &config.listen_unix {
        places.push(format!("unix:{}", path.display()));
    }
    log::info!(
        config.log,
        "sandbox-agent {} listening on {} (default user {}, access token {})",
        env!("CARGO_PKG_VERSION"),
        places.join(" and "),
        config.default_user,
        if config.access_token.is_some() {
            "required"
        } else {
            "not required"
        }
    );
    let log = config.log.clone();
    let agent = Agent::new(config, services, children);
    let stop = pid1::stop_requested();
    let server = listener.map(|l| tokio::spawn(server::serve(Arc::clone(&agent), l)));
    let unix_server = unix.map(|l| tokio::spawn(server::serve_unix(Arc::clone(&agent), l)));
    let signal = stop.await?;
    log::info!(
        log,
        "{signal}: stopping; processes get {} ms to exit",
        grace.as_millis()
    );
    for task in server.iter().chain(unix_server.iter()) {
        task.abort();
    }
    agent.process().shutdown(grace).await;
    reaper.abort();
    Ok(())
}
