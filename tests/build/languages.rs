//! Builds the Python guests (`examples-python/NAME.py`, with componentize-py) and the
//! JavaScript guests (`examples-js/NAME.js`, with componentize-js) as components of the
//! `process` world of `wit/`: `GUEST_PY_<NAME>` and `GUEST_JS_<NAME>` for the tests.
//!
//! The tools are installed, at the versions pinned below, into `<target>/guest-tools/`
//! (never into the repository, nor the user's own Python or npm): `pip install --target`
//! and `npm install --prefix`, as a fresh machine with only Python 3 and Node with npm
//! needs. An install that fails (no network, no `python3` or `npm`) fails the build with
//! what to do; nothing is skipped silently. An install counts only once its marker file
//! is written, so an interrupted one is made again. A lock file a language
//! (`guest-tools/py.lock`, `js.lock`) keeps two builds (the test and bench profiles) from
//! installing or building into the same place at once.
//!
//! Componentizing takes seconds (CPython or SpiderMonkey is linked into each guest), so a
//! guest is built again only when its source, the WIT or the tool's version changed: a
//! stamp beside the `.wasm` holds the hash of all three.

use std::error::Error;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// componentize-py from PyPI: CPython 3.x and its standard library in a component.
const COMPONENTIZE_PY: &str = "0.25.1";
/// componentize-js from npm: SpiderMonkey (StarlingMonkey) in a component.
const COMPONENTIZE_JS: &str = "0.23.0";

/// A language's toolchain.
#[derive(Clone, Copy)]
pub(crate) enum Language {
    Python,
    JavaScript,
}

impl Language {
    /// The directory of its examples, under the repository's root.
    pub(crate) fn examples(self) -> &'static str {
        match self {
            Language::Python => "examples-python",
            Language::JavaScript => "examples-js",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Language::Python => "py",
            Language::JavaScript => "js",
        }
    }

    /// The prefix of its guests' variables: `GUEST_PY_`, `GUEST_JS_`.
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            Language::Python => "PY",
            Language::JavaScript => "JS",
        }
    }

    fn version(self) -> &'static str {
        match self {
            Language::Python => COMPONENTIZE_PY,
            Language::JavaScript => COMPONENTIZE_JS,
        }
    }
}

/// Builds every example of `language` (each `NAME.<ext>` in its directory) into
/// `<target_dir>/wasm-guests/<ext>/NAME.wasm`, installing its tool into
/// `<target_dir>/guest-tools/` if it is not there; returns each guest's name and file.
pub(crate) fn build(
    language: Language,
    root: &Path,
    target_dir: &Path,
) -> Result<Vec<(String, PathBuf)>, Box<dyn Error>> {
    let examples = root.join(language.examples());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&examples)
        .map_err(|e| format!("cannot read `{}`: {e}", examples.display()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == language.extension()))
        .collect();
    sources.sort();
    if sources.is_empty() {
        return Err(format!("no guest in `{}`", examples.display()).into());
    }
    let tools = target_dir.join("guest-tools");
    std::fs::create_dir_all(&tools).map_err(|e| format!("cannot create `{}`: {e}", tools.display()))?;
    // The test and bench profiles run this script each, possibly at once, over the same
    // tool and guest directories: one holds the language's lock until its guests are
    // built (the lock goes with the file, when this function returns).
    let lock_path = tools.join(format!("{}.lock", language.extension()));
    let lock =
        std::fs::File::create(&lock_path).map_err(|e| format!("cannot create `{}`: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("cannot lock `{}`: {e}", lock_path.display()))?;
    let tool = install(language, &tools)?;
    let out = target_dir.join("wasm-guests").join(language.extension());
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create `{}`: {e}", out.display()))?;
    let wit = root.join("wit");
    let mut built = Vec::new();
    for source in sources {
        let name = source.file_stem().and_then(|s| s.to_str()).ok_or("a guest's file name is not UTF-8")?.to_owned();
        let wasm = out.join(format!("{name}.wasm"));
        let stamp = out.join(format!("{name}.stamp"));
        let hash = inputs_hash(language, &source, &wit)?;
        let fresh = wasm.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == hash);
        if !fresh {
            componentize(language, &tool, &source, &name, &wit, &out, &wasm)?;
            std::fs::write(&stamp, &hash).map_err(|e| format!("cannot write `{}`: {e}", stamp.display()))?;
        }
        built.push((name, wasm));
    }
    Ok(built)
}

/// The hash of what a guest is built from: its source, the WIT files and the tool's
/// version.
fn inputs_hash(language: Language, source: &Path, wit: &Path) -> Result<String, Box<dyn Error>> {
    let mut hasher = DefaultHasher::new();
    language.version().hash(&mut hasher);
    // The build's own code: how a guest is built (the flags) changes with it.
    include_str!("languages.rs").hash(&mut hasher);
    read(source)?.hash(&mut hasher);
    let mut wit_files: Vec<PathBuf> = std::fs::read_dir(wit)
        .map_err(|e| format!("cannot read `{}`: {e}", wit.display()))?
        .flatten()
        .map(|entry| entry.path())
        .collect();
    wit_files.sort();
    for file in wit_files {
        file.file_name().hash(&mut hasher);
        read(&file)?.hash(&mut hasher);
    }
    Ok(format!("{:016x}", hasher.finish()))
}

