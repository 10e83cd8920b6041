//! The `wasmproc:commands` custom section: the commands a component declares it yields,
//! written by the guest SDK's `uses!` macro and read by `wasmproc inspect` and `wasmproc
//! run`.
//!
//! The declaration is a static in a core module's custom section [`SECTION`]. A linker
//! concatenates every object's sections of one name, so the section is a sequence of
//! self-delimiting records, one per declaration, each readable and skippable on its own:
//!
//! 1. the format's version, one byte: [`VERSION`] for the commands of every entry method
//!    (`uses!("kv.get")`), [`ENTRY_VERSION`] for those of one (`uses!(list: "kv.get")`);
//! 2. the length in bytes of the rest of the record, an unsigned LEB128
//!    ([`crate::leb128`]);
//! 3. for [`ENTRY_VERSION`], the entry method's name as a Wasm name: its length in bytes
//!    (unsigned LEB128), then its UTF-8;
//! 4. the number of commands, an unsigned LEB128;
//! 5. each command as a Wasm name.
//!
//! A reader skips a record of a version it does not know by its length, so a newer SDK's
//! declaration does not make an older host fail. [`encode`] writes a record, [`records`]
//! reads a section's; both keep to [`MAX_COMMANDS`] and [`MAX_NAME`], so what the macro
//! accepts is always read.
//!
//! ```
//! use wasmproc_types::commands::{self, Record};
//!
//! let section = [commands::encode(None, &["sleep"]), commands::encode(Some("list"), &["kv.get"])].concat();
//! let read: Vec<Record<'_>> = commands::records(&section).map(|r| r.unwrap().1).collect();
//! assert_eq!(read, [
//!     Record::Commands { entry: None, commands: vec!["sleep"] },
//!     Record::Commands { entry: Some("list"), commands: vec!["kv.get"] },
//! ]);
//! ```

use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use core::fmt;

use crate::leb128;

/// The custom section's name.
pub const SECTION: &str = "wasmproc:commands";

/// The version of the record format of the commands of every entry method.
pub const VERSION: u8 = 1;

/// The version of the record format of the commands of one entry method.
pub const ENTRY_VERSION: u8 = 2;

/// The most commands one record may name.
pub const MAX_COMMANDS: usize = 256;

/// The longest command name, in bytes.
pub const MAX_NAME: usize = 128;

/// Whether `name` is a command name: a built-in (`sleep`), a family's command (`kv.get`)
/// or a whole family (`kv.*`): dot-separated words of ASCII letters, digits, `_` and `-`,
/// the last after a dot possibly `*`. No longer than [`MAX_NAME`]. A reader checks it too,
/// so what it shows of a file is never a control sequence.
pub fn is_command_name(name: &str) -> bool {
    let last = name.split('.').count() - 1;
    name.len() <= MAX_NAME
        && name.split('.').enumerate().all(|(i, segment)| {
            (!segment.is_empty() && segment.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                || (i == last && i > 0 && segment == "*")
        })
}

/// Whether `name` is an entry method's name as `uses!` writes it: a Rust function's name
/// (raw identifiers without their `r#`), in ASCII letters, digits and `_`, no longer than
/// [`MAX_NAME`].
pub fn is_entry_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One record: the commands of entry method `entry`, or of every entry method (`None`).
/// Checks nothing: a writer checks the names first ([`is_command_name`],
/// [`is_entry_name`], at most [`MAX_COMMANDS`]).
pub fn encode(entry: Option<&str>, commands: &[&str]) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some(entry) = entry {
        name(&mut body, entry);
    }
    leb128::write(&mut body, commands.len() as u64);
    for command in commands {
        name(&mut body, command);
    }
    let mut record = alloc::vec![if entry.is_some() { ENTRY_VERSION } else { VERSION }];
    leb128::write(&mut record, body.len() as u64);
    record.extend_from_slice(&body);
    record
}

fn name(out: &mut Vec<u8>, name: &str) {
    leb128::write(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
}

/// One record of a section, as [`records`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// The commands of entry method `entry` ([`ENTRY_VERSION`]), or of every entry method
    /// (`None`, [`VERSION`]), as the record lists them.
    Commands {
        /// The entry method.
        entry: Option<&'a str>,
        /// The command names, each checked by [`is_command_name`].
        commands: Vec<&'a str>,
    },
    /// A record of another version, skipped by its length.
    Skipped {
        /// Its version.
        version: u8,
    },
}

