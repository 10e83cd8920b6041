//! The newest pid whose records were removed: process 0's record 1, the journal's one
//! piece of metadata. A scheduler resuming the journal gives out only pids newer than
//! it, as it does than every pid the journal still holds, so a process whose records
//! are gone never lends its pid to another. A pid given out again would inherit what
//! others remember of the old process: another journal's last message number from it
//! (its new messages dropped as duplicates), a workflow's record, a monitor.
//!
//! "Newest" compares a pid's upper word, its generation: a scheduler's pids grow in it,
//! and that is what a resuming scheduler reserves.

use std::ops::ControlFlow;

use wasmproc_types::Pid;

use super::{FORMAT_VERSION, Journal, Key};

/// Where the floor is kept.
const FLOOR: Key = Key { process: 0, seq: 1 };
/// Its record tag, after [`FORMAT_VERSION`]; none of a process's records has it.
const FLOOR_TAG: u8 = 0x80;

/// The journal's floor as loaded, kept with the journal and shared by its clones.
#[derive(Debug, Default)]
pub(crate) struct Floor {
    /// `None` until read from the store.
    newest: Option<Option<Pid>>,
}

fn generation(pid: Pid) -> u64 {
    pid.as_u64() >> 32
}

fn encode(pid: Pid) -> Vec<u8> {
    let mut value = vec![FORMAT_VERSION, FLOOR_TAG];
    value.extend_from_slice(&pid.as_u64().to_le_bytes());
    value
}

fn decode(value: &[u8]) -> std::io::Result<Pid> {
    match value {
        [FORMAT_VERSION, FLOOR_TAG, raw @ ..] if raw.len() == 8 => {
            Ok(Pid::from_u64(u64::from_le_bytes(raw.try_into().expect("eight bytes"))))
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the journal's record of removed pids (process 0, record 1) is damaged: {value:02x?}"),
        )),
    }
}

impl Journal {
    /// The newest pid whose records were removed, if any were.
    ///
    /// # Errors
    ///
    /// The store's read error, or a damaged floor record.
    pub(crate) fn removed_floor(&self) -> std::io::Result<Option<Pid>> {
        let mut floor = self.floor.lock();
        self.loaded(&mut floor)
    }

    fn loaded(&self, floor: &mut Floor) -> std::io::Result<Option<Pid>> {
        if let Some(newest) = floor.newest {
            return Ok(newest);
        }
        let mut found = None;
        self.store.scan(Key { process: 0, seq: 0 }, &mut |key, value| {
            if key != FLOOR {
                return ControlFlow::Break(());
            }
            found = Some(value.to_vec());
            ControlFlow::Break(())
        })?;
        let newest = found.as_deref().map(decode).transpose()?;
        floor.newest = Some(newest);
        Ok(newest)
    }

    /// Calls `remove` with the record that raises the floor to the newest of `removed`
    /// (`None` if it is already as new), to be written in the same batch as the
    /// removal. Removals are handed over in the order their floors rise, so the last
    /// record written is the highest.
    ///
    /// # Errors
    ///
    /// The floor could not be read; nothing was removed.
    pub(crate) fn removing<R>(
        &self,
        removed: impl Iterator<Item = Pid>,
        remove: impl FnOnce(Option<(Key, Vec<u8>)>) -> R,
    ) -> std::io::Result<R> {
        let mut floor = self.floor.lock();
        let current = self.loaded(&mut floor)?;
        let newest = removed.max_by_key(|pid| generation(*pid));
        let raised = match (current, newest) {
            (Some(current), Some(newest)) if generation(newest) > generation(current) => Some(newest),
            (None, newest) => newest,
            _ => None,
        };
        if let Some(pid) = raised {
            floor.newest = Some(Some(pid));
        }
        Ok(remove(raised.map(|pid| (FLOOR, encode(pid)))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::journal::{Batch, JournalSettings, MemoryStore, Store};

    fn on(store: &Arc<dyn Store>) -> Journal {
        Journal { store: store.clone(), settings: JournalSettings::default(), floor: Arc::default() }
    }

    fn pid(generation: u64, index: u64) -> Pid {
        Pid::from_u64(generation << 32 | index)
    }

    fn remove(journal: &Journal, pids: &[Pid]) {
        journal
            .removing(pids.iter().copied(), |put| {
                let batch = Batch { puts: put.into_iter().collect(), removals: Vec::new() };
                journal.store.commit(&batch, true).unwrap();
            })
            .unwrap();
    }

    /// The floor only rises, and a journal opened again on the same store reads it.
    #[test]
    fn the_floor_keeps_the_newest_removed_pid() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let journal = on(&store);
        assert_eq!(journal.removed_floor().unwrap(), None);
        remove(&journal, &[pid(3, 1), pid(5, 0), pid(4, 7)]);
        assert_eq!(journal.removed_floor().unwrap(), Some(pid(5, 0)));
        remove(&journal, &[pid(2, 9)]);
        assert_eq!(journal.removed_floor().unwrap(), Some(pid(5, 0)));
        let again = on(&store);
        assert_eq!(again.removed_floor().unwrap(), Some(pid(5, 0)));
        remove(&again, &[pid(9, 2)]);
        assert_eq!(on(&store).removed_floor().unwrap(), Some(pid(9, 2)));
    }

    /// A damaged floor is an error naming it, not a floor of zero.
    #[test]
    fn a_damaged_floor_is_refused() {
        let store = MemoryStore::default();
        store
            .commit(&Batch { puts: vec![(FLOOR, vec![FORMAT_VERSION, FLOOR_TAG, 1])], removals: Vec::new() }, true)
            .unwrap();
        let error = Journal::with_store(store).removed_floor().unwrap_err();
        assert!(error.to_string().contains("removed pids"), "{error}");
    }
}
