//! The one reader of a journal's records. Every read of them goes through
//! [`Journal::scan_records`], which decodes them in key order and names a damaged one by
//! its key; [`Journal::read_range`] groups them into each process's history, checking that
//! it begins with its spawn and has only one. A resume reads every history
//! ([`Journal::read_processes`]), [`Journal::runs`] only the spawns and exits, and
//! [`Journal::history`] every record as it is, to show it.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use wasmproc_types::{Payload, Pid};

use super::record::{EXIT, Record, SNAPSHOT, SPAWN, SPAWN_NOTED, SnapshotRecord, SpawnRecord, StepRecord};
use super::{Journal, Key};
use crate::step::Exited;

/// Which records a read decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decode {
    /// Every record.
    All,
    /// Spawn, snapshot and exit records only: the others are counted, not decoded (most of the cost
    /// of reading a journal is decoding its steps).
    SpawnsAndExits,
}

/// One process's history as read back.
pub(crate) struct Recorded {
    /// Its spawn record, or the spawn its snapshot holds.
    pub(crate) spawn: SpawnRecord,
    /// The snapshot its history begins with, in place of the records before it, and the
    /// snapshot's sequence number.
    pub(crate) snapshot: Option<(u64, Box<SnapshotRecord>)>,
    /// Its step records with their sequence numbers; empty unless every record is decoded.
    pub(crate) steps: Vec<(u64, StepRecord)>,
    /// The embedder's messages to it: (record, topic, body); empty unless every record is
    /// decoded.
    pub(crate) host_messages: Vec<(u64, String, Payload)>,
    /// The messages of processes of other journals it received: (sender, identity,
    /// topic, body); empty unless every record is decoded.
    pub(crate) received: Vec<(Pid, u64, String, Payload)>,
    pub(crate) exit: Option<Exited>,
    /// The sequence number after its last record: how many records it has.
    pub(crate) next_seq: u64,
}

impl Recorded {
    /// A history whose first record, at `seq`, is its spawn (`snapshot` is `None`) or the
    /// snapshot that holds `spawn`.
    fn beginning(spawn: SpawnRecord, snapshot: Option<(u64, Box<SnapshotRecord>)>, seq: u64) -> Recorded {
        Recorded {
            spawn,
            snapshot,
            steps: Vec::new(),
            host_messages: Vec::new(),
            received: Vec::new(),
            exit: None,
            next_seq: seq + 1,
        }
    }
}

