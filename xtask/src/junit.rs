//! A small JUnit XML reader: just enough to learn each test case's name and verdict.
//!
//! Hand-written rather than an XML crate (a boring xtask has few dependencies). It understands
//! what nextest writes and what other JUnit producers commonly write: any attribute order, either
//! quote style, self-closing tags, the XML prolog, comments, CDATA sections and the five
//! predefined entities plus numeric character references.

/// The verdict of one `<testcase>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Passed,
    /// Has a `<failure>` or `<error>` child.
    Failed,
    /// Has a `<skipped>` child (and no failure).
    Skipped,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestCase {
    pub name: String,
    pub classname: Option<String>,
    pub status: Status,
}

/// Totals over a list of cases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Counts {
    pub fn of(cases: &[TestCase]) -> Self {
        let mut c = Self::default();
        for case in cases {
            match case.status {
                Status::Passed => c.passed += 1,
                Status::Failed => c.failed += 1,
                Status::Skipped => c.skipped += 1,
            }
        }
        c
    }

    pub fn total(&self) -> usize {
        self.passed + self.failed + self.skipped
    }

    pub fn add(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }
}

/// Every `<testcase>` in the document, in document order.
pub fn parse(xml: &str) -> Result<Vec<TestCase>, String> {
    let mut cases = Vec::new();
    // Index into `cases` of the test case whose children we are reading.
    let mut open: Option<usize> = None;
    for tag in Tags::new(xml) {
        match tag? {
            Tag::Start {
                name,
                attrs,
                self_closing,
            } => {
                if name == "testcase" {
                    if open.is_some() {
                        return Err("nested <testcase> elements".into());
                    }
                    let name = attr(&attrs, "name")
                        .ok_or("a <testcase> without a name attribute")?
                        .to_owned();
                    cases.push(TestCase {
                        name,
                        classname: attr(&attrs, "classname").map(str::to_owned),
                        status: Status::Passed,
                    });
                    if !self_closing {
                        open = Some(cases.len() - 1);
                    }
                } else if let Some(i) = open {
                    let case = &mut cases[i];
                    match name.as_str() {
                        "failure" | "error" => case.status = Status::Failed,
                        "skipped" if case.status == Status::Passed => {
                            case.status = Status::Skipped;
                        }
                        _ => {}
                    }
                }
            }
            Tag::End { name } => {
                if name == "testcase" {
                    if open.is_none() {
                        return Err("</testcase> without a matching <testcase>".into());
                    }
                    open = None;
                }
            }
        }
    }
    if open.is_some() {
        return Err("unterminated <testcase> element".into());
    }
    Ok(cases)
}

fn attr<'a>(attrs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[derive(Debug)]
enum Tag {
    Start {
        name: String,
        attrs: Vec<(String, String)>,
        self_closing: bool,
    },
    End {
        name: String,
    },
}

/// Iterates over element tags, skipping text, the prolog, comments, CDATA and DOCTYPE.
struct Tags<'a> {
    rest: &'a str,
}

impl<'a> Tags<'a> {
    fn new(xml: &'a str) -> Self {
        Self { rest: xml }
    }

    /// Skips past `end`, or fails with `what` when the document ends first.
    fn skip_past(&mut self, end: &str, what: &str) -> Result<(), String> {
        match self.rest.find(end) {
            Some(i) => {
                self.rest = &self.rest[i + end.len()..];
                Ok(())
            }
            None => {
                self.rest = "";
                Err(format!("unterminated {what}"))
            }
        }
    }
}

impl Iterator for Tags<'_> {
    type Item = Result<Tag, String>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let lt = self.rest.find('<')?;
            self.rest = &self.rest[lt..];
            let skipped = if self.rest.starts_with("<?") {
                Some(self.skip_past("?>", "processing instruction"))
            } else if self.rest.starts_with("<!--") {
                Some(self.skip_past("-->", "comment"))
            } else if self.rest.starts_with("<![CDATA[") {
                Some(self.skip_past("]]>", "CDATA section"))
            } else if self.rest.starts_with("<!") {
                Some(self.skip_past(">", "declaration"))
            } else {
                None
            };
            match skipped {
                Some(Ok(())) => continue,
                Some(Err(e)) => return Some(Err(e)),
                None => return Some(self.element_tag()),
            }
        }
    }
}

