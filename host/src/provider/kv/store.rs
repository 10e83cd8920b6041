//! The `kv` provider's fjall database: its keyspaces, how records are laid out in them,
//! and the reads (a `kv.get` is answered straight from here, on the calling worker).
//!
//! Keyspaces, each its own ordered map:
//!
//! - `data`: key (its UTF-8 bytes) → the version (8 bytes, big-endian) and the value's
//!   JSON text. Values over 1 KiB live in fjall's blob files (key-value separation), so
//!   that `kv.list`, which reads keys only, never reads a large value.
//! - `meta`: `totals` → [`Totals`], rewritten by every commit that changes anything.
//! - `answers`: idempotency key → the answer's number (8 bytes), the request's digest
//!   (8 bytes) and the answer's JSON.
//! - `ages`: an answer's number (8 bytes, big-endian, so in the order they were given)
//!   → its idempotency key: how the oldest answers are found and forgotten.

use std::ops::Bound;
use std::path::Path;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions};

use super::ListQuery;
use crate::Payload;
use crate::provider::{ErrorCode, Failure};

/// The first byte of [`Totals`]' record: a store written by a later format is refused
/// rather than misread.
const FORMAT_VERSION: u8 = 1;

/// The size at which fjall flushes a memtable to a table. Small, as the journal's (see
/// `journal/store.rs`): opening replays the log back to the last flush, and a store is
/// opened as its host starts.
const MEMTABLE_SIZE: u64 = 8 << 20;

/// What the store holds and has given out, kept exact by writing it in the same atomic
/// batch as the writes it counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Totals {
    /// The last version given to a write; versions are never given twice.
    pub(super) version: u64,
    /// Keys stored.
    pub(super) keys: u64,
    /// Bytes of keys and values (the values' JSON text) stored.
    pub(super) bytes: u64,
    /// The number of the oldest answer that may still be kept.
    pub(super) answers_first: u64,
    /// The number the next answer kept will have.
    pub(super) answers_next: u64,
}

impl Totals {
    const SIZE: usize = 1 + 5 * 8;

    pub(super) fn encode(&self) -> [u8; Totals::SIZE] {
        let mut bytes = [0; Totals::SIZE];
        bytes[0] = FORMAT_VERSION;
        let fields = [self.version, self.keys, self.bytes, self.answers_first, self.answers_next];
        for (chunk, field) in bytes[1..].chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&field.to_be_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<Totals, String> {
        match bytes.first() {
            Some(&FORMAT_VERSION) if bytes.len() == Totals::SIZE => {}
            Some(&version) if version > FORMAT_VERSION => {
                return Err(format!(
                    "it was written by a later wasmproc (format {version}, this one reads {FORMAT_VERSION})"
                ));
            }
            _ => return Err("its totals record is damaged".to_owned()),
        }
        let field = |i: usize| u64_at(&bytes[1 + 8 * i..]);
        Ok(Totals {
            version: field(0),
            keys: field(1),
            bytes: field(2),
            answers_first: field(3),
            answers_next: field(4),
        })
    }
}

/// A write's answer, kept for a retry with the same idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Answer {
    /// Its number: the order in which answers were kept.
    pub(super) seq: u64,
    /// The digest of the request it answered (see `writer::digest`).
    pub(super) digest: u64,
    /// The answer's JSON.
    pub(super) body: Vec<u8>,
}

impl Answer {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(16 + self.body.len());
        bytes.extend_from_slice(&self.seq.to_be_bytes());
        bytes.extend_from_slice(&self.digest.to_be_bytes());
        bytes.extend_from_slice(&self.body);
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<Answer, Failure> {
        if bytes.len() < 16 {
            return Err(damaged("a kept answer is shorter than its header"));
        }
        Ok(Answer { seq: u64_at(bytes), digest: u64_at(&bytes[8..]), body: bytes[16..].to_vec() })
    }
}

/// A stored key's version and the length of its value's JSON text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) version: u64,
    pub(super) len: usize,
}

/// The database and its keyspaces. Shared by the writer thread and the workers that
/// answer `kv.get`: fjall's handles are safe to use from any thread.
pub(super) struct Store {
    pub(super) db: Database,
    pub(super) data: Keyspace,
    pub(super) meta: Keyspace,
    pub(super) answers: Keyspace,
    pub(super) ages: Keyspace,
}

