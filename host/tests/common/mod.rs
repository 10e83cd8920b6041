//! What the cluster's test binaries (`cluster.rs`, `cluster_auth.rs`) share: the
//! `wasmproc` binary they run, which only this package's tests can name
//! (`CARGO_BIN_EXE_wasmproc`), so it is here rather than in `wasmproc_tests`.

use std::process::{Child, Command};

/// A child process killed on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
