//! A real HTTP server on loopback for the tests that fetch over the `http` provider:
//! `python3 -m http.server` serving a directory.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `python3 -m http.server` serving a directory on a free loopback port, killed on drop.
pub struct Site {
    child: Child,
    port: u16,
}

impl Site {
    /// Serves `dir`, once the server has said which port it took.
    ///
    /// # Panics
    ///
    /// `python3` cannot be run, or the server does not say its port.
    pub fn start(dir: &Path) -> Site {
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "--bind", "127.0.0.1", "0"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs (the CI machine has it)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).expect("the server says its port");
        // "Serving HTTP on 127.0.0.1 port 40013 (http://127.0.0.1:40013/) ..."
        let port = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Site { child, port }
    }

    /// The loopback port it serves on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
