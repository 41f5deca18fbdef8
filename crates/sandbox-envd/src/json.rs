//! The proto3-JSON mapping, one scalar kind at a time.
//!
//! envd's messages are protobuf, but every client of it we need to satisfy (the official SDK,
//! our adapters, our fake) speaks the canonical JSON mapping. We write that mapping by hand with
//! serde instead of pulling in a protobuf runtime and a code generator (a build step and a large
//! dependency for about forty messages): the
//! messages are few, and the rules are few too. This module holds the rules; `process.rs` and
//! `filesystem.rs` apply them field by field.
//!
//! The rules (the proto3 JSON specification, as envd uses it: `docs/envd.md`, "The Connect codec"):
//!
//! - Output is canonical: default values are omitted, `uint32`/`sint32` are numbers, `int64` is
//!   a decimal string, `bytes` is standard base64 with padding, enums are their value names.
//! - Input is lenient in the ways the specification demands of parsers: integers as numbers or
//!   strings (also in exponent form when the value is integral), `bytes` in the standard or
//!   URL-safe alphabet with or without padding, enums by name or number, `null` as the default
//!   value of any field, the original snake_case field name as well as the lowerCamelCase one,
//!   and unknown fields ignored (connect-go, and so envd, decodes with `DiscardUnknown`).
//! - A oneof is one of several optional keys. Two members set at once is an error; a member
//!   whose value is `null` counts as absent, as in Go's protojson.
//! - A message is a JSON object and nothing else (serde's derive would also take an array), and
//!   a key given twice is an error.

use std::fmt;
use std::marker::PhantomData;

use base64::Engine as _;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::{DecodePaddingMode, general_purpose};
use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};
use serde::ser::{Serialize, Serializer};

