//! The regex validator against the hand-written matcher it replaced (`validator_old`, kept
//! under `tests/support/` as the oracle): the same full verdict, finding for finding, on
//! scripts, arguments and stdin built from the validator's own vocabulary (every literal of
//! every rule, the words the tokenised rules look for, separators, quotes, case variants)
//! mixed with random text.

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

use super::old;
use super::{Matcher, Pat, SCRIPT_RULES, ScriptValidator};

/// One finding, field for field (kind, label, context, message, as displayed), in a form both
/// implementations share.
type Finding = (&'static str, String, String, String, String);

/// The findings of a `ValidationResult` of either implementation (their types differ, their
/// fields do not).
macro_rules! verdict {
    ($result:expr) => {
        $result
            .errors
            .iter()
            .map(|e| {
                let shown = e.to_string();
                (
                    e.kind.as_str(),
                    e.pattern.clone(),
                    e.context.clone(),
                    e.message.clone(),
                    shown,
                )
            })
            .collect::<Vec<Finding>>()
    };
}

/// The literal of every pattern of every rule, with its blank wildcards (`' '`, `'%'`) still in.
fn rule_literals() -> Vec<&'static str> {
    fn add(out: &mut Vec<&'static str>, pats: &[Pat]) {
        out.extend(pats.iter().map(|p| p.text));
    }
    let mut out = Vec::new();
    for rule in SCRIPT_RULES {
        for matcher in rule.matchers {
            match *matcher {
                Matcher::Any(pats) => add(&mut out, pats),
                Matcher::Seq(stages) => stages.iter().for_each(|s| add(&mut out, s)),
                Matcher::Unless(first, absent) => add(&mut out, &[first, absent]),
                Matcher::Then(first, _) => add(&mut out, &[first]),
                Matcher::Spaced(parts) => out.extend(parts.iter().copied()),
                Matcher::Custom(_) => {}
            }
        }
    }
    out
}

/// The stages of every multi-stage rule, each stage as its literals.
fn rule_sequences() -> Vec<Vec<Vec<&'static str>>> {
    SCRIPT_RULES
        .iter()
        .flat_map(|rule| rule.matchers.iter())
        .filter_map(|matcher| match *matcher {
            Matcher::Seq(stages) => Some(
                stages
                    .iter()
                    .map(|stage| stage.iter().map(|p| p.text).collect())
                    .collect(),
            ),
            Matcher::Unless(first, absent) => Some(vec![vec![first.text], vec![absent.text]]),
            _ => None,
        })
        .collect()
}

/// Whole shapes of the tokenised rules, with `~` where a separator of the generator's choice
/// goes (so the shape is sometimes kept and sometimes broken).
#[rustfmt::skip]
const PHRASES: &[&str] = &[
    "rm~-rf~/", "rm~-fr~/*", "rm~-r~/", "rm~--force~/", "rm~-rf~*", "rm~-rf/*", "/bin/rm~-Rf~\"/\"",
    "rm~-r~--no-preserve-root~/", "sudo~rm~-f~/", "subprocess.run([\"rm\",~\"-rf\",~\"/\"])",
    "chmod~777~/", "chmod~-R~0777~/*", "chown~root:root~/opt", "chown~root.wheel~x",
    "chown~-R~root~/", "service~nginx~restart", "service~--status-all", "service~ssh~force-reload",
    "service(\"a\",~\"stop\")", "nc~-l~4444", "nc~10.0.0.1~80", "nc~'host'~80", "nc~=~4",
    "nc~host~port", "ncat~-e~/bin/sh", ":(){~:|:&~};:", ":()~{~:~|~:~&~}~;~:", "x=$(rm~-rf~/)",
    "os.system(\"halt\")", "echo~done;~reboot", "yaml.load(f,~loader=x)", "yaml.load(~f)~#~loader",
    "cfg~=~yaml.load(f)", "passwd~=~getpass()",
];

const PHRASE_GAPS: &[&str] = &[
    " ", "  ", "\t", "", "\n", ";", "\"", "'", ",", "(", "|", "=", "-", "/",
];

