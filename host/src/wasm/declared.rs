//! The commands a component declares it yields (`wasmproc_guest::uses!`), read from the
//! `wasmproc:commands` custom sections of its core modules: what `wasmproc inspect`
//! shows, `run` warns of when it does not grant them, and the service's component
//! descriptions list.
//!
//! The section's format is `wasmproc_types::commands`, which the SDK's `uses!` writes with
//! too. A record of a version this host does not read is skipped by its length and
//! counted, so a newer SDK's declaration does not make an older host's `inspect` fail.
//! The section comes from the file being inspected, which may be hostile: the reader
//! borrows names from the file's bytes, reads at most [`MAX_SECTION_BYTES`] of sections
//! and [`MAX_COMMANDS`] distinct commands (of at most `commands::MAX_NAME` bytes each),
//! and beyond any bound, or on a record that does not decode, reports the section
//! unreadable rather than listing part of it.

use std::collections::BTreeSet;

use wasmparser::{Parser, Payload};
use wasmproc_types::commands::{self, MAX_COMMANDS, Record, SECTION};

/// The most bytes of `wasmproc:commands` sections read, over all core modules: 256
/// commands of 128 bytes with their lengths come to about 33 KiB; picked with room for
/// repeats across several modules.
const MAX_SECTION_BYTES: usize = 64 * 1024;

/// What a component's sections say about the commands it yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Declared {
    /// No `wasmproc:commands` section: the component does not say (which is not that it
    /// yields none).
    Undeclared,
    /// The commands declared, sorted, each once; none if the component declares that it
    /// yields none.
    Commands {
        /// The command names (`kv.get`, `kv.*`, `sleep`), of every entry method.
        commands: Vec<String>,
        /// The commands among them declared for some entry methods only, with those
        /// methods (sorted); the others are declared for every entry method.
        scoped: Vec<(String, Vec<String>)>,
        /// Records of a version this host does not read, skipped.
        skipped: usize,
    },
    /// A section that does not decode or exceeds a bound: why.
    Unreadable(String),
}

impl Declared {
    /// Reads the declarations in `wasm`, a component or a core module (nested modules
    /// included).
    pub fn read(wasm: &[u8]) -> Declared {
        let mut found = false;
        let mut total = 0usize;
        let mut found_commands = Found::default();
        let mut skipped = 0;
        for payload in Parser::new(0).parse_all(wasm) {
            match payload {
                Ok(Payload::CustomSection(section)) if section.name() == SECTION => {
                    found = true;
                    total = total.saturating_add(section.data().len());
                    if total > MAX_SECTION_BYTES {
                        return Declared::Unreadable(format!(
                            "the `{SECTION}` sections hold more than {MAX_SECTION_BYTES} bytes"
                        ));
                    }
                    match read_section(section.data(), &mut found_commands) {
                        Ok(n) => skipped += n,
                        Err(why) => return Declared::Unreadable(format!("a `{SECTION}` section is damaged: {why}")),
                    }
                }
                Ok(_) => {}
                Err(error) => return Declared::Unreadable(format!("the program does not parse: {error}")),
            }
        }
        if !found {
            return Declared::Undeclared;
        }
        let Found { every, by_entry } = found_commands;
        let scoped: Vec<(String, Vec<String>)> = by_entry
            .iter()
            .filter(|(command, _)| !every.contains(*command))
            .map(|(command, entries)| (command.to_string(), entries.iter().map(|e| e.to_string()).collect()))
            .collect();
        let commands = every.iter().chain(by_entry.keys()).collect::<BTreeSet<_>>();
        Declared::Commands { commands: commands.into_iter().map(|c| c.to_string()).collect(), scoped, skipped }
    }

    /// The commands declared for entry method `method`: those of every entry method and
    /// its own; none if the component does not declare them.
    pub fn of_entry(&self, method: &str) -> Vec<&str> {
        let Declared::Commands { commands, scoped, .. } = self else { return Vec::new() };
        commands
            .iter()
            .filter(|command| {
                scoped
                    .iter()
                    .find(|(c, _)| c == *command)
                    .is_none_or(|(_, entries)| entries.iter().any(|e| e == method))
            })
            .map(String::as_str)
            .collect()
    }
}

