//! A supervision tree as data: [`SupervisorSpec`] and its [`ChildSpec`]s, read from JSON
//! (a `spawn` of the built-in kind `supervisor`) or TOML (`wasmproc run --supervise`)
//! into the same structs, and checked by [`SupervisorSpec::validate`] before anything
//! starts.
//!
//! The spec's parts the guest SDK writes too ([`Strategy`], [`Restart`], [`Shutdown`],
//! [`AutoShutdown`], [`Backoff`]) are defined once, in `wasmproc_types::supervisor`,
//! and re-exported here.
//!
//! Durations are written as text, a number and a unit: `"500ms"`, `"5s"`, `"1m 30s"`.
//! Every field but `strategy` and the children's `id` and `kind` has a default, the same
//! as OTP's where OTP has one.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmproc_types::Payload;
pub(crate) use wasmproc_types::supervisor::duration_text;
pub use wasmproc_types::supervisor::{AutoShutdown, Backoff, Restart, Shutdown, Strategy};

/// The most children one supervisor holds: the static children of its spec, or the
/// children a `simple_one_for_one` supervisor has started and not yet lost. The
/// scheduler's own `max_children` bounds every process's children too; this bound keeps
/// a supervisor's bookkeeping (which it scans on every exit) small whatever that is.
pub const MAX_CHILDREN: usize = 10_000;

/// The longest child id, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// How a supervisor restarts its children, and when it gives up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSpec {
    /// Which children a child's restart takes with it.
    pub strategy: Strategy,
    /// The most restarts within `period`: one more, and the supervisor stops every
    /// child and ends with an error naming the child. By default 1 (as OTP).
    #[serde(default = "default_intensity")]
    pub intensity: u32,
    /// The sliding window restarts are counted in. By default 5 s (as OTP).
    #[serde(default = "default_period", with = "duration_text")]
    pub period: Duration,
    /// The delay before each restart. By default none (as OTP).
    #[serde(default)]
    pub backoff: Backoff,
    /// Whether the end of significant children ends the supervisor. By default never.
    #[serde(default)]
    pub auto_shutdown: AutoShutdown,
    /// The children, started in this order and stopped in the reverse. For
    /// `simple_one_for_one`, exactly one: the template of the children started at run
    /// time (`start_child`).
    #[serde(default)]
    pub children: Vec<ChildSpec>,
}

/// One child: what to start, and how to restart and stop it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildSpec {
    /// Unique among the supervisor's children; names the child in control messages and
    /// in the supervisor's errors.
    pub id: String,
    /// The registered process kind to start (the CLI registers each component a spec
    /// names under its path).
    pub kind: String,
    /// The entry method. By default `main`.
    #[serde(default = "default_method")]
    pub method: String,
    /// The entry method's input: each value one JSON payload. By default none.
    #[serde(default)]
    pub input: Vec<serde_json::Value>,
    /// When the child is restarted. By default `permanent`.
    #[serde(default)]
    pub restart: Restart,
    /// How the child is stopped: `"brutal"` or a timeout (`"5s"`). By default 5 s.
    #[serde(default)]
    pub shutdown: Shutdown,
    /// Whether its end may end the supervisor (see [`AutoShutdown`]). By default not.
    #[serde(default)]
    pub significant: bool,
}

impl ChildSpec {
    /// A permanent child `id` of kind `kind` starting in `method`, without input.
    pub fn new(id: impl Into<String>, kind: impl Into<String>, method: impl Into<String>) -> Self {
        ChildSpec {
            id: id.into(),
            kind: kind.into(),
            method: method.into(),
            input: Vec::new(),
            restart: Restart::default(),
            shutdown: Shutdown::default(),
            significant: false,
        }
    }

    /// The input as payloads, with `extra` (a `start_child`'s) after the spec's own.
    pub(crate) fn payloads(&self, extra: &[serde_json::Value]) -> Vec<Payload> {
        self.input.iter().chain(extra).map(|value| Payload::json(value).expect("a JSON value serialises")).collect()
    }
}

fn default_intensity() -> u32 {
    1
}

fn default_period() -> Duration {
    Duration::from_secs(5)
}

fn default_method() -> String {
    "main".to_owned()
}

impl SupervisorSpec {
    /// A spec of `strategy` with the defaults and no children.
    pub fn new(strategy: Strategy) -> Self {
        SupervisorSpec {
            strategy,
            intensity: default_intensity(),
            period: default_period(),
            backoff: Backoff::default(),
            auto_shutdown: AutoShutdown::default(),
            children: Vec::new(),
        }
    }

