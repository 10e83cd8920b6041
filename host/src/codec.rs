//! The crate's binary encoding, which the journal's records, capability sets and a
//! cluster's frames are all written in: unsigned LEB128 integers
//! ([`wasmproc_types::leb128`]), length-prefixed bytes and strings, and the values they
//! share (a payload, a command's or a process's outcome, an optional string), each
//! written one way.
//!
//! Values are read back with every length checked against what is left, so a damaged
//! value is an error, never a panic or an allocation of its claimed size. The error
//! ([`Malformed`]) names what was being decoded (a journal record, a cluster frame, and
//! its kind once read), the field and the byte it was read at, and what was wrong.

use std::borrow::Cow;
use std::fmt;

use wasmproc_types::{ExitReason, Format, Payload, Pid, Trap, TrapKind, leb128};

use crate::step::Exited;

/// A value that does not decode: damaged, truncated, or of a newer format. Its text says
/// what was being decoded, the field, the byte, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// What was being decoded: `journal record`, `cluster frame`.
    what: &'static str,
    /// Its kind, once read (a record's, a frame's); empty before.
    kind: &'static str,
    /// The field being read; empty for the value as a whole.
    field: &'static str,
    /// The byte of the value the field begins at.
    at: usize,
    why: Why,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Why {
    Truncated,
    Overflow,
    LengthPastEnd {
        length: u64,
        left: usize,
    },
    CountPastEnd {
        count: u64,
        left: usize,
    },
    NotUtf8,
    /// A tag of two values (a boolean, an option, an outcome) that is neither.
    Tag(u8),
    Trailing(usize),
    Invalid(Cow<'static, str>),
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed {}", self.what)?;
        if !self.kind.is_empty() {
            write!(f, " of kind `{}`", self.kind)?;
        }
        if self.field.is_empty() {
            write!(f, ": at byte {}: ", self.at)?;
        } else {
            write!(f, ": `{}` at byte {}: ", self.field, self.at)?;
        }
        match &self.why {
            Why::Truncated => f.write_str("the value ends inside it"),
            Why::Overflow => f.write_str("an integer overflows 64 bits"),
            Why::LengthPastEnd { length, left } => write!(f, "a length of {length} bytes, with {left} left"),
            Why::CountPastEnd { count, left } => write!(f, "a count of {count}, with {left} bytes left"),
            Why::NotUtf8 => f.write_str("a string that is not UTF-8"),
            Why::Tag(tag) => write!(f, "tag {tag}, not 0 or 1"),
            Why::Trailing(n) => write!(f, "{n} bytes past its end"),
            Why::Invalid(why) => f.write_str(why),
        }
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

    pub(crate) fn u64(&mut self, value: u64) {
        leb128::write(&mut self.buf, value);
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

    /// `0`, or `1` and the string.
    pub(crate) fn optional_str(&mut self, value: Option<&str>) {
        self.bool(value.is_some());
        if let Some(value) = value {
            self.str(value);
        }
    }

    /// The format's name, then the bytes.
    pub(crate) fn payload(&mut self, payload: &Payload) {
        self.str(payload.format.as_str());
        self.bytes(&payload.data);
    }

    /// The count, then each payload.
    pub(crate) fn payloads(&mut self, payloads: &[Payload]) {
        self.u64(payloads.len() as u64);
        for payload in payloads {
            self.payload(payload);
        }
    }

    /// A command's or a process's outcome: `0` and the payload, or `1` and the error.
    pub(crate) fn outcome(&mut self, outcome: &Result<Payload, String>) {
        match outcome {
            Ok(payload) => {
                self.u8(0);
                self.payload(payload);
            }
            Err(error) => {
                self.u8(1);
                self.str(error);
            }
        }
    }
}

impl Writer {
    /// Why a process ended: the index of its name in [`ExitReason::NAMES`], then what the
    /// reason carries (a payload, a string, or a trap's kind, as its index in
    /// [`TrapKind::ALL`], and its message).
    pub(crate) fn exit_reason(&mut self, reason: &ExitReason) {
        let index = ExitReason::NAMES.iter().position(|name| *name == reason.name()).expect("every reason is named");
        self.u8(index as u8);
        match reason {
            ExitReason::Normal(payload) => self.payload(payload),
            ExitReason::Error(text) | ExitReason::Noconnection(text) => self.str(text),
            ExitReason::Trap(Trap { kind, message }) => {
                let kind = TrapKind::ALL.iter().position(|k| k == kind).expect("every trap kind is listed");
                self.u8(kind as u8);
                self.str(message);
            }
            _ => {}
        }
    }

    /// A process's end: its reason, then the pid whose exit signal ended it (`0`, or `1`
    /// and the pid).
    pub(crate) fn exited(&mut self, exited: &Exited) {
        self.exit_reason(&exited.reason);
        self.bool(exited.signal_from.is_some());
        if let Some(from) = exited.signal_from {
            self.u64(from.as_u64());
        }
    }
}

/// Reads values back in the order they were written, each read naming its field for the
/// error if it fails.
pub(crate) struct Reader<'a> {
    /// The whole value's length, so that an error can say where it is.
    len: usize,
    rest: &'a [u8],
    /// Where the last integer or byte read began: the field [`Reader::invalid`] speaks of.
    field_at: usize,
    what: &'static str,
    kind: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes`, which hold `what` (a `journal record`, a `cluster frame`).
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { len: bytes.len(), rest: bytes, field_at: 0, what, kind: "" }
    }

    /// Says the value's kind, once read, for the errors after.
    pub(crate) fn kind(&mut self, kind: &'static str) {
        self.kind = kind;
    }

    fn at(&self) -> usize {
        self.len - self.rest.len()
    }

    fn error(&self, field: &'static str, at: usize, why: Why) -> Malformed {
        Malformed { what: self.what, kind: self.kind, field, at, why }
    }

    /// An error the caller finds in `field`, just read: an unknown kind, a value out of
    /// range.
    pub(crate) fn invalid(&self, field: &'static str, why: impl Into<Cow<'static, str>>) -> Malformed {
        self.error(field, self.field_at, Why::Invalid(why.into()))
    }

    /// Fails unless every byte was read: trailing bytes are damage too.
    pub(crate) fn finish(self) -> Result<(), Malformed> {
        if self.rest.is_empty() { Ok(()) } else { Err(self.error("", self.at(), Why::Trailing(self.rest.len()))) }
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, Malformed> {
        self.field_at = self.at();
        let (&first, rest) = self.rest.split_first().ok_or_else(|| self.error(field, self.at(), Why::Truncated))?;
        self.rest = rest;
        Ok(first)
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, Malformed> {
        let at = self.at();
        self.field_at = at;
        leb128::read(&mut self.rest).map_err(|error| {
            let why = match error {
                leb128::Error::Truncated => Why::Truncated,
                leb128::Error::Overflow => Why::Overflow,
            };
            self.error(field, at, why)
        })
    }

    /// A count of items that each take at least one byte: never more than is left, so a
    /// damaged count cannot make the caller reserve memory for it.
    pub(crate) fn count(&mut self, field: &'static str) -> Result<usize, Malformed> {
        let at = self.at();
        let count = self.u64(field)?;
        if count > self.rest.len() as u64 {
            return Err(self.error(field, at, Why::CountPastEnd { count, left: self.rest.len() }));
        }
        Ok(count as usize)
    }

    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], Malformed> {
        let at = self.at();
        let length = self.u64(field)?;
        if length > self.rest.len() as u64 {
            return Err(self.error(field, at, Why::LengthPastEnd { length, left: self.rest.len() }));
        }
        let (value, rest) = self.rest.split_at(length as usize);
        self.rest = rest;
        Ok(value)
    }

    pub(crate) fn str(&mut self, field: &'static str) -> Result<&'a str, Malformed> {
        let at = self.at();
        std::str::from_utf8(self.bytes(field)?).map_err(|_| self.error(field, at, Why::NotUtf8))
    }

    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, Malformed> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(self.error(field, self.field_at, Why::Tag(tag))),
        }
    }

    /// What [`Writer::optional_str`] wrote.
    pub(crate) fn optional_str(&mut self, field: &'static str) -> Result<Option<&'a str>, Malformed> {
        if self.bool(field)? { self.str(field).map(Some) } else { Ok(None) }
    }

    /// What [`Writer::payload`] wrote.
    pub(crate) fn payload(&mut self, field: &'static str) -> Result<Payload, Malformed> {
        Ok(Payload { format: Format::from_name(self.str(field)?), data: self.bytes(field)?.to_vec() })
    }

    /// What [`Writer::payloads`] wrote.
    pub(crate) fn payloads(&mut self, field: &'static str) -> Result<Vec<Payload>, Malformed> {
        let count = self.count(field)?;
        let mut payloads = Vec::with_capacity(count);
        for _ in 0..count {
            payloads.push(self.payload(field)?);
        }
        Ok(payloads)
    }

    /// What [`Writer::outcome`] wrote.
    pub(crate) fn outcome(&mut self, field: &'static str) -> Result<Result<Payload, String>, Malformed> {
        match self.u8(field)? {
            0 => Ok(Ok(self.payload(field)?)),
            1 => Ok(Err(self.str(field)?.to_owned())),
            tag => Err(self.error(field, self.field_at, Why::Tag(tag))),
        }
    }
}

impl Reader<'_> {
    /// What [`Writer::exit_reason`] wrote.
    pub(crate) fn exit_reason(&mut self, field: &'static str) -> Result<ExitReason, Malformed> {
        let name = self.u8(field)?;
        let name = ExitReason::NAMES
            .get(usize::from(name))
            .ok_or_else(|| self.invalid(field, format!("unknown exit reason {name}")))?;
        Ok(match *name {
            "normal" => ExitReason::Normal(self.payload(field)?),
            "error" => ExitReason::Error(self.str(field)?.to_owned()),
            "trap" => {
                let kind = self.u8(field)?;
                let kind = *TrapKind::ALL
                    .get(usize::from(kind))
                    .ok_or_else(|| self.invalid(field, format!("unknown trap kind {kind}")))?;
                ExitReason::Trap(Trap { kind, message: self.str(field)?.to_owned() })
            }
            "killed" => ExitReason::Killed,
            "shutdown" => ExitReason::Shutdown,
            "terminated" => ExitReason::Terminated,
            "noproc" => ExitReason::Noproc,
            "noconnection" => ExitReason::Noconnection(self.str(field)?.to_owned()),
            other => return Err(self.invalid(field, format!("exit reason `{other}` has no encoding"))),
        })
    }

    /// What [`Writer::exited`] wrote.
    pub(crate) fn exited(&mut self, field: &'static str) -> Result<Exited, Malformed> {
        let reason = self.exit_reason(field)?;
        let signal_from = if self.bool(field)? { Some(Pid::from_u64(self.u64(field)?)) } else { None };
        Ok(Exited { reason, signal_from })
    }
}

/// `bytes` as lowercase hex, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One of every exit reason and trap kind.
    pub(crate) fn every_exit_reason() -> Vec<ExitReason> {
        let mut every = vec![
            ExitReason::Normal(Payload::text("done")),
            ExitReason::Error("boom".into()),
            ExitReason::Killed,
            ExitReason::Shutdown,
            ExitReason::Terminated,
            ExitReason::Noproc,
            ExitReason::Noconnection("b".into()),
        ];
        every.extend(TrapKind::ALL.map(|kind| ExitReason::trap(kind, format!("a {kind} trap"))));
        every
    }

    #[test]
    fn hex_is_two_lowercase_digits_a_byte() {
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff, 0x10]), "000fa5ff10");
        let every: Vec<u8> = (0..=255).collect();
        let expected: String = every.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&every), expected);
    }

    #[test]
    fn every_exit_reason_reads_back_as_written() {
        let every = every_exit_reason();
        let mut w = Writer::new();
        for reason in &every {
            w.exit_reason(reason);
        }
        w.exited(&Exited::by_signal(ExitReason::Killed, Pid::from_u64(7)));
        w.exited(&Exited::new(ExitReason::Noproc));
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes, "test value");
        for reason in &every {
            assert_eq!(&r.exit_reason("reason").unwrap(), reason);
        }
        assert_eq!(r.exited("exit").unwrap(), Exited::by_signal(ExitReason::Killed, Pid::from_u64(7)));
        assert_eq!(r.exited("exit").unwrap(), Exited::new(ExitReason::Noproc));
        r.finish().unwrap();
        let error = Reader::new(&[8], "test value").exit_reason("reason").unwrap_err();
        assert!(error.to_string().contains("unknown exit reason 8"), "{error}");
        let error = Reader::new(&[2, 7, 0], "test value").exit_reason("reason").unwrap_err();
        assert!(error.to_string().contains("unknown trap kind 7"), "{error}");
    }

    #[test]
    fn values_read_back_as_written() {
        let mut w = Writer::new();
        for n in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            w.u64(n);
        }
        w.str("héllo");
        w.bytes(&[]);
        w.bool(true);
        w.optional_str(Some("kind"));
        w.optional_str(None);
        let payloads = [Payload::u64(7), Payload { format: Format::Other("x-raw".into()), data: vec![0, 255] }];
        w.payloads(&payloads);
        w.outcome(&Ok(Payload::text("done")));
        w.outcome(&Err("boom".into()));
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes, "test value");
        for n in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(r.u64("n").unwrap(), n);
        }
        assert_eq!(r.str("s").unwrap(), "héllo");
        assert_eq!(r.bytes("b").unwrap(), b"");
        assert!(r.bool("f").unwrap());
        assert_eq!(r.optional_str("o").unwrap(), Some("kind"));
        assert_eq!(r.optional_str("o").unwrap(), None);
        assert_eq!(r.payloads("p").unwrap(), payloads);
        assert_eq!(r.outcome("ok").unwrap(), Ok(Payload::text("done")));
        assert_eq!(r.outcome("err").unwrap(), Err("boom".into()));
        r.finish().unwrap();
    }

    /// The shared values are written as the journal and the cluster wrote each before
    /// they shared them: their formats are fixed.
    #[test]
    fn shared_values_keep_their_bytes() {
        let mut w = Writer::new();
        w.optional_str(Some("a"));
        w.optional_str(None);
        w.payloads(&[Payload::text("hi")]);
        w.outcome(&Ok(Payload::empty()));
        w.outcome(&Err("no".into()));
        assert_eq!(
            w.into_bytes(),
            [&[1, 1, b'a', 0][..], &[1, 4], b"text", &[2], b"hi", &[0, 5], b"bytes", &[0], &[1, 2], b"no"].concat()
        );
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        // A length far past the end, an endless integer, a truncated one.
        assert!(Reader::new(&[0xff, 0xff, 0x03, b'a'], "v").bytes("b").is_err());
        assert!(Reader::new(&[0xff; 11], "v").u64("n").is_err());
        assert!(Reader::new(&[0x80], "v").u64("n").is_err());
        assert!(Reader::new(&[200, 1], "v").count("c").is_err());
        assert!(Reader::new(&[2], "v").bool("f").is_err());
        assert!(Reader::new(&[2], "v").outcome("o").is_err());
        let mut r = Reader::new(&[1, 2], "v");
        r.u8("x").unwrap();
        assert!(r.finish().is_err());
    }

    #[test]
    fn errors_name_the_value_its_kind_the_field_and_the_byte() {
        let mut r = Reader::new(&[7, 1, 0x80], "cluster frame");
        assert_eq!(r.u8("kind").unwrap(), 7);
        r.kind("probe");
        r.bool("flag").unwrap();
        assert_eq!(
            r.u64("nonce").unwrap_err().to_string(),
            "malformed cluster frame of kind `probe`: `nonce` at byte 2: the value ends inside it"
        );
        let mut r = Reader::new(&[3, b'a'], "journal record");
        assert_eq!(
            r.str("topic").unwrap_err().to_string(),
            "malformed journal record: `topic` at byte 0: a length of 3 bytes, with 1 left"
        );
        let mut r = Reader::new(&[1, 0xff], "journal record");
        assert_eq!(
            r.str("topic").unwrap_err().to_string(),
            "malformed journal record: `topic` at byte 0: a string that is not UTF-8"
        );
        let r = Reader::new(&[1], "capability set");
        assert_eq!(r.finish().unwrap_err().to_string(), "malformed capability set: at byte 0: 1 bytes past its end");
        let mut r = Reader::new(&[9], "journal record");
        r.u8("kind").unwrap();
        assert_eq!(
            r.invalid("kind", "unknown record kind 9").to_string(),
            "malformed journal record: `kind` at byte 0: unknown record kind 9"
        );
    }
}
