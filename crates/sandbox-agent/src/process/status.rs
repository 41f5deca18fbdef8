//! The `end` event of a process, worded as envd words it.
//!
//! envd is written in Go and fills `status` with Go's `ProcessState.String()` and `error`
//! with the wait error (the same text) when the process did not exit 0. The SDKs show these
//! strings to users and some match on them, so the agent produces them exactly: `exit status
//! N`, `signal: <name>` with Go's Linux signal names, and ` (core dumped)` when a core was
//! written. A signalled process has exit code -1.

use sandbox_envd::process::process_event::EndEvent;

use crate::pid1::ExitStatus;

/// The `end` event for `status`.
pub(crate) fn end_event(status: ExitStatus) -> EndEvent {
    match status {
        ExitStatus::Exited(code) => {
            let text = format!("exit status {code}");
            EndEvent {
                exit_code: code,
                exited: true,
                error: (code != 0).then(|| text.clone()),
                status: text,
            }
        }
        ExitStatus::Signaled {
            signal,
            core_dumped,
        } => {
            let core = if core_dumped { " (core dumped)" } else { "" };
            let text = format!("signal: {}{core}", signal_name(signal));
            EndEvent {
                exit_code: -1,
                exited: false,
                error: Some(text.clone()),
                status: text,
            }
        }
    }
}

/// Go's name for a Linux signal (`syscall.Signal.String()`), or `signal N`.
pub(crate) fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "hangup",
        "interrupt",
        "quit",
        "illegal instruction",
        "trace/breakpoint trap",
        "aborted",
        "bus error",
        "floating point exception",
        "killed",
        "user defined signal 1",
        "segmentation fault",
        "user defined signal 2",
        "broken pipe",
        "alarm clock",
        "terminated",
        "stack fault",
        "child exited",
        "continued",
        "stopped (signal)",
        "stopped",
        "stopped (tty input)",
        "stopped (tty output)",
        "urgent I/O condition",
        "CPU time limit exceeded",
        "file size limit exceeded",
        "virtual timer expired",
        "profiling timer expired",
        "window changed",
        "I/O possible",
        "power failure",
        "bad system call",
    ];
    usize::try_from(signal)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("signal {signal}"), |n| (*n).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_as_go_prints_them() {
        let ok = end_event(ExitStatus::Exited(0));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let failed = end_event(ExitStatus::Exited(2));
        assert_eq!(failed.status, "exit status 2");
        assert_eq!(failed.error.as_deref(), Some("exit status 2"));
        let killed = end_event(ExitStatus::Signaled {
            signal: 9,
            core_dumped: false,
        });
        assert_eq!(
            (killed.exit_code, killed.exited, killed.status.as_str()),
            (-1, false, "signal: killed")
        );
        let segv = end_event(ExitStatus::Signaled {
            signal: 11,
            core_dumped: true,
        });
        assert_eq!(segv.status, "signal: segmentation fault (core dumped)");
        assert_eq!(signal_name(15), "terminated");
        assert_eq!(signal_name(40), "signal 40");
        assert_eq!(signal_name(0), "signal 0");
    }
}
