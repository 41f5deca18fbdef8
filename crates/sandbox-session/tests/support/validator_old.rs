//! The hand-written script matcher that `sandbox-core` held before issue 14, kept unchanged
//! (apart from this paragraph and the tests, which moved to `src/policy/validator.rs`) as the
//! oracle of the regex validator's differential test (`src/policy/validator_differential.rs`).
//! It is compiled only into that test; delete both together.
//!
//! Static screening of scripts, arguments and stdin that an AI agent asks to run.
//!
//! This is defence in depth against prompt injection, not a sandbox: the sandbox remains the
//! security boundary, and this module only refuses requests that are obviously hostile before
//! they cost a sandbox start. It therefore errs towards catching known attack shapes while
//! keeping false positives on ordinary data-processing scripts low, because every false
//! positive is an agent task that fails for no reason.
//!
//! Every matcher is hand-written over bytes (the crate may not depend on `regex`), never
//! indexes, and is linear in the input apart from a small constant per rule, so hostile input
//! can neither panic the validator nor make it slow.

use std::fmt;

/// Which family of rule fired; callers map these to user-facing categories and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValidationErrorKind {
    DangerousCommand,
    DangerousPattern,
    NetworkAccess,
    ReverseShell,
    ArgInjection,
    ShellInjection,
}

impl ValidationErrorKind {
    /// Stable snake_case names, because they end up in logs and API responses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DangerousCommand => "dangerous_command",
            Self::DangerousPattern => "dangerous_pattern",
            Self::NetworkAccess => "network_access",
            Self::ReverseShell => "reverse_shell",
            Self::ArgInjection => "arg_injection",
            Self::ShellInjection => "shell_injection",
        }
    }

    /// Script messages lead with this so the reader knows why the label matters.
    fn script_phrase(self) -> &'static str {
        match self {
            Self::DangerousCommand => "script uses dangerous command",
            Self::DangerousPattern => "script uses dangerous pattern",
            Self::NetworkAccess => "script attempts network access via",
            Self::ReverseShell => "script contains reverse shell pattern",
            Self::ArgInjection => "script contains argument injection",
            Self::ShellInjection => "script contains shell injection",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    pub kind: ValidationErrorKind,
    /// The rule that fired, e.g. "rm -rf /" or "curl | sh" (a short stable label, not the input).
    pub pattern: String,
    /// Where it fired: "script", "arg[2]", "stdin".
    pub context: String,
    /// One line, human readable, no trailing period.
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ({})",
            self.kind.as_str(),
            self.message,
            self.context
        )
    }
}

impl std::error::Error for ValidationError {}

/// All findings rather than the first, so logs show every reason a request was refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidationResult {
    pub errors: Vec<ValidationError>,
}

impl ValidationResult {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// Callers report one reason to the agent; the first is the most specific one.
    pub fn first(&self) -> Option<&ValidationError> {
        self.errors.first()
    }
}

/// Stateless: the rules are static tables, so one validator can be shared freely.
#[derive(Debug, Clone, Default)]
pub struct ScriptValidator {
    _private: (),
}

impl ScriptValidator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports every script rule that fires, in table order (reverse shells first, then
    /// dangerous commands, dangerous patterns and plain network access), so that the first
    /// error names the most specific threat: `curl ... | sh` is reported as a pattern rather
    /// than as mere network access.
    pub fn validate_script(&self, content: &str) -> ValidationResult {
        // ASCII-only lowering: every pattern is ASCII, byte offsets stay aligned with the
        // input, and full Unicode lowering would map look-alikes such as the Kelvin sign to
        // `k`, producing matches on text no shell would ever execute.
        let lower = content.to_ascii_lowercase();
        let text = lower.as_bytes();
        let errors = SCRIPT_RULES
            .iter()
            .filter(|rule| rule.fires(text))
            .map(|rule| ValidationError {
                kind: rule.kind,
                pattern: rule.label.to_owned(),
                context: "script".to_owned(),
                message: format!("{} `{}`", rule.kind.script_phrase(), rule.label),
            })
            .collect();
        ValidationResult { errors }
    }

    /// Arguments are passed as argv, so a shell metacharacter in one only matters if the
    /// script later interpolates it into a shell; refusing them outright is cheaper than
    /// trusting every script to quote correctly.
    pub fn validate_args(&self, args: &[String]) -> ValidationResult {
        let mut errors = Vec::new();
        for (index, arg) in args.iter().enumerate() {
            let lower = arg.to_ascii_lowercase();
            for label in arg_findings(lower.as_bytes()) {
                errors.push(ValidationError {
                    kind: ValidationErrorKind::ArgInjection,
                    pattern: label.to_owned(),
                    context: format!("arg[{index}]"),
                    message: format!("argument contains {}", arg_description(label)),
                });
            }
        }
        ValidationResult { errors }
    }

    /// Stdin is data, so only shapes that turn into commands when a careless script pastes
    /// it into a shell are refused; ordinary multi-line CSV, JSON and prose pass.
    pub fn validate_stdin(&self, stdin: &str) -> ValidationResult {
        let lower = stdin.to_ascii_lowercase();
        let errors = stdin_findings(lower.as_bytes())
            .into_iter()
            .map(|(label, description)| ValidationError {
                kind: ValidationErrorKind::ShellInjection,
                pattern: label.to_owned(),
                context: "stdin".to_owned(),
                message: format!("stdin contains {description}"),
            })
            .collect();
        ValidationResult { errors }
    }

    /// Script first, then arguments, then stdin, so the first error points at the part the
    /// agent is most likely to have been manipulated into writing.
    pub fn validate_all(&self, script: &str, args: &[String], stdin: &str) -> ValidationResult {
        let mut result = self.validate_script(script);
        result.errors.extend(self.validate_args(args).errors);
        result.errors.extend(self.validate_stdin(stdin).errors);
        result
    }
}

