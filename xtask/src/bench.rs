//! Benchmark suites and their Markdown reports.
//!
//! A suite is a `harness = false` bench binary that prints lines; the headline ones look like
//! `BENCH <suite> <key>=<value>`. Full runs write `docs/bench/<suite>.md` (kept in git as the
//! raw record); smoke runs (`--smoke`, or any run under `CI=true`) write `target/bench/<suite>.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::process::{self, Output};

#[derive(Clone, Copy, Debug)]
pub struct Suite {
    pub name: &'static str,
    pub package: &'static str,
    /// The `[[bench]]` target.
    pub bench: &'static str,
    /// More `(package, bench)` targets run after it, into the same report: a suite whose
    /// figures need a crate the first target's package cannot depend on (the Docker suite's
    /// round trip through the service).
    pub also: &'static [(&'static str, &'static str)],
}

impl Suite {
    /// Every `(package, bench)` target of the suite, in the order they run.
    pub fn targets(&self) -> Vec<(&'static str, &'static str)> {
        std::iter::once((self.package, self.bench))
            .chain(self.also.iter().copied())
            .collect()
    }
}

/// Every suite `cargo xtask bench <suite>` knows. Add a line per suite.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "core",
        package: "sandbox-core",
        bench: "core",
        also: &[],
    },
    // Needs a running Docker engine and the local `sandbox-busybox:test` image (`cargo xtask
    // test` provides both); `bench` starts no services, and the bench binary fails with a
    // message saying so when they are missing. Raw, exec mode and agent mode in one run:
    // `cargo xtask bench docker` builds the static agent first and names it
    // (`SANDBOX_AGENT_BIN`, `bench_cmd.rs`). Then the service's part (`sandbox-app`'s
    // `streams`): a streamed 100 MiB round trip through the HTTP API against `docker cp`.
    Suite {
        name: "docker",
        package: "sandbox-provider-docker",
        bench: "docker",
        also: &[("sandbox-app", "streams")],
    },
    // The HTTP API over the Docker provider called in-process, in exec mode and agent mode
    // (the agent built and named first, as for `docker`); needs the engine and the image.
    Suite {
        name: "api",
        package: "sandbox-app",
        bench: "api",
        also: &[],
    },
    // Hermetic: the lifecycle coordinator on the fake provider and the memory store.
    Suite {
        name: "session",
        package: "sandbox-session",
        bench: "session",
        also: &[],
    },
    // Hermetic: what the production stack Metered(Checked(fake)) adds to a provider call, in
    // the composition root where the metrics layer lives (the session bench measures the
    // checking layer alone).
    Suite {
        name: "layers",
        package: "sandbox-app",
        bench: "layers",
        also: &[],
    },
    // The Redis binding store against the memory store, on the fake provider. The bench binary
    // starts its own redis-server (a child on a free loopback port, no persistence) and stops it
    // at the end; it fails with a message saying so when redis-server is not installed.
    Suite {
        name: "store",
        package: "sandbox-store-redis",
        bench: "store",
        also: &[],
    },
    // Hermetic: the guarded HTTP client against a plain hyper client on a loopback server the
    // bench binary runs itself.
    Suite {
        name: "transport",
        package: "sandbox-transport",
        bench: "transport",
        also: &[],
    },
    // The static agent as PID 1 of the Debian sandbox image: its size, `commands.run("true")`
    // through the official SDK and through a raw HTTP/1.1 client, against raw Docker exec.
    // `cargo xtask bench agent` first builds the agent, the image and the SDK venv and names
    // them to the bench binary (`bench_cmd.rs`); the engine must be running.
    Suite {
        name: "agent",
        package: "xtask",
        bench: "agent",
        also: &[],
    },
    // Time to first command through `sandbox serve`'s E2B API with the official Python SDK
    // (sequential creates, warm runs, 20 concurrent creates) against a raw Engine API baseline
    // in the same run. `cargo xtask bench e2b` first builds the service in release, the agent,
    // the image and the SDK venv and names them (`bench_cmd.rs`); the engine must be running.
    Suite {
        name: "e2b",
        package: "xtask",
        bench: "e2b",
        also: &[],
    },
    // The E2B adapter against `sandbox serve`'s E2B API: exec of `true` and a 1 MiB file round
    // trip through the adapter, against the same envd requests on a plain hyper client and
    // against the official Python SDK, in one run. Built and named like `e2b` (`bench_cmd.rs`);
    // the engine must be running.
    Suite {
        name: "e2b-provider",
        package: "sandbox-provider-e2b",
        bench: "e2b_provider",
        also: &[],
    },
];

pub fn find(name: &str) -> Option<&'static Suite> {
    SUITES.iter().find(|s| s.name == name)
}

pub fn names() -> String {
    SUITES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// The cargo arguments of one target: `bench -p <package> --bench <bench> [-- --smoke]`.
pub fn cargo_args(package: &str, bench: &str, smoke: bool) -> Vec<String> {
    let mut args: Vec<String> = ["bench", "-p", package, "--bench", bench]
        .map(str::to_owned)
        .into();
    if smoke {
        args.extend(["--".to_owned(), "--smoke".to_owned()]);
    }
    args
}

/// The headline lines of a bench's output.
pub fn headline_lines(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| l.trim_start().starts_with("BENCH "))
        .map(str::trim)
        .collect()
}

/// Where the machine and the tree were when the numbers were taken.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub revision: String,
    pub date_utc: String,
    pub nproc: String,
    pub cpu_model: String,
    pub mem_total: String,
    pub rustc: String,
    pub kernel: String,
}

const FACT_DEADLINE: Duration = Duration::from_secs(30);

