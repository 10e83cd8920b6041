//! Requests: commands carried out by a process instead of a handler.
//!
//! [`Handle::forward`](super::Handle::forward) hands a command to a *serving* process
//! as a message: its sender is the process that yielded the command, its topic
//! `NAME#ID`, its body the command's input. The serving process answers with
//! [`Port::respond`](crate::Port::respond)`(ID, result)`, at once or steps later, in any
//! order, and that completes the command. This is how a provider
//! written as Wasm serves a family of commands (`wasmproc run --provider`).
//!
//! Every request is answered exactly once: by its server, or, when the server ends
//! first, with an error saying so (the pending request's completer is dropped with a
//! reason rather than left waiting).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use wasmproc_types::{Payload, Pid};

use crate::error::{PortError, SendError};
use crate::handler::{Completer, Request};
use crate::limits::payload_limit_exceeded;
use crate::step::Outcome;

/// The requests a scheduler's processes have not answered yet.
#[derive(Default)]
pub(super) struct Requests {
    next: AtomicU64,
    pending: Mutex<FxHashMap<u64, Pending>>,
    /// Requests ever sent and not yet taken out of `pending`: every process's end looks
    /// here first, so a scheduler that serves no requests never takes the lock for it.
    outstanding: AtomicUsize,
}

struct Pending {
    server: Pid,
    done: Completer,
}

impl Requests {
    /// Fails every request `server` holds: it has ended without answering them.
    pub(super) fn abandon(&self, server: Pid) {
        if self.outstanding.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut pending = self.pending.lock();
        let ids: Vec<u64> = pending.iter().filter(|(_, p)| p.server == server).map(|(id, _)| *id).collect();
        let abandoned: Vec<Pending> = ids.iter().filter_map(|id| pending.remove(id)).collect();
        self.outstanding.fetch_sub(abandoned.len(), Ordering::AcqRel);
        drop(pending);
        for request in abandoned {
            request.done.complete(Err(format!("unavailable: process {server} ended before it answered")));
        }
    }
}

impl Requests {
    /// Hands the custom command `request` to the process `server` to carry out, through
    /// `send` (from the caller, to the server): see
    /// [`Handle::forward`](super::Handle::forward). `durable`: the scheduler has a
    /// journal, and refuses.
    pub(super) fn forward(
        &self,
        durable: bool,
        server: Pid,
        request: Request<'_>,
        send: impl FnOnce(Pid, Pid, String, Payload) -> Result<(), SendError>,
    ) -> Result<(), SendError> {
        let key = request.idempotency_key();
        let name = request.name().to_owned();
        let (payload, done) = request.into_parts();
        if durable {
            let error = SendError::Journal("a durable scheduler does not serve requests".to_owned());
            done.complete(Err(format!("unavailable: {error}")));
            return Err(error);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let caller = done.pid();
        let topic = match key {
            Some(key) => format!("{name}#{id}#{key}"),
            None => format!("{name}#{id}"),
        };
        // Pending before it is sent: the server may answer before `send` returns.
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        self.pending.lock().insert(id, Pending { server, done });
        let sent = send(caller, server, topic, payload);
        if let Err(error) = &sent
            && let Some(request) = self.pending.lock().remove(&id)
        {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            request.done.complete(Err(format!("unavailable: {error}")));
        }
        sent
    }

    /// Answers the request `id` that the process `server` was sent (see
    /// [`Port::respond`](crate::Port::respond)), with its payload limit `max_payload`.
    pub(super) fn respond(&self, server: Pid, max_payload: usize, id: u64, result: Outcome) -> Result<(), PortError> {
        let size = match &result {
            Ok(payload) => payload.data.len() + payload.format.as_str().len(),
            Err(error) => error.len(),
        };
        if size > max_payload {
            return Err(PortError::TooLarge(payload_limit_exceeded(size, "respond", max_payload)));
        }
        let mut pending = self.pending.lock();
        match pending.get(&id) {
            Some(request) if request.server == server => {
                let request = pending.remove(&id).expect("just looked up under the same lock");
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
                drop(pending);
                request.done.complete(result);
                Ok(())
            }
            _ => Err(PortError::NoRequest(id)),
        }
    }
}