// ---------------------------------------------------------------------------------------------
// Pattern primitives
// ---------------------------------------------------------------------------------------------

/// What must precede a match. Plain substring search fires on `shutdown_hook` and `data.nc`,
/// so most rules demand a boundary.
#[derive(Debug, Clone, Copy)]
enum Lead {
    Any,
    /// Not preceded by `[a-z0-9_]`: for names that are dangerous even as attributes
    /// (`os.setuid`, `window.fetch`).
    Ident,
    /// Not preceded by `[a-z0-9_.-]`: shell command words, where a preceding `.` means a
    /// method (`executor.shutdown()`, `df.eval()`) or a file extension (`data.nc`) and a
    /// preceding `-` means a kebab-case name.
    Cmd,
    /// `Cmd`, and also at the start of a shell command (see [`at_command_position`]): for
    /// words such as `halt` or `passwd` that also appear in comments, prose and parameter lists.
    CmdPos,
}

/// What must follow a match.
#[derive(Debug, Clone, Copy)]
enum Trail {
    Any,
    /// Not followed by `[a-z0-9_]`.
    Ident,
    /// Not followed by `[a-z0-9_-]`, and the next non-blank byte is not `=`, so `nc = 4` or
    /// `passwd = getpass()` (assignments) do not fire while `reboot;` does.
    Cmd,
}

/// A literal in which `' '` matches one or more blanks and `'%'` matches zero or more, so
/// one pattern covers the spacing variants attackers use to dodge naive substring checks.
#[derive(Debug, Clone, Copy)]
struct Pat {
    text: &'static str,
    lead: Lead,
    trail: Trail,
}

const fn lit(text: &'static str) -> Pat {
    Pat {
        text,
        lead: Lead::Any,
        trail: Trail::Any,
    }
}

const fn word(text: &'static str) -> Pat {
    Pat {
        text,
        lead: Lead::Cmd,
        trail: Trail::Cmd,
    }
}

const fn ident(text: &'static str) -> Pat {
    Pat {
        text,
        lead: Lead::Ident,
        trail: Trail::Ident,
    }
}

const fn cmd_start(text: &'static str) -> Pat {
    Pat {
        text,
        lead: Lead::Cmd,
        trail: Trail::Any,
    }
}

const fn ident_start(text: &'static str) -> Pat {
    Pat {
        text,
        lead: Lead::Ident,
        trail: Trail::Any,
    }
}

const fn cmd_pos(text: &'static str) -> Pat {
    Pat {
        text,
        lead: Lead::CmdPos,
        trail: Trail::Cmd,
    }
}

#[derive(Debug, Clone, Copy)]
enum Matcher {
    /// Any of the patterns anywhere.
    Any(&'static [Pat]),
    /// One pattern from each stage, in order, on a single line ("A ... later ... B").
    Seq(&'static [&'static [Pat]]),
    /// The first pattern without any of the second later on the same line.
    Unless(&'static [Pat], &'static [Pat]),
    /// Shapes that need tokenising rather than pattern search.
    Custom(fn(&[u8]) -> bool),
}

impl Matcher {
    fn fires(&self, text: &[u8]) -> bool {
        match *self {
            Self::Any(pats) => pats.iter().any(|pat| find(text, 0, *pat).is_some()),
            Self::Seq(stages) => seq_found(text, stages),
            Self::Unless(first, absent) => unless_found(text, first, absent),
            Self::Custom(check) => check(text),
        }
    }
}

#[derive(Debug)]
struct Rule {
    kind: ValidationErrorKind,
    label: &'static str,
    matchers: &'static [Matcher],
}

impl Rule {
    fn fires(&self, text: &[u8]) -> bool {
        self.matchers.iter().any(|matcher| matcher.fires(text))
    }
}

