//! Components moving between nodes: a node that lacks the component of a spawn fetches
//! its bytes from the spawner (a node, or a client) by hash, in chunks that fit a NATS
//! frame, checks them against the hash, and loads them once; concurrent spawns of one
//! component in one run share the fetch.
//!
//! A component is spawnable by hash only within the runs that brought it: a
//! run whose spawner cannot hand over the bytes does not get to run what another run
//! brought, though its hash is public (`cluster ls`). A node started with components
//! shared (`ClusterConfig::share_components`) skips that.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures_util::StreamExt as _;

use super::shared::{Fetched, Inner, Loader};
use super::wire::{self, Body, Key, Peer};
use crate::handler::Factory;
use crate::scheduler::remote::RunId;

/// The largest component a node fetches: the CLI's default `--max-module-size`.
pub(super) const MAX_CODE: u64 = 128 << 20;
/// How long one chunk may take to arrive.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(10);

/// The subject a node serves its components on.
pub(super) fn subject(prefix: &str, node: u16) -> String {
    format!("{prefix}.code.{node}")
}

/// Whether `bytes` are what `hash` (`sha256:<hex>`) names.
pub(super) fn verify(hash: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let held = super::workflows::hash_of(bytes);
    ensure!(held == hash, "the component fetched as `{hash}` has hash `{held}`");
    Ok(())
}

/// Fetches component `hash` from whoever serves it on `subject` (a node's
/// `PREFIX.code.ID`, a client's `INBOX.code`).
pub(super) async fn fetch(
    client: &async_nats::Client,
    key: &Key,
    me: Peer,
    subject: &str,
    hash: &str,
) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    loop {
        let inbox = client.new_inbox();
        let mut answers = client.subscribe(inbox.clone()).await.context("failed to subscribe for a code answer")?;
        let body = wire::encode(me, &Body::CodeRequest { hash: hash.to_owned(), offset: bytes.len() as u64 });
        let request = key.seal(subject, &inbox, &body);
        client
            .publish_with_reply(subject.to_owned(), inbox.clone(), request.into())
            .await
            .with_context(|| format!("failed to ask `{subject}` for component `{hash}`"))?;
        let reply = tokio::time::timeout(CHUNK_TIMEOUT, answers.next())
            .await
            .ok()
            .flatten()
            .with_context(|| format!("no answer on `{subject}` for component `{hash}` within {CHUNK_TIMEOUT:?}"))?;
        let (_, body) = wire::decode(key.open(&inbox, "", &reply.payload)?)?;
        let Body::CodeChunk { result } = body else { bail!("`{subject}` answered a code request with another frame") };
        let (total, chunk) = result.map_err(anyhow::Error::msg)?;
        ensure!(total <= MAX_CODE, "component `{hash}` is {total} bytes, more than the {MAX_CODE} a node fetches");
        ensure!(!chunk.is_empty() || bytes.len() as u64 == total, "`{subject}` sent an empty chunk of `{hash}`");
        bytes.extend_from_slice(&chunk);
        ensure!(bytes.len() as u64 <= total, "`{subject}` sent more of `{hash}` than its size");
        if bytes.len() as u64 == total {
            verify(hash, &bytes)?;
            return Ok(bytes);
        }
    }
}

/// The factory of component `hash` for a spawn of run `run`: the one this node holds
/// for that run (or for all, with components shared), or fetched now from `source`
/// (the spawner's code subject) and loaded, once however many spawns of the run ask at
/// the same time, and once for all runs: a run that brings a component this node has
/// loaded for another hands over its bytes, checked against the hash, and loads nothing.
/// `from`: the node that serves it on `source`, if a node does (not a client).
pub(super) async fn factory(
    inner: &Arc<Inner>,
    client: &async_nats::Client,
    me: Peer,
    (source, from): (&str, Option<u16>),
    hash: &str,
    run: RunId,
) -> anyhow::Result<Arc<dyn Factory>> {
    if let Some(factory) = inner.factory_in(hash, run) {
        return Ok(factory);
    }
    let key = (hash.to_owned(), run.client);
    let cell = inner.fetching.lock().entry(key.clone()).or_default().clone();
    let result = cell
        .get_or_init(|| async {
            let loader: Loader = inner.loader.get().cloned().context("this node loads no fetched components")?;
            let bytes: Arc<[u8]> = fetch(client, &inner.key, me, source, hash).await?.into();
            let loaded = inner.fetched.read().get(hash).map(|fetched| fetched.factory.clone());
            let factory = match loaded {
                Some(factory) => factory,
                None => {
                    let load = bytes.clone();
                    tokio::task::spawn_blocking(move || loader(&load))
                        .await
                        .context("the loading thread failed")?
                        .with_context(|| format!("failed to load component `{hash}` fetched from `{source}`"))?
                }
            };
            let mut fetched = inner.fetched.write();
            let entry = fetched
                .entry(hash.to_owned())
                .or_insert_with(|| Fetched { factory: factory.clone(), runs: Default::default() });
            entry.runs.insert(run.client);
            inner.code.offer(hash.to_owned(), bytes);
            // The name the node it came from knows it by, as that node last announced.
            let name = inner
                .view
                .read()
                .iter()
                .find(|n| Some(n.id) == from)
                .and_then(|n| n.component_name(hash))
                .map(str::to_owned);
            if let Some(name) = name {
                inner.code.name_if_unnamed(hash, name);
            }
            Ok::<_, anyhow::Error>(entry.factory.clone())
        })
        .await;
    // Done with, either way: the run's next spawn finds the factory held for it, and a
    // failed fetch is not remembered (the next spawn tries again).
    inner.fetching.lock().remove(&key);
    match result {
        Ok(factory) => Ok(factory.clone()),
        Err(error) => bail!("{error:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_checked_against_their_hash() {
        let hash = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        verify(hash, b"hello").unwrap();
        let error = verify(hash, b"hellO").unwrap_err().to_string();
        assert!(error.contains("has hash `sha256:"), "{error}");
        assert!(verify("md5:00", b"hello").is_err());
    }
}
