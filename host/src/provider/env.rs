//! `env.*`: the environment variables granted to processes (`--env NAME=VALUE`), and
//! no others: the host's own environment is never visible unless a grant passes a
//! variable through.
//!
//! - `env.get {"name"}` → the value, or `null` when it is not granted;
//! - `env.vars {}` → `[[name, value], …]`, every granted variable, in name order.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::{Provider, answer, input, unknown};
use crate::handler::Request;

/// The `env` provider: a fixed set of variables.
#[derive(Clone, Default)]
pub struct Env {
    vars: Arc<BTreeMap<String, String>>,
}

impl Env {
    /// A provider that answers with `vars`.
    pub fn new(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        Env { vars: Arc::new(vars.into_iter().collect()) }
    }
}

#[derive(Deserialize)]
struct Get {
    name: String,
}

impl Provider for Env {
    fn family(&self) -> &str {
        "env"
    }

    fn handle(&self, request: Request<'_>) {
        let outcome = match request.name() {
            "env.get" => answer(input::<Get>(request.name(), request.payload()).map(|get| self.vars.get(&get.name))),
            "env.vars" => answer(Ok(self.vars.iter().collect::<Vec<_>>())),
            name => answer::<()>(Err(unknown(name, "env", &["get", "vars"]))),
        };
        request.complete(outcome);
    }

    fn reads_only(&self, _: &str) -> bool {
        true
    }
}
