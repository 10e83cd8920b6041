//! JSON payloads (the `json` feature): writing them, and reading payloads as Rust values.

use core::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Format, Payload};

impl Payload {
    /// `value` serialised as JSON.
    ///
    /// # Errors
    ///
    /// Fails if `value` cannot be serialised (for example a map with non-string keys).
    pub fn json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        Ok(Payload { format: Format::Json, data: serde_json::to_vec(value)? })
    }

    /// The payload as one JSON value, for reports and APIs: a `json` payload as itself
    /// (`{"invalid_json": TEXT}` if it does not parse), `text` as a string, and any other
    /// format as `{"bytes": "<hex>"}`.
    pub fn to_json_value(&self) -> serde_json::Value {
        match self.format {
            Format::Json => serde_json::from_slice(&self.data)
                .unwrap_or_else(|_| serde_json::json!({ "invalid_json": self.as_str() })),
            Format::Text => serde_json::json!(self.as_str()),
            _ => {
                use core::fmt::Write as _;
                let mut hex = alloc::string::String::with_capacity(self.data.len() * 2);
                for byte in &self.data {
                    let _ = write!(hex, "{byte:02x}");
                }
                serde_json::json!({ "bytes": hex })
            }
        }
    }

    /// Reads the data as JSON, whatever the declared format.
    ///
    /// # Errors
    ///
    /// Fails if the data is not JSON of the shape `T` expects.
    pub fn parse_json<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.data)
    }

    /// Reads the payload as a `T`, by its format.
    ///
    /// A `json` payload is parsed; a `text` payload is read as a JSON string; an empty
    /// `bytes` payload (what commands that return nothing complete with) is read as JSON
    /// `null`, so it decodes into `()` or `None`.
    ///
    /// # Errors
    ///
    /// Fails if the data does not have the shape `T` expects, or the format is none of
    /// the above.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        let shape = |source| DecodeError::Shape { format: self.format.clone(), source };
        let value = match self.format {
            Format::Json => return serde_json::from_slice(&self.data).map_err(shape),
            Format::Text => serde_json::Value::String(self.as_str().ok_or(DecodeError::NotUtf8)?.into()),
            Format::Bytes if self.data.is_empty() => serde_json::Value::Null,
            _ => return Err(DecodeError::Unsupported { format: self.format.clone(), len: self.data.len() }),
        };
        serde_json::from_value(value).map_err(shape)
    }
}

/// Why [`Payload::decode`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum DecodeError {
    /// The payload's value does not have the shape asked for: a `json` payload's data (not
    /// JSON, or JSON of another shape), a `text` payload's string, an empty `bytes`
    /// payload's `null`.
    Shape {
        /// The payload's format.
        format: Format,
        /// What `serde_json` found wrong.
        source: serde_json::Error,
    },
    /// A `text` payload whose data is not UTF-8.
    NotUtf8,
    /// A format `decode` does not read: anything but `json`, `text` and empty `bytes`.
    Unsupported {
        /// The payload's format.
        format: Format,
        /// The payload's length in bytes.
        len: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Shape { format, .. } => write!(f, "failed to decode a `{format}` payload"),
            DecodeError::NotUtf8 => f.write_str("a `text` payload is not UTF-8"),
            DecodeError::Unsupported { format, len } => {
                write!(f, "cannot decode a `{format}` payload of {len} bytes; expected `json` or `text`")
            }
        }
    }
}

impl core::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            DecodeError::Shape { source, .. } => Some(source),
            DecodeError::NotUtf8 | DecodeError::Unsupported { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::string::{String, ToString};
    use alloc::vec::Vec;

    use super::*;

    #[test]
    fn decodes_each_format() {
        assert_eq!(Payload::json(&[1, 2]).unwrap().decode::<Vec<u8>>().unwrap(), [1, 2]);
        assert_eq!(Payload::text("hi").decode::<String>().unwrap(), "hi");
        Payload::empty().decode::<()>().unwrap();
        assert_eq!(Payload::empty().decode::<Option<u8>>().unwrap(), None);
        let error = Payload::bytes([1, 2]).decode::<u8>().unwrap_err();
        assert_eq!(error.to_string(), "cannot decode a `bytes` payload of 2 bytes; expected `json` or `text`");
        let error = Payload::text("hi").decode::<u8>().unwrap_err();
        assert_eq!(error.to_string(), "failed to decode a `text` payload");
        assert!(core::error::Error::source(&error).is_some());
        let invalid = Payload { format: Format::Text, data: alloc::vec![0xff] };
        assert!(matches!(invalid.decode::<String>(), Err(DecodeError::NotUtf8)));
    }

    #[test]
    fn parse_json_ignores_the_format() {
        let payload = Payload::json(&serde_json::json!({"a": [1, 2]})).unwrap();
        let value: serde_json::Value = payload.parse_json().unwrap();
        assert_eq!(value["a"][1], 2);
        assert_eq!(Payload::text("3").parse_json::<u8>().unwrap(), 3);
    }
}