impl Tags<'_> {
    /// Parses the element tag at the start of `rest` (which starts with `<`).
    fn element_tag(&mut self) -> Result<Tag, String> {
        let mut chars = self.rest.char_indices().skip(1).peekable();
        let is_end = matches!(chars.peek(), Some((_, '/')));
        if is_end {
            chars.next();
        }
        let name_start = chars.peek().map_or(self.rest.len(), |&(i, _)| i);
        let mut name_end = self.rest.len();
        while let Some(&(i, c)) = chars.peek() {
            if c.is_whitespace() || c == '/' || c == '>' {
                name_end = i;
                break;
            }
            chars.next();
        }
        let name = self.rest[name_start..name_end].to_owned();
        if name.is_empty() {
            self.rest = "";
            return Err("a tag without a name".into());
        }

        let mut attrs = Vec::new();
        let mut self_closing = false;
        loop {
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
            let Some((i, c)) = chars.next() else {
                self.rest = "";
                return Err(format!("unterminated <{name}> tag"));
            };
            match c {
                '>' => {
                    self.rest = &self.rest[i + 1..];
                    break;
                }
                '/' => self_closing = true,
                _ => {
                    // An attribute: key = "value" (or 'value').
                    let key_start = i;
                    let mut key_end = self.rest.len();
                    while let Some(&(j, c)) = chars.peek() {
                        if c == '=' || c.is_whitespace() || c == '>' || c == '/' {
                            key_end = j;
                            break;
                        }
                        chars.next();
                    }
                    let key = self.rest[key_start..key_end].to_owned();
                    while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
                    if chars.next_if(|&(_, c)| c == '=').is_none() {
                        // A bare attribute is not XML; tolerate it as an empty value.
                        attrs.push((key, String::new()));
                        continue;
                    }
                    while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
                    let Some((q, quote)) = chars.next().filter(|(_, c)| *c == '"' || *c == '\'')
                    else {
                        self.rest = "";
                        return Err(format!("attribute {key} of <{name}> is not quoted"));
                    };
                    let value_start = q + 1;
                    let Some((value_end, _)) = chars.find(|&(_, c)| c == quote) else {
                        self.rest = "";
                        return Err(format!("unterminated value of attribute {key}"));
                    };
                    attrs.push((key, unescape(&self.rest[value_start..value_end])));
                }
            }
        }
        Ok(if is_end {
            Tag::End { name }
        } else {
            Tag::Start {
                name,
                attrs,
                self_closing,
            }
        })
    }
}

/// Replaces the predefined entities and numeric character references; unknown ones stay as is.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest.find(';') else { break };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .or_else(|| entity.strip_prefix("#X"))
                .map(|hex| u32::from_str_radix(hex, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(xml: &str, expected: &[(&str, Status)]) {
        let cases = parse(xml).unwrap();
        let got: Vec<(&str, Status)> = cases.iter().map(|c| (c.name.as_str(), c.status)).collect();
        assert_eq!(got, expected, "for document:\n{xml}");
    }

    #[test]
    fn nextest_style_document() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="4" failures="1" errors="0" uuid="x" timestamp="2026-01-01T00:00:00Z" time="1.5">
    <testsuite name="sandbox-testkit::conformance" tests="4" disabled="0" errors="0" failures="1">
        <testcase name="conformance::exec_argv_roundtrip" classname="sandbox-testkit::conformance" timestamp="t" time="0.01">
        </testcase>
        <testcase name="conformance::files_roundtrip" classname="sandbox-testkit::conformance" timestamp="t" time="0.02"/>
        <testcase name="conformance::delete_absent" classname="sandbox-testkit::conformance" timestamp="t" time="0.03">
            <failure type="test failure">thread &apos;main&apos; panicked at x &lt;y&gt;</failure>
            <system-out>some &lt;testcase name="fake"&gt; text</system-out>
            <system-err><![CDATA[raw <skipped/> <testcase name="no">]]></system-err>
        </testcase>
        <testcase classname="c" name="conformance::slow" time="60"><skipped message="ignored"/></testcase>
    </testsuite>
</testsuites>
"#;
        check(
            xml,
            &[
                ("conformance::exec_argv_roundtrip", Status::Passed),
                ("conformance::files_roundtrip", Status::Passed),
                ("conformance::delete_absent", Status::Failed),
                ("conformance::slow", Status::Skipped),
            ],
        );
        let cases = parse(xml).unwrap();
        assert_eq!(
            cases[0].classname.as_deref(),
            Some("sandbox-testkit::conformance")
        );
        assert_eq!(
            Counts::of(&cases),
            Counts {
                passed: 2,
                failed: 1,
                skipped: 1
            }
        );
    }

    #[test]
    fn error_child_and_odd_formatting() {
        check(
            "<testsuite><!-- <testcase name='commented'/> -->\
             <testcase\n  time = '1'\n  name = 'a&amp;b' ><error message='boom'/></testcase>\
             <testcase name=\"x&#62;y&#x3C;\"   /></testsuite>",
            &[("a&b", Status::Failed), ("x>y<", Status::Passed)],
        );
    }

    #[test]
    fn failure_wins_over_skipped() {
        check(
            "<testcase name='t'><skipped/><failure/></testcase>",
            &[("t", Status::Failed)],
        );
        check(
            "<testcase name='t'><failure/><skipped/></testcase>",
            &[("t", Status::Failed)],
        );
    }

    #[test]
    fn retry_elements_do_not_count_as_failure() {
        // nextest records earlier attempts of a flaky test as <flakyFailure>/<rerunFailure>.
        check(
            "<testcase name='t'><flakyFailure message='1st'/></testcase>",
            &[("t", Status::Passed)],
        );
    }

    #[test]
    fn empty_and_caseless_documents() {
        check("", &[]);
        check("<?xml version='1.0'?><testsuites/>", &[]);
    }

    #[test]
    fn malformed_documents_are_errors() {
        for bad in [
            "<testcase name='a'>",
            "<testcase name='a'><testcase name='b'/></testcase>",
            "</testcase>",
            "<testcase time='1'/>",
            "<testcase name='a",
            "<testcase name=a/>",
            "<!-- never closed",
            "<>",
        ] {
            assert!(parse(bad).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn unescape_leaves_unknown_entities() {
        assert_eq!(unescape("a &nbsp; &amp; b & c"), "a &nbsp; & b & c");
    }
}
