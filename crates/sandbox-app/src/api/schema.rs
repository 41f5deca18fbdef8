//! The schemas of the API's constrained strings, built from the validators' own patterns
//! (`sandbox_core::patterns`), so the OpenAPI document states every rule the handlers enforce
//! and a client generated from it sends nothing the service refuses. Fields and parameters
//! name these with `#[schema(schema_with = …)]` / `#[param(schema_with = …)]`.
//!
//! Lengths: `maxLength` counts characters, the validators count bytes of UTF-8. Where text
//! may be non-ASCII the description says "bytes"; a fuzzer that draws a string of few but wide
//! characters past the byte bound is refused with the route's documented 400.

use sandbox_core::patterns;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
use utoipa::openapi::{Object, RefOr, Required, Schema};

/// The longest identifier, in bytes (`sandbox_core::ids::MAX_ID_LEN`).
const MAX_ID: usize = sandbox_core::ids::MAX_ID_LEN;
/// The longest sandbox path, in bytes.
const MAX_PATH: usize = sandbox_core::path::MAX_PATH_LEN;

/// The `{process}` segment: a pid (digits, at most `u32::MAX`; written here as at most nine
/// digits, which JSON Schema can say) or a tag (`ProcessTag`), so a digits-only tag cannot be
/// confused with a pid.
pub const PROCESS_SELECTOR: &str =
    r"^(?:[0-9]{1,9}|[A-Za-z][A-Za-z0-9._-]*|[0-9]+[A-Za-z._-][A-Za-z0-9._-]*)$";

/// A signal name as `Signal::parse` reads it: any case, with or without `SIG`.
pub const SIGNAL: &str = concat!(
    "^(?:[Ss][Ii][Gg])?(?:[Hh][Uu][Pp]|[Ii][Nn][Tt]|[Qq][Uu][Ii][Tt]|[Kk][Ii][Ll][Ll]",
    "|[Uu][Ss][Rr][12]|[Tt][Ee][Rr][Mm])$"
);

/// A path parameter (always required) with `schema`; its description is the schema's.
pub fn path_param(name: &str, schema: Object) -> Parameter {
    param(name, ParameterIn::Path, true, schema)
}

/// A query parameter with `schema`; its description is the schema's.
pub fn query_param(name: &str, required: bool, schema: Object) -> Parameter {
    param(name, ParameterIn::Query, required, schema)
}

fn param(name: &str, location: ParameterIn, required: bool, schema: Object) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(location)
        .required(if required {
            Required::True
        } else {
            Required::False
        })
        .description(schema.description.clone())
        .schema(Some(schema))
        .build()
}

/// A listing's depth: 1 (default) to 16.
pub fn depth() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Integer))
        .minimum(Some(1))
        .maximum(Some(crate::http::files::MAX_LIST_DEPTH as f64))
        .description(Some("1 (default) to 16"))
        .build()
}

/// A watch's `recursive` flag.
pub fn recursive() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Boolean))
        .description(Some("Report changes below the directory's own entries too"))
        .build()
}

fn text(pattern: &str, min: usize, max: usize, description: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .pattern(Some(pattern))
        .min_length(Some(min))
        .max_length(Some(max))
        .description(Some(description))
        .build()
}

fn nullable(object: Object) -> RefOr<Schema> {
    let mut object = object;
    object.schema_type = SchemaType::from_iter([Type::String, Type::Null]);
    RefOr::T(Schema::Object(object))
}

/// A `{session}` segment.
pub fn session() -> Object {
    text(
        patterns::SESSION_ID,
        1,
        MAX_ID,
        "Percent-encoded; tenant-scoped; not blank, no braces or control characters, at most 512 bytes",
    )
}

/// A `{process}` segment.
pub fn process() -> Object {
    text(
        PROCESS_SELECTOR,
        1,
        sandbox_core::ProcessTag::MAX_LEN,
        "The process: its pid (digits) or the tag it was started with",
    )
}

/// A sandbox path.
pub fn path() -> Object {
    text(
        patterns::SANDBOX_PATH,
        1,
        MAX_PATH,
        "Absolute sandbox path without `..` components or control characters, at most 4096 bytes",
    )
}

/// A sandbox path that may be absent (`null`).
pub fn optional_path() -> RefOr<Schema> {
    nullable(path())
}

