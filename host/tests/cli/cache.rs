//! The compiled-code cache and precompiled files, as an attacker who can write them
//! would try them: each test has a cache and a key (a user) of its own.

use std::os::unix::fs::PermissionsExt as _;

use sha2::{Digest as _, Sha256};
use wasmproc_tests::guests::WASI_CLI;

use super::*;

/// A user of the binary: a cache directory and a configuration directory (the key) of
/// their own.
struct User {
    cache: PathBuf,
    config: PathBuf,
}

impl User {
    fn new(name: &str) -> User {
        let home = scratch(name);
        User { cache: home.join("cache"), config: home.join("config") }
    }

    /// Where `wasmproc` keeps this user's compiled code.
    fn cache_dir(&self) -> PathBuf {
        self.cache.join("wasmproc")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = wasmproc(args);
        command.env("XDG_CACHE_HOME", &self.cache).env("XDG_CONFIG_HOME", &self.config).stdin(Stdio::null());
        command
    }

    fn run(&self, args: &[&str]) -> Ran {
        finish(self.command(args).output().expect("wasmproc runs"))
    }

    /// The cache entry `inspect` names for `app` (compiling it into the cache if needed).
    fn entry(&self, app: &str) -> PathBuf {
        let found = self.run(&["inspect", app, "--json"]).expect(0).json();
        PathBuf::from(found["cache_entry"].as_str().expect("a cache entry is named"))
    }

    /// Runs HELLO's `greet` and asserts that HELLO ran (not code from elsewhere) and
    /// whether it was compiled now rather than loaded.
    #[track_caller]
    fn greet(&self) -> Ran {
        let ran = self.run(&["run", HELLO, "--method", "greet", "--input", "\"cache\""]).expect(0);
        assert_eq!(ran.stdout, "\"hello, cache\"\n", "HELLO ran as itself; stderr: {}", ran.stderr);
        ran
    }

    /// Whether `inspect` found HELLO's code in the cache.
    fn hello_cached(&self) -> bool {
        self.run(&["inspect", HELLO, "--json"]).expect(0).json()["cached"] == true
    }
}

/// The lines of stderr that are warnings.
fn warnings(ran: &Ran) -> Vec<&str> {
    ran.stderr.lines().filter(|line| line.contains("WARN")).collect()
}

/// An attack on the cache: the code of an entry replaced (here by another guest's
/// genuine code, so that the test sees which ran; breakpoints would crash the host) and
/// its integrity field recomputed as a SHA-256 (a checksum anyone can compute). Without the key
/// no tag can be made: the entry is refused and HELLO compiles and runs as itself.
#[test]
fn a_forged_cache_entry_is_refused_and_the_module_runs() {
    let user = User::new("cache-forged");
    let hello = user.entry(HELLO);
    let fan_out = std::fs::read(user.entry(FAN_OUT)).expect("read");
    // `MAGIC` (8 bytes), the kind (1), the tag (32), the code.
    let (head, code) = fan_out.split_at(8 + 1 + 32);
    let mut forged = head[..9].to_vec();
    forged.extend_from_slice(&Sha256::digest(code));
    forged.extend_from_slice(code);
    std::fs::write(&hello, &forged).expect("forge");

    let ran = user.greet();
    let warned = warnings(&ran);
    assert!(warned.iter().any(|w| w.contains("does not verify")), "the refusal is logged: {}", ran.stderr);
    assert!(user.hello_cached(), "the forgery was replaced by a good entry");
}

/// FAN_OUT's genuine entry, tag and all, copied over HELLO's name.
#[test]
fn an_entry_copied_over_another_modules_name_is_refused() {
    let user = User::new("cache-copied");
    let hello = user.entry(HELLO);
    std::fs::copy(user.entry(FAN_OUT), &hello).expect("copy");
    user.greet();
}

/// As root, an entry owned by another user (as with a shared `XDG_CACHE_HOME`) is not
/// loaded, and an entry others may write is not either: one warning a run, which says
/// what to do.
#[test]
fn an_entry_of_another_user_or_writable_by_others_is_refused_once() {
    let user = User::new("cache-owner");
    let hello = user.entry(HELLO);
    std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let ran = user.greet();
    let warned = warnings(&ran);
    assert_eq!(warned.len(), 1, "one warning: {}", ran.stderr);
    assert!(warned[0].contains("chmod go-w"), "it says what to do: {}", warned[0]);
    assert!(user.hello_cached(), "a good entry replaced it");

    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(&hello, Some(65534), Some(65534)).expect("chown");
        let ran = user.greet();
        let warned = warnings(&ran);
        assert_eq!(warned.len(), 1, "one warning: {}", ran.stderr);
        assert!(warned[0].contains("owned by uid 65534"), "{}", warned[0]);
    } else {
        eprintln!("not root: the test of an entry owned by another user is skipped");
    }
}