const fn rule(
    kind: ValidationErrorKind,
    label: &'static str,
    matchers: &'static [Matcher],
) -> Rule {
    Rule {
        kind,
        label,
        matchers,
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn blanks_at(hay: &[u8], from: usize) -> usize {
    hay.get(from..)
        .map_or(0, |rest| rest.iter().take_while(|b| is_blank(**b)).count())
}

fn line_end(hay: &[u8], from: usize) -> usize {
    hay.get(from..)
        .and_then(|rest| rest.iter().position(|b| *b == b'\n'))
        .map_or(hay.len(), |offset| from + offset)
}

fn is_command_separator(b: u8) -> bool {
    matches!(b, b'\n' | b';' | b'|' | b'&')
}

/// Quotes, brackets and commas separate the arguments read by [`next_tokens`], so that
/// `service("nginx", "restart")` and `nc 'host' 80` read like shell.
fn is_token_separator(b: u8) -> bool {
    (b.is_ascii_whitespace() && b != b'\n')
        || matches!(
            b,
            b'"' | b'\'' | b'`' | b'(' | b')' | b'[' | b']' | b'{' | b'}' | b','
        )
}

/// Up to `limit` tokens after `from` within the same simple command. It reads only as far as
/// it needs, so a word repeated many times on one huge line stays linear overall.
fn next_tokens(hay: &[u8], from: usize, limit: usize) -> Vec<&[u8]> {
    let mut found = Vec::new();
    let mut pos = from;
    while found.len() < limit {
        let rest = hay.get(pos..).unwrap_or_default();
        pos += rest.iter().take_while(|b| is_token_separator(**b)).count();
        let rest = hay.get(pos..).unwrap_or_default();
        let len = rest
            .iter()
            .take_while(|b| !is_token_separator(**b) && !is_command_separator(**b))
            .count();
        match rest.get(..len) {
            Some(token) if !token.is_empty() => found.push(token),
            _ => break,
        }
        pos += len;
    }
    found
}

/// Words after which the next word is still the command being run.
const COMMAND_PREFIXES: &[&[u8]] = &[
    b"sudo", b"doas", b"exec", b"nohup", b"then", b"do", b"else", b"xargs", b"env", b"time",
    b"nice", b"command", b"busybox",
];

/// True when position `at` starts a shell command: after a separator, an opening quote or
/// bracket (`os.system("halt")`, `$(reboot)`), a path (`/sbin/halt`) or a prefix such as
/// `sudo`. A comment like `# halt on error` or prose like `the shutdown` is not.
fn at_command_position(hay: &[u8], at: usize) -> bool {
    let Some(before) = hay.get(..at) else {
        return false;
    };
    if before.last() == Some(&b'/') {
        return true;
    }
    let trimmed_len = before.len() - before.iter().rev().take_while(|b| is_blank(**b)).count();
    let trimmed = before.get(..trimmed_len).unwrap_or_default();
    let Some(&last) = trimmed.last() else {
        return true;
    };
    if matches!(
        last,
        b'\n' | b'\r' | b';' | b'&' | b'|' | b'(' | b'`' | b'{' | b'"' | b'\'' | b'!'
    ) {
        return true;
    }
    let start = trimmed
        .iter()
        .rposition(|b| !(is_word_byte(*b) || *b == b'-'))
        .map_or(0, |p| p + 1);
    let previous = trimmed.get(start..).unwrap_or_default();
    COMMAND_PREFIXES.contains(&previous)
}

fn lead_ok(hay: &[u8], at: usize, lead: Lead) -> bool {
    let prev = at.checked_sub(1).and_then(|p| hay.get(p)).copied();
    match lead {
        Lead::Any => true,
        Lead::Ident => !prev.is_some_and(is_word_byte),
        Lead::Cmd => !prev.is_some_and(|b| is_word_byte(b) || b == b'.' || b == b'-'),
        Lead::CmdPos => lead_ok(hay, at, Lead::Cmd) && at_command_position(hay, at),
    }
}

fn trail_ok(hay: &[u8], end: usize, trail: Trail) -> bool {
    let next = hay.get(end).copied();
    match trail {
        Trail::Any => true,
        Trail::Ident => !next.is_some_and(is_word_byte),
        Trail::Cmd => {
            let glued = next.is_some_and(|b| is_word_byte(b) || b == b'-');
            let assigned = hay.get(end + blanks_at(hay, end)) == Some(&b'=');
            !glued && !assigned
        }
    }
}

/// Matches `pat` (with its blank wildcards) at exactly `at`, returning the end offset.
fn match_at(hay: &[u8], at: usize, pat: &[u8]) -> Option<usize> {
    let mut pos = at;
    for &p in pat {
        match p {
            b' ' => {
                let n = blanks_at(hay, pos);
                if n == 0 {
                    return None;
                }
                pos += n;
            }
            b'%' => pos += blanks_at(hay, pos),
            c => {
                if hay.get(pos) != Some(&c) {
                    return None;
                }
                pos += 1;
            }
        }
    }
    Some(pos)
}

/// First match of `pat` starting at or after `from`, as `(start, end)`.
fn find(hay: &[u8], from: usize, pat: Pat) -> Option<(usize, usize)> {
    let bytes = pat.text.as_bytes();
    let first = *bytes.first()?;
    let mut pos = from;
    loop {
        pos += hay.get(pos..)?.iter().position(|b| *b == first)?;
        if lead_ok(hay, pos, pat.lead)
            && let Some(end) = match_at(hay, pos, bytes)
            && trail_ok(hay, end, pat.trail)
        {
            return Some((pos, end));
        }
        pos += 1;
    }
}

fn occurrences(hay: &[u8], pat: Pat) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut from = 0;
    std::iter::from_fn(move || {
        let found = find(hay, from, pat)?;
        from = found.0 + 1;
        Some(found)
    })
}

/// Only the first occurrence of stage one per line needs trying: later ones would search a
/// suffix of the same line for the remaining stages, so skipping them keeps this linear.
fn seq_found(hay: &[u8], stages: &[&[Pat]]) -> bool {
    let Some((first, rest)) = stages.split_first() else {
        return false;
    };
    first.iter().any(|pat| {
        let mut from = 0;
        while let Some((start, end)) = find(hay, from, *pat) {
            let eol = line_end(hay, start);
            if rest_on_line(hay, end, eol, rest) {
                return true;
            }
            from = eol + 1;
        }
        false
    })
}

fn rest_on_line(hay: &[u8], from: usize, eol: usize, stages: &[&[Pat]]) -> bool {
    let Some((first, rest)) = stages.split_first() else {
        return true;
    };
    let line = hay.get(..eol).unwrap_or_default();
    first
        .iter()
        .any(|pat| find(line, from, *pat).is_some_and(|(_, end)| rest_on_line(hay, end, eol, rest)))
}

/// Fires when some occurrence of `first` has none of `absent` after it on its line. The
/// position of the last `absent` match found is remembered so that many occurrences on one
/// long line do not rescan it.
fn unless_found(hay: &[u8], first: &[Pat], absent: &[Pat]) -> bool {
    first.iter().any(|pat| {
        let mut covered: Option<(usize, usize)> = None;
        let mut eol = 0;
        for (start, end) in occurrences(hay, *pat) {
            if start >= eol {
                eol = line_end(hay, start);
            }
            if covered.is_some_and(|(at, line)| line == eol && at >= end) {
                continue;
            }
            let line = hay.get(..eol).unwrap_or_default();
            match absent
                .iter()
                .filter_map(|p| find(line, end, *p))
                .map(|(s, _)| s)
                .min()
            {
                Some(at) => covered = Some((at, eol)),
                None => return true,
            }
        }
        false
    })
}

// ---------------------------------------------------------------------------------------------
// Tokenised command checks
// ---------------------------------------------------------------------------------------------

/// Simple commands of the script, each as its shell words (see [`shell_word`]).
fn commands(text: &[u8]) -> impl Iterator<Item = Vec<Vec<u8>>> {
    text.split(|b| is_command_separator(*b)).map(|segment| {
        segment
            .split(|b| b.is_ascii_whitespace() || matches!(b, b',' | b'[' | b']'))
            .map(shell_word)
            .filter(|word| !word.is_empty())
            .collect()
    })
}

/// Approximates the word the shell would see. Quotes are removed rather than treated as
/// separators, because `"$OUT"/*` is a single word and must not read as the target `/*`.
/// Commas and brackets separate and a call's `(` / `)` are cut off, so that
/// `os.system("rm -rf /")` and `subprocess.run(["rm", "-rf", "/"])` read like the shell
/// command they run, while `$(pwd)/*` stays one word that is not the root.
fn shell_word(raw: &[u8]) -> Vec<u8> {
    let unquoted: Vec<u8> = raw
        .iter()
        .copied()
        .filter(|b| !matches!(b, b'"' | b'\'' | b'`'))
        .collect();
    let start = unquoted
        .iter()
        .rposition(|b| *b == b'(')
        .map_or(0, |p| p + 1);
    let mut word = unquoted.get(start..).unwrap_or_default().to_vec();
    while word.last() == Some(&b')') {
        word.pop();
    }
    word
}

/// `rm` and `/bin/rm` both name the command.
fn is_command(token: &[u8], name: &[u8]) -> bool {
    token
        .strip_suffix(name)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with(b"/"))
}

