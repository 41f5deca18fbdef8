//! Stages: the `==> stage` / `<== stage (1.2s)` framing, the timed steps inside a stage, the
//! closing summary (every stage and step with its time) and CI's time budget.
//!
//! Times come from a [`Clock`] the stages are given, so the summary and the budget are tested
//! with a clock the test moves instead of with real waiting.

use std::time::{Duration, Instant};

/// Under `CI=true`, a whole run that takes longer than this fails, naming its slowest stages.
/// The pipeline is meant to stay inside its CI time as the suite grows: a run that creeps past
/// the budget fails here with the stages to look at, instead of being cut off by the runner's
/// own timeout with nothing named.
pub(crate) const CI_BUDGET: Duration = Duration::from_secs(75 * 60);

/// How many of the slowest stages the budget failure names.
const SLOWEST_NAMED: usize = 3;

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

    fn passed(&self) -> bool {
        matches!(self, Self::Passed | Self::Warned(_))
    }
}

/// Where stage times come from: the monotonic clock in a real run, a test's own in tests.
pub(crate) trait Clock {
    /// The time since this clock's fixed origin.
    fn now(&self) -> Duration;
}

/// The real clock: time since the run started.
#[derive(Debug)]
struct Monotonic(Instant);

impl Clock for Monotonic {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

#[derive(Debug)]
struct Row {
    name: String,
    verdict: Verdict,
    /// `None` for a stage skipped because an earlier one failed: it took no time.
    elapsed: Option<Duration>,
    /// The stage's steps, each timed (empty for a stage without steps).
    steps: Vec<Row>,
}

/// The stages of one command, in order.
pub(crate) struct Stages {
    rows: Vec<Row>,
    clock: Box<dyn Clock>,
    start: Duration,
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stages")
            .field("rows", &self.rows)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl Stages {
    pub(crate) fn new() -> Self {
        Self::with_clock(Box::new(Monotonic(Instant::now())))
    }

    /// Stages timed by `clock` (tests).
    pub(crate) fn with_clock(clock: Box<dyn Clock>) -> Self {
        let start = clock.now();
        Self {
            rows: Vec::new(),
            clock,
            start,
        }
    }

    /// Whether a stage has failed (later stages are then not run).
    pub(crate) fn failed(&self) -> bool {
        self.rows
            .iter()
            .any(|r| matches!(r.verdict, Verdict::Failed(_)))
    }

    /// The first failed stage's name.
    pub(crate) fn first_failure(&self) -> Option<&str> {
        self.rows
            .iter()
            .find(|r| matches!(r.verdict, Verdict::Failed(_)))
            .map(|r| r.name.as_str())
    }

    /// Runs `stage` unless an earlier one failed; returns whether it passed (or warned).
    pub(crate) fn run(&mut self, name: &str, stage: impl FnOnce() -> Verdict) -> bool {
        self.run_steps(name, |_| stage())
    }

    /// Runs a stage made of timed steps unless an earlier stage failed. `stage` runs its steps
    /// through the [`Steps`] it is given and returns the stage's own verdict (its preconditions:
    /// `NotRun` or `Failed` before any step, else `Passed`); the stage's verdict combines that
    /// with its steps' (see [`combine`]).
    pub(crate) fn run_steps(
        &mut self,
        name: &str,
        stage: impl FnOnce(&mut Steps<'_>) -> Verdict,
    ) -> bool {
        if self.failed() {
            self.record_not_run(name, "an earlier stage failed".into());
            return false;
        }
        self.always_steps(name, stage)
    }

    /// Runs `stage` even after a failure (cleanup, reporting).
    pub(crate) fn always(&mut self, name: &str, stage: impl FnOnce() -> Verdict) -> bool {
        self.always_steps(name, |_| stage())
    }

    fn always_steps(&mut self, name: &str, stage: impl FnOnce(&mut Steps<'_>) -> Verdict) -> bool {
        println!("==> {name}");
        let start = self.clock.now();
        let mut steps = Steps {
            clock: self.clock.as_ref(),
            rows: Vec::new(),
        };
        let own = stage(&mut steps);
        let steps = steps.rows;
        let verdict = combine(own, &steps);
        let elapsed = self.clock.now().saturating_sub(start);
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
        let ok = verdict.passed();
        self.rows.push(Row {
            name: name.to_owned(),
            verdict,
            elapsed: Some(elapsed),
            steps,
        });
        ok
    }

    fn record_not_run(&mut self, name: &str, why: String) {
        println!("--- {name}: not run ({why})");
        self.rows.push(Row {
            name: name.to_owned(),
            verdict: Verdict::NotRun(why),
            elapsed: None,
            steps: Vec::new(),
        });
    }

    /// The time since these stages were created.
    fn total(&self) -> Duration {
        self.clock.now().saturating_sub(self.start)
    }

    /// Prints the closing table: each stage and step, its verdict and duration, the total, then
    /// every warning again.
    pub(crate) fn summary(&self) {
        for line in self.summary_lines() {
            println!("{line}");
        }
    }

    fn summary_lines(&self) -> Vec<String> {
        let mut out = vec!["==> summary".to_owned()];
        let width = self
            .rows
            .iter()
            .flat_map(|r| {
                std::iter::once(r.name.len()).chain(r.steps.iter().map(|s| s.name.len() + 2))
            })
            .max()
            .unwrap_or(0)
            .max("total".len());
        let line = |name: &str, verdict: &Verdict, elapsed: Option<Duration>| {
            // A stage skipped after a failure took no time: a dash, not a blank to misread.
            let time = elapsed.map_or_else(|| "-".to_owned(), secs);
            let why = match verdict {
                Verdict::Failed(w) | Verdict::NotRun(w) => first_line(w),
                Verdict::Warned(w) => format!("{} warning(s)", w.len()),
                Verdict::Passed => String::new(),
            };
            let row = format!("  {name:<width$}  {:<8} {time:>8}  {why}", verdict.label());
            row.trim_end().to_owned()
        };
        for r in &self.rows {
            out.push(line(&r.name, &r.verdict, r.elapsed));
            for s in &r.steps {
                out.push(line(&format!("  {}", s.name), &s.verdict, s.elapsed));
            }
        }
        out.push(format!(
            "  {:<width$}  {:<8} {:>8}",
            "total",
            "",
            secs(self.total())
        ));
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
            out.push("warnings:".to_owned());
            out.extend(warnings.into_iter().map(|w| format!("  - {w}")));
        }
        out
    }

    /// The failure line when the run so far has taken longer than `budget`, naming the slowest
    /// stages with their times; `None` within the budget.
    pub(crate) fn over_budget(&self, budget: Duration) -> Option<String> {
        let stages: Vec<(&str, Duration)> = self
            .rows
            .iter()
            .filter_map(|r| r.elapsed.map(|e| (r.name.as_str(), e)))
            .collect();
        over_budget(self.total(), budget, &stages)
    }
}

/// The timed steps of one stage.
pub(crate) struct Steps<'c> {
    clock: &'c dyn Clock,
    rows: Vec<Row>,
}

impl std::fmt::Debug for Steps<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl Steps<'_> {
    /// Runs one step and records its verdict and time; returns whether it passed (or warned).
    /// A failed step does not stop the next: the stage decides (a stage of independent checks
    /// runs them all, so one failure does not hide the others' results).
    pub(crate) fn run(&mut self, name: &str, step: impl FnOnce() -> Verdict) -> bool {
        println!("  --> {name}");
        let start = self.clock.now();
        let verdict = step();
        let elapsed = self.clock.now().saturating_sub(start);
        println!("  <-- {name} ({}): {}", secs(elapsed), verdict.label());
        let ok = verdict.passed();
        self.rows.push(Row {
            name: name.to_owned(),
            verdict,
            elapsed: Some(elapsed),
            steps: Vec::new(),
        });
        ok
    }
}

/// A stage's verdict from its own (`own`: its preconditions) and its steps': any failure fails
/// the stage, each failed step named; a stage that did not run stays not run; otherwise every
/// warning and every step that did not run is a warning of the stage.
fn combine(own: Verdict, steps: &[Row]) -> Verdict {
    let mut failures: Vec<String> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    match own {
        Verdict::Passed => {}
        Verdict::Warned(w) => warnings.extend(w),
        Verdict::Failed(why) => failures.push(why),
        Verdict::NotRun(why) if steps.is_empty() => return Verdict::NotRun(why),
        Verdict::NotRun(why) => warnings.push(format!("not run: {why}")),
    }
    for s in steps {
        match &s.verdict {
            Verdict::Passed => {}
            Verdict::Warned(w) => warnings.extend(w.iter().map(|l| format!("{}: {l}", s.name))),
            Verdict::Failed(why) => failures.push(format!("{}: {why}", s.name)),
            Verdict::NotRun(why) => warnings.push(format!("{}: not run: {why}", s.name)),
        }
    }
    if !failures.is_empty() {
        Verdict::Failed(failures.join("\n"))
    } else if !warnings.is_empty() {
        Verdict::Warned(warnings)
    } else {
        Verdict::Passed
    }
}

/// The budget rule on its own: a run of `total` fails when it passes `budget`, and the line
/// says so with the [`SLOWEST_NAMED`] slowest of `stages` (name, time), slowest first.
fn over_budget(total: Duration, budget: Duration, stages: &[(&str, Duration)]) -> Option<String> {
    if total <= budget {
        return None;
    }
    let mut slowest: Vec<&(&str, Duration)> = stages.iter().collect();
    // Stable: among equal times, the earlier stage is named first.
    slowest.sort_by_key(|s| std::cmp::Reverse(s.1));
    let named: Vec<String> = slowest
        .iter()
        .take(SLOWEST_NAMED)
        .map(|(name, d)| format!("{name} {}", minutes(*d)))
        .collect();
    Some(format!(
        "xtask: FAILED: the run took {}, over the CI budget of {}; slowest stages: {}",
        minutes(total),
        minutes(budget),
        if named.is_empty() {
            "none recorded".to_owned()
        } else {
            named.join(", ")
        }
    ))
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

/// `80m05s`: the unit the budget is stated in.
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}m{:02}s", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A clock that moves only when the test says so.
    #[derive(Debug, Clone, Default)]
    struct FakeClock(Rc<Cell<Duration>>);