fn command_line(root: &Path, program: &str, args: &[&str]) -> Option<String> {
    let mut cmd = process::command(program, args);
    cmd.current_dir(root);
    let out = process::run_with_deadline(&mut cmd, FACT_DEADLINE, Output::Capture).ok()?;
    out.success().then(|| out.stdout.trim().to_owned())
}

/// Gathers [`Facts`] about this machine and the tree at `root`. Anything unknowable is
/// "unknown" rather than an error: a report without a kernel version is still worth writing.
pub fn gather_facts(root: &Path, rustc: &str) -> Facts {
    let unknown = || "unknown".to_owned();
    let revision = match command_line(root, "git", &["rev-parse", "HEAD"]) {
        Some(rev) => {
            let dirty = command_line(root, "git", &["status", "--porcelain"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{rev}-dirty") } else { rev }
        }
        None => "unknown (no git revision)".to_owned(),
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    Facts {
        revision,
        date_utc: format_utc(SystemTime::now()),
        nproc: std::thread::available_parallelism()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| unknown()),
        cpu_model: proc_field(&cpuinfo, "model name").unwrap_or_else(unknown),
        mem_total: proc_field(&meminfo, "MemTotal").unwrap_or_else(unknown),
        rustc: command_line(root, rustc, &["-V"]).unwrap_or_else(unknown),
        kernel: command_line(root, "uname", &["-r"]).unwrap_or_else(unknown),
    }
}

/// The value of the first `key: value` line of a `/proc` file.
pub fn proc_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

/// `2026-11-29T09:53:07Z`.
pub fn format_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// The Markdown report: facts, the exact command, the raw output.
pub fn report(suite: &Suite, smoke: bool, facts: &Facts, command: &str, output: &str) -> String {
    let mut s = String::new();
    let kind = if smoke { "smoke run" } else { "full run" };
    let _ = writeln!(s, "# Benchmark `{}` ({kind})\n", suite.name);
    let _ = writeln!(
        s,
        "Written by `cargo xtask bench {}{}`. The raw output below is the record; \
         headline lines start with `BENCH`.\n",
        suite.name,
        if smoke { " --smoke" } else { "" }
    );
    let _ = writeln!(s, "| fact | value |\n| --- | --- |");
    for (k, v) in [
        ("git revision", &facts.revision),
        ("date (UTC)", &facts.date_utc),
        ("cores (nproc)", &facts.nproc),
        ("CPU", &facts.cpu_model),
        ("memory (MemTotal)", &facts.mem_total),
        ("rustc", &facts.rustc),
        ("kernel", &facts.kernel),
    ] {
        let _ = writeln!(s, "| {k} | {} |", v.replace('|', "\\|"));
    }
    let _ = writeln!(s, "\n## Command\n\n```sh\n{command}\n```\n");
    let headlines = headline_lines(output);
    if !headlines.is_empty() {
        let _ = writeln!(s, "## Headline\n\n```text\n{}\n```\n", headlines.join("\n"));
    }
    // A fence longer than any backtick run in the output, so the output cannot close it.
    let longest = output.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let _ = writeln!(
        s,
        "## Raw output\n\n{fence}text\n{}\n{fence}",
        output.trim_end()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_for_full_and_smoke() {
        let s = find("core").unwrap();
        assert_eq!(s.targets(), [("sandbox-core", "core")]);
        assert_eq!(
            cargo_args("sandbox-core", "core", false).join(" "),
            "bench -p sandbox-core --bench core"
        );
        assert_eq!(
            cargo_args("sandbox-core", "core", true).join(" "),
            "bench -p sandbox-core --bench core -- --smoke"
        );
        let docker = find("docker").unwrap();
        assert_eq!(
            docker.targets(),
            [
                ("sandbox-provider-docker", "docker"),
                ("sandbox-app", "streams")
            ]
        );
    }

    #[test]
    fn headlines_are_found() {
        let out = "warming up\nBENCH core parse_ns=12\n  BENCH core ratio=1.5  \nBENCHMARK no\n";
        assert_eq!(
            headline_lines(out),
            vec!["BENCH core parse_ns=12", "BENCH core ratio=1.5"]
        );
    }

    #[test]
    fn utc_dates() {
        let at = |secs| format_utc(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_859_587), "2026-11-28T09:53:07Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn proc_fields() {
        let cpu = "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nmodel name\t: other\n";
        assert_eq!(
            proc_field(cpu, "model name").as_deref(),
            Some("Some CPU @ 2.0GHz")
        );
        assert_eq!(
            proc_field("MemTotal:       24576000 kB\n", "MemTotal").as_deref(),
            Some("24576000 kB")
        );
        assert_eq!(proc_field("", "MemTotal"), None);
    }

    #[test]
    fn report_holds_facts_command_and_output() {
        let facts = Facts {
            revision: "abc-dirty".into(),
            date_utc: "2026-11-29T00:00:00Z".into(),
            nproc: "2".into(),
            cpu_model: "CPU".into(),
            mem_total: "1 kB".into(),
            rustc: "rustc 1.95.0".into(),
            kernel: "6.1".into(),
        };
        let out = "BENCH core x=1\nraw ``` fence\n";
        let md = report(
            find("core").unwrap(),
            true,
            &facts,
            "cargo bench -p sandbox-core",
            out,
        );
        for needle in [
            "| git revision | abc-dirty |",
            "| date (UTC) | 2026-11-29T00:00:00Z |",
            "| cores (nproc) | 2 |",
            "| rustc | rustc 1.95.0 |",
            "| kernel | 6.1 |",
            "```sh\ncargo bench -p sandbox-core\n```",
            "````text\nBENCH core x=1\nraw ``` fence\n````",
            "(smoke run)",
        ] {
            assert!(md.contains(needle), "{needle:?} not in:\n{md}");
        }
    }
}