/// Whether a value equals its type's default, for `skip_serializing_if` (proto3 omits defaults).
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Reads a field whose JSON `null` means "the default value" (strings, bools, repeated fields,
/// maps, enums). Plain serde refuses `null` for these.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

// ------------------------------------------------------------------------------------------------
// Messages
// ------------------------------------------------------------------------------------------------

/// Declares a message struct: `Serialize` derived as usual, `Deserialize` implemented so that
/// only a JSON object is accepted.
///
/// serde's derived struct impls also accept a JSON array of the field values in order, which
/// no proto3 JSON parser does (`[]` is not an end-of-stream message, `["ls"]` not a process
/// config). So the macro derives `Deserialize` on a private twin with the same fields and
/// attributes (named like the message, so errors name it), reads the twin through
/// [`ObjectOnly`], and moves its fields over. The public type keeps a plain API.
macro_rules! message {
    (
        $(#[doc = $doc:literal])*
        #[derive($($derive:path),* $(,)?)]
        $(#[serde($($container:tt)*)])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive($($derive),*)]
        $(#[serde($($container)*)])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                pub $field: $ty,
            )*
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                #[derive(::serde::Deserialize)]
                $(#[serde($($container)*)])*
                struct $name {
                    $(
                        $(#[$field_meta])*
                        $field: $ty,
                    )*
                }
                #[allow(unused_variables, reason = "empty messages have no fields to move")]
                let twin = <$name as ::serde::Deserialize<'de>>::deserialize(
                    $crate::json::ObjectOnly(deserializer),
                )?;
                Ok(Self { $($field: twin.$field,)* })
            }
        }
    };
}
pub(crate) use message;

/// A deserializer that reads a struct only from a map (a JSON object), never from a sequence.
#[derive(Debug)]
pub(crate) struct ObjectOnly<D>(pub(crate) D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

// ------------------------------------------------------------------------------------------------
// Integers
// ------------------------------------------------------------------------------------------------

/// A proto integer as read from JSON: a number, a string holding a number, or `null` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Int<T>(pub(crate) Option<T>);

impl<'de, T> Deserialize<'de> for Int<T>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(IntVisitor(PhantomData))
            .map(Int)
    }
}

struct IntVisitor<T>(PhantomData<T>);

fn int_from_u64<T: TryFrom<u64>>(v: u64) -> Option<T> {
    T::try_from(v).ok()
}

fn int_from_i64<T: TryFrom<i64>>(v: i64) -> Option<T> {
    T::try_from(v).ok()
}

/// Exponent and fraction forms are accepted when the value is integral (`1e3`, `5.0`).
fn int_from_f64<T: TryFrom<i64> + TryFrom<u64>>(v: f64) -> Option<T> {
    if !v.is_finite() || v.fract() != 0.0 {
        return None;
    }
    // -2^63 and 2^64 are exactly representable, so these bounds are exact and the casts below
    // cannot saturate.
    if v < 0.0 {
        (v >= -9_223_372_036_854_775_808.0).then(|| int_from_i64(v as i64))?
    } else {
        (v < 18_446_744_073_709_551_616.0).then(|| int_from_u64(v as u64))?
    }
}

impl<'de, T> Visitor<'de> for IntVisitor<T>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an integer within the range of {} as a JSON number or string",
            std::any::type_name::<T>()
        )
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        int_from_u64(v)
            .map(Some)
            .ok_or_else(|| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        int_from_i64(v)
            .map(Some)
            .ok_or_else(|| E::invalid_value(Unexpected::Signed(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        int_from_f64(v)
            .map(Some)
            .ok_or_else(|| E::invalid_value(Unexpected::Float(v), &self))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        let value = match parse_number_string(s) {
            Some(NumberString::Integer(n)) => u64::try_from(n)
                .ok()
                .and_then(int_from_u64)
                .or_else(|| i64::try_from(n).ok().and_then(int_from_i64)),
            Some(NumberString::Float(v)) => int_from_f64(v),
            None => None,
        };
        value
            .map(Some)
            .ok_or_else(|| E::invalid_value(Unexpected::Str(s), &self))
    }
}

/// A number written inside a JSON string.
enum NumberString {
    Integer(i128),
    Float(f64),
}

/// Parses `s` if it is a JSON number literal (no sign other than a leading `-`, no whitespace,
/// no leading zeros): the proto3 JSON parsers we interoperate with accept exactly that.
fn parse_number_string(s: &str) -> Option<NumberString> {
    let bytes = s.as_bytes();
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let int_len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if int_len == 0 || (int_len > 1 && digits.first() == Some(&b'0')) {
        return None;
    }
    let rest = &digits[int_len..];
    if rest.is_empty() {
        // Out of i128 range is out of every proto integer's range too.
        return s.parse::<i128>().ok().map(NumberString::Integer);
    }
    let mut rest = rest;
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    if let Some(exp) = rest.strip_prefix(b"e").or_else(|| rest.strip_prefix(b"E")) {
        let exp = exp
            .strip_prefix(b"+")
            .or_else(|| exp.strip_prefix(b"-"))
            .unwrap_or(exp);
        let n = exp.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &exp[n..];
    }
    if !rest.is_empty() {
        return None;
    }
    s.parse::<f64>().ok().map(NumberString::Float)
}

/// Generates a `with = "json::<kind>"` module for a proto integer type: numbers out (or strings,
/// for the 64-bit kinds), numbers or strings in, `null` as zero.
macro_rules! int_module {
    ($(#[$doc:meta])* $name:ident, $ty:ty, number) => {
        $(#[$doc])*
        pub(crate) mod $name {
            use serde::{Deserialize, Deserializer, Serializer};

            pub(crate) fn serialize<S: Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                serde::Serialize::serialize(v, s)
            }

            pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                Ok(super::Int::<$ty>::deserialize(d)?.0.unwrap_or_default())
            }
        }
    };
    ($(#[$doc:meta])* $name:ident, $ty:ty, string) => {
        $(#[$doc])*
        pub(crate) mod $name {
            use serde::{Deserialize, Deserializer, Serializer};

            pub(crate) fn serialize<S: Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(v)
            }

            pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                Ok(super::Int::<$ty>::deserialize(d)?.0.unwrap_or_default())
            }
        }
    };
}

int_module!(
    /// `uint32`: a JSON number.
    uint32, u32, number
);
int_module!(
    /// `sint32` (and `int32`): a JSON number.
    sint32, i32, number
);
int_module!(
    /// `int64`: a decimal string, because JSON numbers lose precision past 2^53.
    int64, i64, string
);

// ------------------------------------------------------------------------------------------------
// Bytes
// ------------------------------------------------------------------------------------------------

/// Decoding engines: proto3 JSON parsers must accept either alphabet, padded or not. Trailing
/// bits are tolerated, as Go's and Python's decoders do, since envd and the SDK use those.
const LENIENT: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_decode_padding_mode(DecodePaddingMode::Indifferent)
    .with_decode_allow_trailing_bits(true);
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT);
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT);

