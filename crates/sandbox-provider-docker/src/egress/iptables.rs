//! Running `iptables`/`ip6tables`: the injectable runner, the real one, and the calls every
//! step needs with their failure messages ("not found", "permission denied", iptables' own
//! stderr).

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;

use super::rules::strings;

pub(super) const DOCKER_USER: &str = "DOCKER-USER";
pub(super) const INPUT: &str = "INPUT";
pub(super) const FORWARD: &str = "FORWARD";

/// A wedged iptables (a lock held by a hung process under the legacy backend) must fail a
/// create with a message instead of hanging it.
const IPTABLES_DEADLINE: Duration = Duration::from_secs(60);

/// Which address family a rule belongs to, i.e. which program installs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

impl IpFamily {
    /// The program that edits this family's rules.
    pub fn program(self) -> &'static str {
        match self {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        }
    }

    pub(super) fn host_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    pub(super) fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (IpFamily::V4, IpAddr::V4(_)) | (IpFamily::V6, IpAddr::V6(_))
        )
    }
}

/// How one iptables invocation ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunOutput {
    /// The exit status; `-1` when the process was killed by a signal.
    pub status: i32,
    /// Standard output (the listings of `-S`).
    pub stdout: String,
    /// Standard error (the reason of a failure).
    pub stderr: String,
}

impl RunOutput {
    /// A successful run printing `stdout`.
    pub fn ok(stdout: impl Into<String>) -> Self {
        RunOutput {
            status: 0,
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }
    /// A failed run with `status` and `stderr`.
    pub fn failed(status: i32, stderr: impl Into<String>) -> Self {
        RunOutput {
            status,
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }
}

/// Runs `iptables`/`ip6tables`. Injectable so rule generation is testable without root.
#[async_trait]
pub trait IptablesRunner: fmt::Debug + Send + Sync {
    /// Runs the family's program with `args` (which already include `-w`). An `Err` means the
    /// program could not be started at all (`NotFound` when it is not installed).
    async fn run(&self, family: IpFamily, args: &[String]) -> io::Result<RunOutput>;
}

/// The real runner: spawns the program found on `PATH`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandRunner;

#[async_trait]
impl IptablesRunner for CommandRunner {
    async fn run(&self, family: IpFamily, args: &[String]) -> io::Result<RunOutput> {
        let mut cmd = tokio::process::Command::new(family.program());
        cmd.args(args)
            // Messages are matched (permission, missing chain) and end up in errors: keep them
            // in the untranslated form.
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(IPTABLES_DEADLINE, cmd.output())
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} did not finish within {}s",
                        family.program(),
                        IPTABLES_DEADLINE.as_secs()
                    ),
                )
            })??;
        Ok(RunOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// One family's iptables, with the failure messages every caller needs.
pub(super) struct Ipt<'a> {
    pub(super) runner: &'a dyn IptablesRunner,
    pub(super) family: IpFamily,
}

impl<'a> Ipt<'a> {
    pub(super) fn new(runner: &'a dyn IptablesRunner, family: IpFamily) -> Self {
        Ipt { runner, family }
    }

    /// Runs `-w <args>`; `Err` only when the program could not run.
    pub(super) async fn call(&self, args: &[&str]) -> Result<(Vec<String>, RunOutput), String> {
        let mut full = vec!["-w".to_owned()];
        full.extend(args.iter().map(|a| (*a).to_owned()));
        match self.runner.run(self.family, &full).await {
            Ok(out) => Ok((full, out)),
            Err(e) => Err(self.spawn_failure(&e)),
        }
    }

    /// Runs and requires success.
    pub(super) async fn ok(&self, args: &[&str]) -> Result<RunOutput, String> {
        let (full, out) = self.call(args).await?;
        if out.status == 0 {
            Ok(out)
        } else {
            Err(self.failure(&full, &out))
        }
    }

    /// For `-C` and `-S <chain>`: status 0 is yes, 1 is no (rule or chain missing), anything
    /// else (2 bad arguments, 4 permission or resource problem) is an error.
    pub(super) async fn probe(&self, args: &[&str]) -> Result<bool, String> {
        let (full, out) = self.call(args).await?;
        match out.status {
            0 => Ok(true),
            1 if !denied(&out.stderr) => Ok(false),
            _ => Err(self.failure(&full, &out)),
        }
    }

