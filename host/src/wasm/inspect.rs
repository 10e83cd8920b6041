//! [`Runtime::inspect`]: what a program is, described without running it
//! ([`Inspection`], [`ProgramKind`]).

use std::path::PathBuf;

use super::bindings::WORLD;
use super::cache::{self, Compiled};
use super::precompiled;
use super::runtime::{Found, Runtime};
use super::wasi::COMMAND_ENTRY;

impl Runtime {
    /// Describes the program in `bytes` without running it: what it is, whether it fits
    /// the `process` world (and if not, why), its entry methods, imports and exports,
    /// and whether the disk cache already held its compiled code.
    ///
    /// # Errors
    ///
    /// The bytes are not Wasm, are past a compile limit, or do not compile, or are a
    /// precompiled file that cannot be loaded (the error says why).
    pub fn inspect(&self, bytes: &[u8]) -> anyhow::Result<Inspection> {
        let is_precompiled = precompiled::is_precompiled(bytes);
        self.check_wasm(bytes)?;
        let digest = cache::digest(bytes);
        let super::runtime::Built { compiled, found, image, reference, key } = self.code(bytes, &digest)?;
        // After the load, which decided whether the cache directory may be used.
        let cache_entry = self.disk().filter(|disk| !is_precompiled && disk.is_usable()).map(|disk| disk.entry(&key));
        let (kind, imports, exports) = match &compiled {
            Compiled::Module(module) => {
                let has_start = module.get_export("_start").is_some();
                let kind = if has_start { ProgramKind::WasiModule } else { ProgramKind::OtherModule };
                let imports = module.imports().map(|i| format!("{}#{}", i.module(), i.name())).collect();
                (kind, imports, module.exports().map(|e| e.name().to_owned()).collect())
            }
            Compiled::Component(component) => {
                let ty = component.component_type();
                let imports = ty.imports(self.engine()).map(|(name, _)| name.to_owned()).collect();
                // The hooks of hibernation are the host's, not the guest's.
                let exports: Vec<String> = ty
                    .exports(self.engine())
                    .map(|(name, _)| name.to_owned())
                    .filter(|name| !name.starts_with(super::hibernate::PREFIX))
                    .collect();
                let kind = if self.is_command(component) { ProgramKind::WasiCommand } else { ProgramKind::Process };
                (kind, imports, exports)
            }
        };
        let (entries, problem) = match (&kind, compiled) {
            (ProgramKind::Process, Compiled::Component(component)) => {
                match self.prepare(component, digest, image, reference) {
                    Ok(component) => (component.entries().to_vec(), None),
                    Err(e) => (Vec::new(), Some(format!("{e:#}"))),
                }
            }
            // What `run` would say: the checks of a command's load, linking included.
            (ProgramKind::WasiModule, Compiled::Module(module)) => match self.wasi_module(&module) {
                Ok(_) => (vec![COMMAND_ENTRY.to_owned()], None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
            },
            (ProgramKind::WasiCommand, _) => (vec![COMMAND_ENTRY.to_owned()], None),
            (ProgramKind::OtherModule, _) => (
                Vec::new(),
                Some(format!(
                    "a core module without a `_start` export: neither a WASI command nor a process \
                     (processes are components of the `{WORLD}` world)"
                )),
            ),
            (ProgramKind::WasiModule, Compiled::Component(_)) | (ProgramKind::Process, Compiled::Module(_)) => {
                unreachable!("programs are classified by what they compiled to, above")
            }
        };
        Ok(Inspection {
            kind,
            size: bytes.len() as u64,
            sha256: crate::codec::hex(&digest),
            source_sha256: precompiled::header(bytes).map(|header| header.source_sha256().to_owned()),
            precompiled: is_precompiled,
            cached: found == Found::OnDisk,
            cache_entry,
            problem,
            entries,
            imports,
            exports,
        })
    }
}

/// What a program is; see [`Inspection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgramKind {
    /// A component that should be of the `process` world (see [`Inspection::problem`]
    /// for whether it is).
    Process,
    /// A component exporting `wasi:cli/run`.
    WasiCommand,
    /// A preview 1 core module with `_start`.
    WasiModule,
    /// A core module that is no WASI command.
    OtherModule,
}

impl ProgramKind {
    /// A short description, as `wasmproc inspect` prints it.
    pub fn describe(self) -> &'static str {
        match self {
            ProgramKind::Process => "process component (wasmproc:process world)",
            ProgramKind::WasiCommand => "WASI command component (wasi:cli/run)",
            ProgramKind::WasiModule => "WASI preview 1 command module (_start)",
            ProgramKind::OtherModule => "core module (not runnable)",
        }
    }
}

/// What [`Runtime::inspect`] found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Inspection {
    /// What the program is.
    pub kind: ProgramKind,
    /// The file's size in bytes.
    pub size: u64,
    /// The SHA-256 of the file, in hex.
    pub sha256: String,
    /// For a precompiled file: the SHA-256 of the Wasm it was compiled from, in hex, as
    /// its header says.
    pub source_sha256: Option<String>,
    /// Whether the file was made by `wasmproc compile`.
    pub precompiled: bool,
    /// Whether the compiled code was loaded from the disk cache (it held a usable entry
    /// before this inspection) rather than compiled now.
    pub cached: bool,
    /// The disk cache's file for it (absent for precompiled files, without a disk cache,
    /// and when the cache directory was refused).
    pub cache_entry: Option<PathBuf>,
    /// Why it cannot run, if it cannot (for example the world export it lacks).
    pub problem: Option<String>,
    /// Its entry methods (`run` for a WASI command).
    pub entries: Vec<String>,
    /// What it imports: interface names for components, `module#name` for modules.
    pub imports: Vec<String>,
    /// What it exports.
    pub exports: Vec<String>,
}