fn damaged(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

impl Journal {
    /// Visits the records of the processes from `from` up to (not including) `to`, in key
    /// order, each decoded as `decode` says (`None`: one it does not decode). `visit` stops
    /// the read by breaking with what is wrong.
    ///
    /// # Errors
    ///
    /// The store's read error; a damaged record, named by its key; or what `visit` broke
    /// with (all but the first `InvalidData`).
    pub(crate) fn scan_records(
        &self,
        from: u64,
        to: Option<u64>,
        decode: Decode,
        visit: &mut dyn FnMut(Key, Option<Record>) -> ControlFlow<String>,
    ) -> std::io::Result<()> {
        let mut failure = None;
        self.store.scan(Key { process: from, seq: 0 }, &mut |key, value| {
            if to.is_some_and(|to| key.process >= to) {
                return ControlFlow::Break(());
            }
            let wanted = match decode {
                Decode::All => true,
                Decode::SpawnsAndExits => matches!(value.get(1), Some(&SPAWN | &SPAWN_NOTED | &SNAPSHOT | &EXIT)),
            };
            let record = if wanted {
                match Record::decode(value) {
                    Ok(record) => Some(record),
                    Err(error) => {
                        let pid = Pid::from_u64(key.process);
                        failure = Some(format!("record {} of process {pid}: {error}", key.seq));
                        return ControlFlow::Break(());
                    }
                }
            } else {
                None
            };
            match visit(key, record) {
                ControlFlow::Continue(()) => ControlFlow::Continue(()),
                ControlFlow::Break(wrong) => {
                    failure = Some(wrong);
                    ControlFlow::Break(())
                }
            }
        })?;
        match failure {
            Some(message) => Err(damaged(message)),
            None => Ok(()),
        }
    }

    /// The histories of the processes from `from` up to (not including) `to`.
    ///
    /// # Errors
    ///
    /// The store's read error, a damaged record (named by its key), or a process whose
    /// records do not begin with its one spawn record.
    pub(crate) fn read_range(
        &self,
        from: u64,
        to: Option<u64>,
        decode: Decode,
    ) -> std::io::Result<BTreeMap<Pid, Recorded>> {
        let mut saved: BTreeMap<Pid, Recorded> = BTreeMap::new();
        // The history being read: records come in key order, so a process's records are
        // together, and it goes into `saved` once the next process's begin.
        let mut current: Option<(Pid, Recorded)> = None;
        self.scan_records(from, to, decode, &mut |key, record| {
            let pid = Pid::from_u64(key.process);
            if current.as_ref().is_some_and(|(p, _)| *p != pid) {
                let (done, history) = current.take().expect("checked above");
                saved.insert(done, history);
            }
            match (&mut current, record) {
                (None, Some(Record::Spawn(spawn))) => {
                    current = Some((pid, Recorded::beginning(spawn, None, key.seq)));
                }
                (None, Some(Record::Snapshot(snapshot))) => {
                    let spawn = snapshot.spawn.clone();
                    current = Some((pid, Recorded::beginning(spawn, Some((key.seq, snapshot)), key.seq)));
                }
                (None, _) => return ControlFlow::Break(format!("process {pid} has records but no spawn record")),
                (Some((_, history)), record) => {
                    history.next_seq = key.seq + 1;
                    match record {
                        Some(Record::Spawn(_)) => {
                            return ControlFlow::Break(format!(
                                "process {pid} has a second spawn record at {}",
                                key.seq
                            ));
                        }
                        Some(Record::Snapshot(_)) => {
                            return ControlFlow::Break(format!(
                                "process {pid} has a snapshot at {} after other records",
                                key.seq
                            ));
                        }
                        Some(Record::Step(step)) => history.steps.push((key.seq, step)),
                        Some(Record::HostMessage { topic, body }) => history.host_messages.push((key.seq, topic, body)),
                        Some(Record::Received { from, id, topic, body }) => {
                            history.received.push((from, id, topic, body));
                        }
                        Some(Record::Exit(result)) => history.exit = Some(result),
                        None => {}
                    }
                }
            }
            ControlFlow::Continue(())
        })?;
        if let Some((pid, history)) = current {
            saved.insert(pid, history);
        }
        Ok(saved)
    }

    /// Reads every history, for a resume, on as many threads as the machine has cores:
    /// each reads and decodes the records of one range of processes (decoding is most of
    /// the cost of reading a journal of a million records), and the ranges are disjoint,
    /// so the histories need no merging beyond putting them together.
    ///
    /// # Errors
    ///
    /// The store cannot be read, or a record is damaged (named by its key): a journal that
    /// cannot be trusted is not resumed at all.
    pub(crate) fn read_processes(&self) -> anyhow::Result<BTreeMap<Pid, Recorded>> {
        // The processes in key order, to cut into ranges of about as many processes.
        let mut processes: Vec<u64> = Vec::new();
        self.store.scan(Key { process: 1, seq: 0 }, &mut |key, _| {
            if processes.last() != Some(&key.process) {
                processes.push(key.process);
            }
            ControlFlow::Continue(())
        })?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(processes.len()).max(1);
        let per = processes.len().div_ceil(threads).max(1);
        let ranges: Vec<(u64, Option<u64>)> = processes
            .chunks(per)
            .enumerate()
            .map(|(i, chunk)| (chunk[0], processes.get((i + 1) * per).copied()))
            .collect();
        let parts: Vec<anyhow::Result<BTreeMap<Pid, Recorded>>> = std::thread::scope(|scope| {
            let readers: Vec<_> = ranges
                .iter()
                .map(|&(from, to)| scope.spawn(move || Ok(self.read_range(from, to, Decode::All)?)))
                .collect();
            readers
                .into_iter()
                .map(|r| r.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a reader panicked"))))
                .collect()
        });
        let mut saved = BTreeMap::new();
        for part in parts {
            saved.append(&mut part.map_err(|error| error.context("the journal is damaged and cannot be resumed"))?);
        }
        Ok(saved)
    }
}