/// Encodes `bytes` as proto3 JSON does: standard alphabet, padded.
pub(crate) fn encode_base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Encodes `bytes` as Connect error details do: standard alphabet, unpadded.
pub(crate) fn encode_base64_unpadded(bytes: &[u8]) -> String {
    general_purpose::STANDARD_NO_PAD.encode(bytes)
}

/// Decodes base64 in either alphabet, padded or not. The alphabet is chosen by the characters
/// present (as Go's protojson does), so a string mixing `+` and `_` is refused.
pub(crate) fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    if text.contains(['-', '_']) {
        URL_SAFE_LENIENT.decode(text)
    } else {
        STANDARD_LENIENT.decode(text)
    }
}

/// A `bytes` value as read from JSON: base64 text or `null` (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Base64(pub(crate) Option<Vec<u8>>);

impl<'de> Deserialize<'de> for Base64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Base64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("base64-encoded bytes as a JSON string")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Base64, E> {
                Ok(Base64(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Base64, E> {
                Ok(Base64(None))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Base64, D::Error> {
                d.deserialize_str(self)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Base64, E> {
                decode_base64(s)
                    .map(|b| Base64(Some(b)))
                    .map_err(|e| E::custom(format_args!("invalid base64 in a bytes field: {e}")))
            }
        }
        deserializer.deserialize_option(V)
    }
}

/// A `bytes` value to write: standard base64 with padding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Base64Ref<'a>(pub(crate) &'a [u8]);

impl Serialize for Base64Ref<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&encode_base64(self.0))
    }
}

// ------------------------------------------------------------------------------------------------
// Oneofs
// ------------------------------------------------------------------------------------------------

/// What a oneof member's JSON value reads as: the member, or `None` for `null`.
pub(crate) trait IntoMember {
    type Value;
    fn into_member(self) -> Option<Self::Value>;
}

impl<T> IntoMember for Option<T> {
    type Value = T;
    fn into_member(self) -> Option<T> {
        self
    }
}

impl<T> IntoMember for Int<T> {
    type Value = T;
    fn into_member(self) -> Option<T> {
        self.0
    }
}

impl IntoMember for Base64 {
    type Value = Vec<u8>;
    fn into_member(self) -> Option<Vec<u8>> {
        self.0
    }
}

/// Collects a oneof while its message's keys are read: refuses a key seen twice and a second
/// member set (the specification's "exactly one"), and lets `null` members count as absent.
#[derive(Debug)]
pub(crate) struct OneofSlot<T> {
    message: &'static str,
    oneof: &'static str,
    seen: Vec<&'static str>,
    value: Option<(&'static str, T)>,
}

impl<T> OneofSlot<T> {
    pub(crate) fn new(message: &'static str, oneof: &'static str) -> Self {
        OneofSlot {
            message,
            oneof,
            seen: Vec::new(),
            value: None,
        }
    }