/// A program or shell expression.
pub fn program() -> Object {
    text(
        patterns::PROGRAM,
        1,
        usize::MAX,
        "The program (argv form) or the whole shell expression (shell form): not blank, no NUL",
    )
}

/// An account name or numeric ID.
pub fn user() -> Object {
    text(
        patterns::USER,
        1,
        64,
        "The OS account: a name or numeric ID of `[A-Za-z0-9_.-]`, not starting with `-`",
    )
}

/// An account name or numeric ID that may be absent.
pub fn optional_user() -> RefOr<Schema> {
    nullable(user())
}

/// Arguments: any text without NUL.
pub fn args() -> ArrayBuilder {
    ArrayBuilder::new().items(
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .pattern(Some(patterns::NO_NUL)),
    )
}

/// Arguments, as a schema.
pub fn args_schema() -> RefOr<Schema> {
    RefOr::T(Schema::Array(args().build()))
}

/// An environment: names `[A-Za-z_][A-Za-z0-9_]*` (at most 256), values without NUL.
pub fn env() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .pattern(Some(patterns::ENV_NAME))
                .max_length(Some(256)),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .pattern(Some(patterns::NO_NUL)),
        ))
        .build()
}

/// A process tag that may be absent.
pub fn optional_tag() -> RefOr<Schema> {
    nullable(text(
        patterns::PROCESS_TAG,
        1,
        sandbox_core::ProcessTag::MAX_LEN,
        "The caller's name for it, unique among running processes: 1 to 64 of `[A-Za-z0-9._-]`, starting with a letter or digit",
    ))
}

/// A snapshot ID.
pub fn snapshot_id() -> Object {
    text(
        patterns::TEXT_ID,
        1,
        MAX_ID,
        "Not blank, no control characters, at most 512 bytes",
    )
}

/// A snapshot name that may be absent.
pub fn optional_snapshot_name() -> RefOr<Schema> {
    nullable(text(
        patterns::TEXT_ID,
        1,
        MAX_ID,
        "Not blank, no control characters, at most 512 bytes",
    ))
}

/// A script's file name.
pub fn script_file_name() -> Object {
    text(
        patterns::SCRIPT_FILE_NAME,
        1,
        MAX_PATH,
        "One path segment, not starting with `.`; its extension (.sh, .bash, .py, .js, .mjs, .cjs, .ts, .rb, .pl, any case) picks the interpreter",
    )
}

/// A signal name.
pub fn signal() -> Object {
    text(
        SIGNAL,
        1,
        7,
        "`HUP`, `INT`, `QUIT`, `KILL`, `USR1`, `USR2` or `TERM` (any case, `SIG` prefix allowed); a backend may send only `TERM` and `KILL` (then 501 `unsupported` for the others)",
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use regex::Regex;

    use super::*;

    #[test]
    fn the_selector_pattern_names_what_the_selector_reads() {
        let re = Regex::new(PROCESS_SELECTOR).unwrap();
        for raw in [
            "0",
            "1",
            "123456789",
            "4294967295",
            "4294967296",
            "99999999999",
            "a",
            "a1",
            "1a",
            "web-1",
            "-a",
            ".a",
            "_a",
            "a b",
            "",
            "é",
            &"a".repeat(64),
            &"a".repeat(65),
        ] {
            let accepted = crate::http::processes::selector(raw).is_ok();
            // The pattern may leave out pids of ten digits (it cannot bound a number), never
            // let through what the selector refuses.
            if re.is_match(raw) && raw.len() <= sandbox_core::ProcessTag::MAX_LEN {
                assert!(accepted, "{raw:?} matches but is refused");
            } else if accepted {
                assert!(
                    raw.len() == 10 && raw.bytes().all(|b| b.is_ascii_digit()),
                    "{raw:?} is accepted but does not match"
                );
            }
        }
    }

    #[test]
    fn the_signal_pattern_names_what_signals_parse() {
        let re = Regex::new(SIGNAL).unwrap();
        for raw in [
            "TERM", "term", "SIGterm", "sigKILL", "HUP", "INT", "QUIT", "USR1", "usr2", "USR3", "",
            "SIG", "STOP", " TERM", "TERMX",
        ] {
            assert_eq!(
                re.is_match(raw),
                sandbox_core::Signal::parse(raw).is_ok(),
                "{raw:?}"
            );
        }
    }
}
