//! Stages: the `==> stage` / `<== stage (1.2s)` framing and the closing summary.

use std::time::{Duration, Instant};

/// How a stage ended.
#[derive(Clone, Debug)]
pub(crate) enum Verdict {
    Passed,
    /// Passed, with things the reader should know (e.g. a prerequisite missing locally).
    Warned(Vec<String>),
    Failed(String),
    /// Not run, and why: never a silent skip.
    NotRun(String),
}

impl Verdict {
    fn label(&self) -> &'static str {
        match self {
            Self::Passed => "ok",
            Self::Warned(_) => "warning",
            Self::Failed(_) => "FAILED",
            Self::NotRun(_) => "not run",
        }
    }
}

struct Row {
    name: &'static str,
    verdict: Verdict,
    elapsed: Option<Duration>,
}

/// The stages of one command, in order.
pub(crate) struct Stages {
    rows: Vec<Row>,
    start: Instant,
}

impl Stages {
    pub(crate) fn new() -> Self {
        Self {
            rows: Vec::new(),
            start: Instant::now(),
        }
    }

    /// Whether a stage has failed (later stages are then not run).
    pub(crate) fn failed(&self) -> bool {
        self.rows
            .iter()
            .any(|r| matches!(r.verdict, Verdict::Failed(_)))
    }

    /// The first failed stage's name.
    pub(crate) fn first_failure(&self) -> Option<&'static str> {
        self.rows
            .iter()
            .find(|r| matches!(r.verdict, Verdict::Failed(_)))
            .map(|r| r.name)
    }

    /// Runs `stage` unless an earlier one failed; returns whether it passed (or warned).
    pub(crate) fn run(&mut self, name: &'static str, stage: impl FnOnce() -> Verdict) -> bool {
        if self.failed() {
            self.record_not_run(name, "an earlier stage failed".into());
            return false;
        }
        self.always(name, stage)
    }

    /// Runs `stage` even after a failure (cleanup, reporting).
    pub(crate) fn always(&mut self, name: &'static str, stage: impl FnOnce() -> Verdict) -> bool {
        println!("==> {name}");
        let start = Instant::now();
        let verdict = stage();
        let elapsed = start.elapsed();
        println!("<== {name} ({})", secs(elapsed));
        match &verdict {
            Verdict::Passed => {}
            Verdict::Warned(w) => {
                for line in w {
                    println!("warning: {name}: {line}");
                }
            }
            Verdict::Failed(why) => println!("error: {name} failed: {why}"),
            Verdict::NotRun(why) => println!("note: {name} not run: {why}"),
        }
        let ok = matches!(verdict, Verdict::Passed | Verdict::Warned(_));
        self.rows.push(Row {
            name,
            verdict,
            elapsed: Some(elapsed),
        });
        ok
    }

    fn record_not_run(&mut self, name: &'static str, why: String) {
        println!("--- {name}: not run ({why})");
        self.rows.push(Row {
            name,
            verdict: Verdict::NotRun(why),
            elapsed: None,
        });
    }

    /// The closing table: each stage, its verdict and duration, then every warning again.
    pub(crate) fn summary(&self) {
        println!("==> summary");
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
        for r in &self.rows {
            let time = r.elapsed.map(secs).unwrap_or_default();
            let why = match &r.verdict {
                Verdict::Failed(w) | Verdict::NotRun(w) => first_line(w),
                Verdict::Warned(w) => format!("{} warning(s)", w.len()),
                Verdict::Passed => String::new(),
            };
            let row = format!(
                "  {:<width$}  {:<8} {:>8}  {why}",
                r.name,
                r.verdict.label(),
                time
            );
            println!("{}", row.trim_end());
        }
        println!(
            "  {:<width$}  {:<8} {:>8}",
            "total",
            "",
            secs(self.start.elapsed())
        );
        let warnings: Vec<String> = self
            .rows
            .iter()
            .flat_map(|r| match &r.verdict {
                Verdict::Warned(w) => w.iter().map(|l| format!("{}: {l}", r.name)).collect(),
                // Stages skipped after a failure (no elapsed time) are a consequence, not news.
                Verdict::NotRun(why) if r.elapsed.is_some() => {
                    vec![format!("{}: not run: {}", r.name, first_line(why))]
                }
                _ => Vec::new(),
            })
            .collect();
        if !warnings.is_empty() {
            println!("warnings:");
            for w in warnings {
                println!("  - {w}");
            }
        }
    }
}

fn first_line(s: &str) -> String {
    let mut lines = s.lines();
    let first = lines.next().unwrap_or_default().to_owned();
    if lines.next().is_some() {
        format!("{first} ...")
    } else {
        first
    }
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
