//! The proto3-JSON rules one at a time: what is accepted, what it reads as, what is refused
//! and with which message. Every case goes through [`check`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;

use sandbox_envd::{EndStreamMessage, filesystem as fs, process as ps};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Decodes `input` as `T`. `Ok(out)`: it must decode and encode to `out`. `Err(needle)`: it
/// must be refused with an error message containing `needle`.
#[track_caller]
fn check<T: Serialize + DeserializeOwned + Debug>(input: &str, expected: Result<&str, &str>) {
    let decoded = serde_json::from_str::<T>(input);
    match (decoded, expected) {
        (Ok(value), Ok(out)) => {
            assert_eq!(serde_json::to_string(&value).unwrap(), out, "input {input}");
        }
        (Err(e), Err(needle)) => {
            let message = e.to_string();
            assert!(
                message.contains(needle),
                "input {input}: error {message:?} lacks {needle:?}"
            );
        }
        (Ok(value), Err(needle)) => {
            panic!("input {input}: accepted as {value:?}, expected an error with {needle:?}")
        }
        (Err(e), Ok(out)) => panic!("input {input}: refused ({e}), expected {out}"),
    }
}

#[test]
fn oneofs_take_at_most_one_member() {
    check::<ps::ProcessEvent>(
        r#"{"data":{"stdout":"YQ==","stderr":"Yg=="}}"#,
        Err(
            "oneof `output` of process.ProcessEvent.DataEvent has more than one member set: `stdout` and `stderr`",
        ),
    );
    check::<ps::ProcessEvent>(
        r#"{"start":{"pid":1},"end":{}}"#,
        Err(
            "oneof `event` of process.ProcessEvent has more than one member set: `start` and `end`",
        ),
    );
    check::<ps::ProcessSelector>(
        r#"{"pid":1,"tag":"x"}"#,
        Err("oneof `selector` of process.ProcessSelector has more than one member set"),
    );
    check::<ps::ProcessInput>(r#"{"stdin":"","pty":""}"#, Err("more than one member set"));
    check::<ps::StreamInputRequest>(r#"{"keepalive":{},"start":{}}"#, Err("more than one"));
    check::<fs::WatchDirResponse>(r#"{"start":{},"keepalive":{}}"#, Err("more than one"));
    // A member set to its default value is still set, and written back.
    check::<ps::ProcessSelector>(r#"{"pid":0}"#, Ok(r#"{"pid":0}"#));
    check::<ps::ProcessInput>(r#"{"stdin":""}"#, Ok(r#"{"stdin":""}"#));
    // `null` members count as absent, so a null beside a set member is fine.
    check::<ps::ProcessSelector>(r#"{"pid":null,"tag":"x"}"#, Ok(r#"{"tag":"x"}"#));
    check::<ps::ProcessSelector>(r#"{"pid":null}"#, Ok("{}"));
    // Unknown keys beside a oneof are ignored.
    check::<ps::ProcessSelector>(r#"{"pgid":5,"tag":"x"}"#, Ok(r#"{"tag":"x"}"#));
}

#[test]
fn duplicate_keys_are_refused() {
    check::<ps::ProcessSelector>(r#"{"pid":1,"pid":2}"#, Err("duplicate field `pid`"));
    check::<ps::ProcessSelector>(r#"{"pid":null,"pid":2}"#, Err("duplicate field `pid`"));
    check::<ps::pty::Size>(r#"{"cols":1,"cols":2}"#, Err("duplicate field `cols`"));
    // The JSON name and the proto name are the same field.
    check::<ps::process_event::EndEvent>(
        r#"{"exitCode":1,"exit_code":2}"#,
        Err("duplicate field `exitCode`"),
    );
}

#[test]
fn messages_are_objects_only() {
    check::<EndStreamMessage>(
        "[]",
        Err("invalid type: sequence, expected struct EndStreamMessage"),
    );
    check::<ps::ProcessConfig>(r#"["ls"]"#, Err("invalid type: sequence"));
    check::<ps::StartRequest>(r#"{"process":["ls"]}"#, Err("invalid type: sequence"));
    check::<ps::ListRequest>("[]", Err("invalid type: sequence"));
    check::<ps::ProcessEvent>("[]", Err("invalid type: sequence"));
    check::<ps::ListRequest>("null", Err("invalid type: null"));
    check::<ps::ListRequest>(r#""""#, Err("invalid type: string"));
    check::<ps::ListRequest>(r#"{"anything":[1,{"x":null}]}"#, Ok("{}"));
}

#[test]
fn integers() {
    use ps::pty::Size;
    check::<Size>(r#"{"cols":4294967295}"#, Ok(r#"{"cols":4294967295}"#));
    check::<Size>(
        r#"{"cols":4294967296}"#,
        Err("invalid value: integer `4294967296`"),
    );
    check::<Size>(r#"{"cols":-1}"#, Err("invalid value: integer `-1`"));
    check::<Size>(
        r#"{"cols":1.5}"#,
        Err("invalid value: floating point `1.5`"),
    );
    check::<Size>(r#"{"cols":"1.5"}"#, Err("invalid value: string \"1.5\""));
    check::<Size>(r#"{"cols":"0x10"}"#, Err("invalid value: string \"0x10\""));
    check::<Size>(r#"{"cols":" 1"}"#, Err("invalid value"));
    check::<Size>(r#"{"cols":"+1"}"#, Err("invalid value"));
    check::<Size>(r#"{"cols":""}"#, Err("invalid value"));
    check::<Size>(r#"{"cols":true}"#, Err("invalid type: boolean"));
    check::<Size>(
        r#"{"cols":"80","rows":2.4e1}"#,
        Ok(r#"{"cols":80,"rows":24}"#),
    );
    check::<Size>(r#"{"cols":0,"rows":null}"#, Ok("{}"));

    use ps::process_event::EndEvent;
    check::<EndEvent>(
        r#"{"exitCode":-2147483648}"#,
        Ok(r#"{"exitCode":-2147483648}"#),
    );
    check::<EndEvent>(r#"{"exitCode":2147483648}"#, Err("invalid value"));
    check::<EndEvent>(r#"{"exitCode":"-1"}"#, Ok(r#"{"exitCode":-1}"#));

    use fs::EntryInfo;
    check::<EntryInfo>(
        r#"{"size":"-9223372036854775808"}"#,
        Ok(r#"{"size":"-9223372036854775808"}"#),
    );
    check::<EntryInfo>(
        r#"{"size":9223372036854775807}"#,
        Ok(r#"{"size":"9223372036854775807"}"#),
    );
    check::<EntryInfo>(r#"{"size":"9223372036854775808"}"#, Err("invalid value"));
    check::<EntryInfo>(r#"{"size":"1e3"}"#, Ok(r#"{"size":"1000"}"#));
    check::<EntryInfo>(r#"{"size":"0"}"#, Ok("{}"));
}

#[test]
fn bytes() {
    use ps::ProcessInput;
    check::<ProcessInput>(r#"{"stdin":"+/8="}"#, Ok(r#"{"stdin":"+/8="}"#));
    check::<ProcessInput>(r#"{"stdin":"-_8"}"#, Ok(r#"{"stdin":"+/8="}"#));
    check::<ProcessInput>(
        r#"{"stdin":"+_8="}"#,
        Err("invalid base64 in a bytes field"),
    );
    check::<ProcessInput>(r#"{"stdin":"***"}"#, Err("invalid base64 in a bytes field"));
    check::<ProcessInput>(r#"{"stdin":"a"}"#, Err("invalid base64"));
    check::<ProcessInput>(r#"{"stdin":5}"#, Err("invalid type: integer `5`"));
}

#[test]
fn enums() {
    use fs::FileType;
    use ps::{SendSignalRequest, Signal};
    check::<SendSignalRequest>(
        r#"{"signal":"SIGNAL_SIGTERM"}"#,
        Ok(r#"{"signal":"SIGNAL_SIGTERM"}"#),
    );
    check::<SendSignalRequest>(r#"{"signal":15}"#, Ok(r#"{"signal":"SIGNAL_SIGTERM"}"#));
    check::<SendSignalRequest>(r#"{"signal":"15"}"#, Ok(r#"{"signal":"SIGNAL_SIGTERM"}"#));
    // The zero value is the default, so it is omitted.
    check::<SendSignalRequest>(r#"{"signal":"SIGNAL_UNSPECIFIED"}"#, Ok("{}"));
    check::<SendSignalRequest>(r#"{"signal":null}"#, Ok("{}"));
    // An unknown name reads as the default (connect-go's DiscardUnknown); an unknown number is
    // kept and written back as a number (proto3 enums are open).
    check::<SendSignalRequest>(r#"{"signal":"SIGNAL_SIGHUP"}"#, Ok("{}"));
    check::<SendSignalRequest>(r#"{"signal":1}"#, Ok(r#"{"signal":1}"#));
    check::<SendSignalRequest>(r#"{"signal":4294967296}"#, Err("invalid value"));
    check::<SendSignalRequest>(r#"{"signal":1.5}"#, Err("invalid value"));
    check::<SendSignalRequest>(r#"{"signal":true}"#, Err("invalid type: boolean"));

    let unknown: SendSignalRequest = serde_json::from_str(r#"{"signal":1}"#).unwrap();
    assert_eq!(unknown.signal, Signal::Unrecognized(1));
    assert_eq!(Signal::from_i32(9), Signal::Sigkill);
    assert_eq!(Signal::Sigkill.as_str_name(), Some("SIGNAL_SIGKILL"));
    assert_eq!(
        Signal::from_str_name("SIGNAL_SIGTERM"),
        Some(Signal::Sigterm)
    );
    assert_eq!(Signal::default(), Signal::Unspecified);
    for ft in FileType::KNOWN {
        assert_eq!(FileType::from_i32(ft.as_i32()), *ft);
        assert_eq!(
            FileType::from_str_name(ft.as_str_name().unwrap()),
            Some(*ft)
        );
    }
    assert_eq!(FileType::PROTO_NAME, "filesystem.FileType");
    check::<fs::FilesystemEvent>(
        r#"{"type":"EVENT_TYPE_CHMOD"}"#,
        Ok(r#"{"type":"EVENT_TYPE_CHMOD"}"#),
    );
}

#[test]
fn scalars_and_presence() {
    use ps::{ProcessConfig, StartRequest};
    // Explicit-presence fields are written when set, even to their default.
    check::<StartRequest>(
        r#"{"stdin":false,"tag":""}"#,
        Ok(r#"{"tag":"","stdin":false}"#),
    );
    check::<StartRequest>(r#"{"stdin":true}"#, Ok(r#"{"stdin":true}"#));
    check::<StartRequest>(r#"{"stdin":"true"}"#, Err("invalid type: string"));
    // A message field set to an empty message is present.
    check::<StartRequest>(r#"{"process":{}}"#, Ok(r#"{"process":{}}"#));
    // Plain scalars: defaults and nulls are omitted.
    check::<ProcessConfig>(r#"{"cmd":"","args":[],"envs":{},"cwd":null}"#, Ok("{}"));
    check::<ProcessConfig>(r#"{"cmd":null,"args":null,"envs":null}"#, Ok("{}"));
    check::<ProcessConfig>(r#"{"args":[null]}"#, Err("invalid type: null"));
    check::<ProcessConfig>(r#"{"envs":{"A":null}}"#, Err("invalid type: null"));
    check::<ProcessConfig>(
        r#"{"envs":{"B":"2","A":"1"}}"#,
        Ok(r#"{"envs":{"A":"1","B":"2"}}"#),
    );
}

#[test]
fn timestamps() {
    use fs::EntryInfo;
    check::<EntryInfo>(
        r#"{"modifiedTime":"2026-01-01T00:00:00.100000Z"}"#,
        Ok(r#"{"modifiedTime":"2026-01-01T00:00:00.100Z"}"#),
    );
    check::<EntryInfo>(
        r#"{"modifiedTime":"2026-01-01T00:00:00-08:00"}"#,
        Ok(r#"{"modifiedTime":"2026-01-01T08:00:00Z"}"#),
    );
    check::<EntryInfo>(
        r#"{"modifiedTime":"1970-01-01T00:00:00Z"}"#,
        Ok(r#"{"modifiedTime":"1970-01-01T00:00:00Z"}"#),
    );
    check::<EntryInfo>(r#"{"modifiedTime":"yesterday"}"#, Err("is not RFC 3339"));
    check::<EntryInfo>(r#"{"modifiedTime":"2026-01-01"}"#, Err("is not RFC 3339"));
    check::<EntryInfo>(
        r#"{"modifiedTime":1767225600}"#,
        Err("invalid type: integer"),
    );
}

#[test]
fn connect_errors() {
    use sandbox_envd::ConnectError;
    check::<ConnectError>(r#"{"code":"not_found"}"#, Ok(r#"{"code":"not_found"}"#));
    check::<ConnectError>(r#"{"message":"x"}"#, Err("missing field `code`"));
    check::<ConnectError>(r#"{"code":null}"#, Err("invalid type: null"));
    check::<ConnectError>(r#"{"code":"teapot"}"#, Ok(r#"{"code":"unknown"}"#));
    check::<ConnectError>(
        r#"{"code":"internal","details":[{"type":"t","value":"!"}]}"#,
        Err("invalid base64 in an error detail"),
    );
    check::<ConnectError>(
        r#"{"code":"internal","details":[{"value":"AA"}]}"#,
        Err("missing field `type`"),
    );
    check::<EndStreamMessage>(r#"{"error":null}"#, Err("invalid type: null"));
    check::<EndStreamMessage>(r#"{"error":{}}"#, Err("missing field `code`"));
    check::<EndStreamMessage>(
        r#"{"metadata":{"k":["a","b"]},"error":{"code":"aborted","message":"m"}}"#,
        Ok(r#"{"error":{"code":"aborted","message":"m"},"metadata":{"k":["a","b"]}}"#),
    );
}