fn is_root(token: &[u8]) -> bool {
    token == b"/" || token == b"/*"
}

#[derive(Debug, Default, Clone, Copy)]
struct RmCall {
    recursive: bool,
    force: bool,
    root: bool,
    star: bool,
}

/// Parses every `rm` invocation's flags and targets; flags glued to a target (`-rf/*`) are
/// split so that spelling does not slip through.
fn rm_calls(text: &[u8]) -> impl Iterator<Item = RmCall> + '_ {
    commands(text).flat_map(|toks| {
        let mut calls = Vec::new();
        let mut current: Option<RmCall> = None;
        for token in &toks {
            let token = token.as_slice();
            if is_command(token, b"rm") {
                calls.extend(current.take());
                current = Some(RmCall::default());
                continue;
            }
            let Some(call) = current.as_mut() else {
                continue;
            };
            let mut target = token;
            if let Some(long) = token.strip_prefix(b"--") {
                call.recursive |= long == b"recursive";
                call.force |= long == b"force";
                continue;
            }
            if let Some(short) = token.strip_prefix(b"-") {
                let flags = short.iter().take_while(|b| b.is_ascii_alphabetic()).count();
                let (flag_bytes, rest) = short.split_at_checked(flags).unwrap_or((short, b""));
                call.recursive |= flag_bytes.contains(&b'r');
                call.force |= flag_bytes.contains(&b'f');
                target = rest;
            }
            call.root |= is_root(target);
            call.star |= target == b"*";
        }
        calls.extend(current);
        calls
    })
}

