//! The agent's own log: one line per event, to stderr or to a size-bounded file.
//!
//! Inside a sandbox the agent is often PID 1 with nobody reading its stderr, and a long-lived
//! sandbox must not fill its disk with the agent's log: with `--log-file` the file is rotated
//! once (to `<file>.1`) when it passes `--log-max-bytes`, so the log never takes more than
//! twice that. Processes the agent starts never write here (their output has pipes of its
//! own). Logging never fails a request: a write error is dropped.

use std::fmt;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

enum Sink {
    Stderr,
    File(FileSink),
}

/// A log file that is rotated once past `max` bytes.
struct FileSink {
    path: PathBuf,
    file: Option<std::fs::File>,
    written: u64,
    max: u64,
}

impl FileSink {
    fn open(path: PathBuf, max: u64) -> std::io::Result<Self> {
        let file = open_append(&path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(FileSink {
            path,
            file: Some(file),
            written,
            max,
        })
    }

    fn write(&mut self, text: &str) {
        if self.written + text.len() as u64 > self.max {
            // Rotate: the current file becomes `.1` (replacing the older one).
            self.file = None;
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            let _ = std::fs::rename(&self.path, old);
            self.file = open_append(&self.path).ok();
            self.written = 0;
        }
        if let Some(f) = &mut self.file
            && f.write_all(text.as_bytes()).is_ok()
        {
            self.written += text.len() as u64;
        }
    }
}

/// Where the agent logs; cheap to clone, every clone writes to the same sink.
#[derive(Clone)]
pub struct Log {
    sink: Arc<Mutex<Sink>>,
}

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Log")
    }
}

impl Default for Log {
    fn default() -> Self {
        Log::stderr()
    }
}

impl Log {
    /// Lines go to stderr.
    pub fn stderr() -> Log {
        Log {
            sink: Arc::new(Mutex::new(Sink::Stderr)),
        }
    }

    /// Lines go to `path`, bounded by `max_bytes` (see the module docs).
    pub fn to_file(path: PathBuf, max_bytes: u64) -> std::io::Result<Log> {
        Ok(Log {
            sink: Arc::new(Mutex::new(Sink::File(FileSink::open(path, max_bytes)?))),
        })
    }

    /// Writes one line: seconds since the epoch, the level, the message.
    pub fn line(&self, level: &str, message: fmt::Arguments<'_>) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let text = format!(
            "{}.{:03} {level} {message}\n",
            now.as_secs(),
            now.subsec_millis()
        );
        let Ok(mut sink) = self.sink.lock() else {
            return;
        };
        match &mut *sink {
            Sink::Stderr => {
                let _ = std::io::stderr().write_all(text.as_bytes());
            }
            Sink::File(file) => file.write(&text),
        }
    }
}

fn open_append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Logs at level `info`.
macro_rules! info {
    ($log:expr, $($arg:tt)*) => { $log.line("info", format_args!($($arg)*)) };
}
/// Logs at level `warn`.
macro_rules! warning {
    ($log:expr, $($arg:tt)*) => { $log.line("warn", format_args!($($arg)*)) };
}
pub(crate) use {info, warning};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_rotated_once_so_it_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.log");
        let mut sink = FileSink::open(path.clone(), 100).unwrap();
        for i in 0..50 {
            sink.write(&format!("line {i:02} of the log\n"));
        }
        let current = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(dir.path().join("agent.log.1"))
            .unwrap()
            .len();
        assert!(current <= 100 && old <= 100, "{current} {old}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("line 49 of the log\n"), "{text}");
    }
}