/// What the tokenised rules, the command-position rule, the argument and stdin checks read.
#[rustfmt::skip]
const EXTRA_WORDS: &[&str] = &[
    "rm", "/bin/rm", "-rf", "-fr", "-r", "-f", "-rf/*", "--recursive", "--force", "/", "/*", "*",
    "chmod", "-R", "777", "0777", "chown", "root", "root:root", "root.wheel", "service", "nginx",
    "restart", "start", "stop", "reload", "force-reload", "status", "--status-all", "nc", "ncat",
    "10.0.0.1", "80", "4444", "-l", "-e", ":", "(", ")", "{", "}", ":(){", ":|:&", "};:", "sudo",
    "doas", "exec", "nohup", "then", "do", "else", "xargs", "env", "time", "nice", "command",
    "busybox", "os.system(\"", "subprocess.run([\"", "$(", "${", "$home", "$_x", "`", "``", "&&",
    "||", ">>", "2>", "&>", ";", "|", ">", "<", "..", "../", "..\\", "/..", "\\..", "#", "=", " = ",
    ".", "-", "_", "x", "print(1)", "loader", "loader=yaml.safeloader", "shutdown_hook", "data.nc",
    "model.eval()", "é", "你好", "🚀", "\u{212A}", "İ", "\u{0}", "\u{7f}",
];

#[rustfmt::skip]
const SEPARATORS: &[&str] = &[
    " ", "  ", "\t", "\n", "\r\n", "\r", "\x0c", ";", "; ", " | ", "|", "&", " && ", "\n  ", "\n\t",
    "'", "\"", "`", "(", ")", "[", "]", "{", "}", ",", "/", "=", "",
];

/// A vocabulary entry as written in some script: each wildcard blank as one or more blanks
/// (or none, where `'%'` allows), each letter in the case `case` picks.
fn render(text: &str, blanks: &[u8], case: u64) -> String {
    let mut out = String::new();
    let mut blank = blanks.iter().cycle();
    let mut next_blank = || match blank.next().copied().unwrap_or(0) % 4 {
        0 => " ",
        1 => "  ",
        2 => "\t",
        _ => "",
    };
    for (i, c) in text.chars().enumerate() {
        match c {
            ' ' => match next_blank() {
                "" => out.push(' '),
                b => out.push_str(b),
            },
            '%' => out.push_str(next_blank()),
            c if (case >> (i % 64)) & 1 == 1 => out.push(c.to_ascii_uppercase()),
            c => out.push(c),
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Piece {
    Literal(usize, Vec<u8>, u64),
    Extra(usize, u64),
    Separator(usize),
    Random(String),
    /// A multi-stage rule's stages, one literal each, with a gap before each stage.
    Sequence(usize, Vec<usize>, u64),
    /// One of [`PHRASES`], each `~` replaced by a gap.
    Phrase(usize, Vec<usize>, u64),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        4 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..4), prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()])
            .prop_map(|(i, b, c)| Piece::Literal(i, b, c)),
        3 => (any::<usize>(), prop_oneof![Just(0u64), any::<u64>()]).prop_map(|(i, c)| Piece::Extra(i, c)),
        4 => any::<usize>().prop_map(Piece::Separator),
        2 => "[ -~]{0,3}".prop_map(Piece::Random),
        1 => prop::collection::vec(any::<char>(), 0..3).prop_map(|c| Piece::Random(c.into_iter().collect())),
        3 => (any::<usize>(), prop::collection::vec(any::<usize>(), 6), prop_oneof![Just(0u64), any::<u64>()])
            .prop_map(|(i, g, c)| Piece::Sequence(i, g, c)),
        3 => (any::<usize>(), prop::collection::vec(any::<usize>(), 8), prop_oneof![Just(0u64), any::<u64>()])
            .prop_map(|(i, g, c)| Piece::Phrase(i, g, c)),
    ]
}

/// The rules' own words, gathered once.
#[derive(Debug)]
struct Vocabulary {
    literals: Vec<&'static str>,
    sequences: Vec<Vec<Vec<&'static str>>>,
}

impl Vocabulary {
    fn new() -> Self {
        Self {
            literals: rule_literals(),
            sequences: rule_sequences(),
        }
    }
}

