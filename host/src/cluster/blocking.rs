//! A blocking face for the cluster's JetStream clients ([`Io`]).

use std::future::Future;
use std::io;
use std::time::Duration;

/// A tokio runtime of its own for a blocking API over JetStream: the journal calls a
/// store from plain threads (its committer, a recovery) and from within other runtimes
/// (the service's handlers), so work goes to this runtime and the caller waits on a
/// channel, never on a runtime. Each call is bounded by `patience`.
pub(super) struct Io {
    runtime: Option<tokio::runtime::Runtime>,
    patience: Duration,
}

impl Io {
    pub(super) fn new(name: &str, patience: Duration) -> io::Result<Io> {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name(name).enable_all().build()?;
        Ok(Io { runtime: Some(runtime), patience })
    }

    pub(super) fn run<F>(&self, work: F) -> io::Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = self.runtime.as_ref().ok_or_else(|| io::Error::other("the JetStream client is closed"))?;
        let patience = self.patience;
        let (done, result) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = done.send(tokio::time::timeout(patience, work).await);
        });
        match result.recv() {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the NATS server did not answer within {patience:?}"),
            )),
            Err(_) => Err(io::Error::other("the JetStream client's runtime stopped")),
        }
    }
}

impl Io {
    /// Runs `work` on the runtime without waiting for it (a subscription's loop).
    pub(super) fn spawn<F>(&self, work: F) -> io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = self.runtime.as_ref().ok_or_else(|| io::Error::other("the JetStream client is closed"))?;
        runtime.spawn(work);
        Ok(())
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        // Dropping a runtime inside another would block there; this lets its threads go.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
