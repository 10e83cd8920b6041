//! An HTTP server on loopback that records what it is sent: the tests' outside world
//! for side effects that must happen once. Each request is answered `200` with its own
//! body, and kept as a [`Received`]: its path, its `Idempotency-Key` header and its body.
//!
//! Plain `std`, one thread per connection (a handful at once in the tests), requests of
//! at most [`MAX_BODY`] bytes; nothing else is served.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// The largest body recorded; a larger one is answered `413` and not kept.
pub const MAX_BODY: usize = 64 * 1024;
/// How long a connection may stay silent before it is dropped.
const IDLE: Duration = Duration::from_secs(30);

/// A request the [`Recorder`] was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The request's path, query included.
    pub path: String,
    /// Its `Idempotency-Key` header, if it had one.
    pub key: Option<String>,
    /// Its body, as text (lossy).
    pub body: String,
}

/// The server: see the module's docs. It serves until the test process ends.
pub struct Recorder {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Recorder {
    /// Listens on a free loopback port.
    ///
    /// # Panics
    ///
    /// No loopback port can be bound.
    pub fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the recorder");
        let port = listener.local_addr().expect("the recorder's address").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Recorder { port, received }
    }

    /// `host:port`, for `--allow-host`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The URL of `path` (which starts with `/`) on it.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request recorded so far, in the order they arrived.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().clone()
    }
}

/// Serves one connection's requests (keep-alive) until it closes or breaks the protocol.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Received>>) {
    let _ = stream.set_read_timeout(Some(IDLE));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let Some(path) = line.split_whitespace().nth(1).map(str::to_owned) else { return };
        let (mut length, mut key) = (0usize, None);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else { return };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                let Ok(parsed) = value.parse() else { return };
                length = parsed;
            } else if name.eq_ignore_ascii_case("idempotency-key") {
                key = Some(value.to_owned());
            }
        }
        if length > MAX_BODY {
            let _ =
                writer.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            return;
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        kept.lock().push(Received { path, key, body: String::from_utf8_lossy(&body).into_owned() });
        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n");
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(&body)).is_err() {
            return;
        }
    }
}
