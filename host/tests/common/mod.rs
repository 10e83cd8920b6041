//! What the cluster's test binaries (`cluster.rs`, `cluster_auth.rs`) share besides
//! `wasmproc_tests` (`Killed`): the `wasmproc` binary they run, which only this package's
//! tests can name (`CARGO_BIN_EXE_wasmproc`), and a component's hash, in the host's own
//! `sha2`.

use std::process::Command;

/// The `wasmproc` binary this package builds.
pub fn wasmproc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wasmproc"))
}

/// A component's identity: `sha256:<hex>` of its bytes.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