    /// Reads a spec from JSON and validates it.
    ///
    /// # Errors
    ///
    /// JSON that is not a spec (with its line and column), or a spec
    /// [`SupervisorSpec::validate`] refuses.
    pub fn from_json(json: &[u8]) -> anyhow::Result<Self> {
        let spec: SupervisorSpec =
            serde_json::from_slice(json).map_err(|e| anyhow::anyhow!("invalid supervisor spec: {e}"))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks what the types do not: each error names the field (`children[2].id`) and
    /// the value.
    ///
    /// # Errors
    ///
    /// A static strategy without children, `simple_one_for_one` with other than one,
    /// more than [`MAX_CHILDREN`], an empty, overlong or repeated id, an empty kind or
    /// method, a zero period, a backoff whose `multiplier` is below 1, `jitter` outside
    /// 0..=1 or `max` below `initial`, and significant children that are `permanent` or
    /// under `auto_shutdown: never`.
    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::{bail, ensure};
        let count = self.children.len();
        match self.strategy {
            Strategy::SimpleOneForOne => ensure!(
                count == 1,
                "`children`: a `simple_one_for_one` supervisor takes exactly one child spec, the template of its \
                 children, got {count}"
            ),
            strategy => {
                ensure!(count > 0, "`children`: a `{}` supervisor needs at least one child, got none", strategy.name())
            }
        }
        ensure!(count <= MAX_CHILDREN, "`children`: at most {MAX_CHILDREN} children, got {count}");
        ensure!(!self.period.is_zero(), "`period` must be longer than 0, got \"0s\"");
        let backoff = &self.backoff;
        ensure!(
            backoff.multiplier.is_finite() && backoff.multiplier >= 1.0,
            "`backoff.multiplier` must be at least 1, got {}",
            backoff.multiplier
        );
        ensure!(
            (0.0..=1.0).contains(&backoff.jitter),
            "`backoff.jitter` must be between 0 and 1, got {}",
            backoff.jitter
        );
        ensure!(
            backoff.max >= backoff.initial,
            "`backoff.max` ({}) must be at least `backoff.initial` ({})",
            duration_text::format(backoff.max),
            duration_text::format(backoff.initial)
        );
        for (i, child) in self.children.iter().enumerate() {
            let at = format!("children[{i}]");
            ensure!(!child.id.is_empty(), "`{at}.id` must not be empty");
            ensure!(child.id.len() <= MAX_ID_LEN, "`{at}.id` is {} bytes long; at most {MAX_ID_LEN}", child.id.len());
            if let Some(first) = self.children[..i].iter().position(|other| other.id == child.id) {
                bail!("`{at}.id`: the id `{}` is already the id of `children[{first}]`; ids must be unique", child.id);
            }
            ensure!(!child.kind.is_empty(), "`{at}.kind` (of child `{}`) must not be empty", child.id);
            ensure!(!child.method.is_empty(), "`{at}.method` (of child `{}`) must not be empty", child.id);
            if child.significant {
                ensure!(
                    self.auto_shutdown != AutoShutdown::Never,
                    "`{at}.significant`: child `{}` is significant, but `auto_shutdown` is `never`; set \
                     `auto_shutdown` to `any_significant` or `all_significant`",
                    child.id
                );
                ensure!(
                    child.restart != Restart::Permanent,
                    "`{at}.significant`: child `{}` is significant and `permanent`, so it never ends for good; a \
                     significant child is `transient` or `temporary`",
                    child.id
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> anyhow::Result<SupervisorSpec> {
        SupervisorSpec::from_json(json.as_bytes())
    }

    fn error(json: &str) -> String {
        format!("{:#}", spec(json).expect_err("the spec is refused"))
    }

    #[test]
    fn defaults_are_otps() {
        let spec = spec(r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": "worker"}]}"#).unwrap();
        assert_eq!((spec.intensity, spec.period), (1, Duration::from_secs(5)));
        assert_eq!(spec.backoff, Backoff::default());
        assert_eq!(spec.backoff.base_delay(1), Duration::ZERO, "no delay by default");
        assert_eq!(spec.auto_shutdown, AutoShutdown::Never);
        let child = &spec.children[0];
        assert_eq!(
            (child.method.as_str(), child.restart, child.shutdown),
            ("main", Restart::Permanent, Shutdown::default())
        );
        assert_eq!(child.shutdown, Shutdown::Timeout(Duration::from_secs(5)));
        assert!(!child.significant && child.input.is_empty());
    }

    #[test]
    fn every_field_reads_and_writes_back() {
        let spec = spec(
            r#"{"strategy": "rest_for_one", "intensity": 3, "period": "10s",
                "backoff": {"initial": "100ms", "max": "2s", "multiplier": 3, "jitter": 0.5},
                "auto_shutdown": "any_significant",
                "children": [
                  {"id": "db", "kind": "store", "method": "serve", "input": [{"port": 1}, 2],
                   "restart": "transient", "shutdown": "brutal", "significant": true},
                  {"id": "web", "kind": "app", "restart": "temporary", "shutdown": "1m 30s"}]}"#,
        )
        .unwrap();
        assert_eq!(spec.strategy, Strategy::RestForOne);
        assert_eq!((spec.intensity, spec.period), (3, Duration::from_secs(10)));
        assert_eq!(spec.backoff.initial, Duration::from_millis(100));
        assert_eq!(spec.children[0].shutdown, Shutdown::Brutal);
        assert_eq!(spec.children[1].shutdown, Shutdown::Timeout(Duration::from_secs(90)));
        assert_eq!(spec.children[0].payloads(&[serde_json::json!("x")]).len(), 3);
        let again: SupervisorSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(again, spec);
    }

    #[test]
    fn bad_specs_are_refused_naming_the_field_and_the_value() {
        let one = r#""children": [{"id": "a", "kind": "k"}]"#;
        let cases = [
            (r#"{"strategy": "one_for_one", "children": []}"#.to_owned(), "`children`: a `one_for_one` supervisor needs at least one child"),
            (r#"{"strategy": "simple_one_for_one", "children": [{"id": "a", "kind": "k"}, {"id": "b", "kind": "k"}]}"#.to_owned(), "exactly one child spec, the template of its children, got 2"),
            (r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": "k"}, {"id": "a", "kind": "j"}]}"#.to_owned(), "`children[1].id`: the id `a` is already the id of `children[0]`"),
            (r#"{"strategy": "one_for_one", "children": [{"id": "", "kind": "k"}]}"#.to_owned(), "`children[0].id` must not be empty"),
            (r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": ""}]}"#.to_owned(), "`children[0].kind` (of child `a`) must not be empty"),
            (format!(r#"{{"strategy": "one_for_one", "backoff": {{"multiplier": 0.5}}, {one}}}"#), "`backoff.multiplier` must be at least 1, got 0.5"),
            (format!(r#"{{"strategy": "one_for_one", "backoff": {{"jitter": 1.5}}, {one}}}"#), "`backoff.jitter` must be between 0 and 1, got 1.5"),
            (format!(r#"{{"strategy": "one_for_one", "backoff": {{"initial": "5s", "max": "1s"}}, {one}}}"#), "`backoff.max` (1s) must be at least `backoff.initial` (5s)"),
            (format!(r#"{{"strategy": "one_for_one", "period": "0s", {one}}}"#), "`period` must be longer than 0"),
            (r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": "k", "restart": "transient", "significant": true}]}"#.to_owned(), "`children[0].significant`: child `a` is significant, but `auto_shutdown` is `never`"),
            (r#"{"strategy": "one_for_one", "auto_shutdown": "any_significant", "children": [{"id": "a", "kind": "k", "significant": true}]}"#.to_owned(), "child `a` is significant and `permanent`"),
            (format!(r#"{{"strategy": "one_for_one", "period": "soon", {one}}}"#), "invalid duration `soon`"),
            (r#"{"strategy": "one_for_one", "children": [{"id": "a", "kind": "k", "shutdown": "later"}]}"#.to_owned(), "invalid shutdown `later`: expected \"brutal\" or a timeout"),
            (format!(r#"{{"strategy": "one_by_one", {one}}}"#), "unknown variant `one_by_one`"),
            (format!(r#"{{"strategy": "one_for_one", "intensty": 3, {one}}}"#), "unknown field `intensty`"),
            (r#"{"strategy": "one_for_one", "children": [{"id": "a"}]}"#.to_owned(), "missing field `kind`"),
        ];
        for (json, expected) in cases {
            let error = error(&json);
            assert!(error.contains(expected), "{json}\n  gave: {error}\n  not: {expected}");
        }
        let many: Vec<String> = (0..=MAX_CHILDREN).map(|i| format!(r#"{{"id": "c{i}", "kind": "k"}}"#)).collect();
        let too_many = error(&format!(r#"{{"strategy": "one_for_one", "children": [{}]}}"#, many.join(",")));
        assert!(too_many.contains(&format!("at most {MAX_CHILDREN} children, got {}", MAX_CHILDREN + 1)), "{too_many}");
        let misplaced = error(
            r#"{"strategy": "one_for_one",
  "children": [{"id": "a", "kind": 7}]}"#,
        );
        assert!(misplaced.contains("line 2"), "a JSON error says where: {misplaced}");
    }
}
