//! `run --supervise FILE` (a supervision tree described in a file) and `run --restart
//! POLICY` (the entry process under a one-child supervisor): the flags, reading and
//! checking the spec, and the components its children name.
//!
//! Both make the run's entry process the built-in `supervisor` (see
//! `wasmproc::supervisor`); the run ends when it ends, and prints its result.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use wasmproc::Payload;
use wasmproc::scheduler::SpawnOptions;
use wasmproc::scheduler::{Retry, RetryPolicy};
use wasmproc::supervisor::{self, AutoShutdown, Backoff, ChildSpec, Restart, Strategy, SupervisorSpec};

use super::{Exit, Failure, units};

/// How a run is supervised.
#[derive(Args, Debug)]
#[command(next_help_heading = "Supervision")]
pub(super) struct SuperviseArgs {
    /// Run the supervision tree described in FILE instead of one entry process: JSON, or
    /// TOML if FILE ends in .toml (the format is in the README, "Supervision"). Its
    /// supervisor is the entry process; the run ends when it ends, printing its result.
    /// A child's `kind` is a component's path, relative to FILE's directory, or
    /// `supervisor` for a nested supervisor (its spec its one input). Takes no APP.wasm,
    /// --method or --input: the file says what runs. With --journal the tree is durable:
    /// after a crash the same command resumes it by replay, restarting no child.
    #[arg(long, value_name = "FILE")]
    pub(super) supervise: Option<PathBuf>,
    /// Run the entry process under a supervisor that restarts it: `permanent` whenever it
    /// ends, `transient` when it fails (an error or a trap), `temporary` never. Past
    /// --restart-intensity restarts within --restart-period, the run ends with an error
    /// naming the last failure; a transient or temporary entry that ends for good ends
    /// the run with its result. With --journal, `transient` retries the process's traps
    /// from its last journaled step instead (the steps before the trap are replayed, not
    /// done again), and past the intensity the process fails with its trap; `permanent`
    /// is refused with --journal.
    #[arg(long, value_name = "POLICY", value_enum)]
    pub(super) restart: Option<RestartPolicy>,
    /// With --restart: the most restarts within --restart-period.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "restart")]
    pub(super) restart_intensity: u32,
    /// With --restart: the sliding window restarts are counted in (e.g. 5s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "5s", requires = "restart", value_parser = units::duration)]
    pub(super) restart_period: Duration,
    /// With --restart: the delay before the first restart within the period, doubled for
    /// each next one, up to 30s, less up to a tenth at random. [default: none]
    #[arg(long, value_name = "DURATION", requires = "restart", value_parser = units::duration)]
    pub(super) restart_backoff: Option<Duration>,
}

/// `--restart`'s policies: a child spec's restart types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum RestartPolicy {
    /// Restart whenever it ends.
    Permanent,
    /// Restart when it fails.
    Transient,
    /// Never restart (supervised all the same: stopped in order, reported alike).
    Temporary,
}

impl SuperviseArgs {
    /// Whether the run is supervised, either way.
    pub(super) fn supervised(&self) -> bool {
        self.supervise.is_some() || self.restart.is_some()
    }

    /// The flag that makes the run supervised, for errors that refuse another with it.
    pub(super) fn flag(&self) -> &'static str {
        if self.supervise.is_some() { "--supervise" } else { "--restart" }
    }

    /// The retry of a durable run's entry process (`--restart transient` with --journal):
    /// its traps retried from its last journaled step, as the --restart flags say.
    pub(super) fn retry(&self, durable: bool) -> Option<Retry> {
        if !durable || self.restart != Some(RestartPolicy::Transient) {
            return None;
        }
        let backoff = self.backoff().unwrap_or_default();
        Some(Retry::new(RetryPolicy { intensity: self.restart_intensity, period: self.restart_period, backoff }))
    }

    /// --restart-backoff's backoff.
    fn backoff(&self) -> Option<Backoff> {
        self.restart_backoff.map(|initial| Backoff {
            initial,
            max: initial.max(Duration::from_secs(30)),
            multiplier: 2.0,
            jitter: 0.1,
        })
    }

    /// The options that spawn the supervisor of `--restart`: one child, `id`, of the
    /// kind `kind` (the run's component) in `method` with `inputs`.
    pub(super) fn restart_options(
        &self,
        id: &str,
        kind: &str,
        method: &str,
        inputs: &[Payload],
    ) -> Result<Option<SpawnOptions>, Failure> {
        let Some(policy) = self.restart else { return Ok(None) };
        let input = inputs
            .iter()
            .map(|payload| payload.parse_json())
            .collect::<Result<Vec<serde_json::Value>, _>>()
            .map_err(|e| Failure::new(Exit::Usage, format!("--restart needs JSON input: {e}")))?;
        let mut child = ChildSpec::new(id, kind, method);
        child.input = input;
        child.restart = match policy {
            RestartPolicy::Permanent => Restart::Permanent,
            RestartPolicy::Transient => Restart::Transient,
            RestartPolicy::Temporary => Restart::Temporary,
        };
        let mut spec = SupervisorSpec::new(Strategy::OneForOne);
        // Ending for good ends the run with the child's result.
        if child.restart != Restart::Permanent {
            child.significant = true;
            spec.auto_shutdown = AutoShutdown::AnySignificant;
        }
        spec.intensity = self.restart_intensity;
        spec.period = self.restart_period;
        if let Some(backoff) = self.backoff() {
            spec.backoff = backoff;
        }
        spec.children.push(child);
        spec.spawn_options()
            .map(Some)
            .map_err(|e| Failure::new(Exit::Usage, format!("the --restart flags do not hold together: {e:#}")))
    }
}