    /// The `-S <chain>` listing, `None` when the chain does not exist.
    pub(super) async fn listing(&self, chain: &str) -> Result<Option<String>, String> {
        let (full, out) = self.call(&["-S", chain]).await?;
        match out.status {
            0 => Ok(Some(out.stdout)),
            1 if !denied(&out.stderr) => Ok(None),
            _ => Err(self.failure(&full, &out)),
        }
    }

    /// Whether the program exists at all (any answer counts; only a failed spawn does not).
    pub(super) async fn installed(&self) -> bool {
        !matches!(
            self.runner
                .run(self.family, &strings(&["-w", "-S", DOCKER_USER]))
                .await,
            Err(e) if e.kind() == io::ErrorKind::NotFound
        )
    }

    fn spawn_failure(&self, e: &io::Error) -> String {
        let program = self.family.program();
        match e.kind() {
            io::ErrorKind::NotFound => format!(
                "{program} not found: egress protection of bridge-mode sandboxes needs it \
                 (apt-get install iptables)"
            ),
            io::ErrorKind::PermissionDenied => format!(
                "permission denied: egress rules need root (CAP_NET_ADMIN): cannot run {program}: {e}"
            ),
            _ => format!("cannot run {program}: {e}"),
        }
    }

    pub(super) fn failure(&self, args: &[String], out: &RunOutput) -> String {
        let command = format!("{} {}", self.family.program(), args.join(" "));
        let stderr = out.stderr.trim();
        if denied(stderr) {
            format!(
                "permission denied: egress rules need root (CAP_NET_ADMIN): `{command}`: {stderr}"
            )
        } else {
            format!("`{command}` failed (exit {}): {stderr}", out.status)
        }
    }
}

pub(super) fn denied(stderr: &str) -> bool {
    [
        "Permission denied",
        "you must be root",
        "Operation not permitted",
    ]
    .iter()
    .any(|m| stderr.contains(m))
}

/// Deletes the rule an `-A <chain> <spec>` listing line describes. A rule that is already gone
/// (status 1) is fine: a concurrent remover got there first.
pub(super) async fn delete_listed(ipt: &Ipt<'_>, tokens: &[String]) -> Result<(), String> {
    let mut args = vec!["-D"];
    args.extend(tokens.iter().skip(1).map(String::as_str));
    let (full, out) = ipt.call(&args).await?;
    if out.status == 0 || (out.status == 1 && !denied(&out.stderr)) {
        Ok(())
    } else {
        Err(ipt.failure(&full, &out))
    }
}

#[cfg(test)]
mod tests {
    use sandbox_core::{ErrorCode, ErrorKind};

    use super::*;
    use crate::egress::guard::ensure_error;
    use crate::egress::testing::*;

    #[test]
    fn fails_closed_with_the_reason() {
        let cases: [(Option<io::ErrorKind>, Option<RunOutput>, &str); 4] = [
            (Some(io::ErrorKind::NotFound), None, "iptables not found"),
            (
                None,
                Some(RunOutput::failed(
                    4,
                    "iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)",
                )),
                "permission denied: egress rules need root (CAP_NET_ADMIN)",
            ),
            (
                None,
                Some(RunOutput::failed(
                    3,
                    "iptables v1.8.9: can't initialize iptables table `filter': Table does not exist (do you need to insmod?)",
                )),
                "Table does not exist",
            ),
            (
                None,
                Some(RunOutput::failed(1, "")),
                "has no DOCKER-USER chain",
            ),
        ];
        for (spawn_error, answer, want) in cases {
            let fake = FakeIptables::docker_host();
            fake.lock().spawn_error = spawn_error;
            fake.lock().answer = answer;
            let message = install_strict_v4(&fake).unwrap_err();
            assert!(message.contains(want), "{message:?} lacks {want:?}");
            assert_eq!(mutating(&fake.calls()), Vec::<String>::new(), "{want}");
            let e = ensure_error(message);
            assert_eq!(e.kind(), ErrorKind::Unavailable);
            assert_eq!(e.code(), Some(ErrorCode::EgressProtectionUnavailable));
            assert!(!e.can_replace_binding());
        }
    }
}
