//! Fetches a page over HTTP and keeps, in the host's key-value store, how many times each
//! URL was fetched and the size of its last body: state that outlives the run.
//!
//! ```text
//! wasmproc run fetcher.wasm --allow-host 127.0.0.1:8080 --kv ./state \
//!     --input '{"url": "http://127.0.0.1:8080/"}'
//! ```
//!
//! The count is kept with compare-and-swap, so fetchers running at once never lose an
//! increment.

use serde::{Deserialize, Serialize};
use wasmproc_guest::prelude::*;
use wasmproc_guest::ErrorCode;

/// What to fetch.
#[derive(Deserialize)]
struct Job {
    url: String,
}

/// What one fetch learned.
#[derive(Serialize)]
struct Fetched {
    status: u16,
    bytes: usize,
    /// How many times this URL has been fetched, this time included.
    fetches: u64,
}

/// The per-URL record in the store.
#[derive(Serialize, Deserialize, Default)]
struct Record {
    fetches: u64,
    last_bytes: usize,
}

/// Fetches `job.url` and counts the fetch.
#[entry]
async fn main(ctx: Ctx, job: Job) -> Result<Fetched> {
    let response = ctx.http().get(&job.url).await.context("fetching the page")?;
    let bytes = response.body.len();
    let key = format!("fetches/{}", job.url);
    let kv = ctx.kv();
    loop {
        let current = kv.get::<Record>(&key).await?;
        let (mut record, version) = current.map_or((Record::default(), 0), |v| (v.value, v.version));
        record.fetches += 1;
        record.last_bytes = bytes;
        match kv.compare_and_swap(&key, version, &record).await {
            Ok(_) => return Ok(Fetched { status: response.status, bytes, fetches: record.fetches }),
            // Another fetcher wrote first: read again and retry.
            Err(Error::Command { code: ErrorCode::Conflict, .. }) => {}
            Err(error) => return Err(error).context("counting the fetch"),
        }
    }
}

/// What [`flaky`] fetches.
#[derive(Deserialize)]
struct Flaky {
    /// Fetched first, once: an effect of the run's first steps.
    before: String,
    /// Fetched next; it must answer 200.
    url: String,
}

/// Fetches `before`, then `url`, and panics unless `url` answers 200. Run durably with
/// `--restart transient`, the panic is retried from the last journaled step: the fetch
/// of `url`, whose answer the journal never took, is made again, and `before` is not.
///
/// ```text
/// wasmproc run fetcher.wasm --method flaky --journal ./journal --restart transient \
///     --restart-intensity 3 --allow-host 127.0.0.1:8080 \
///     --input '{"before": "http://127.0.0.1:8080/a", "url": "http://127.0.0.1:8080/b"}'
/// ```
#[entry]
async fn flaky(ctx: Ctx, job: Flaky) -> Result<String> {
    ctx.http().get(&job.before).await.context("fetching `before`")?;
    let response = ctx.http().get(&job.url).await.context("fetching the page")?;
    if response.status != 200 {
        panic!("the server answered {}", response.status);
    }
    Ok(String::from_utf8_lossy(&response.body).into_owned())
}

wasmproc_guest::export!(main, flaky);
wasmproc_guest::uses!("http.request", "kv.get", "kv.cas");