fn read(path: &Path) -> Result<Vec<u8>, Box<dyn Error>> {
    Ok(std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?)
}

/// Where an installed tool is: what the componentize step runs.
struct Tool {
    dir: PathBuf,
}

/// Installs `language`'s tool into `tools` unless its marker says it is there.
fn install(language: Language, tools: &Path) -> Result<Tool, Box<dyn Error>> {
    let (dir, marker) = match language {
        Language::Python => (tools.join("py"), format!("componentize-py-{COMPONENTIZE_PY}.installed")),
        Language::JavaScript => (tools.join("js"), format!("componentize-js-{COMPONENTIZE_JS}.installed")),
    };
    let marker = dir.join(marker);
    if marker.exists() {
        return Ok(Tool { dir });
    }
    // Whatever an interrupted install left is removed: the directory is the build's own.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove `{}`: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let (program, mut command, what) = match language {
        Language::Python => {
            let python = python();
            let mut command = Command::new(&python);
            command
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--upgrade", "--target"])
                .arg(&dir)
                .arg(format!("componentize-py=={COMPONENTIZE_PY}"));
            (python, command, format!("componentize-py {COMPONENTIZE_PY} from PyPI"))
        }
        Language::JavaScript => {
            // A manifest of its own: npm then installs into `dir` (not into a
            // `package.json` it finds further up) and keeps the dependencies' tree whole.
            let manifest = format!(
                "{{\"private\": true, \"dependencies\": {{\"@bytecodealliance/componentize-js\": \"{COMPONENTIZE_JS}\"}}}}\n"
            );
            let file = dir.join("package.json");
            std::fs::write(&file, manifest).map_err(|e| format!("cannot write `{}`: {e}", file.display()))?;
            let mut command = Command::new("npm");
            command.args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"]).arg(&dir);
            ("npm".to_owned(), command, format!("@bytecodealliance/componentize-js {COMPONENTIZE_JS} from npm"))
        }
    };
    // Cargo reads a build script's stdout for its directives: the tools' output goes to
    // stderr.
    let status = command.stdout(Stdio::from(std::io::stderr())).status().map_err(|e| {
        format!(
            "cannot run `{program}` to install {what} into `{}` ({e}): the {} example guests need it; \
             install {}",
            dir.display(),
            language.examples(),
            match language {
                Language::Python => "Python 3 with pip (or set $PYTHON)",
                Language::JavaScript => "Node.js with npm",
            }
        )
    })?;
    if !status.success() {
        return Err(format!(
            "failed to install {what} into `{}` ({status}; its messages are above): the `{}` guests need it, \
             and the build fails without them. Check the network access (or the registry and proxy settings of \
             {program}) and build again",
            dir.display(),
            language.examples()
        )
        .into());
    }
    std::fs::write(&marker, "").map_err(|e| format!("cannot write `{}`: {e}", marker.display()))?;
    Ok(Tool { dir })
}

/// The Python to run pip and componentize-py with: `$PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Builds `source` into `wasm`. The source is copied into `out` first: componentize-py
/// imports the module, which would write `__pycache__` beside it in the repository.
fn componentize(
    language: Language,
    tool: &Tool,
    source: &Path,
    name: &str,
    wit: &Path,
    out: &Path,
    wasm: &Path,
) -> Result<(), Box<dyn Error>> {
    let staged = out.join("src").join(name);
    std::fs::create_dir_all(&staged).map_err(|e| format!("cannot create `{}`: {e}", staged.display()))?;
    let file = staged.join(source.file_name().ok_or("a guest source has no file name")?);
    std::fs::copy(source, &file).map_err(|e| format!("cannot copy `{}`: {e}", source.display()))?;
    let mut command = match language {
        Language::Python => {
            let mut command = Command::new(python());
            command
                .env("PYTHONPATH", &tool.dir)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .args(["-c", "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; sys.exit(script())"])
                .arg("-d")
                .arg(wit)
                .args(["-w", "process", "componentize", "-p"])
                .arg(&staged)
                .arg(name)
                .arg("-o")
                .arg(wasm);
            command
        }
        Language::JavaScript => {
            let mut command = Command::new("node");
            command
                .arg(tool.dir.join("node_modules/@bytecodealliance/componentize-js/src/cli.js"))
                .arg(&file)
                .arg("--wit")
                .arg(wit)
                .args(["--world-name", "process"])
                // componentize-js imports `wasi:http` for `fetch` by default; the host links
                // WASI without it (a process reaches the network through the `http.*`
                // commands).
                .args(["--disable", "http", "fetch-event", "-o"])
                .arg(wasm);
            command
        }
    };
    let status =
        command.stdout(Stdio::from(std::io::stderr())).status().map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "failed to build the guest `{}` ({status}); the messages of {command:?} are above",
            source.display()
        )
        .into());
    }
    Ok(())
}