fn rm_rf_root(text: &[u8]) -> bool {
    rm_calls(text).any(|c| c.recursive && c.force && c.root)
}

fn rm_rf_star(text: &[u8]) -> bool {
    rm_calls(text).any(|c| c.recursive && c.force && c.star)
}

fn rm_flag_root(text: &[u8]) -> bool {
    rm_calls(text).any(|c| (c.recursive || c.force) && c.root)
}

/// Anything after the command name in the same simple command.
fn command_args<'a>(toks: &'a [Vec<u8>], name: &[u8]) -> Option<&'a [Vec<u8>]> {
    let at = toks.iter().position(|t| is_command(t, name))?;
    toks.get(at + 1..)
}

fn chmod_777_root(text: &[u8]) -> bool {
    commands(text).any(|toks| {
        command_args(&toks, b"chmod").is_some_and(|args| {
            args.iter().any(|a| a == b"777" || a == b"0777") && args.iter().any(|a| is_root(a))
        })
    })
}

fn chown_root(text: &[u8]) -> bool {
    commands(text).any(|toks| {
        command_args(&toks, b"chown").is_some_and(|args| {
            args.iter()
                .any(|a| a == b"root" || a.starts_with(b"root:") || a.starts_with(b"root."))
        })
    })
}

/// Whitespace is irrelevant to the shell here, so `:(){ :|:& };:` and `:() { : | : & } ; :`
/// are the same bomb.
fn fork_bomb(text: &[u8]) -> bool {
    let squeezed: Vec<u8> = text
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    squeezed.windows(11).any(|w| w == b":(){:|:&};:")
}

/// `service` is an ordinary English word, so it only fires in the SysV shape
/// `service <name> <action>` or `service --status-all`; "web service is down" stays valid.
fn service_command(text: &[u8]) -> bool {
    const ACTIONS: &[&[u8]] = &[
        b"start",
        b"stop",
        b"restart",
        b"reload",
        b"force-reload",
        b"status",
    ];
    occurrences(text, word("service")).any(|(_, end)| {
        let args = next_tokens(text, end, 2);
        match args.as_slice() {
            [first, ..] if *first == b"--status-all" => true,
            [name, action, ..] => {
                name.first().is_some_and(u8::is_ascii_alphanumeric) && ACTIONS.contains(action)
            }
            _ => false,
        }
    })
}