    impl FakeClock {
        fn advance(&self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
    }

    fn min(m: u64) -> Duration {
        Duration::from_secs(m * 60)
    }

    /// Stages on a fake clock, each taking the given minutes.
    fn run_stages(times: &[(&str, u64)]) -> Stages {
        let clock = FakeClock::default();
        let mut stages = Stages::with_clock(Box::new(clock.clone()));
        for &(name, m) in times {
            let c = clock.clone();
            stages.run(name, move || {
                c.advance(min(m));
                Verdict::Passed
            });
        }
        stages
    }

    #[test]
    fn within_the_budget_passes() {
        let stages = run_stages(&[("clippy", 30), ("hermetic tests", 45)]);
        // Exactly 75 minutes has not passed 75 minutes.
        assert_eq!(stages.over_budget(CI_BUDGET), None);
    }

    #[test]
    fn past_the_budget_fails_naming_the_slowest_stages() {
        let stages = run_stages(&[
            ("fmt", 1),
            ("clippy", 20),
            ("tidy", 1),
            ("hermetic tests", 15),
            ("conformance", 10),
            ("docker engine tests", 30),
        ]);
        let line = stages.over_budget(CI_BUDGET).expect("77 minutes is over");
        assert_eq!(
            line,
            "xtask: FAILED: the run took 77m00s, over the CI budget of 75m00s; slowest stages: \
             docker engine tests 30m00s, clippy 20m00s, hermetic tests 15m00s"
        );
    }

