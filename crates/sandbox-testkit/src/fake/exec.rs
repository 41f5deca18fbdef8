//! The fake's portable argv vocabulary, run natively (no shell is interpreted):
//! `echo [-n] ARGS`, `cat [FILE...]`, `pwd`, `env`, `id -un`, `whoami`, `sleep SECONDS`,
//! `exit N`, `head -c N [FILE]`, `true`, `false`, and busybox's echo server
//! `nc -l[l] -p PORT -e cat` (`fake::tunnel`). Anything else exits 127 with "command not found", as a
//! shell would. Real backends run the same argv as real programs (`exit N` is the exception:
//! it is a shell builtin, so the conformance suite sends `sh -c 'exit N'` where a POSIX shell
//! exists).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_core::{OutputHook, OutputStream, SandboxPath};

use super::fs::MemFs;
use super::tunnel::{self, Ports};

/// Collects a process's output and forwards each chunk to the caller's hook as it is produced.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    hook: Option<OutputHook>,
}

impl Output {
    pub(crate) fn new(hook: Option<OutputHook>) -> Self {
        Output {
            stdout: Vec::new(),
            stderr: Vec::new(),
            hook,
        }
    }
    /// [exec.stream]: output goes to the hook when there is one, else into the result.
    fn out(&mut self, bytes: &[u8]) {
        match &self.hook {
            Some(hook) => hook.emit(OutputStream::Stdout, bytes),
            None => self.stdout.extend_from_slice(bytes),
        }
    }
    fn err(&mut self, bytes: &[u8]) {
        match &self.hook {
            Some(hook) => hook.emit(OutputStream::Stderr, bytes),
            None => self.stderr.extend_from_slice(bytes),
        }
    }
}

/// Everything a fake process can see.
pub(crate) struct ProcessEnv {
    pub(crate) argv: Vec<String>,
    pub(crate) stdin: Vec<u8>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: SandboxPath,
    /// The account it runs as: the call's user, else the sandbox's default user, else root.
    /// The fake keeps no account database, so any valid name is an account.
    pub(crate) user: String,
    /// The sandbox's filesystem, read at the moment a command opens a file.
    pub(crate) fs: Arc<Mutex<MemFs>>,
    /// The sandbox's ports, which `nc -l` listens on.
    pub(crate) ports: Arc<Ports>,
}

/// Runs one process to completion, writing into `output` (shared so that a timeout keeps what
/// was produced before the kill). Returns the exit status.
pub(crate) async fn run(process: ProcessEnv, output: Arc<Mutex<Output>>) -> i32 {
    let emit_out = |bytes: &[u8]| {
        output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .out(bytes)
    };
    let emit_err = |bytes: &[u8]| {
        output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .err(bytes)
    };
    let Some((program, args)) = process.argv.split_first() else {
        emit_err(b"fake: empty command\n");
        return 127;
    };
    match program.as_str() {
        "true" => 0,
        "false" => 1,
        "echo" => {
            let (newline, words) = match args.first().map(String::as_str) {
                Some("-n") => (false, &args[1..]),
                _ => (true, args),
            };
            let mut line = words.join(" ").into_bytes();
            if newline {
                line.push(b'\n');
            }
            emit_out(&line);
            0
        }
        "pwd" => {
            emit_out(format!("{}\n", process.cwd).as_bytes());
            0
        }
        "whoami" if args.is_empty() => {
            emit_out(format!("{}\n", process.user).as_bytes());
            0
        }
        "id" => match args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["-un"] | ["-nu"] | ["-u", "-n"] | ["-n", "-u"] => {
                emit_out(format!("{}\n", process.user).as_bytes());
                0
            }
            // Numeric IDs need an account database, which the fake does not keep.
            _ => {
                emit_err(b"id: the fake answers only id -un\n");
                1
            }
        },
        "env" => {
            let mut text = String::new();
            for (k, v) in &process.env {
                text.push_str(&format!("{k}={v}\n"));
            }
            emit_out(text.as_bytes());
            0
        }
        "cat" => {
            if args.is_empty() {
                emit_out(&process.stdin);
                return 0;
            }
            let mut status = 0;
            for name in args {
                match read_file(&process, name) {
                    Ok(bytes) => emit_out(&bytes),
                    Err(message) => {
                        emit_err(format!("cat: {name}: {message}\n").as_bytes());
                        status = 1;
                    }
                }
            }
            status
        }
        "head" => match args {
            [flag, count, rest @ ..] if flag == "-c" && rest.len() <= 1 => {
                let Ok(count) = count.parse::<usize>() else {
                    emit_err(format!("head: invalid number of bytes: {count}\n").as_bytes());
                    return 1;
                };
                let bytes = match rest.first() {
                    None => process.stdin.clone(),
                    Some(name) => match read_file(&process, name) {
                        Ok(bytes) => bytes,
                        Err(message) => {
                            emit_err(format!("head: {name}: {message}\n").as_bytes());
                            return 1;
                        }
                    },
                };
                emit_out(&bytes[..count.min(bytes.len())]);
                0
            }
            _ => {
                emit_err(b"head: usage: head -c N [FILE]\n");
                1
            }
        },
        "sleep" => {
            let secs = args
                .first()
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0);
            match secs.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
                Some(duration) => {
                    tokio::time::sleep(duration).await;
                    0
                }
                None => {
                    emit_err(b"sleep: invalid time interval\n");
                    1
                }
            }
        }
        "exit" => match args.first().map(|s| s.parse::<u8>()) {
            None => 0,
            Some(Ok(code)) => i32::from(code),
            Some(Err(_)) => {
                emit_err(b"exit: numeric argument 0-255 required\n");
                2
            }
        },
        "nc" => {
            let (port, persistent) = match tunnel::parse_nc(args) {
                Ok(parsed) => parsed,
                Err(message) => {
                    emit_err(format!("nc: {message}\n").as_bytes());
                    return 1;
                }
            };
            let mut listening = match process.ports.listen(port) {
                Ok(listening) => listening,
                Err(message) => {
                    emit_err(format!("nc: {message}\n").as_bytes());
                    return 1;
                }
            };
            if !persistent {
                // busybox's `nc -l` stops listening once it accepted its one connection.
                let Some(connection) = listening.accept.recv().await else {
                    return 1;
                };
                drop(listening);
                tunnel::echo(connection).await;
                return 0;
            }
            // Served connections are tasks of this set, so killing the process (aborting
            // this future) ends them with it.
            let mut serving = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    connection = listening.accept.recv() => match connection {
                        Some(connection) => {
                            serving.spawn(tunnel::echo(connection));
                        }
                        None => return 0,
                    },
                    Some(_) = serving.join_next(), if !serving.is_empty() => {}
                }
            }
        }
        other => {
            emit_err(format!("{other}: command not found\n").as_bytes());
            127
        }
    }
}

fn read_file(process: &ProcessEnv, name: &str) -> Result<Vec<u8>, String> {
    let path = if name.starts_with('/') {
        SandboxPath::new(name)
    } else {
        process.cwd.join(name)
    };
    let path = path.map_err(|e| e.message().to_owned())?;
    let fs = process.fs.lock().unwrap_or_else(PoisonError::into_inner);
    match fs.read(&path) {
        Ok(bytes) => Ok(bytes.to_vec()),
        Err(e) if e.kind() == sandbox_core::ErrorKind::NotFound => {
            Err("No such file or directory".to_owned())
        }
        Err(e) => Err(e.message().to_owned()),
    }
}