/// The spec in `path` (TOML if it ends in `.toml`, else JSON), checked, at most
/// `max_size` bytes: what a supervisor would refuse is refused here, before anything
/// runs, with the file's name.
pub(super) fn read_spec(path: &Path, max_size: u64) -> Result<SupervisorSpec, Failure> {
    let shown = path.display();
    let bytes = read_bounded(path, max_size)
        .map_err(|e| Failure::new(Exit::Usage, format!("cannot read the supervisor spec `{shown}`: {e}")))?;
    let spec: SupervisorSpec = if path.extension().is_some_and(|ext| ext == "toml") {
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| Failure::new(Exit::Usage, format!("cannot read the supervisor spec `{shown}`: {e}")))?;
        toml::from_str(text).map_err(|e| {
            Failure::new(
                Exit::Usage,
                format!("cannot read the supervisor spec `{shown}`: {}", e.to_string().trim_end()),
            )
        })?
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| Failure::new(Exit::Usage, format!("cannot read the supervisor spec `{shown}`: {e}")))?
    };
    check(&spec).map_err(|e| Failure::new(Exit::Usage, format!("the supervisor spec `{shown}` is refused: {e:#}")))?;
    Ok(spec)
}

/// The bytes of the regular file `path`, if it holds at most `max_size`.
fn read_bounded(path: &Path, max_size: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(max_size + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_size {
        return Err(std::io::Error::other(format!("larger than --max-payload ({max_size} bytes)")));
    }
    Ok(bytes)
}

/// Validates `spec` and the specs of the supervisors nested in it.
fn check(spec: &SupervisorSpec) -> anyhow::Result<()> {
    spec.validate()?;
    for (i, child) in spec.children.iter().enumerate() {
        if child.kind == supervisor::KIND {
            let nested = nested(child).map_err(|e| anyhow::anyhow!("`children[{i}]` (`{}`): {e}", child.id))?;
            check(&nested).map_err(|e| anyhow::anyhow!("in the spec of `children[{i}]` (`{}`): {e:#}", child.id))?;
        }
    }
    Ok(())
}

/// The spec of a nested supervisor: its child spec's one input.
fn nested(child: &ChildSpec) -> anyhow::Result<SupervisorSpec> {
    anyhow::ensure!(
        child.method == supervisor::START,
        "a nested supervisor's `method` is `{}`, got `{}`",
        supervisor::START,
        child.method
    );
    let [spec] = child.input.as_slice() else {
        anyhow::bail!("a nested supervisor takes one input, its spec, got {}", child.input.len());
    };
    serde_json::from_value(spec.clone()).map_err(|e| anyhow::anyhow!("its input is not a supervisor spec: {e}"))
}

/// The components the spec's children name, at any depth, each once: `(kind, path)`,
/// the path relative to `base` unless absolute.
pub(super) fn components(spec: &SupervisorSpec, base: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    collect(spec, base, &mut found);
    found
}

fn collect(spec: &SupervisorSpec, base: &Path, found: &mut Vec<(String, PathBuf)>) {
    for child in &spec.children {
        if child.kind == supervisor::KIND {
            if let Ok(nested) = nested(child) {
                collect(&nested, base, found);
            }
        } else if !found.iter().any(|(kind, _)| *kind == child.kind) {
            found.push((child.kind.clone(), base.join(&child.kind)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wasmproc-supervise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn toml_and_json_read_the_same_spec() {
        let toml = write(
            "a.toml",
            "strategy = \"rest_for_one\"\nintensity = 3\nperiod = \"10s\"\n\n[backoff]\ninitial = \"100ms\"\n\n\
             [[children]]\nid = \"db\"\nkind = \"db.wasm\"\ninput = [{ port = 1 }]\n\n\
             [[children]]\nid = \"web\"\nkind = \"web.wasm\"\nrestart = \"transient\"\nshutdown = \"brutal\"\n",
        );
        let json = write(
            "a.json",
            r#"{"strategy": "rest_for_one", "intensity": 3, "period": "10s", "backoff": {"initial": "100ms"},
                "children": [{"id": "db", "kind": "db.wasm", "input": [{"port": 1}]},
                             {"id": "web", "kind": "web.wasm", "restart": "transient", "shutdown": "brutal"}]}"#,
        );
        let (toml, json) = (read_spec(&toml, 1 << 20).unwrap(), read_spec(&json, 1 << 20).unwrap());
        assert_eq!(toml, json);
        let kinds = components(&toml, Path::new("/specs"));
        assert_eq!(kinds, [("db.wasm".into(), "/specs/db.wasm".into()), ("web.wasm".into(), "/specs/web.wasm".into())]);
    }

    #[test]
    fn a_bad_file_says_where() {
        let toml = write("bad.toml", "strategy = \"one_for_one\"\n\n[[children]]\nid = \"a\"\nkind = 7\n");
        let error = read_spec(&toml, 1 << 20).unwrap_err().message;
        assert!(error.contains("bad.toml") && error.contains("line 5"), "{error}");
        let json = write("bad.json", "{\"strategy\": \"one_for_one\",\n \"children\": [{\"id\": \"a\"}]}");
        let error = read_spec(&json, 1 << 20).unwrap_err().message;
        assert!(error.contains("missing field `kind` at line 2"), "{error}");
        let nested = write(
            "nested.json",
            r#"{"strategy": "one_for_one", "children": [{"id": "inner", "kind": "supervisor", "method": "start",
                "input": [{"strategy": "one_for_all", "children": []}]}]}"#,
        );
        let error = read_spec(&nested, 1 << 20).unwrap_err().message;
        assert!(error.contains("in the spec of `children[0]` (`inner`): `children`: a `one_for_all` supervisor needs at least one child"), "{error}");
    }
}