/// `nc` is also a common short variable name (`nc = 4`, `for nc in range(n)`), so it only
/// fires when followed by a flag (`nc -l`) or by a host and a numeric port (`nc 10.0.0.1 80`).
fn nc_command(text: &[u8]) -> bool {
    occurrences(text, word("nc")).any(|(_, end)| {
        if blanks_at(text, end) == 0 {
            return false;
        }
        let args = next_tokens(text, end, 2);
        match args.as_slice() {
            [flag, ..] if flag.len() > 1 && flag.starts_with(b"-") => true,
            [_, port, ..] => port.iter().all(u8::is_ascii_digit),
            _ => false,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Script rules
// ---------------------------------------------------------------------------------------------

const DC: ValidationErrorKind = ValidationErrorKind::DangerousCommand;
const DP: ValidationErrorKind = ValidationErrorKind::DangerousPattern;
const NA: ValidationErrorKind = ValidationErrorKind::NetworkAccess;
const RS: ValidationErrorKind = ValidationErrorKind::ReverseShell;

const PIPE_TO_SHELL: &[Pat] = &[
    Pat {
        text: "|%sh",
        lead: Lead::Any,
        trail: Trail::Cmd,
    },
    Pat {
        text: "|%bash",
        lead: Lead::Any,
        trail: Trail::Cmd,
    },
    Pat {
        text: "|%zsh",
        lead: Lead::Any,
        trail: Trail::Cmd,
    },
    Pat {
        text: "|%sudo sh",
        lead: Lead::Any,
        trail: Trail::Cmd,
    },
    Pat {
        text: "|%sudo bash",
        lead: Lead::Any,
        trail: Trail::Cmd,
    },
];

const NC_WORDS: &[Pat] = &[word("nc"), word("ncat"), word("netcat")];

/// Ordered most specific first; see [`ScriptValidator::validate_script`].
static SCRIPT_RULES: &[Rule] = &[
    // Reverse shells.
    rule(RS, "/dev/tcp/", &[Matcher::Any(&[lit("/dev/tcp/")])]),
    rule(RS, "/dev/udp/", &[Matcher::Any(&[lit("/dev/udp/")])]),
    rule(RS, "/inet/tcp/", &[Matcher::Any(&[lit("/inet/tcp/")])]),
    rule(RS, "bash -i", &[Matcher::Any(&[word("bash -i")])]),
    rule(RS, "sh -i", &[Matcher::Any(&[word("sh -i")])]),
    rule(RS, "pty.spawn", &[Matcher::Any(&[lit("pty.spawn")])]),
    rule(
        RS,
        "perl socket",
        &[Matcher::Seq(&[&[word("perl")], &[lit("socket")]])],
    ),
    rule(
        RS,
        "ruby socket",
        &[Matcher::Seq(&[&[word("ruby")], &[lit("socket")]])],
    ),
    rule(
        RS,
        "socat exec",
        &[Matcher::Seq(&[&[word("socat")], &[lit("exec")]])],
    ),
    rule(RS, "mkfifo", &[Matcher::Any(&[ident("mkfifo")])]),
    rule(
        RS,
        "mknod p",
        &[Matcher::Seq(&[&[ident("mknod")], &[ident("p")]])],
    ),
    rule(RS, "0<&196", &[Matcher::Any(&[lit("0<&196")])]),
    rule(RS, "196>&0", &[Matcher::Any(&[lit("196>&0")])]),
    rule(
        RS,
        "bash >& 0>&1",
        &[Matcher::Seq(&[
            &[word("bash"), word("sh")],
            &[lit(">&")],
            &[lit("0>&1")],
        ])],
    ),
    rule(
        RS,
        "nc -e",
        &[Matcher::Seq(&[
            NC_WORDS,
            &[word("-e"), word("-c"), word("--exec"), word("--sh-exec")],
        ])],
    ),
    // Destructive and privileged commands.
    rule(DC, "rm -rf /", &[Matcher::Custom(rm_rf_root)]),
    rule(DC, "rm -rf *", &[Matcher::Custom(rm_rf_star)]),
    rule(DC, "mkfs", &[Matcher::Any(&[word("mkfs")])]),
    rule(
        DC,
        "dd if=/dev/zero",
        &[Matcher::Any(&[cmd_start("dd if=/dev/zero")])],
    ),
    rule(
        DC,
        "dd if=/dev/random",
        &[Matcher::Any(&[
            cmd_start("dd if=/dev/random"),
            cmd_start("dd if=/dev/urandom"),
        ])],
    ),
    rule(DC, "fork bomb", &[Matcher::Custom(fork_bomb)]),
    rule(DC, "shutdown", &[Matcher::Any(&[cmd_pos("shutdown")])]),
    rule(DC, "reboot", &[Matcher::Any(&[cmd_pos("reboot")])]),
    rule(DC, "halt", &[Matcher::Any(&[cmd_pos("halt")])]),
    rule(DC, "poweroff", &[Matcher::Any(&[word("poweroff")])]),
    rule(DC, "init 0", &[Matcher::Any(&[word("init 0")])]),
    rule(DC, "init 6", &[Matcher::Any(&[word("init 6")])]),
    rule(DC, "killall", &[Matcher::Any(&[word("killall")])]),
    rule(DC, "pkill", &[Matcher::Any(&[word("pkill")])]),
    rule(DC, "chmod 777 /", &[Matcher::Custom(chmod_777_root)]),
    rule(DC, "chown root", &[Matcher::Custom(chown_root)]),
    rule(DC, "setuid", &[Matcher::Any(&[ident("setuid")])]),
    rule(DC, "setgid", &[Matcher::Any(&[ident("setgid")])]),
    rule(DC, "/etc/passwd", &[Matcher::Any(&[lit("/etc/passwd")])]),
    rule(DC, "/etc/shadow", &[Matcher::Any(&[lit("/etc/shadow")])]),
    rule(DC, "/etc/sudoers", &[Matcher::Any(&[lit("/etc/sudoers")])]),
    rule(DC, "passwd", &[Matcher::Any(&[cmd_pos("passwd")])]),
    rule(DC, ".ssh/", &[Matcher::Any(&[lit(".ssh/")])]),
    rule(DC, "id_rsa", &[Matcher::Any(&[ident_start("id_rsa")])]),
    rule(
        DC,
        "id_ed25519",
        &[Matcher::Any(&[ident_start("id_ed25519")])],
    ),
    rule(
        DC,
        "export path=",
        &[Matcher::Any(&[cmd_start("export path=")])],
    ),
    rule(
        DC,
        "export ld_preload",
        &[Matcher::Any(&[cmd_start("export ld_preload")])],
    ),
    rule(
        DC,
        "export ld_library_path",
        &[Matcher::Any(&[cmd_start("export ld_library_path")])],
    ),
    rule(DC, "/etc/cron", &[Matcher::Any(&[lit("/etc/cron")])]),
    rule(DC, "crontab", &[Matcher::Any(&[word("crontab")])]),
    rule(DC, "systemctl", &[Matcher::Any(&[word("systemctl")])]),
    rule(DC, "service", &[Matcher::Custom(service_command)]),
    rule(DC, "insmod", &[Matcher::Any(&[word("insmod")])]),
    rule(DC, "modprobe", &[Matcher::Any(&[word("modprobe")])]),
    rule(DC, "rmmod", &[Matcher::Any(&[word("rmmod")])]),
    rule(
        DC,
        "docker",
        &[Matcher::Any(&[word("docker"), word("docker-compose")])],
    ),
    rule(DC, "kubectl", &[Matcher::Any(&[word("kubectl")])]),
    rule(DC, "nsenter", &[Matcher::Any(&[word("nsenter")])]),
    rule(DC, "unshare", &[Matcher::Any(&[ident("unshare")])]),
    rule(DC, "capsh", &[Matcher::Any(&[word("capsh")])]),
    // Obfuscation, dynamic code execution and anti-forensics.
    rule(
        DP,
        "base64 -d",
        &[Matcher::Any(&[word("base64 -d"), word("base64 --decode")])],
    ),
    rule(DP, "xxd -r", &[Matcher::Any(&[cmd_start("xxd -r")])]),
    rule(
        DP,
        "echo -e \\x",
        &[Matcher::Seq(&[
            &[word("echo -e"), word("echo -ne"), word("echo -en")],
            &[lit("\\x")],
        ])],
    ),
    rule(
        DP,
        "curl | sh",
        &[
            Matcher::Seq(&[&[word("curl")], PIPE_TO_SHELL]),
            Matcher::Any(&[lit("sh <(%curl")]),
        ],
    ),
    rule(
        DP,
        "wget | sh",
        &[
            Matcher::Seq(&[&[word("wget")], PIPE_TO_SHELL]),
            Matcher::Any(&[lit("sh <(%wget")]),
        ],
    ),
    rule(
        DP,
        "python -m http.server",
        &[Matcher::Seq(&[
            &[cmd_start("python")],
            &[lit("-m http.server"), lit("-m simplehttpserver")],
        ])],
    ),
    rule(DP, "eval(", &[Matcher::Any(&[cmd_start("eval%(")])]),
    rule(DP, "exec(", &[Matcher::Any(&[cmd_start("exec%(")])]),
    rule(DP, "os.system(", &[Matcher::Any(&[lit("os.system%(")])]),
    rule(DP, "os.popen(", &[Matcher::Any(&[lit("os.popen%(")])]),
    rule(DP, "shell=true", &[Matcher::Any(&[ident("shell%=%true")])]),
    rule(
        DP,
        "commands.getoutput",
        &[Matcher::Any(&[
            lit("commands.getoutput"),
            lit("subprocess.getoutput"),
            lit("subprocess.getstatusoutput"),
        ])],
    ),
    rule(DP, "history -c", &[Matcher::Any(&[word("history -c")])]),
    rule(
        DP,
        "unset histfile",
        &[Matcher::Any(&[word("unset histfile")])],
    ),
    rule(DP, "histsize=0", &[Matcher::Any(&[ident("histsize=0")])]),
    rule(DP, "__import__(", &[Matcher::Any(&[lit("__import__%(")])]),
    rule(
        DP,
        "importlib.import_module",
        &[Matcher::Any(&[lit("importlib.import_module")])],
    ),
    rule(
        DP,
        "compile(...exec)",
        &[Matcher::Seq(&[&[cmd_start("compile%(")], &[ident("exec")]])],
    ),
    rule(
        DP,
        "pickle.load(",
        &[Matcher::Any(&[lit("pickle.load%("), lit("pickle.loads%(")])],
    ),
    rule(
        DP,
        "yaml.load( without loader",
        &[Matcher::Unless(&[lit("yaml.load%(")], &[lit("loader")])],
    ),
    rule(
        DP,
        "yaml.unsafe_load",
        &[Matcher::Any(&[lit("yaml.unsafe_load")])],
    ),
    rule(DP, "rm -r /", &[Matcher::Custom(rm_flag_root)]),
    rule(
        DP,
        "--no-preserve-root",
        &[Matcher::Any(&[lit("--no-preserve-root")])],
    ),
    // Plain network access.
    rule(NA, "curl", &[Matcher::Any(&[word("curl")])]),
    rule(NA, "wget", &[Matcher::Any(&[word("wget")])]),
    rule(NA, "nc", &[Matcher::Custom(nc_command)]),
    rule(
        NA,
        "netcat",
        &[Matcher::Any(&[word("netcat"), word("ncat")])],
    ),
    rule(NA, "telnet", &[Matcher::Any(&[word("telnet")])]),
    rule(NA, "ssh", &[Matcher::Any(&[word("ssh")])]),
    rule(NA, "scp", &[Matcher::Any(&[word("scp")])]),
    rule(NA, "rsync", &[Matcher::Any(&[word("rsync")])]),
    rule(NA, "ftp", &[Matcher::Any(&[word("ftp")])]),
    rule(NA, "sftp", &[Matcher::Any(&[word("sftp")])]),
    rule(
        NA,
        "socket.connect",
        &[Matcher::Any(&[lit("socket.connect")])],
    ),
    rule(
        NA,
        "urllib.request",
        &[Matcher::Any(&[lit("urllib.request")])],
    ),
    rule(
        NA,
        "requests.get",
        &[Matcher::Any(&[ident_start("requests.get")])],
    ),
    rule(
        NA,
        "requests.post",
        &[Matcher::Any(&[ident_start("requests.post")])],
    ),
    rule(
        NA,
        "http.client",
        &[Matcher::Any(&[ident_start("http.client")])],
    ),
    rule(NA, "httplib", &[Matcher::Any(&[ident_start("httplib")])]),
    rule(NA, "fetch(", &[Matcher::Any(&[ident_start("fetch%(")])]),
    rule(NA, "axios", &[Matcher::Any(&[ident("axios")])]),
    rule(
        NA,
        "xmlhttprequest",
        &[Matcher::Any(&[lit("xmlhttprequest")])],
    ),
];

// ---------------------------------------------------------------------------------------------
// Arguments and stdin
// ---------------------------------------------------------------------------------------------

/// Longest first, so `&&` is reported as itself rather than as `&>` or a stray `&`.
const ARG_OPERATORS: &[(&str, &str)] = &[
    ("&&", "&&"),
    ("||", "||"),
    (">>", ">>"),
    ("2>", "2>"),
    ("&>", "&>"),
    ("$(", "$("),
    ("${", "${"),
    (";", ";"),
    ("|", "|"),
    (">", ">"),
    ("<", "<"),
    ("`", "`"),
    ("\n", "newline"),
    ("\r", "carriage return"),
];

/// Labels of every finding in one argument, each once, in order of first appearance.
fn arg_findings(arg: &[u8]) -> Vec<&'static str> {
    let mut found: Vec<&'static str> = Vec::new();
    let mut note = |label: &'static str| {
        if !found.contains(&label) {
            found.push(label);
        }
    };
    let mut pos = 0;
    while let Some(rest) = arg.get(pos..).filter(|r| !r.is_empty()) {
        if let Some((op, label)) = ARG_OPERATORS
            .iter()
            .find(|(op, _)| rest.starts_with(op.as_bytes()))
        {
            note(label);
            pos += op.len();
            continue;
        }
        if rest.first() == Some(&b'$')
            && rest
                .get(1)
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        {
            note("$VAR");
        }
        pos += 1;
    }
    if arg.windows(3).any(|w| w == b"../") {
        note("../");
    }
    if arg.windows(3).any(|w| w == b"..\\") {
        note("..\\");
    }
    if arg == b".." || arg.ends_with(b"/..") || arg.ends_with(b"\\..") {
        note("..");
    }
    found
}

fn arg_description(label: &str) -> String {
    match label {
        "$(" => "command substitution `$(`".to_owned(),
        "`" => "a backtick (command substitution)".to_owned(),
        "newline" => "a newline".to_owned(),
        "carriage return" => "a carriage return".to_owned(),
        "../" | "..\\" | ".." => format!("path traversal `{label}`"),
        "${" | "$VAR" => format!("environment reference `{label}`"),
        other => format!("shell operator `{other}`"),
    }
}

/// Findings as `(label, description)`.
fn stdin_findings(stdin: &[u8]) -> Vec<(&'static str, &'static str)> {
    let mut found = Vec::new();
    let substitution = stdin
        .windows(2)
        .position(|w| w == b"$(")
        .is_some_and(|at| stdin.get(at + 2..).is_some_and(|rest| rest.contains(&b')')));
    if substitution {
        found.push(("$(...)", "command substitution `$(...)`"));
    }
    // A lone backtick is an apostrophe in prose; substitution needs a closed, non-empty pair.
    let ticks: Vec<usize> = stdin
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'`')
        .map(|(i, _)| i)
        .collect();
    if ticks
        .windows(2)
        .any(|pair| matches!(pair, [open, close] if *close > *open + 1))
    {
        found.push(("`...`", "backtick command substitution"));
    }
    const LINE_OPERATORS: &[(&[u8], &str, &str)] = &[
        (
            b"&&",
            "newline &&",
            "a line starting with shell operator `&&`",
        ),
        (
            b"||",
            "newline ||",
            "a line starting with shell operator `||`",
        ),
        (b";", "newline ;", "a line starting with shell operator `;`"),
        (b"|", "newline |", "a line starting with shell operator `|`"),
    ];
    for (at, _) in stdin.iter().enumerate().filter(|(_, b)| **b == b'\n') {
        let start = at + 1 + blanks_at(stdin, at + 1);
        let rest = stdin.get(start..).unwrap_or_default();
        if let Some((_, label, description)) = LINE_OPERATORS
            .iter()
            .find(|(op, _, _)| rest.starts_with(op))
            && !found.iter().any(|(l, _)| l == label)
        {
            found.push((label, description));
        }
    }
    found
}
