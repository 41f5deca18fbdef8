//! `GET /sandbox-agent/processes` (our extension): the live processes and the recently ended
//! ones, with how each ended.
//!
//! envd's `Process/List` answers live processes only, and stays that way for plain envd
//! clients. A client that reconnects (a restarted service) also needs to learn how a process it
//! started ended, and the agent keeps an ended process connectable for
//! [`super::EXITED_RETENTION`] anyway, so this listing names those too. It is bounded: every
//! live process (at most `--max-processes`) and the [`LISTED_EXITED`] most recently ended ones,
//! the oldest dropped first.

use serde::Serialize;

use sandbox_envd::ProcessStatus;

/// The most ended processes one answer lists (the most recently ended first to stay).
pub const LISTED_EXITED: usize = 64;

/// The answer of `GET /sandbox-agent/processes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// The live processes in pid order, then the ended ones, oldest ended first.
    pub processes: Vec<Listed>,
}

/// One process of the listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub cmd: String,
    pub args: Vec<String>,
    /// Started with a PTY.
    pub pty: bool,
    /// Whether its stdin still takes input (kept open at start and not closed since).
    pub stdin: bool,
    /// Output bytes produced so far, all streams together (the offset of the next byte).
    pub output_bytes: u64,
    /// The size of its replay ring (`--output-ring-bytes`).
    pub ring_bytes: u64,
    /// `false` once the reaper has collected it.
    pub running: bool,
    /// Ended: envd's status text (`exit status 0`, `signal: killed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Ended by `exit`: its code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Ended by a signal: its number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl Listed {
    /// Fills the ended fields from the process's `end` status text (`None`: still running, or
    /// an end whose status the agent could not tell).
    pub(super) fn ended(mut self, status: Option<&str>) -> Self {
        if let Some(text) = status {
            self.status = Some(text.to_owned());
            match ProcessStatus::parse(text) {
                Some(ProcessStatus::Exited(code)) => self.exit_code = Some(code),
                Some(ProcessStatus::Signaled { signal, .. }) => self.signal = Some(signal),
                None => {}
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(running: bool) -> Listed {
        Listed {
            pid: 7,
            tag: Some("job".to_owned()),
            cmd: "sleep".to_owned(),
            args: vec!["1".to_owned()],
            pty: false,
            stdin: false,
            output_bytes: 3,
            ring_bytes: 1024,
            running,
            status: None,
            exit_code: None,
            signal: None,
        }
    }

    #[test]
    fn an_ended_process_names_its_code_or_its_signal() {
        let by_exit = listed(false).ended(Some("exit status 3"));
        assert_eq!((by_exit.exit_code, by_exit.signal), (Some(3), None));
        let by_kill = listed(false).ended(Some("signal: killed"));
        assert_eq!((by_kill.exit_code, by_kill.signal), (None, Some(9)));
        let unknown = listed(false).ended(Some("unknown"));
        assert_eq!((unknown.exit_code, unknown.signal), (None, None));
        assert_eq!(unknown.status.as_deref(), Some("unknown"));
        let json = serde_json::to_value(listed(true).ended(None)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "pid": 7, "tag": "job", "cmd": "sleep", "args": ["1"], "pty": false,
                "stdin": false, "output_bytes": 3, "ring_bytes": 1024, "running": true
            })
        );
    }
}
