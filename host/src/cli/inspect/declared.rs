//! The grant each declared command needs from `wasmproc run` ([`GrantedBy`]); the
//! declarations themselves are read by the library ([`Declared`]).

pub(in crate::cli) use wasmproc::wasm::Declared;

/// What grants a command to a process of `wasmproc run`: its flag, as the run's denial of
/// it names (`providers.rs`). The one table of commands to flags, which `inspect` shows
/// and `run` checks its flags against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cli) enum GrantedBy<'a> {
    /// Nothing: granted by default.
    Default,
    /// `--allow terminate`.
    AllowTerminate,
    /// Not a command `wasmproc run` carries out: an embedder's.
    Embedders,
    /// `--allow-host`.
    AllowHost,
    /// `--kv`.
    Kv,
    /// `--dir`, or `--dir-rw`: the reads of `fs`.
    Dir,
    /// `--dir-rw`: the writes of `fs`.
    DirRw,
    /// The whole `fs` family, or an `fs` command of neither kind: reads with `--dir`,
    /// writes with `--dir-rw`.
    DirEither,
    /// `--env`.
    Env,
    /// `--provider FAMILY=FILE`.
    Provider(&'a str),
}

impl GrantedBy<'_> {
    /// What grants `command` (a name, or a family as `kv.*`).
    pub(in crate::cli) fn of(command: &str) -> GrantedBy<'_> {
        let Some((family, rest)) = command.split_once('.') else {
            return match command {
                "terminate" => GrantedBy::AllowTerminate,
                builtin if wasmproc::Capabilities::BUILTIN.contains(&builtin) => GrantedBy::Default,
                _ => GrantedBy::Embedders,
            };
        };
        match family {
            "http" => GrantedBy::AllowHost,
            "kv" => GrantedBy::Kv,
            "fs" => match rest {
                "read" | "list" | "stat" => GrantedBy::Dir,
                "write" | "mkdir" | "remove" => GrantedBy::DirRw,
                _ => GrantedBy::DirEither,
            },
            "env" => GrantedBy::Env,
            "time" | "random" => GrantedBy::Default,
            family => GrantedBy::Provider(family),
        }
    }

    /// The flag, as `inspect` shows it.
    pub(in crate::cli) fn flag(self) -> String {
        match self {
            GrantedBy::Default => "granted by default".to_owned(),
            GrantedBy::AllowTerminate => "--allow terminate".to_owned(),
            GrantedBy::Embedders => "not a command of `wasmproc run` (an embedder's)".to_owned(),
            GrantedBy::AllowHost => "--allow-host HOST[:PORT]".to_owned(),
            GrantedBy::Kv => "--kv DIR".to_owned(),
            GrantedBy::Dir => "--dir HOST::GUEST".to_owned(),
            GrantedBy::DirRw => "--dir-rw HOST::GUEST".to_owned(),
            GrantedBy::DirEither => "--dir HOST::GUEST (reads), --dir-rw HOST::GUEST (writes)".to_owned(),
            GrantedBy::Env => "--env NAME[=VALUE]".to_owned(),
            GrantedBy::Provider(family) => format!("--provider {family}=FILE"),
        }
    }
}

/// The flag that grants `command` to a process of `wasmproc run`, or that it is granted
/// by default ([`GrantedBy`]).
pub(in crate::cli) fn grant(command: &str) -> String {
    GrantedBy::of(command).flag()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::providers::FAMILIES;

    #[test]
    fn grants_name_the_run_flags() {
        assert_eq!(grant("kv.get"), "--kv DIR");
        assert_eq!(grant("kv.*"), "--kv DIR");
        assert_eq!(grant("http.request"), "--allow-host HOST[:PORT]");
        assert_eq!(grant("fs.write"), "--dir-rw HOST::GUEST");
        assert_eq!(grant("fs.read"), "--dir HOST::GUEST");
        assert_eq!(grant("env.get"), "--env NAME[=VALUE]");
        assert_eq!(grant("time.now"), "granted by default");
        assert_eq!(grant("sleep"), "granted by default");
        assert_eq!(grant("terminate"), "--allow terminate");
        assert_eq!(grant("inventory.reserve"), "--provider inventory=FILE");
        assert!(grant("reticulate").contains("an embedder's"));
        for family in FAMILIES {
            assert!(!grant(&format!("{family}.x")).starts_with("--provider"), "`{family}` needs its own grant");
        }
    }
}
