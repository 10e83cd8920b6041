//! Builds the example guests (`examples-wasm/`, a workspace of its own) for
//! `wasm32-wasip2` and tells the tests where they are: one
//! `GUEST_<NAME>=<path to the .wasm>` variable per guest crate, the name uppercased with
//! `-` as `_` (`ping-pong` → `GUEST_PING_PONG`). Guests are never committed as binaries.
//!
//! The guests build in a target directory of their own (beside the outer build's, in
//! `wasm-guests/`): the outer cargo holds the lock on its own, and the guests need other
//! flags (see `examples-wasm/.cargo/config.toml`) that would rebuild one another's
//! dependencies if they shared a directory.
//!
//! The Python and JavaScript example guests (`examples-python/`, `examples-js/`) are
//! built too, at the same time, by `build/languages.rs`: `GUEST_PY_<NAME>` and
//! `GUEST_JS_<NAME>`.

use std::error::Error;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[path = "build/languages.rs"]
mod languages;
use languages::Language;

const TARGET: &str = "wasm32-wasip2";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("`CARGO_MANIFEST_DIR` is not set")?);
    let root = manifest_dir.parent().ok_or("the tests crate has no parent directory")?;
    let guests = root.join("examples-wasm");
    for dir in ["examples-wasm", "guest-sdk", "wit", Language::Python.examples(), Language::JavaScript.examples()] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("`OUT_DIR` is not set")?);
    // OUT_DIR is `<target>/<profile>/build/<crate>-<hash>/out`.
    let outer_target_dir = out_dir.ancestors().nth(4).ok_or("unexpected `OUT_DIR` layout")?;
    let target_dir = outer_target_dir.join("wasm-guests");
    // Where the tests install the tools they run (`nats.rs`), beside what the build installs.
    println!("cargo:rustc-env=WASMPROC_TARGET_DIR={}", outer_target_dir.display());

    // The Python and JavaScript guests build on threads of their own while cargo builds
    // the Rust ones: their tools use one core for much of the time.
    let (rust, others) = std::thread::scope(|scope| {
        let others = [Language::Python, Language::JavaScript].map(|language| {
            scope.spawn(move || {
                languages::build(language, root, outer_target_dir).map_err(|e| format!("{e}")).map(|b| (language, b))
            })
        });
        let rust = ensure_target_installed().and_then(|()| build_guests(&guests, &target_dir));
        (rust, others.map(|thread| thread.join().unwrap_or_else(|_| Err("a guest build thread panicked".into()))))
    });
    // Every failure is reported, not only the first.
    let failures: Vec<String> = std::iter::once(rust.as_ref().err().map(|e| e.to_string()))
        .chain(others.iter().map(|other| other.as_ref().err().cloned()))
        .flatten()
        .collect();
    if !failures.is_empty() {
        // `main`'s error is printed with `Debug`, which would escape the line breaks.
        for failure in &failures {
            eprintln!("error: {failure}");
        }
        return Err(format!("{} of the example guests' builds failed (see the errors above)", failures.len()).into());
    }
    let built = rust?;
    if built.is_empty() {
        return Err(format!("no guest was built from `{}`", guests.display()).into());
    }
    for (name, path) in built {
        println!("cargo:rustc-env=GUEST_{}={}", name.to_uppercase().replace('-', "_"), path.display());
    }
    for (language, built) in others.into_iter().flatten() {
        for (name, path) in built {
            let name = name.to_uppercase().replace('-', "_");
            println!("cargo:rustc-env=GUEST_{}_{name}={}", language.prefix(), path.display());
        }
    }
    Ok(())
}

/// Installs the target's standard library if the toolchain lacks it (a fresh machine);
/// a no-op when it is there.
fn ensure_target_installed() -> Result<(), Box<dyn Error>> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let libdir = Command::new(&rustc).args(["--print", "target-libdir", "--target", TARGET]).output()?;
    let libdir = PathBuf::from(String::from_utf8_lossy(&libdir.stdout).trim());
    if has_std(&libdir) {
        return Ok(());
    }
    let status = Command::new("rustup").args(["target", "add", TARGET]).status().map_err(|e| {
        format!("the `{TARGET}` standard library is missing and `rustup` could not be run to add it ({e}); run `rustup target add {TARGET}`")
    })?;
    if !status.success() {
        return Err(format!("`rustup target add {TARGET}` failed ({status})").into());
    }
    Ok(())
}

fn has_std(libdir: &Path) -> bool {
    std::fs::read_dir(libdir)
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        .unwrap_or(false)
}

/// Builds every member of the guests' workspace; returns each guest's name and `.wasm`.
fn build_guests(guests: &Path, target_dir: &Path) -> Result<Vec<(String, PathBuf)>, Box<dyn Error>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(guests)
        .args(["build", "--release", "--workspace", "--target", TARGET, "--message-format=json-render-diagnostics"])
        .arg("--target-dir")
        .arg(target_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // What cargo sets for this build script must not leak into the guests' build: the
    // flags are for the host, and under clippy the workspace wrapper would lint guests.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        command.env_remove(var);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("failed to run cargo to build the guests in `{}`: {e}", guests.display()))?;
    let stdout = child.stdout.take().ok_or("cargo's stdout was not captured")?;

    let mut built = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let message: serde_json::Value = match serde_json::from_str(&line?) {
            Ok(message) => message,
            Err(_) => continue,
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let name = message["target"]["name"].as_str().unwrap_or_default().to_owned();
        let wasm = message["filenames"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(message.get("executable"))
            .filter_map(|f| f.as_str())
            .find(|f| f.ends_with(".wasm"));
        if let Some(wasm) = wasm {
            built.push((name, PathBuf::from(wasm)));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(format!(
            "failed to build the example guests in `{}` for `{TARGET}` ({status}); the compiler's messages are above",
            guests.display()
        )
        .into());
    }
    built.sort();
    built.dedup();
    Ok(built)
}