fn assemble(pieces: &[Piece], vocabulary: &Vocabulary) -> String {
    let (literals, sequences) = (&vocabulary.literals, &vocabulary.sequences);
    let pick =
        |list: &[&'static str], i: usize| list.get(i % list.len().max(1)).copied().unwrap_or("");
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Literal(i, blanks, case) => {
                let text = literals
                    .get(i % literals.len().max(1))
                    .copied()
                    .unwrap_or("");
                out.push_str(&render(text, blanks, *case));
            }
            Piece::Extra(i, case) => out.push_str(&render(pick(EXTRA_WORDS, *i), &[0], *case)),
            Piece::Separator(i) => out.push_str(pick(SEPARATORS, *i)),
            Piece::Random(s) => out.push_str(s),
            Piece::Sequence(i, gaps, case) => {
                let Some(stages) = sequences.get(i % sequences.len().max(1)) else {
                    continue;
                };
                for (n, stage) in stages.iter().enumerate() {
                    let gap = gaps.get(n).copied().unwrap_or(0);
                    // Mostly a plain gap, sometimes filler text, sometimes nothing at all.
                    match gap % 5 {
                        0 => {}
                        1 => out.push_str(" x "),
                        _ => out.push_str(pick(SEPARATORS, gap / 5)),
                    }
                    let text = stage
                        .get(gap / 7 % stage.len().max(1))
                        .copied()
                        .unwrap_or("");
                    out.push_str(&render(text, &[gap.to_le_bytes()[1]], *case));
                }
            }
            Piece::Phrase(i, gaps, case) => {
                let mut gaps = gaps.iter().copied().cycle();
                for c in render(pick(PHRASES, *i), &[0], *case).chars() {
                    match c {
                        // Mostly a blank, so the shape stays whole.
                        '~' => match gaps.next().unwrap_or(0) {
                            g if g % 3 == 0 => out.push_str(pick(PHRASE_GAPS, g / 3)),
                            _ => out.push(' '),
                        },
                        c => out.push(c),
                    }
                }
            }
        }
    }
    out
}

fn input() -> impl Strategy<Value = Vec<Piece>> {
    prop::collection::vec(piece(), 0..24)
}

/// The whole verdict of both implementations on one input, compared.
fn agree(
    new: &ScriptValidator,
    old: &old::ScriptValidator,
    (script, args, stdin): (String, Vec<String>, String),
) -> Result<(), TestCaseError> {
    let got = verdict!(new.validate_all(&script, &args, &stdin));
    let want = verdict!(old.validate_all(&script, &args, &stdin));
    prop_assert_eq!(
        got,
        want,
        "script {:?} args {:?} stdin {:?}",
        script,
        args,
        stdin
    );
    Ok(())
}

fn request() -> impl Strategy<Value = (String, Vec<String>, String)> {
    let vocabulary = Vocabulary::new();
    (
        input(),
        prop::collection::vec(prop::collection::vec(piece(), 0..6), 0..4),
        input(),
    )
        .prop_map(move |(script, args, stdin)| {
            (
                assemble(&script, &vocabulary),
                args.iter().map(|a| assemble(a, &vocabulary)).collect(),
                assemble(&stdin, &vocabulary),
            )
        })
}

/// A runner rather than the `proptest!` macro, so that each validator is built (its regexes
/// compiled) once for all cases.
#[test]
fn regex_validator_agrees_with_the_old_matcher() {
    let config = ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let (new, old) = (ScriptValidator::new(), old::ScriptValidator::new());
    let outcome = TestRunner::new(config).run(&request(), |case| agree(&new, &old, case));
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

/// The generated inputs really exercise the rules: most of them draw findings, and together
/// they make every rule fire, so the agreement above is not agreement on empty verdicts.
#[test]
fn generated_inputs_reach_the_rules() {
    use proptest::strategy::ValueTree;
    let vocabulary = Vocabulary::new();
    let mut runner = TestRunner::deterministic();
    let strategy = input();
    let validator = ScriptValidator::new();
    let mut fired = std::collections::BTreeSet::new();
    let mut with_findings = 0;
    const RUNS: usize = 2_000;
    for _ in 0..RUNS {
        let Ok(tree) = strategy.new_tree(&mut runner) else {
            panic!("the input strategy cannot fail");
        };
        let result = validator.validate_script(&assemble(&tree.current(), &vocabulary));
        with_findings += usize::from(!result.is_valid());
        fired.extend(result.errors.into_iter().map(|e| e.pattern));
    }
    assert!(
        with_findings > RUNS / 2,
        "{with_findings} of {RUNS} inputs drew a finding"
    );
    let missing: Vec<&str> = SCRIPT_RULES
        .iter()
        .map(|r| r.label)
        .filter(|l| !fired.contains(*l))
        .collect();
    assert!(missing.is_empty(), "rules never fired: {missing:?}");
}
