//! A headless chromium driven through WebDriver: Debian's `chromium` under its
//! `chromedriver` (both installed by `.ci/run`; `WASMPROC_CHROMIUM` and
//! `WASMPROC_CHROMEDRIVER` name others), for the console's tests and benchmark. A small
//! client of the W3C WebDriver protocol over loopback HTTP; every wait is bounded.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::HANG;

/// How long the page may take to show what a test waits for.
pub const SHOWN: Duration = HANG;

/// The browser: `chromium`, or `WASMPROC_CHROMIUM`.
fn chromium() -> String {
    std::env::var("WASMPROC_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned())
}

/// Its WebDriver server: `chromedriver`, or `WASMPROC_CHROMEDRIVER`.
fn chromedriver() -> String {
    std::env::var("WASMPROC_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned())
}

/// One request to a WebDriver server on loopback: the answer's `value`, or a panic with
/// the error it names.
fn webdriver(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("cannot reach chromedriver: {e}"))?;
    // A bound on a failure: a new session starts chromium, which beside the rest of the
    // suite on two cores has taken longer than `HANG` to answer.
    stream.set_read_timeout(Some(3 * HANG)).expect("a read timeout");
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).map_err(|e| e.to_string())?;
    // The head, then as many bytes as it says: chromedriver keeps the connection open.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).map_err(|e| format!("no answer from chromedriver: {e}"))? {
            0 => return Err(format!("chromedriver closed the connection: {:?}", String::from_utf8_lossy(&head))),
            _ => head.push(byte[0]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:")?.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("an answer without a length: {head}"))?;
    let mut body = Vec::new();
    (&mut stream).take(length).read_to_end(&mut body).map_err(|e| format!("a short answer: {e}"))?;
    let body = String::from_utf8_lossy(&body);
    let json: Value = serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body:?}"))?;
    let value = json.get("value").cloned().unwrap_or(Value::Null);
    if head.get(9..12) != Some("200") {
        return Err(format!("{method} {path}: {value}"));
    }
    Ok(value)
}

/// A headless chromium under chromedriver, with one session; both end when dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    shots: PathBuf,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless chromium session
    /// with `profile` as its user data directory; screenshots go to `shots`.
    ///
    /// # Panics
    ///
    /// Without chromium or chromedriver (naming what to install), or if either does
    /// not start within [`HANG`].
    pub fn start(shots: &Path, profile: &Path) -> Browser {
        // A free port for chromedriver: taken, read and let go (a race with another
        // program taking it meanwhile is possible and would fail the start loudly).
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `{}` ({e}): install chromium and chromium-driver (`.ci/run` does)", chromedriver())
            });
        let mut browser = Browser { driver, port, session: String::new(), shots: shots.to_owned() };
        let begun = Instant::now();
        while webdriver(port, "GET", "/status", None).is_err() {
            assert!(begun.elapsed() < HANG, "chromedriver did not answer on port {port} within {HANG:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000", format!("--user-data-dir={}", profile.display())],
            },
        }}});
        let session = webdriver(port, "POST", "/session", Some(&capabilities))
            .unwrap_or_else(|e| panic!("chromedriver cannot start `{}`: {e}", chromium()));
        browser.session = session["sessionId"].as_str().expect("a session id").to_owned();
        std::fs::create_dir_all(shots).expect("the screenshots' directory");
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        webdriver(self.port, method, &format!("/session/{}{path}", self.session), body)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Navigates to `url`.
    pub fn go(&self, url: &str) {
        self.call("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body; its arguments in `arguments`) in the page.
    pub fn js(&self, script: &str, args: Value) -> Value {
        self.call("POST", "/execute/sync", Some(&json!({ "script": script, "args": args })))
    }

    /// Waits (at most [`SHOWN`]) until `script` gives something neither `null` nor
    /// `false`; that.
    #[track_caller]
    pub fn wait(&self, what: &str, script: &str, args: Value) -> Value {
        let begun = Instant::now();
        loop {
            let value = self.js(script, args.clone());
            if !value.is_null() && value != Value::Bool(false) {
                return value;
            }
            if begun.elapsed() > SHOWN {
                let shot = self.screenshot("timed-out");
                panic!("the page did not show {what} within {SHOWN:?} (screenshot {})", shot.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The element `css` selects, once there.
    #[track_caller]
    pub fn find(&self, css: &str) -> String {
        self.wait(&format!("`{css}`"), "return document.querySelector(arguments[0]) !== null;", json!([css]));
        let found = self.call("POST", "/element", Some(&json!({"using": "css selector", "value": css})));
        found.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).expect("an element id").to_owned()
    }

    /// Clicks `css`, as a user does (WebDriver's click: scrolled to, visible, not
    /// covered).
    #[track_caller]
    pub fn click(&self, css: &str) {
        let element = self.find(css);
        self.call("POST", &format!("/element/{element}/click"), Some(&json!({})));
    }

    /// Types `text` into `css`, after clearing it.
    #[track_caller]
    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css);
        self.call("POST", &format!("/element/{element}/clear"), Some(&json!({})));
        self.call("POST", &format!("/element/{element}/value"), Some(&json!({ "text": text })));
    }

    /// The text of the element `css` selects; empty if there is none.
    pub fn text(&self, css: &str) -> String {
        let text =
            self.js("const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", json!([css]));
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Saves a screenshot as `NAME.png` among the test's artefacts; its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let encoded = self.call("GET", "/screenshot", None);
        let png = base64_decode(encoded.as_str().expect("base64 text"));
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("the screenshot is written");
        println!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = webdriver(self.port, "DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