    #[test]
    fn the_budget_counts_time_outside_stages_and_ties_keep_order() {
        let clock = FakeClock::default();
        let mut stages = Stages::with_clock(Box::new(clock.clone()));
        let c = clock.clone();
        stages.run("a", move || {
            c.advance(min(2));
            Verdict::Passed
        });
        let c = clock.clone();
        stages.run("b", move || {
            c.advance(min(2));
            Verdict::Passed
        });
        // Between stages (e.g. the summary's own work): still the run's time.
        clock.advance(min(72));
        let line = stages.over_budget(CI_BUDGET).expect("76 minutes is over");
        assert!(line.contains("took 76m00s"), "{line}");
        assert!(line.ends_with("slowest stages: a 2m00s, b 2m00s"), "{line}");
    }

    #[test]
    fn the_rule_alone_with_no_stages_still_says_so() {
        assert_eq!(over_budget(min(10), min(75), &[]), None);
        let line = over_budget(min(76) + Duration::from_secs(5), min(75), &[]).expect("over");
        assert!(line.contains("took 76m05s"), "{line}");
        assert!(line.ends_with("none recorded"), "{line}");
    }

    #[test]
    fn the_summary_shows_every_stage_and_step_with_its_time() {
        let clock = FakeClock::default();
        let mut stages = Stages::with_clock(Box::new(clock.clone()));
        let c = clock.clone();
        stages.run("fmt", move || {
            c.advance(Duration::from_millis(1500));
            Verdict::Passed
        });
        let c = clock.clone();
        stages.run_steps("clippy", move |steps| {
            let c1 = c.clone();
            steps.run("workspace", move || {
                c1.advance(Duration::from_secs(60));
                Verdict::Passed
            });
            steps.run("sandbox-app, no default features", move || {
                c.advance(Duration::from_secs(10));
                Verdict::Failed("clippy found 2 warnings".into())
            });
            Verdict::Passed
        });
        stages.run("tidy", || Verdict::Passed);
        let lines = stages.summary_lines();
        let row = |name: &str| {
            lines
                .iter()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no row for {name} in {lines:#?}"))
                .clone()
        };
        assert!(row("fmt").contains("1.5s"), "{lines:#?}");
        assert!(row("clippy ").contains("FAILED"), "{lines:#?}");
        assert!(row("clippy ").contains("70.0s"), "{lines:#?}");
        assert!(row("workspace").contains("60.0s"), "{lines:#?}");
        let failed_step = row("sandbox-app, no default features");
        assert!(failed_step.contains("FAILED"), "{failed_step}");
        assert!(failed_step.contains("10.0s"), "{failed_step}");
        // Skipped after the failure: no time, shown as such.
        let tidy = row("tidy");
        assert!(tidy.contains("not run"), "{tidy}");
        assert!(tidy.contains(" - "), "{tidy}");
        assert!(row("total").contains("71.5s"), "{lines:#?}");
        assert_eq!(stages.first_failure(), Some("clippy"));
    }

    #[test]
    fn a_stage_combines_its_steps() {
        let step = |name: &str, verdict: Verdict| Row {
            name: name.to_owned(),
            verdict,
            elapsed: Some(Duration::ZERO),
            steps: Vec::new(),
        };
        assert!(matches!(combine(Verdict::Passed, &[]), Verdict::Passed));
        assert!(matches!(
            combine(Verdict::NotRun("no clippy".into()), &[]),
            Verdict::NotRun(w) if w == "no clippy"
        ));
        let steps = [
            step("a", Verdict::Warned(vec!["slow".into()])),
            step("b", Verdict::NotRun("no redis".into())),
        ];
        match combine(Verdict::Passed, &steps) {
            Verdict::Warned(w) => assert_eq!(w, ["a: slow", "b: not run: no redis"]),
            other => panic!("{other:?}"),
        }
        let steps = [
            step("a", Verdict::Failed("boom".into())),
            step("b", Verdict::Passed),
            step("c", Verdict::Failed("bang".into())),
        ];
        match combine(Verdict::Passed, &steps) {
            Verdict::Failed(w) => assert_eq!(w, "a: boom\nc: bang"),
            other => panic!("{other:?}"),
        }
    }
}