/// The records of one section's bytes, each with the byte it begins at; after an error,
/// nothing more.
pub fn records(section: &[u8]) -> Records<'_> {
    Records { section, at: 0 }
}

/// The iterator of [`records`].
#[derive(Clone, Debug)]
pub struct Records<'a> {
    section: &'a [u8],
    /// Where the next record begins; past the end after an error.
    at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(usize, Record<'a>), SectionError>;

    fn next(&mut self) -> Option<Self::Item> {
        let at = self.at;
        let mut rest = self.section.get(at..).filter(|rest| !rest.is_empty())?;
        let record = read_record(self.section, at, &mut rest);
        self.at = if record.is_ok() { self.section.len() - rest.len() } else { usize::MAX };
        Some(record.map(|record| (at, record)))
    }
}

/// Reads the record at byte `at` of `section`, whose bytes from there are `rest`.
fn read_record<'a>(section: &'a [u8], at: usize, rest: &mut &'a [u8]) -> Result<Record<'a>, SectionError> {
    let fail = |why| SectionError { at, why };
    let (&version, after) = rest.split_first().ok_or(fail(Why::Integer(leb128::Error::Truncated)))?;
    *rest = after;
    let length = leb128::read(rest).map_err(|e| fail(Why::Integer(e)))?;
    let body_at = section.len() - rest.len();
    let body = usize::try_from(length)
        .ok()
        .and_then(|length| rest.get(..length))
        .ok_or(fail(Why::PastEnd { length, left: rest.len() }))?;
    *rest = &rest[body.len()..];
    let entry = match version {
        VERSION => false,
        ENTRY_VERSION => true,
        version => return Ok(Record::Skipped { version }),
    };
    let mut body = Body { rest: body, at: body_at };
    let entry = if entry { Some(body.name(is_entry_name, "an entry method's name").map_err(fail)?) } else { None };
    let count = body.integer().map_err(fail)?;
    if count > MAX_COMMANDS as u64 {
        return Err(fail(Why::TooMany(count)));
    }
    let mut commands = Vec::with_capacity(count as usize);
    for _ in 0..count {
        commands.push(body.name(is_command_name, "a command name").map_err(fail)?);
    }
    if !body.rest.is_empty() {
        return Err(fail(Why::Trailing(body.rest.len())));
    }
    Ok(Record::Commands { entry, commands })
}

/// A record's body being read: what is left of it, and the section's byte it starts at.
struct Body<'a> {
    rest: &'a [u8],
    at: usize,
}

impl<'a> Body<'a> {
    fn integer(&mut self) -> Result<u64, Why> {
        let before = self.rest.len();
        let value = leb128::read(&mut self.rest).map_err(Why::Integer)?;
        self.at += before - self.rest.len();
        Ok(value)
    }

    /// A Wasm name of at most [`MAX_NAME`] bytes that `fits` (it is `what`).
    fn name(&mut self, fits: fn(&str) -> bool, what: &'static str) -> Result<&'a str, Why> {
        let length = self.integer()?;
        if length > MAX_NAME as u64 {
            return Err(Why::TooLong(length));
        }
        let at = self.at;
        let bytes = self.rest.get(..length as usize).ok_or(Why::NamePastEnd(at))?;
        self.rest = &self.rest[bytes.len()..];
        self.at += bytes.len();
        let name = core::str::from_utf8(bytes).map_err(|_| Why::NotUtf8(at))?;
        if !fits(name) {
            return Err(Why::NotA { name: name.to_string(), at, what });
        }
        Ok(name)
    }
}

/// A section that does not decode: which record, and why. Its text names the record by the
/// byte it begins at in its section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionError {
    at: usize,
    why: Why,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Why {
    Integer(leb128::Error),
    PastEnd { length: u64, left: usize },
    TooMany(u64),
    TooLong(u64),
    NamePastEnd(usize),
    NotUtf8(usize),
    NotA { name: String, at: usize, what: &'static str },
    Trailing(usize),
}

impl SectionError {
    /// The byte of its section the record begins at.
    pub fn at(&self) -> usize {
        self.at
    }
}

impl fmt::Display for SectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.at;
        match &self.why {
            Why::PastEnd { length, left } => {
                write!(f, "the record at byte {at} claims {length} bytes; {left} are left")
            }
            why => write!(f, "in the record at byte {at}: {why}"),
        }
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Integer(error) => write!(f, "{error}"),
            Why::PastEnd { length, left } => write!(f, "{length} bytes claimed; {left} are left"),
            Why::TooMany(count) => write!(f, "{count} commands, more than the {MAX_COMMANDS} read"),
            Why::TooLong(length) => write!(f, "a name of {length} bytes, longer than the {MAX_NAME} read"),
            Why::NamePastEnd(at) => write!(f, "a name runs past the record's end at byte {at}"),
            Why::NotUtf8(at) => write!(f, "the name at byte {at} is not UTF-8"),
            Why::NotA { name, at, what } => write!(f, "{name:?} at byte {at} is not {what}"),
            Why::Trailing(n) => write!(f, "{n} bytes past its last command"),
        }
    }
}

