//! A `wasmproc serve` of its own on a free loopback port, for the CLI tests and the
//! benchmarks: started from a command the caller prepares (its binary, its environment),
//! its address read from what it says on stderr, killed (SIGKILL) when dropped.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `wasmproc serve`, killed when dropped.
pub struct Served {
    child: Child,
    address: String,
    data: PathBuf,
}

impl Served {
    /// Runs `command` (a `wasmproc` binary, with whatever environment the caller gives
    /// it) as `serve --data DATA --listen 127.0.0.1:0 FLAGS…`, and waits at most `patience`
    /// for it to say where it listens.
    ///
    /// # Panics
    ///
    /// The server cannot be run, or says nothing of where it listens in time.
    pub fn start(mut command: Command, data: &Path, flags: &[&str], patience: Duration) -> Served {
        let mut child = command
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the server starts");
        let stderr = child.stderr.take().expect("its stderr");
        let (found, address) = std::sync::mpsc::channel();
        // Until it listens, what it says, for the failure of a server that never does.
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let early = said.clone();
        // Reads stderr to its end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut listening = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on http://") {
                    let rest = &line[at + "listening on http://".len()..];
                    let _ = found.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
                    listening = true;
                } else if !listening && let Ok(mut said) = early.lock() {
                    said.push_str(&line);
                    said.push('\n');
                }
            }
        });
        let Ok(address) = address.recv_timeout(patience) else {
            let status = child.try_wait().ok().flatten();
            let _ = child.kill();
            let said = said.lock().map(|said| said.clone()).unwrap_or_default();
            panic!(
                "the server did not say where it listens within {patience:?} (exited: {status:?}); it said:\n{said}"
            );
        };
        Served { child, address, data: data.to_owned() }
    }

    /// Its `HOST:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// `http://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Its data directory.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// The admin's token, as the server wrote it in its data directory.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data.join("admin.token")).expect("the admin token").trim().to_owned()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it (SIGKILL) and waits for it.
    pub fn kill(mut self) {
        self.end();
    }

    fn end(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.end();
    }
}
