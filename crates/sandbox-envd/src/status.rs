//! How a process ended, worded as envd words it in the `end` event, and read back.
//!
//! envd is written in Go and fills `EndEvent.status` with Go's `ProcessState.String()`, and
//! `error` with the wait error (the same text) when the process did not exit 0. The SDKs show
//! these strings to users and some match on them, so a server produces them exactly: `exit
//! status N`; `signal: <name>` with Go's Linux signal names (`signal N` for a signal without
//! one), and ` (core dumped)` when a core was written. A signalled process has exit code -1.
//!
//! One copy for both sides: `sandbox-agent` produces the text ([`ProcessStatus::end_event`]),
//! and a client that must tell the signal from the text (the Docker adapter reports `128 + N`,
//! as the engine does for an exec) reads it back ([`ProcessStatus::parse`]). `parse` is the
//! exact inverse of [`fmt::Display`]: it accepts only the canonical text, so every status
//! produced reads back as itself and nothing else reads as a status.

use std::fmt;

use crate::process::process_event::EndEvent;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessStatus {
    /// It called `exit` with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled {
        /// The signal's number.
        signal: i32,
        /// Whether a core was written.
        core_dumped: bool,
    },
}

/// Go's names of the Linux signals 1 to 31 (`syscall.Signal.String()`), in order.
const SIGNAL_NAMES: [&str; 31] = [
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

const EXITED_PREFIX: &str = "exit status ";
const SIGNALED_PREFIX: &str = "signal: ";
const CORE_SUFFIX: &str = " (core dumped)";
const UNNAMED_SIGNAL_PREFIX: &str = "signal ";

/// Go's name for a Linux signal (`syscall.Signal.String()`), or `signal N`.
pub fn signal_name(signal: i32) -> String {
    usize::try_from(signal)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| SIGNAL_NAMES.get(i))
        .map_or_else(
            || format!("{UNNAMED_SIGNAL_PREFIX}{signal}"),
            |n| (*n).to_owned(),
        )
}

/// The number of the signal [`signal_name`] names `name`: the inverse of it, so `signal 9`
/// (which Go would have called `killed`) is no name.
pub fn signal_number(name: &str) -> Option<i32> {
    if let Some(i) = SIGNAL_NAMES.iter().position(|n| *n == name) {
        return i32::try_from(i + 1).ok();
    }
    let number: i32 = name.strip_prefix(UNNAMED_SIGNAL_PREFIX)?.parse().ok()?;
    (signal_name(number) == name).then_some(number)
}

impl fmt::Display for ProcessStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProcessStatus::Exited(code) => write!(f, "{EXITED_PREFIX}{code}"),
            ProcessStatus::Signaled {
                signal,
                core_dumped,
            } => {
                let core = if core_dumped { CORE_SUFFIX } else { "" };
                write!(f, "{SIGNALED_PREFIX}{}{core}", signal_name(signal))
            }
        }
    }
}

impl ProcessStatus {
    /// The status `text` words (`exit status 2`, `signal: killed`), or `None` for anything that
    /// is not exactly what [`fmt::Display`] writes for some status.
    pub fn parse(text: &str) -> Option<ProcessStatus> {
        let status = if let Some(code) = text.strip_prefix(EXITED_PREFIX) {
            ProcessStatus::Exited(code.parse().ok()?)
        } else {
            let rest = text.strip_prefix(SIGNALED_PREFIX)?;
            // A name never ends in the suffix, so stripping it cannot eat part of one.
            let (name, core_dumped) = match rest.strip_suffix(CORE_SUFFIX) {
                Some(name) => (name, true),
                None => (rest, false),
            };
            ProcessStatus::Signaled {
                signal: signal_number(name)?,
                core_dumped,
            }
        };
        // `parse` accepts "+2" and "02" as 2: only the canonical spelling is a status.
        (status.to_string() == text).then_some(status)
    }

    /// The exit code envd reports: the process's, or -1 when a signal ended it.
    pub fn exit_code(self) -> i32 {
        match self {
            ProcessStatus::Exited(code) => code,
            ProcessStatus::Signaled { .. } => -1,
        }
    }

