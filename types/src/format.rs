//! [`Format`], how to read a payload's bytes, and its WIT name.

use alloc::string::String;
use alloc::sync::Arc;
use core::fmt;

use crate::Payload;

/// How to read a [`Payload`]'s bytes.
///
/// WIT carries the format as a string; [`Format::as_str`] and [`Format::from_name`] map
/// between the two, keeping names other than the three known ones as they are.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// UTF-8 JSON text.
    #[default]
    Json,
    /// Opaque bytes.
    Bytes,
    /// UTF-8 text.
    Text,
    /// Any other format, by a name both sides agree on.
    Other(Arc<str>),
}

impl Format {
    /// The format's name as guests see it: `json`, `bytes`, `text` or the other name.
    pub fn as_str(&self) -> &str {
        match self {
            Format::Json => Payload::JSON,
            Format::Bytes => Payload::BYTES,
            Format::Text => Payload::TEXT,
            Format::Other(name) => name,
        }
    }

    /// The format named `name`; the three known names map to their variants.
    pub fn from_name(name: &str) -> Self {
        match name {
            Payload::JSON => Format::Json,
            Payload::BYTES => Format::Bytes,
            Payload::TEXT => Format::Text,
            other => Format::Other(other.into()),
        }
    }
}

/// The format's name: [`Format::as_str`].
impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`Format::from_name`].
impl From<&str> for Format {
    fn from(name: &str) -> Self {
        Format::from_name(name)
    }
}

/// [`Format::from_name`].
impl From<String> for Format {
    fn from(name: String) -> Self {
        Format::from_name(&name)
    }
}

/// Compares by name: `format == "json"`.
impl PartialEq<str> for Format {
    fn eq(&self, name: &str) -> bool {
        self.as_str() == name
    }
}

/// Compares by name: `format == Payload::JSON`.
impl PartialEq<&str> for Format {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for format in [Format::Json, Format::Bytes, Format::Text, Format::Other("cbor".into())] {
            assert_eq!(Format::from_name(format.as_str()), format);
            assert_eq!(format, format.as_str());
        }
        assert_eq!(Format::from_name("text"), Format::Text);
        assert_eq!(Format::from("cbor").as_str(), "cbor");
        assert_eq!(Format::default(), Format::Json);
    }
}