impl core::error::Error for SectionError {}

#[cfg(test)]
mod tests {
    use alloc::string::ToString as _;
    use alloc::vec;

    use super::*;

    fn error(section: &[u8]) -> String {
        records(section).find_map(Result::err).expect("an error").to_string()
    }

    #[test]
    fn encodes_records_of_wasm_names() {
        let record = encode(None, &["kv.*", "sleep"]);
        assert_eq!(record, b"\x01\x0c\x02\x04kv.*\x05sleep");
        assert_eq!(encode(None, &[]), [VERSION, 1, 0]);
        let record = encode(Some("list"), &["kv.get"]);
        assert_eq!(record, b"\x02\x0d\x04list\x01\x06kv.get");
        let long = "a".repeat(MAX_NAME);
        let record = encode(None, &[&long]);
        // The rest, 1 (count) + 2 (the name's length) + 128 bytes, takes a two-byte length.
        assert_eq!(&record[..6], [VERSION, 0x83, 0x01, 1, 0x80, 0x01]);
        assert_eq!(&record[6..], long.as_bytes());
    }

    #[test]
    fn reads_what_it_writes_and_skips_other_versions() {
        let newer = [3, 3, 0xff, 0xff, 0xff];
        let section = [encode(None, &["kv.get", "sleep"]), newer.to_vec(), encode(Some("x"), &[])].concat();
        let read: Vec<_> = records(&section).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            read,
            [
                (0, Record::Commands { entry: None, commands: vec!["kv.get", "sleep"] }),
                (16, Record::Skipped { version: 3 }),
                (21, Record::Commands { entry: Some("x"), commands: vec![] }),
            ]
        );
        assert!(records(&[]).next().is_none());
    }

    #[test]
    fn names_are_checked() {
        assert!(is_command_name("kv.*") && is_command_name("sleep") && is_command_name("inventory.re-serve_2"));
        for bad in ["", "kv.", "*", "a.*.b", "kv get", "\x1b[2J", &"a".repeat(MAX_NAME + 1)] {
            assert!(!is_command_name(bad), "{bad:?}");
        }
        assert!(is_entry_name("list_all") && !is_entry_name("") && !is_entry_name("a-b"));
    }

    #[test]
    fn damage_is_an_error_naming_the_record() {
        let truncated = &encode(None, &["kv.get"])[..5];
        assert_eq!(error(truncated), "the record at byte 0 claims 8 bytes; 3 are left");
        assert_eq!(error(&[1, 2, 1, 6]), "in the record at byte 0: a name runs past the record's end at byte 4");
        assert_eq!(error(&[1, 2, 0, 0]), "in the record at byte 0: 1 bytes past its last command");
        assert!(error(&encode(None, &["\x1b[2J"])).contains("\"\\u{1b}[2J\" at byte 4 is not a command name"));
        assert!(error(&encode(Some("a b"), &[])).contains("is not an entry method's name"));
        assert_eq!(error(&[1, 3, 1, 1, 0xff]), "in the record at byte 0: the name at byte 4 is not UTF-8");
        assert_eq!(error(&[1, 0xff, 0xff]), "in the record at byte 0: the bytes end inside an integer");
        assert!(error(&[1, 5, 0xff, 0xff, 0xff, 0xff, 0x0f]).contains("4294967295 commands, more than the 256 read"));
        let long = "a".repeat(MAX_NAME + 1);
        assert!(error(&encode(None, &[&long])).contains("a name of 129 bytes, longer than the 128 read"));
        // An error ends the records, and names the record it is in.
        let section = [encode(None, &["sleep"]), vec![1, 2, 0, 0]].concat();
        let mut read = records(&section);
        assert!(read.next().unwrap().is_ok());
        assert_eq!(read.next().unwrap().unwrap_err().at(), 9);
        assert!(read.next().is_none());
    }
}