impl Store {
    /// Opens (or creates) the database in `dir`, and reads its totals.
    ///
    /// # Errors
    ///
    /// Another process (or another `Kv` of this one) has the directory open, or it holds
    /// a damaged database or one of a later format.
    pub(super) fn open(dir: &Path) -> anyhow::Result<(Store, Totals)> {
        let failed = |why: String| anyhow::anyhow!("cannot open the key-value store in {}: {why}", dir.display());
        let db = Database::builder(dir).open().map_err(|error| {
            match error {
            fjall::Error::Locked => failed(
                "it is in use by another wasmproc (or another `Kv` in this process); one host at a time can use a store"
                    .to_owned(),
            ),
            other => failed(other.to_string()),
        }
        })?;
        let small = || KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_SIZE);
        let keyspace = |name: &str, options: fn() -> KeyspaceCreateOptions| {
            db.keyspace(name, options).map_err(|e| failed(format!("keyspace `{name}`: {e}")))
        };
        let data = keyspace("data", || {
            KeyspaceCreateOptions::default()
                .max_memtable_size(MEMTABLE_SIZE)
                .with_kv_separation(Some(KvSeparationOptions::default()))
        })?;
        let meta = keyspace("meta", small)?;
        let answers = keyspace("answers", small)?;
        let ages = keyspace("ages", small)?;
        let store = Store { db, data, meta, answers, ages };
        let totals = match store.meta.get(TOTALS).map_err(|e| failed(e.to_string()))? {
            Some(bytes) => Totals::decode(&bytes).map_err(failed)?,
            None if store.data.first_key_value().is_some() => {
                return Err(failed("it holds keys but no totals: it is damaged".to_owned()));
            }
            None => Totals::default(),
        };
        Ok((store, totals))
    }

    /// `kv.get`'s answer for `key`: `{"value": V, "version": N}`, or `null`.
    pub(super) fn get(&self, key: &str) -> Result<Payload, Failure> {
        let Some(record) = self.data.get(key).map_err(unavailable)? else {
            return Ok(super::got(None));
        };
        let (version, text) = split_record(&record)?;
        Ok(super::got(Some((text, version))))
    }

    /// `key`'s value text and version, if it is stored.
    pub(super) fn read(&self, key: &str) -> Result<Option<(String, u64)>, Failure> {
        let Some(record) = self.data.get(key).map_err(unavailable)? else {
            return Ok(None);
        };
        let (version, text) = split_record(&record)?;
        let text = String::from_utf8(text.to_vec()).map_err(|_| damaged("a value is not UTF-8"))?;
        Ok(Some((text, version)))
    }

    /// `key`'s version and value length, if it is stored.
    pub(super) fn stored(&self, key: &str) -> Result<Option<Stored>, Failure> {
        let Some(record) = self.data.get(key).map_err(unavailable)? else {
            return Ok(None);
        };
        let (version, text) = split_record(&record)?;
        Ok(Some(Stored { version, len: text.len() }))
    }

    /// The answer kept under the idempotency key `key`, if any.
    pub(super) fn answer(&self, key: &str) -> Result<Option<Answer>, Failure> {
        self.answers.get(key).map_err(unavailable)?.map(|bytes| Answer::decode(&bytes)).transpose()
    }

    /// The idempotency keys of the answers numbered `from..to`, in order.
    pub(super) fn ages(&self, from: u64, to: u64) -> Result<Vec<(u64, String)>, Failure> {
        let mut ages = Vec::new();
        for guard in self.ages.range(from.to_be_bytes()..to.to_be_bytes()) {
            let (seq, key) = guard.into_inner().map_err(unavailable)?;
            let key = String::from_utf8(key.to_vec()).map_err(|_| damaged("an answer's key is not UTF-8"))?;
            ages.push((u64_at(&seq), key));
        }
        Ok(ages)
    }

    /// `kv.list`'s answer: `{"keys": [...], "more": bool}`.
    pub(super) fn list(&self, query: &ListQuery) -> Result<serde_json::Value, Failure> {
        let prefix = query.prefix.as_bytes();
        // Strictly after `after` when it sorts at or past the prefix; otherwise every
        // key with the prefix is after it.
        let start = match &query.after {
            Some(after) if after.as_bytes() >= prefix => Bound::Excluded(after.as_bytes()),
            _ => Bound::Included(prefix),
        };
        let mut keys = Vec::new();
        let mut more = false;
        for guard in self.data.range::<&[u8], _>((start, Bound::Unbounded)) {
            // `key()` reads no value: a separated one stays in its blob file.
            let key = guard.key().map_err(unavailable)?;
            if !key.starts_with(prefix) {
                break;
            }
            if keys.len() == query.limit {
                more = true;
                break;
            }
            keys.push(String::from_utf8(key.to_vec()).map_err(|_| damaged("a key is not UTF-8"))?);
        }
        Ok(serde_json::json!({ "keys": keys, "more": more }))
    }
}

/// The key of [`Totals`]' record in `meta`.
pub(super) const TOTALS: &str = "totals";

/// A `data` record: the version, then the value's JSON text.
pub(super) fn record(version: u64, text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + text.len());
    bytes.extend_from_slice(&version.to_be_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

fn split_record(record: &[u8]) -> Result<(u64, &[u8]), Failure> {
    if record.len() < 8 {
        return Err(damaged("a record is shorter than its version"));
    }
    Ok((u64_at(record), &record[8..]))
}

/// The big-endian `u64` at the start of `bytes`, which the caller has checked holds 8.
fn u64_at(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().expect("the caller checked the length"))
}

/// A failure of the store itself.
pub(super) fn unavailable(error: fjall::Error) -> Failure {
    Failure::new(ErrorCode::Unavailable, format!("the key-value store failed: {error}"))
}

fn damaged(what: &str) -> Failure {
    Failure::new(ErrorCode::Unavailable, format!("the key-value store is damaged: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_read_back_and_a_later_format_is_refused() {
        let totals = Totals { version: 7, keys: 2, bytes: 300, answers_first: 4, answers_next: 9 };
        assert_eq!(Totals::decode(&totals.encode()), Ok(totals));
        let mut later = totals.encode();
        later[0] = FORMAT_VERSION + 1;
        assert!(Totals::decode(&later).unwrap_err().contains("later wasmproc"));
        assert!(Totals::decode(&later[..5]).is_err());
    }
}
