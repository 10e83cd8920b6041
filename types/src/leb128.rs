//! Unsigned LEB128, the variable-length integers of the Wasm binary format, which the
//! `wasmproc:commands` section ([`crate::commands`]) and the host's own encodings (its
//! journal, a cluster's frames) write every count and length in: seven bits a byte, least
//! significant first, the high bit set on every byte but the last.
//!
//! ```
//! use wasmproc_types::leb128;
//!
//! let mut out = Vec::new();
//! leb128::write(&mut out, 300);
//! assert_eq!(out, [0xac, 0x02]);
//! let mut rest = &out[..];
//! assert_eq!(leb128::read(&mut rest), Ok(300));
//! assert!(rest.is_empty());
//! ```

use alloc::vec::Vec;
use core::fmt;

/// The most bytes a `u64` takes: `ceil(64 / 7)`.
pub const MAX_LEN: usize = 10;

/// Appends `value` to `out`.
#[inline]
pub fn write(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Why an integer did not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The bytes end before the integer's last byte.
    Truncated,
    /// The integer has more than 64 bits (more than [`MAX_LEN`] bytes, or bits past the
    /// 64th in the last).
    Overflow,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "the bytes end inside an integer",
            Error::Overflow => "an integer overflows 64 bits",
        })
    }
}

impl core::error::Error for Error {}

/// Reads an integer from the front of `bytes` and advances it past the integer; on an
/// error `bytes` is left where it was.
///
/// # Errors
///
/// [`Error::Truncated`] if `bytes` ends first, [`Error::Overflow`] if the integer does
/// not fit in 64 bits. Reads at most [`MAX_LEN`] bytes either way.
#[inline]
pub fn read(bytes: &mut &[u8]) -> Result<u64, Error> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(MAX_LEN) {
        let bits = u64::from(byte & 0x7f);
        let shift = 7 * i as u32;
        if shift == 63 && bits > 1 {
            return Err(Error::Overflow);
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Ok(value);
        }
    }
    if bytes.len() >= MAX_LEN { Err(Error::Overflow) } else { Err(Error::Truncated) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_back_as_written() {
        for n in [0, 1, 127, 128, 300, 16_383, 16_384, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            write(&mut out, n);
            assert!(out.len() <= MAX_LEN);
            out.push(0xee);
            let mut rest = &out[..];
            assert_eq!(read(&mut rest), Ok(n));
            assert_eq!(rest, [0xee]);
        }
        let mut out = Vec::new();
        write(&mut out, 128);
        assert_eq!(out, [0x80, 0x01]);
    }

    #[test]
    fn damage_is_an_error_and_reads_nothing() {
        let cases: [(&[u8], Error); 5] = [
            (&[], Error::Truncated),
            (&[0x80], Error::Truncated),
            (&[0xff; 9], Error::Truncated),
            (&[0xff; 11], Error::Overflow),
            // The tenth byte may only carry the 64th bit.
            (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], Error::Overflow),
        ];
        for (bytes, error) in cases {
            let mut rest = bytes;
            assert_eq!(read(&mut rest), Err(error), "{bytes:?}");
            assert_eq!(rest, bytes);
        }
        // Ten bytes ending in a continuation byte overflow rather than wait for more.
        let mut rest = &[0x80; 10][..];
        assert_eq!(read(&mut rest), Err(Error::Overflow));
    }
}
