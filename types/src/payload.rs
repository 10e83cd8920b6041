//! [`Payload`]: bytes plus how to read them.

use alloc::string::String;
use alloc::vec::Vec;

use crate::Format;

/// Bytes plus how to read them: inputs, results, message bodies.
///
/// The default is an empty `json` payload; [`Payload::empty`] is an empty `bytes` one.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Payload {
    /// How to read `data`: `json`, `bytes`, `text`, or a name both sides agree on.
    pub format: Format,
    /// The content.
    pub data: Vec<u8>,
}

impl Payload {
    /// The name of [`Format::Json`], the format of JSON payloads.
    pub const JSON: &str = "json";
    /// The name of [`Format::Bytes`], the format of opaque bytes.
    pub const BYTES: &str = "bytes";
    /// The name of [`Format::Text`], the format of UTF-8 text.
    pub const TEXT: &str = "text";

    /// An empty payload (format `bytes`, no data): the result of commands that return nothing.
    pub fn empty() -> Self {
        Payload { format: Format::Bytes, data: Vec::new() }
    }

    /// Opaque bytes.
    pub fn bytes(data: impl Into<Vec<u8>>) -> Self {
        Payload { format: Format::Bytes, data: data.into() }
    }

    /// UTF-8 text.
    pub fn text(text: impl Into<String>) -> Self {
        Payload { format: Format::Text, data: text.into().into_bytes() }
    }

    /// A little-endian `u64` as 8 opaque bytes: the cheapest way to pass a number
    /// between native processes, and how a `spawn` completes with the child's pid.
    pub fn u64(value: u64) -> Self {
        Payload::bytes(value.to_le_bytes())
    }

    /// Reads back a [`Payload::u64`]: the data as a little-endian `u64`, if it is 8 bytes
    /// long, whatever the declared format.
    pub fn to_u64(&self) -> Option<u64> {
        Some(u64::from_le_bytes(self.data.as_slice().try_into().ok()?))
    }

    /// The data as text, if it is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        core::str::from_utf8(&self.data).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_set_their_format() {
        assert_eq!(Payload::u64(42).to_u64(), Some(42));
        assert_eq!(Payload::u64(42).format, Format::Bytes);
        assert_eq!(Payload::text("hi").to_u64(), None);
        assert_eq!((Payload::text("hi").format, Payload::text("hi").as_str()), (Format::Text, Some("hi")));
        assert_eq!(Payload::bytes([0xff]).as_str(), None);
        assert_eq!(Payload::empty(), Payload::bytes([]));
    }
}