/// The commands of the records read so far.
#[derive(Default)]
struct Found<'a> {
    /// Declared for every entry method (version 1).
    every: BTreeSet<&'a str>,
    /// Declared for some entry methods (version 2): each command with its methods.
    by_entry: std::collections::BTreeMap<&'a str, BTreeSet<&'a str>>,
}

impl Found<'_> {
    fn len(&self) -> usize {
        self.every.len() + self.by_entry.keys().filter(|command| !self.every.contains(*command)).count()
    }
}

/// Adds the commands of one section's records to `found`; the number of records skipped
/// for their version.
fn read_section<'a>(data: &'a [u8], found: &mut Found<'a>) -> Result<usize, String> {
    let mut skipped = 0;
    for record in commands::records(data) {
        match record.map_err(|e| e.to_string())? {
            (at, Record::Commands { entry, commands }) => {
                for name in commands {
                    match entry {
                        None => {
                            found.every.insert(name);
                        }
                        Some(entry) => {
                            found.by_entry.entry(name).or_default().insert(entry);
                        }
                    }
                }
                if found.len() > MAX_COMMANDS {
                    return Err(format!("in the record at byte {at}: more than {MAX_COMMANDS} commands in all"));
                }
            }
            (_, Record::Skipped { .. }) => skipped += 1,
        }
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module with one custom section per item of `sections`.
    fn module(sections: &[&[u8]]) -> Vec<u8> {
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        for data in sections {
            let mut payload = Vec::new();
            leb(&mut payload, SECTION.len());
            payload.extend_from_slice(SECTION.as_bytes());
            payload.extend_from_slice(data);
            wasm.push(0);
            leb(&mut wasm, payload.len());
            wasm.extend_from_slice(&payload);
        }
        wasm
    }

    fn leb(out: &mut Vec<u8>, value: usize) {
        wasmproc_types::leb128::write(out, value as u64);
    }

    /// A version-1 record of `names`, as `uses!` writes it.
    fn record(names: &[&str]) -> Vec<u8> {
        commands::encode(None, names)
    }

    fn commands(names: &[&str], skipped: usize) -> Declared {
        Declared::Commands { commands: names.iter().map(|s| s.to_string()).collect(), scoped: Vec::new(), skipped }
    }

    /// A version-2 record of `names` for entry method `entry`, as `uses!(entry: …)`
    /// writes it.
    fn entry_record(entry: &str, names: &[&str]) -> Vec<u8> {
        commands::encode(Some(entry), names)
    }

    /// What each entry method declares, beside what every one does.
    #[test]
    fn reads_what_each_entry_method_declares() {
        let section = [
            record(&["sleep"]),
            entry_record("add", &["fs.read", "fs.write"]),
            entry_record("list", &["fs.read", "env.get", "sleep"]),
        ]
        .concat();
        let declared = Declared::read(&module(&[&section]));
        let Declared::Commands { commands, scoped, skipped: 0 } = &declared else { panic!("{declared:?}") };
        assert_eq!(commands, &["env.get", "fs.read", "fs.write", "sleep"]);
        let scoped_to = |entries: &[&str]| entries.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        assert_eq!(
            scoped,
            &[
                ("env.get".to_owned(), scoped_to(&["list"])),
                ("fs.read".to_owned(), scoped_to(&["add", "list"])),
                ("fs.write".to_owned(), scoped_to(&["add"])),
            ]
        );
        assert_eq!(declared.of_entry("list"), ["env.get", "fs.read", "sleep"]);
        assert_eq!(declared.of_entry("add"), ["fs.read", "fs.write", "sleep"]);
        assert_eq!(declared.of_entry("other"), ["sleep"]);
        let bad_entry = entry_record("\x1b[2J", &["sleep"]);
        assert!(unreadable(Declared::read(&module(&[&bad_entry]))).contains("is not an entry method's name"));
    }

    fn unreadable(declared: Declared) -> String {
        match declared {
            Declared::Unreadable(why) => why,
            other => panic!("expected an unreadable section, got {other:?}"),
        }
    }

    #[test]
    fn reads_concatenated_records_and_sections() {
        let first = [record(&["sleep", "kv.get"]), record(&["kv.get", "http.request"])].concat();
        let wasm = module(&[&first, &record(&["inventory.*"])]);
        assert_eq!(Declared::read(&wasm), commands(&["http.request", "inventory.*", "kv.get", "sleep"], 0));
        assert_eq!(Declared::read(&module(&[&record(&[])])), commands(&[], 0));
        assert_eq!(Declared::read(&module(&[])), Declared::Undeclared);
    }

    #[test]
    fn reads_the_section_of_a_nested_module() {
        let inner = module(&[&record(&["sleep"])]);
        // A component (version 0x0d, layer 1) whose only section is a core module.
        let mut component = b"\0asm\x0d\0\x01\0".to_vec();
        component.push(1);
        leb(&mut component, inner.len());
        component.extend_from_slice(&inner);
        assert_eq!(Declared::read(&component), commands(&["sleep"], 0));
    }

    #[test]
    fn skips_records_of_another_version() {
        let newer = [3, 3, 0xff, 0xff, 0xff];
        let wasm = module(&[&[&newer[..], &record(&["kv.put"])].concat()]);
        assert_eq!(Declared::read(&wasm), commands(&["kv.put"], 1));
    }

    #[test]
    fn damaged_sections_are_unreadable() {
        let truncated = &record(&["kv.get"])[..5];
        assert!(unreadable(Declared::read(&module(&[truncated]))).contains("claims 8 bytes; 3 are left"));
        // The record's length covers the name's length byte but not the name.
        assert!(unreadable(Declared::read(&module(&[&[1, 2, 1, 6]]))).contains("runs past the record's end"));
        let extra = [1, 2, 0, 0];
        assert!(unreadable(Declared::read(&module(&[&extra]))).contains("1 bytes past its last command"));
        let escape = record(&["\x1b[2J"]);
        assert!(unreadable(Declared::read(&module(&[&escape]))).contains("is not a command name"));
        let bad_utf8 = [1, 3, 1, 1, 0xff];
        assert!(unreadable(Declared::read(&module(&[&bad_utf8]))).contains("not UTF-8"));
        let endless_leb = [1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert!(unreadable(Declared::read(&module(&[&endless_leb]))).starts_with("a `wasmproc:commands` section"));
        assert!(unreadable(Declared::read(b"\0asm\x01\0\0\0\0\x05")).contains("does not parse"));
    }

    #[test]
    fn oversized_sections_are_unreadable() {
        let long = "a".repeat(commands::MAX_NAME + 1);
        assert!(unreadable(Declared::read(&module(&[&record(&[&long])]))).contains("longer than the 128 read"));
        // A count far beyond the bytes there are is refused before reading on.
        let claims = [1, 5, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(unreadable(Declared::read(&module(&[&claims]))).contains("more than the 256 read"));
        let names: Vec<String> = (0..=MAX_COMMANDS).map(|i| format!("p.c{i}")).collect();
        let (first, second) = names.split_at(MAX_COMMANDS / 2);
        let first: Vec<&str> = first.iter().map(String::as_str).collect();
        let second: Vec<&str> = second.iter().map(String::as_str).collect();
        let wasm = module(&[&record(&first), &record(&second)]);
        assert!(unreadable(Declared::read(&wasm)).contains("more than 256 commands in all"));
        // Two sections, each within the bound, that exceed it together.
        let big = [&[9, 0x80, 0x80, 0x02][..], &[0; 0x8000]].concat();
        let wasm = module(&[&big, &big]);
        assert!(unreadable(Declared::read(&wasm)).contains("more than 65536 bytes"));
    }
}