    /// The `end` event envd sends for this status.
    pub fn end_event(self) -> EndEvent {
        let text = self.to_string();
        let (exited, failed) = match self {
            ProcessStatus::Exited(code) => (true, code != 0),
            ProcessStatus::Signaled { .. } => (false, true),
        };
        EndEvent {
            exit_code: self.exit_code(),
            exited,
            error: failed.then(|| text.clone()),
            status: text,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn check(status: ProcessStatus, text: &str) {
        assert_eq!(status.to_string(), text);
        assert_eq!(ProcessStatus::parse(text), Some(status), "{text:?}");
    }

    #[test]
    fn statuses_read_as_go_prints_them() {
        check(ProcessStatus::Exited(0), "exit status 0");
        check(ProcessStatus::Exited(2), "exit status 2");
        check(ProcessStatus::Exited(-1), "exit status -1");
        let signaled = |signal, core_dumped| ProcessStatus::Signaled {
            signal,
            core_dumped,
        };
        check(signaled(9, false), "signal: killed");
        check(signaled(15, false), "signal: terminated");
        check(signaled(1, false), "signal: hangup");
        check(signaled(31, false), "signal: bad system call");
        check(
            signaled(11, true),
            "signal: segmentation fault (core dumped)",
        );
        check(signaled(40, false), "signal: signal 40");
        check(signaled(0, false), "signal: signal 0");
        check(signaled(-3, true), "signal: signal -3 (core dumped)");
        assert_eq!(signal_name(15), "terminated");
        assert_eq!(signal_name(32), "signal 32");
    }

    #[test]
    fn the_end_event_is_envds() {
        let ok = ProcessStatus::Exited(0).end_event();
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let failed = ProcessStatus::Exited(2).end_event();
        assert_eq!((failed.exit_code, failed.exited), (2, true));
        assert_eq!(failed.error.as_deref(), Some("exit status 2"));
        let killed = ProcessStatus::Signaled {
            signal: 9,
            core_dumped: false,
        }
        .end_event();
        assert_eq!(
            (
                killed.exit_code,
                killed.exited,
                killed.status.as_str(),
                killed.error.as_deref()
            ),
            (-1, false, "signal: killed", Some("signal: killed"))
        );
    }

    #[test]
    fn every_status_produced_reads_back_as_itself() {
        let codes = (-300..=300).chain([i32::MIN, i32::MIN + 1, i32::MAX - 1, i32::MAX]);
        for code in codes.clone() {
            let status = ProcessStatus::Exited(code);
            assert_eq!(ProcessStatus::parse(&status.to_string()), Some(status));
            assert_eq!(
                ProcessStatus::parse(&status.end_event().status),
                Some(status)
            );
            for core_dumped in [false, true] {
                let status = ProcessStatus::Signaled {
                    signal: code,
                    core_dumped,
                };
                assert_eq!(ProcessStatus::parse(&status.to_string()), Some(status));
                assert_eq!(
                    ProcessStatus::parse(&status.end_event().status),
                    Some(status)
                );
            }
        }
        for (i, name) in SIGNAL_NAMES.iter().enumerate() {
            let n = i32::try_from(i + 1).unwrap();
            assert_eq!(
                (signal_name(n).as_str(), signal_number(name)),
                (*name, Some(n))
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_status_reads_back_as_itself(code: i32, signaled: bool, core_dumped: bool) {
            let status = if signaled {
                ProcessStatus::Signaled { signal: code, core_dumped }
            } else {
                ProcessStatus::Exited(code)
            };
            proptest::prop_assert_eq!(ProcessStatus::parse(&status.to_string()), Some(status));
        }

        #[test]
        fn any_text_that_reads_as_a_status_is_its_canonical_text(
            text in "(exit status |signal: (signal )?)?[-+0-9a-z ()]{0,16}"
        ) {
            if let Some(status) = ProcessStatus::parse(&text) {
                proptest::prop_assert_eq!(status.to_string(), text);
            }
        }
    }

    #[test]
    fn nothing_but_the_canonical_text_is_a_status() {
        for text in [
            "",
            "exit status",
            "exit status ",
            "exit status +2",
            "exit status 02",
            "exit status 2 ",
            "exit status 99999999999",
            "Exit status 2",
            "signal: ",
            "signal: signal 9",
            "signal: signal 09",
            "signal: signal +40",
            "signal: KILLED",
            "signal: killed (core dumped) (core dumped)",
            "signal:killed",
            "signal 40",
            "killed",
            " (core dumped)",
            "signal:  (core dumped)",
        ] {
            assert_eq!(ProcessStatus::parse(text), None, "{text:?}");
        }
    }
}
