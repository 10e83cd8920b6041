//! Components moving between nodes: a node that lacks the component of a spawn fetches
//! its bytes from the spawner by hash, in chunks that fit a NATS frame, checks them
//! against the hash, and loads them once; concurrent spawns of one component share the
//! fetch.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use sha2::{Digest as _, Sha256};

use super::wire::{self, Body, Key, Peer};
use super::{Inner, Loader};
use crate::handler::Factory;

/// The largest component a node fetches: the CLI's default `--max-module-size`.
pub(super) const MAX_CODE: u64 = 128 << 20;
/// Bytes a chunk carries: under NATS's default 1 MiB frame with room for the header.
pub(super) const CHUNK: usize = 512 << 10;
/// How long one chunk may take to arrive.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(10);

/// The subject a node serves its components on.
pub(super) fn subject(prefix: &str, node: u16) -> String {
    format!("{prefix}.code.{node}")
}

/// Whether `bytes` are what `hash` (`sha256:<hex>`) names.
pub(super) fn verify(hash: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    ensure!(
        hash.strip_prefix("sha256:") == Some(hex.as_str()),
        "the component fetched as `{hash}` has hash `sha256:{hex}`"
    );
    Ok(())
}

/// The answer to a chunk request.
pub(super) fn answer(inner: &Inner, hash: &str, offset: u64) -> Body {
    let Some(bytes) = inner.code.read().get(hash).cloned() else {
        return Body::CodeChunk { result: Err(format!("node {} does not hold component `{hash}`", inner.node)) };
    };
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = (start + CHUNK).min(bytes.len());
    Body::CodeChunk { result: Ok((bytes.len() as u64, bytes[start..end].to_vec())) }
}

/// Fetches component `hash` from node `from`.
pub(super) async fn fetch(
    client: &async_nats::Client,
    key: &Key,
    me: Peer,
    prefix: &str,
    from: u16,
    hash: &str,
) -> anyhow::Result<Vec<u8>> {
    let subject = subject(prefix, from);
    let mut bytes = Vec::new();
    loop {
        let request =
            key.seal(&wire::encode(me, &Body::CodeRequest { hash: hash.to_owned(), offset: bytes.len() as u64 }));
        let reply = tokio::time::timeout(CHUNK_TIMEOUT, client.request(subject.clone(), request.into()))
            .await
            .with_context(|| format!("node {from} did not answer for component `{hash}` within {CHUNK_TIMEOUT:?}"))?
            .with_context(|| format!("failed to ask node {from} for component `{hash}`"))?;
        let (_, body) = wire::decode(key.open(&reply.payload)?)?;
        let Body::CodeChunk { result } = body else { bail!("node {from} answered a code request with another frame") };
        let (total, chunk) = result.map_err(anyhow::Error::msg)?;
        ensure!(total <= MAX_CODE, "component `{hash}` is {total} bytes, more than the {MAX_CODE} a node fetches");
        ensure!(!chunk.is_empty() || bytes.len() as u64 == total, "node {from} sent an empty chunk of `{hash}`");
        bytes.extend_from_slice(&chunk);
        ensure!(bytes.len() as u64 <= total, "node {from} sent more of `{hash}` than its size");
        if bytes.len() as u64 == total {
            verify(hash, &bytes)?;
            return Ok(bytes);
        }
    }
}

/// The factory of component `hash`: the one fetched before, or fetched now from node
/// `from` and loaded (once, however many spawns ask at the same time).
pub(super) async fn factory(
    inner: &Arc<Inner>,
    client: &async_nats::Client,
    me: Peer,
    from: u16,
    hash: &str,
) -> anyhow::Result<Arc<dyn Factory>> {
    if let Some(factory) = inner.fetched.read().get(hash) {
        return Ok(factory.clone());
    }
    let cell = inner.fetching.lock().entry(hash.to_owned()).or_default().clone();
    let result = cell
        .get_or_init(|| async {
            let loader: Loader = inner.loader.get().cloned().context("this node loads no fetched components")?;
            let bytes = fetch(client, &inner.key, me, &inner.prefix, from, hash).await?;
            let bytes: Arc<[u8]> = bytes.into();
            let load = bytes.clone();
            let factory = tokio::task::spawn_blocking(move || loader(&load))
                .await
                .context("the loading thread failed")?
                .with_context(|| format!("failed to load component `{hash}` fetched from node {from}"))?;
            inner.fetched.write().insert(hash.to_owned(), factory.clone());
            inner.code.write().insert(hash.to_owned(), bytes);
            // The name the node it came from knows it by, as that node last announced.
            let name =
                inner.view.read().iter().find(|n| n.id == from).and_then(|n| n.component_name(hash)).map(str::to_owned);
            if let Some(name) = name {
                inner.names.write().insert(hash.to_owned(), name);
            }
            Ok::<_, anyhow::Error>(factory)
        })
        .await;
    match result {
        Ok(factory) => Ok(factory.clone()),
        Err(error) => {
            // A failed fetch is not remembered: the next spawn tries again.
            let message = format!("{error:#}");
            inner.fetching.lock().remove(hash);
            bail!(message)
        }
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