/// A cache directory others may write is neither read nor written, with one warning.
#[test]
fn a_cache_directory_writable_by_others_is_refused_with_one_warning() {
    let user = User::new("cache-open-dir");
    let hello = user.entry(HELLO);
    std::fs::remove_file(&hello).expect("remove");
    std::fs::set_permissions(user.cache_dir(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let ran = user.greet();
    let warned = warnings(&ran);
    assert_eq!(warned.len(), 1, "one warning: {}", ran.stderr);
    assert!(warned[0].contains("not using the compiled-code cache"), "{}", warned[0]);
    assert!(warned[0].contains("chmod go-w"), "it says what to do: {}", warned[0]);
    assert!(!hello.exists(), "nothing is written into the directory");
    let ran = user.run(&["inspect", HELLO]).expect(0);
    assert!(ran.stdout.contains("compiled now, not cached (the disk cache is not in use"), "{}", ran.stdout);
}

/// A FIFO in an entry's place (no one will ever write it) does not block the run.
#[test]
fn a_fifo_in_place_of_an_entry_does_not_block() {
    let user = User::new("cache-fifo");
    let hello = user.entry(HELLO);
    std::fs::remove_file(&hello).expect("remove");
    let made = Command::new("mkfifo").arg(&hello).status().expect("mkfifo runs");
    assert!(made.success());

    let mut child = user
        .command(&["run", HELLO, "--method", "greet", "--input", "\"fifo\""])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wasmproc runs");
    let deadline = Instant::now() + HANG;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run blocked on the FIFO for {HANG:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ran = finish(child.wait_with_output().expect("wasmproc ends")).expect(0);
    assert_eq!(ran.stdout, "\"hello, fifo\"\n");
    assert!(ran.stderr.contains("not a regular file"), "the FIFO is logged: {}", ran.stderr);
}

/// A precompiled file runs for the user who made it; altered (code changed, checksum
/// recomputed) it is refused; made by another user it is refused unless trusted.
#[test]
fn precompiled_files_run_only_for_their_maker_unless_trusted() {
    let (maker, other) = (User::new("precompiled-maker"), User::new("precompiled-other"));
    let dir = scratch("precompiled-files");
    let file = dir.join("hello.cwasm");
    let path = file.to_str().expect("utf-8");
    maker.run(&["compile", HELLO, "-o", path]).expect(0);
    let greet = ["run", path, "--method", "greet", "--input", "\"pre\""];
    assert_eq!(maker.run(&greet).expect(0).stdout, "\"hello, pre\"\n");

    other.run(&greet).expect(3).error_says("was not made with this user's key").error_says("`--trust-precompiled`");
    other.run(&["inspect", path]).expect(3).error_says("`--trust-precompiled`");
    let trusted = [&greet[..], &["--trust-precompiled"]].concat();
    assert_eq!(other.run(&trusted).expect(0).stdout, "\"hello, pre\"\n");

    // The code altered and its checksum recomputed: the layout is the magic, a header
    // line, the checksum, the tag, the code.
    let mut altered = std::fs::read(&file).expect("read");
    let line_end = altered.iter().skip(1).position(|&b| b == b'\n').expect("the magic line") + 1;
    let header_end = line_end + 1 + altered[line_end + 1..].iter().position(|&b| b == b'\n').expect("header");
    let code = header_end + 1 + 32 + 32;
    let last = altered.len() - 1;
    altered[last] ^= 0xff;
    let sum = Sha256::digest(&altered[code..]);
    altered[header_end + 1..header_end + 33].copy_from_slice(&sum);
    let altered_path = dir.join("altered.cwasm");
    std::fs::write(&altered_path, &altered).expect("write");
    maker.run(&["run", altered_path.to_str().expect("utf-8")]).expect(3).error_says(
        "was not made with this user's key (it was compiled by another user or on another machine, or altered",
    );
}

/// `inspect` shows a precompiled file's own hash as its hash, and the hash of the Wasm
/// it says it was compiled from apart.
#[test]
fn inspect_shows_a_precompiled_files_own_hash_and_its_source_apart() {
    let user = User::new("precompiled-inspect");
    let dir = scratch("precompiled-inspect-files");
    let file = dir.join("hello.cwasm");
    let path = file.to_str().expect("utf-8");
    user.run(&["compile", HELLO, "-o", path]).expect(0);
    let own = format!("{:x}", Sha256::digest(std::fs::read(&file).expect("read")));
    let source = format!("{:x}", Sha256::digest(std::fs::read(HELLO).expect("read")));

    let found = user.run(&["inspect", path, "--json"]).expect(0).json();
    assert_eq!(found["sha256"], own.as_str(), "{found}");
    assert_eq!(found["compiled_from_sha256"], source.as_str(), "{found}");
    let text = user.run(&["inspect", path]).expect(0).stdout;
    assert!(text.contains(&format!("sha256 {own})")), "{text}");
    assert!(text.contains(&format!("source:    compiled from sha256 {source}")), "{text}");
    let wasm = user.run(&["inspect", HELLO, "--json"]).expect(0).json();
    assert_eq!(wasm["sha256"], source.as_str());
    assert_eq!(wasm["compiled_from_sha256"], Value::Null);
}

/// `compile` of an ELF file (a native program, or wasmtime's own precompiled format) says
/// what it is, not that it is "already precompiled".
#[test]
fn compile_of_an_elf_file_says_it_is_not_wasm() {
    let user = User::new("compile-elf");
    let dir = scratch("compile-elf-files");
    let elf = dir.join("program");
    std::fs::write(&elf, b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0rest").expect("write");
    let out = dir.join("out.cwasm");
    user.run(&["compile", elf.to_str().expect("utf-8"), "-o", out.to_str().expect("utf-8")])
        .expect(3)
        .error_says("this is an ELF file (a native program, or wasmtime's precompiled format");
    // A file `wasmproc compile` made is still called precompiled.
    let made = dir.join("cli.cwasm");
    user.run(&["compile", WASI_CLI, "-o", made.to_str().expect("utf-8")]).expect(0);
    user.run(&["compile", made.to_str().expect("utf-8"), "-o", out.to_str().expect("utf-8")])
        .expect(3)
        .error_says("already precompiled");
}
