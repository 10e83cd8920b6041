//! The crate's value encoding (the journal's records, capability sets, a cluster's frames): LEB128 integers, length-prefixed bytes and strings, read
//! back with every length checked against what is left, so a damaged value is an error,
//! never a panic or an allocation of its claimed size.

use std::fmt;

/// A value that does not decode: damaged, truncated, or of a newer format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub(crate) &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed journal record: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// Appends the encoding of values to a buffer.
#[derive(Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A writer with room for 64 bytes: a step's record (about 40 bytes when its events
    /// and commands carry no payload) and most messages then take one allocation, not
    /// the four of a buffer doubling from eight.
    pub(crate) fn new() -> Self {
        Writer { buf: Vec::with_capacity(64) }
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub(crate) fn u8(&mut self, value: u8) {
        self.buf.push(value);
    }

    pub(crate) fn u64(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.buf.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.buf.push(value as u8);
    }

    pub(crate) fn bytes(&mut self, value: &[u8]) {
        self.u64(value.len() as u64);
        self.buf.extend_from_slice(value);
    }

    pub(crate) fn str(&mut self, value: &str) {
        self.bytes(value.as_bytes());
    }

    pub(crate) fn bool(&mut self, value: bool) {
        self.u8(u8::from(value));
    }
}

/// Reads values back in the order they were written.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    /// Fails unless every byte was read: trailing bytes are damage too.
    pub(crate) fn finish(self) -> Result<(), Malformed> {
        if self.rest.is_empty() { Ok(()) } else { Err(Malformed("trailing bytes")) }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Malformed> {
        let (&first, rest) = self.rest.split_first().ok_or(Malformed("truncated"))?;
        self.rest = rest;
        Ok(first)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(Malformed("integer overflows 64 bits"));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Malformed("integer overflows 64 bits"))
    }

    /// A count of items that each take at least one byte: never more than is left, so a
    /// damaged count cannot make the caller reserve memory for it.
    pub(crate) fn count(&mut self) -> Result<usize, Malformed> {
        let count = self.u64()?;
        if count > self.rest.len() as u64 {
            return Err(Malformed("count past the end"));
        }
        Ok(count as usize)
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let len = self.u64()?;
        if len > self.rest.len() as u64 {
            return Err(Malformed("length past the end"));
        }
        let (value, rest) = self.rest.split_at(len as usize);
        self.rest = rest;
        Ok(value)
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, Malformed> {
        std::str::from_utf8(self.bytes()?).map_err(|_| Malformed("string is not UTF-8"))
    }

    pub(crate) fn bool(&mut self) -> Result<bool, Malformed> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Malformed("bad boolean")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_written() {
        let mut w = Writer::new();
        for n in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            w.u64(n);
        }
        w.str("héllo");
        w.bytes(&[]);
        w.bool(true);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        for n in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(r.u64().unwrap(), n);
        }
        assert_eq!(r.str().unwrap(), "héllo");
        assert_eq!(r.bytes().unwrap(), b"");
        assert!(r.bool().unwrap());
        r.finish().unwrap();
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        // A length far past the end, an endless integer, a truncated one.
        assert!(Reader::new(&[0xff, 0xff, 0x03, b'a']).bytes().is_err());
        assert!(Reader::new(&[0xff; 11]).u64().is_err());
        assert!(Reader::new(&[0x80]).u64().is_err());
        assert!(Reader::new(&[200, 1]).count().is_err());
        assert!(Reader::new(&[2]).bool().is_err());
        let mut r = Reader::new(&[1, 2]);
        r.u8().unwrap();
        assert!(r.finish().is_err());
    }
}