    /// Records the member `key` with its (possibly null) value.
    pub(crate) fn set<E: de::Error>(
        &mut self,
        key: &'static str,
        value: Option<T>,
    ) -> Result<(), E> {
        if self.seen.contains(&key) {
            return Err(E::custom(format_args!(
                "duplicate field `{key}` in {}",
                self.message
            )));
        }
        self.seen.push(key);
        let Some(value) = value else {
            return Ok(());
        };
        if let Some((first, _)) = &self.value {
            return Err(E::custom(format_args!(
                "oneof `{}` of {} has more than one member set: `{first}` and `{key}`",
                self.oneof, self.message
            )));
        }
        self.value = Some((key, value));
        Ok(())
    }

    pub(crate) fn into_value(self) -> Option<T> {
        self.value.map(|(_, v)| v)
    }
}

/// Implements proto3-JSON `Serialize`/`Deserialize` for a message whose only content is one
/// oneof (all six of envd's oneofs are shaped so): the object has at most one key, the set
/// member's. `kind` says how the member's value is written: `message`, `bytes`, `uint32` or
/// `string`.
macro_rules! oneof_message {
    (
        $msg:ident { $field:ident: $oneof:path } as $proto:literal, oneof $oneof_name:literal {
            $($variant:ident => $json:literal: $kind:ident),+ $(,)?
        }
    ) => {
        impl ::serde::Serialize for $msg {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use ::serde::ser::SerializeMap as _;
                type Oneof = $oneof;
                let len = usize::from(self.$field.is_some());
                let mut map = serializer.serialize_map(Some(len))?;
                match &self.$field {
                    None => {}
                    $(Some(Oneof::$variant(value)) => {
                        map.serialize_entry($json, $crate::json::oneof_message!(@ser $kind, value))?;
                    })+
                }
                map.end()
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $msg {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct MessageVisitor;
                impl<'de> ::serde::de::Visitor<'de> for MessageVisitor {
                    type Value = $msg;

                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        f.write_str(concat!("a JSON object for ", $proto))
                    }

                    fn visit_map<A: ::serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<$msg, A::Error> {
                        use $crate::json::IntoMember as _;
                        type Oneof = $oneof;
                        let mut slot = $crate::json::OneofSlot::new($proto, $oneof_name);
                        while let Some(key) = map.next_key::<::std::borrow::Cow<'de, str>>()? {
                            match &*key {
                                $($json => {
                                    let value = map
                                        .next_value::<$crate::json::oneof_message!(@de $kind)>()?
                                        .into_member()
                                        .map(Oneof::$variant);
                                    slot.set($json, value)?;
                                })+
                                _ => {
                                    map.next_value::<::serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok($msg { $field: slot.into_value() })
                    }
                }
                deserializer.deserialize_map(MessageVisitor)
            }
        }
    };
    (@ser bytes, $value:expr) => { &$crate::json::Base64Ref($value) };
    (@ser uint32, $value:expr) => { $value };
    (@ser string, $value:expr) => { $value };
    (@ser message, $value:expr) => { $value };
    (@de bytes) => { $crate::json::Base64 };
    (@de uint32) => { $crate::json::Int<u32> };
    (@de string) => { Option<String> };
    (@de message) => { Option<_> };
}
pub(crate) use oneof_message;

// ------------------------------------------------------------------------------------------------
// Enums
// ------------------------------------------------------------------------------------------------

/// Declares a proto3 enum: known values as variants plus `Unrecognized(i32)`, because proto3
/// enums are open (a newer envd may send a value this crate does not know, and re-encoding must
/// not lose it). Written as the value's name, read from a name or a number.
macro_rules! proto_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident as $proto:literal {
            $($(#[$vmeta:meta])* $variant:ident = $number:literal => $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this crate does not know (proto3 enums are open). Produced only for
            /// numbers that match no known variant; written back as that number.
            Unrecognized(i32),
        }

        impl $name {
            /// Every known value, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant,)+];

            /// The proto enum's fully qualified name.
            pub const PROTO_NAME: &'static str = $proto;

            /// The value's number.
            pub const fn as_i32(self) -> i32 {
                match self {
                    $($name::$variant => $number,)+
                    $name::Unrecognized(n) => n,
                }
            }

            /// The value with this number; unknown numbers are kept as `Unrecognized`.
            pub const fn from_i32(n: i32) -> Self {
                match n {
                    $($number => $name::$variant,)+
                    n => $name::Unrecognized(n),
                }
            }

            /// The value's proto name (`None` for an unrecognized number).
            pub const fn as_str_name(self) -> Option<&'static str> {
                match self {
                    $($name::$variant => Some($text),)+
                    $name::Unrecognized(_) => None,
                }
            }

            /// The value with this proto name.
            pub fn from_str_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// Whether this is the zero value, which proto3 omits on the wire.
            pub const fn is_default(&self) -> bool {
                self.as_i32() == 0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::from_i32(0)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self.as_str_name() {
                    Some(text) => serializer.serialize_str(text),
                    None => serializer.serialize_i32(self.as_i32()),
                }
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::json::deserialize_enum(deserializer, $name::from_str_name, $name::from_i32)
            }
        }
    };
}
pub(crate) use proto_enum;

/// Reads a proto3 enum: a name, a number, a number in a string (Python's protobuf accepts it),
/// or `null` (the zero value). An unknown *name* reads as the zero value, as connect-go's
/// `DiscardUnknown` does: a newer envd must not make a whole response undecodable.
pub(crate) fn deserialize_enum<'de, D, T>(
    deserializer: D,
    from_name: fn(&str) -> Option<T>,
    from_number: fn(i32) -> T,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default,
{
    struct V<T> {
        from_name: fn(&str) -> Option<T>,
        from_number: fn(i32) -> T,
    }
    impl<'de, T: Default> Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an enum value name or number")
        }
        fn visit_unit<E: de::Error>(self) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
            if let Some(v) = (self.from_name)(s) {
                return Ok(v);
            }
            if s.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
                let n = IntVisitor::<i32>(PhantomData).visit_str::<E>(s)?;
                return Ok(n.map_or_else(T::default, self.from_number));
            }
            Ok(T::default())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            let n = IntVisitor::<i32>(PhantomData).visit_u64::<E>(v)?;
            Ok(n.map_or_else(T::default, self.from_number))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            let n = IntVisitor::<i32>(PhantomData).visit_i64::<E>(v)?;
            Ok(n.map_or_else(T::default, self.from_number))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
            let n = IntVisitor::<i32>(PhantomData).visit_f64::<E>(v)?;
            Ok(n.map_or_else(T::default, self.from_number))
        }
    }
    deserializer.deserialize_any(V {
        from_name,
        from_number,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn number_strings() {
        let check = |s: &str, want: Option<i128>| {
            let got = match parse_number_string(s) {
                Some(NumberString::Integer(n)) => Some(n),
                Some(NumberString::Float(f)) if f.fract() == 0.0 => Some(f as i128),
                _ => None,
            };
            assert_eq!(got, want, "{s:?}");
        };
        check("0", Some(0));
        check("-12", Some(-12));
        check("1e3", Some(1000));
        check("1.0", Some(1));
        check("1E+2", Some(100));
        check("", None);
        check("-", None);
        check("+1", None);
        check(" 1", None);
        check("1 ", None);
        check("01", None);
        check("1.", None);
        check(".5", None);
        check("1e", None);
        check("0x10", None);
    }

    #[test]
    fn base64_alphabets() {
        assert_eq!(decode_base64("+/8=").unwrap(), vec![0xfb, 0xff]);
        assert_eq!(decode_base64("+/8").unwrap(), vec![0xfb, 0xff]);
        assert_eq!(decode_base64("-_8=").unwrap(), vec![0xfb, 0xff]);
        assert_eq!(decode_base64("-_8").unwrap(), vec![0xfb, 0xff]);
        assert!(decode_base64("+_8=").is_err());
        assert!(decode_base64("a").is_err());
        assert_eq!(encode_base64(&[0xfb, 0xff]), "+/8=");
        assert_eq!(encode_base64_unpadded(&[0xfb, 0xff]), "+/8");
    }
}
