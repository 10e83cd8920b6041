//! Whole-instance hibernation: what of a live instance the host can reach, and how a
//! waiting process's instance is captured ([`Captured`]) and made again from it.
//!
//! wasmtime 48's component API reaches none of a core instance's globals, and its
//! linear memory only through the arena that made it (`memory.rs`). (`Instance::
//! debug_global` and `Store::debug_all_instances` reach them, but only on an engine with
//! `Config::guest_debug`, which instruments all compiled code.) So the host instruments
//! the component at load ([`instrument`]): every core module with mutable globals gets
//! exported functions that read and write each of them, the module that defines the
//! memory gets two that read its size and grow it, and the component lifts them as
//! extra exports named [`PREFIX`]`…`. Everything else a component may hold between two
//! steps is refused at load, and such a component is never hibernated whole (its
//! processes still give back their fiber stacks):
//!
//! - a start function (a core module's or the component's): re-instantiating would run
//!   it again, and what it does beyond memory and globals (host calls) would be seen;
//! - an instruction that changes a table (`table.set`, `table.grow`, `table.fill`,
//!   `table.copy`, `table.init`) or drops a segment (`elem.drop`, `data.drop`): the
//!   tables are made again from the component's element segments, and a dropped
//!   segment would be back;
//! - canonical built-ins other than `lift`, `lower` and `resource.drop` (resources the
//!   guest defines, the asynchronous ABI's tasks, streams and futures): their tables are
//!   the instance's and unreachable;
//! - more or less than one memory, a 64-bit or shared one, data segments the analysis
//!   cannot place (not `i32.const`, not in the memory's module), globals of types other
//!   than `i32`, `i64`, `f32` and `f64`, nested components.
//!
//! The resources the guest holds from the host (WASI's streams) live in the store's
//! `ResourceTable`: a process holding one is not hibernated at that moment (checked at
//! each hibernation, `process.rs`).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmparser::{
    CanonicalFunction, ComponentAlias, ComponentExternalKind, ComponentOuterAliasKind, ComponentTypeRef, Operator,
    Parser, Payload, ValType,
};

/// The start of the name of every export [`instrument`] adds.
pub(crate) const PREFIX: &str = "wasmproc-hibernate-";

/// Label of the key under which the disk cache keeps the code of an instrumented
/// component (`runtime.rs`): code compiled before instrumentation has no hooks.
pub(crate) const KEY_LABEL: &[u8] = b"wasmproc hibernation hooks v1";

/// The disk cache's key for the code of the component of `digest`, as prepared for this
/// host (instrumented, and split if its image is large; `runtime.rs`).
pub(crate) fn key(digest: &super::cache::Digest) -> super::cache::Digest {
    super::cache::digest(&[KEY_LABEL, digest.as_slice()].concat())
}

/// The names of the exports [`instrument`] adds.
pub(crate) mod names {
    pub(crate) const MEMORY_SIZE: &str = "wasmproc-hibernate-memory-size";
    pub(crate) const MEMORY_GROW: &str = "wasmproc-hibernate-memory-grow";

    /// The getter of global `k` (counted over the whole component), `wide` for a 64-bit one.
    pub(crate) fn get(k: usize, wide: bool) -> String {
        format!("wasmproc-hibernate-get{}-g{k}", if wide { 64 } else { 32 })
    }

    pub(crate) fn set(k: usize, wide: bool) -> String {
        format!("wasmproc-hibernate-set{}-g{k}", if wide { 64 } else { 32 })
    }
}

/// A mutable global a module defines: its index in the module and its type.
#[derive(Clone, Copy)]
struct Global {
    index: u32,
    ty: ValType,
}

impl Global {
    fn wide(self) -> bool {
        matches!(self.ty, ValType::I64 | ValType::F64)
    }
}

/// A top-level core module, as [`analyse`] reads it.
#[derive(Default)]
struct Module {
    range: Range<usize>,
    types: u32,
    imported_funcs: u32,
    funcs: u32,
    imported_globals: u32,
    globals: Vec<Global>,
    memories: u32,
    export_names: Vec<String>,
    /// Active segments: (offset in the memory, bytes in the component).
    segments: Vec<(usize, Range<usize>)>,
}

/// What [`analyse`] found: the modules and which of them each core instance instantiates.
struct Analysis {
    modules: Vec<Module>,
    /// For each core instance, the module it instantiates (`None`: made of exports).
    instances: Vec<Option<usize>>,
    /// The module that defines the one memory.
    memory_module: usize,
}

/// Why a component cannot be hibernated whole, or what it is made of.
fn analyse(bytes: &[u8]) -> Result<Analysis, String> {
    let mut modules: Vec<Module> = Vec::new();
    let mut instances: Vec<Option<usize>> = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("unreadable: {e}"))?;
        let in_module = depth == 2;
        match payload {
            // A module's own header comes after its section, which counted it.
            Payload::Version { .. } => {
                depth = depth.max(1);
                continue;
            }
            Payload::ModuleSection { unchecked_range, .. } => {
                modules.push(Module { range: unchecked_range, ..Module::default() });
                depth += 1;
                continue;
            }
            Payload::ComponentSection { .. } => return Err("it nests a component".into()),
            Payload::End(_) => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                continue;
            }
            _ => {}
        }
        if in_module {
            let module = modules.last_mut().ok_or("a module section out of place")?;
            module_payload(module, payload, bytes)?;
            continue;
        }
        match payload {
            Payload::ComponentStartSection { .. } => return Err("it has a start function".into()),
            Payload::InstanceSection(reader) => {
                for instance in reader {
                    instances.push(match instance.map_err(|e| e.to_string())? {
                        wasmparser::Instance::Instantiate { module_index, .. } => Some(module_index as usize),
                        wasmparser::Instance::FromExports(_) => None,
                    });
                }
            }
            Payload::ComponentCanonicalSection(reader) => {
                for canon in reader {
                    match canon.map_err(|e| e.to_string())? {
                        CanonicalFunction::Lift { .. }
                        | CanonicalFunction::Lower { .. }
                        | CanonicalFunction::ResourceDrop { .. } => {}
                        other => {
                            let name = format!("{other:?}");
                            let name = name.split([' ', '{', '(']).next().unwrap_or_default().to_owned();
                            return Err(format!("it uses the canonical built-in `{name}`"));
                        }
                    }
                }
            }
            Payload::ComponentAliasSection(reader) => {
                for alias in reader {
                    match alias.map_err(|e| e.to_string())? {
                        ComponentAlias::Outer { kind: ComponentOuterAliasKind::CoreModule, .. }
                        | ComponentAlias::InstanceExport { kind: ComponentExternalKind::Module, .. } => {
                            return Err("it aliases a core module".into());
                        }
                        _ => {}
                    }
                }
            }
            Payload::ComponentImportSection(reader) => {
                for import in reader {
                    if matches!(import.map_err(|e| e.to_string())?.ty, ComponentTypeRef::Module(_)) {
                        return Err("it imports a core module".into());
                    }
                }
            }
            _ => {}
        }
    }
    let instantiated = |m: usize| instances.iter().filter(|&&i| i == Some(m)).count();
    let mut defining = (0..modules.len()).filter(|&m| modules[m].memories > 0 && instantiated(m) > 0);
    let memory_module = defining.next().ok_or("it defines no memory")?;
    if defining.next().is_some() || modules[memory_module].memories != 1 || instantiated(memory_module) != 1 {
        return Err("it defines more than one memory".into());
    }
    for (m, module) in modules.iter().enumerate() {
        if m != memory_module && !module.segments.is_empty() && instantiated(m) > 0 {
            return Err("a module that does not define the memory has data segments".into());
        }
        if module.export_names.iter().any(|name| name.starts_with(PREFIX)) {
            return Err(format!("a module already exports a name starting with `{PREFIX}`"));
        }
    }
    Ok(Analysis { modules, instances, memory_module })
}

/// Reads one payload of a top-level core module into `module`.
fn module_payload(module: &mut Module, payload: Payload<'_>, bytes: &[u8]) -> Result<(), String> {
    let err = |e: wasmparser::BinaryReaderError| e.to_string();
    match payload {
        Payload::TypeSection(reader) => {
            for group in reader {
                module.types += u32::try_from(group.map_err(err)?.types().len()).map_err(|e| e.to_string())?;
            }
        }
        Payload::ImportSection(reader) => {
            for import in reader.into_imports() {
                match import.map_err(err)?.ty {
                    wasmparser::TypeRef::Func(_) | wasmparser::TypeRef::FuncExact(_) => module.imported_funcs += 1,
                    wasmparser::TypeRef::Global(_) => module.imported_globals += 1,
                    wasmparser::TypeRef::Memory(_) => {}
                    _ => {}
                }
            }
        }
        Payload::FunctionSection(reader) => module.funcs = reader.count(),
        Payload::MemorySection(reader) => {
            for memory in reader {
                let memory = memory.map_err(err)?;
                if memory.memory64 || memory.shared || memory.page_size_log2.is_some_and(|log| log != 16) {
                    return Err("its memory is 64-bit, shared or of a custom page size".into());
                }
                module.memories += 1;
            }
        }
        Payload::GlobalSection(reader) => {
            for (i, global) in reader.into_iter().enumerate() {
                let global = global.map_err(err)?;
                if !global.ty.mutable {
                    continue;
                }
                let ty = global.ty.content_type;
                if !matches!(ty, ValType::I32 | ValType::I64 | ValType::F32 | ValType::F64) {
                    return Err(format!("it has a mutable global of type `{ty}`"));
                }
                let index = module.imported_globals + u32::try_from(i).map_err(|e| e.to_string())?;
                module.globals.push(Global { index, ty });
            }
        }
        Payload::ExportSection(reader) => {
            for export in reader {
                module.export_names.push(export.map_err(err)?.name.to_owned());
            }
        }
        Payload::StartSection { .. } => return Err("a core module has a start function".into()),
        Payload::DataSection(reader) => {
            for data in reader {
                let data = data.map_err(err)?;
                let wasmparser::DataKind::Active { memory_index: 0, offset_expr } = data.kind else {
                    if matches!(data.kind, wasmparser::DataKind::Passive) {
                        continue;
                    }
                    return Err("a data segment is for another memory".into());
                };
                let mut ops = offset_expr.get_operators_reader();
                let offset = match (ops.read(), ops.read()) {
                    (Ok(Operator::I32Const { value }), Ok(Operator::End)) => value as u32 as usize,
                    _ => return Err("a data segment's offset is not an `i32.const`".into()),
                };
                let start = data.data.as_ptr() as usize - bytes.as_ptr() as usize;
                module.segments.push((offset, start..start + data.data.len()));
            }
        }
        Payload::CodeSectionEntry(body) => {
            let mut reader = body.get_operators_reader().map_err(err)?;
            while !reader.eof() {
                let name = match reader.read().map_err(err)? {
                    Operator::TableSet { .. } => "table.set",
                    Operator::TableGrow { .. } => "table.grow",
                    Operator::TableFill { .. } => "table.fill",
                    Operator::TableCopy { .. } => "table.copy",
                    Operator::TableInit { .. } => "table.init",
                    Operator::ElemDrop { .. } => "elem.drop",
                    Operator::DataDrop { .. } => "data.drop",
                    _ => continue,
                };
                return Err(format!("it uses `{name}`"));
            }
        }
        _ => {}
    }
    Ok(())
}

/// `bytes` (a component) with the hooks of hibernation added (see the module's docs), or
/// why it cannot be hibernated whole.
pub(crate) fn instrument(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use wasm_encoder::{
        Alias, CanonicalFunctionSection, ComponentAliasSection, ComponentExportKind, ComponentExportSection,
        ComponentTypeSection, ExportKind, PrimitiveValType,
    };
    let analysis = analyse(bytes)?;
    // The index spaces the new items are appended to.
    let mut validator = wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all());
    let types = validator.validate_all(bytes).map_err(|e| format!("it does not validate: {e}"))?;
    let types = types.as_ref();
    let core_funcs = types.function_count();
    let component_types = types.component_type_count();
    let component_funcs = types.component_function_count();

    // Each instantiated module rewritten once; the hooks of each instance of it aliased.
    let mut rewritten: Vec<Option<Vec<u8>>> = vec![None; analysis.modules.len()];
    for (m, module) in analysis.modules.iter().enumerate() {
        let memory = m == analysis.memory_module;
        if (module.globals.is_empty() && !memory) || !analysis.instances.contains(&Some(m)) {
            continue;
        }
        rewritten[m] = Some(rewrite_module(bytes, module, memory).ok_or("a core module cannot be rewritten")?);
    }

    let mut aliases = ComponentAliasSection::new();
    let mut lifts = CanonicalFunctionSection::new();
    let mut exports = ComponentExportSection::new();
    let mut component_types_section = ComponentTypeSection::new();
    // Types: 0 `() -> u32`, 1 `() -> u64`, 2 `(v: u32)`, 3 `(v: u64)`, 4 `(v: u32) -> u32`.
    component_types_section
        .function()
        .params(Vec::<(&str, PrimitiveValType)>::new())
        .result(Some(PrimitiveValType::U32.into()));
    component_types_section
        .function()
        .params(Vec::<(&str, PrimitiveValType)>::new())
        .result(Some(PrimitiveValType::U64.into()));
    component_types_section.function().params([("v", PrimitiveValType::U32)]).result(None);
    component_types_section.function().params([("v", PrimitiveValType::U64)]).result(None);
    component_types_section
        .function()
        .params([("v", PrimitiveValType::U32)])
        .result(Some(PrimitiveValType::U32.into()));
    let mut added = 0u32;
    let mut add = |instance: u32, core_name: &str, ty: u32, name: &str| {
        aliases.alias(Alias::CoreInstanceExport { instance, kind: ExportKind::Func, name: core_name });
        lifts.lift(core_funcs + added, component_types + ty, []);
        exports.export(name, ComponentExportKind::Func, component_funcs + added, None);
        added += 1;
    };
    let mut k = 0;
    for (instance, module) in analysis.instances.iter().enumerate() {
        let Some(m) = *module else { continue };
        let instance = u32::try_from(instance).map_err(|e| e.to_string())?;
        if m == analysis.memory_module {
            add(instance, names::MEMORY_SIZE, 0, names::MEMORY_SIZE);
            add(instance, names::MEMORY_GROW, 4, names::MEMORY_GROW);
        }
        for global in &analysis.modules[m].globals {
            let wide = global.wide();
            let (get, set) = (core_get(global.index), core_set(global.index));
            add(instance, &get, u32::from(wide), &names::get(k, wide));
            add(instance, &set, 2 + u32::from(wide), &names::set(k, wide));
            k += 1;
        }
    }

    let mut out = bytes[..8].to_vec();
    let mut module_index = 0;
    for (id, content) in super::image::sections(bytes, 8, bytes.len()).ok_or("unreadable sections")? {
        let replacement = match id {
            1 => {
                module_index += 1;
                rewritten[module_index - 1].as_deref()
            }
            _ => None,
        };
        let content = replacement.unwrap_or(&bytes[content]);
        out.push(id);
        write_u32(&mut out, u32::try_from(content.len()).map_err(|e| e.to_string())?);
        out.extend_from_slice(content);
    }
    let mut tail = wasm_encoder::Component::new();
    tail.section(&component_types_section);
    tail.section(&aliases);
    tail.section(&lifts);
    tail.section(&exports);
    out.extend_from_slice(&tail.finish()[8..]);
    Ok(out)
}

fn core_get(index: u32) -> String {
    format!("{PREFIX}get-{index}")
}

fn core_set(index: u32) -> String {
    format!("{PREFIX}set-{index}")
}

/// The module at `module.range` of `bytes` with the hooks added: a getter and a setter of
/// each mutable global it defines, and if `memory`, the memory's size and growth.
fn rewrite_module(bytes: &[u8], module: &Module, memory: bool) -> Option<Vec<u8>> {
    // Added types: 0 `() -> i32`, 1 `() -> i64`, 2 `(i32)`, 3 `(i64)`, 4 `(i32) -> i32`.
    let mut types = Vec::new();
    for (params, results) in
        [(&[][..], &[0x7f][..]), (&[], &[0x7e]), (&[0x7f], &[]), (&[0x7e], &[]), (&[0x7f], &[0x7f])]
    {
        types.push(0x60);
        write_u32(&mut types, params.len() as u32);
        types.extend_from_slice(params);
        write_u32(&mut types, results.len() as u32);
        types.extend_from_slice(results);
    }
    let base_type = module.types;
    // (type, body, export name) of each added function.
    let mut funcs: Vec<(u32, Vec<u8>, String)> = Vec::new();
    if memory {
        funcs.push((base_type, vec![0x3f, 0x00], names::MEMORY_SIZE.to_owned()));
        funcs.push((base_type + 4, vec![0x20, 0x00, 0x40, 0x00], names::MEMORY_GROW.to_owned()));
    }
    for global in &module.globals {
        let mut get = vec![0x23];
        write_u32(&mut get, global.index);
        let mut set = vec![0x20, 0x00];
        match global.ty {
            ValType::F32 => {
                get.push(0xbc);
                set.push(0xbe);
            }
            ValType::F64 => {
                get.push(0xbd);
                set.push(0xbf);
            }
            _ => {}
        }
        set.push(0x24);
        write_u32(&mut set, global.index);
        let wide = u32::from(global.wide());
        funcs.push((base_type + wide, get, core_get(global.index)));
        funcs.push((base_type + 2 + wide, set, core_set(global.index)));
    }
    let first_func = module.imported_funcs + module.funcs;
    let added = u32::try_from(funcs.len()).ok()?;
    let mut function_entries = Vec::new();
    let mut export_entries = Vec::new();
    let mut code_entries = Vec::new();
    for (i, (ty, body, name)) in funcs.iter().enumerate() {
        write_u32(&mut function_entries, *ty);
        write_u32(&mut export_entries, name.len() as u32);
        export_entries.extend_from_slice(name.as_bytes());
        export_entries.push(0x00);
        write_u32(&mut export_entries, first_func + i as u32);
        let mut code = vec![0x00];
        code.extend_from_slice(body);
        code.push(0x0b);
        write_u32(&mut code_entries, code.len() as u32);
        code_entries.extend_from_slice(&code);
    }
    // Section id, the entries appended, and how many.
    let additions: [(u8, &[u8], u32); 4] =
        [(1, &types, 5), (3, &function_entries, added), (7, &export_entries, added), (10, &code_entries, added)];
    let rank = |id: u8| [1u8, 2, 3, 4, 5, 13, 6, 7, 8, 9, 12, 10, 11].iter().position(|&r| r == id);
    let header = module.range.start.checked_add(8)?;
    let mut out = bytes.get(module.range.start..header)?.to_vec();
    let mut pending: Vec<(u8, &[u8], u32)> = additions.to_vec();
    let emit_new = |out: &mut Vec<u8>, (id, entries, count): (u8, &[u8], u32)| {
        let mut content = Vec::new();
        write_u32(&mut content, count);
        content.extend_from_slice(entries);
        out.push(id);
        write_u32(out, content.len() as u32);
        out.extend_from_slice(&content);
    };
    for (id, content) in super::image::sections(bytes, header, module.range.end)? {
        if id != 0 {
            // Sections this module lacks, whose place comes before this one.
            let this = rank(id)?;
            while let Some(&first) = pending.first() {
                if rank(first.0)? >= this || first.0 == id {
                    break;
                }
                emit_new(&mut out, pending.remove(0));
            }
        }
        if let Some(at) = pending.iter().position(|p| p.0 == id && id != 0) {
            let (_, entries, count) = pending.remove(at);
            let mut at = content.start;
            let old = super::image::read_u32(bytes, &mut at)?;
            let mut merged = Vec::new();
            write_u32(&mut merged, old.checked_add(count)?);
            merged.extend_from_slice(&bytes[at..content.end]);
            merged.extend_from_slice(entries);
            out.push(id);
            write_u32(&mut out, u32::try_from(merged.len()).ok()?);
            out.extend_from_slice(&merged);
            continue;
        }
        out.push(id);
        write_u32(&mut out, u32::try_from(content.len()).ok()?);
        out.extend_from_slice(&bytes[content]);
    }
    for addition in pending {
        emit_new(&mut out, addition);
    }
    Some(out)
}

fn write_u32(out: &mut Vec<u8>, value: u32) {
    super::image::write_u32(out, value);
}

/// The initial contents of a component's memory, page by page (host pages): what its
/// instantiation writes there. Pages not listed start zero.
pub(crate) struct Reference {
    page: usize,
    /// A page of zeros, to compare with (`memcmp`, fast in every build).
    zero: Vec<u8>,
    /// The pages with data, sorted.
    pages: Vec<u32>,
    /// Their bytes, `page` each, in the order of `pages`.
    data: Vec<u8>,
}

impl Reference {
    /// The reference of `bytes` (the component as given), if [`instrument`] takes it.
    pub(crate) fn of(bytes: &[u8]) -> Result<Reference, String> {
        let analysis = analyse(bytes)?;
        let page = rustix::param::page_size();
        let mut map: std::collections::BTreeMap<u32, Vec<u8>> = std::collections::BTreeMap::new();
        for (offset, range) in &analysis.modules[analysis.memory_module].segments {
            let body = &bytes[range.clone()];
            let mut done = 0;
            while done < body.len() {
                let at = offset + done;
                let index = u32::try_from(at / page).map_err(|e| e.to_string())?;
                let within = at % page;
                let n = (page - within).min(body.len() - done);
                let target = map.entry(index).or_insert_with(|| vec![0; page]);
                target[within..within + n].copy_from_slice(&body[done..done + n]);
                done += n;
            }
        }
        let mut pages = Vec::with_capacity(map.len());
        let mut data = Vec::with_capacity(map.len() * page);
        for (index, bytes) in map {
            pages.push(index);
            data.extend_from_slice(&bytes);
        }
        Ok(Reference { page, zero: vec![0; page], pages, data })
    }

    fn page(&self, index: u32) -> Option<&[u8]> {
        let at = self.pages.binary_search(&index).ok()?;
        Some(&self.data[at * self.page..(at + 1) * self.page])
    }
}

impl std::fmt::Debug for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reference").field("pages", &self.pages.len()).finish()
    }
}

/// What the processes of a runtime hibernated whole (`Runtime::hibernation_stats`).
#[derive(Default)]
pub(crate) struct Counts {
    now: AtomicU64,
    total: AtomicU64,
    wakes: AtomicU64,
    bytes: AtomicU64,
}

impl Counts {
    pub(crate) fn woken(&self) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> super::HibernationStats {
        super::HibernationStats {
            hibernated: self.now.load(Ordering::Relaxed),
            hibernations: self.total.load(Ordering::Relaxed),
            wakes: self.wakes.load(Ordering::Relaxed),
            kept_bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// A hibernated instance's memory: the pages that differ from its [`Reference`],
/// each compressed, and its size. Counted in its [`Counts`] while it lives.
pub(crate) struct Captured {
    /// The memory's size in bytes.
    pub(crate) size: usize,
    /// (page index, end of its compressed bytes in `data`), by page.
    pages: Vec<(u32, u32)>,
    data: Vec<u8>,
    counts: Arc<Counts>,
}

impl Captured {
    fn held(&self) -> u64 {
        (self.data.capacity() + self.pages.capacity() * std::mem::size_of::<(u32, u32)>()) as u64
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        self.counts.now.fetch_sub(1, Ordering::Relaxed);
        self.counts.bytes.fetch_sub(self.held(), Ordering::Relaxed);
    }
}

impl Captured {
    /// Captures the `size` bytes of memory at `base`.
    ///
    /// # Safety
    ///
    /// `[base, base + size)` is the live memory of an instance none of whose calls is
    /// under way, and `size` a multiple of the host page size.
    pub(crate) unsafe fn take(
        base: *const u8,
        size: usize,
        reference: &Reference,
        counts: &Arc<Counts>,
    ) -> Option<Captured> {
        let page = reference.page;
        let mut pages = Vec::new();
        let mut data = Vec::new();
        for index in 0..size / page {
            // SAFETY: the page lies inside the memory (the caller's contract).
            let now = unsafe { std::slice::from_raw_parts(base.add(index * page), page) };
            let index = u32::try_from(index).ok()?;
            let same = now == reference.page(index).unwrap_or(&reference.zero);
            if same {
                continue;
            }
            let start = data.len();
            data.resize(start + lz4_flex::block::get_maximum_output_size(page), 0);
            let n = lz4_flex::block::compress_into(now, &mut data[start..]).ok()?;
            data.truncate(start + n);
            pages.push((index, u32::try_from(data.len()).ok()?));
        }
        data.shrink_to_fit();
        pages.shrink_to_fit();
        let captured = Captured { size, pages, data, counts: counts.clone() };
        counts.now.fetch_add(1, Ordering::Relaxed);
        counts.total.fetch_add(1, Ordering::Relaxed);
        counts.bytes.fetch_add(captured.held(), Ordering::Relaxed);
        Some(captured)
    }

    /// Appends what [`Captured::decode`] reads back: the size, then each page's index
    /// and compressed bytes.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.size as u64).to_le_bytes());
        out.extend_from_slice(&(self.pages.len() as u64).to_le_bytes());
        let mut start = 0usize;
        for &(index, end) in &self.pages {
            let bytes = &self.data[start..end as usize];
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
            start = end as usize;
        }
    }

    /// Reads what [`Captured::encode`] wrote at the start of `bytes`; the rest of
    /// `bytes` with it. Counted in `counts`, as a capture is.
    ///
    /// # Errors
    ///
    /// `bytes` is cut short, or lists pages out of order or past the size.
    pub(crate) fn decode<'a>(bytes: &'a [u8], counts: &Arc<Counts>) -> Result<(Captured, &'a [u8]), String> {
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&'a [u8], String> {
            if rest.len() < n {
                return Err("the captured memory is cut short".to_owned());
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let size = usize::try_from(word(take(8)?)).map_err(|e| e.to_string())?;
        let count = word(take(8)?);
        let page = rustix::param::page_size();
        if size % 65536 != 0 || count > (size / page) as u64 {
            return Err(format!("a captured memory of {size} bytes with {count} pages"));
        }
        let mut pages = Vec::with_capacity(count as usize);
        let mut data = Vec::new();
        for _ in 0..count {
            let index = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
            let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
            if pages.last().is_some_and(|&(last, _)| last >= index) || (index as usize + 1) * page > size {
                return Err(format!("a captured page {index} out of order or past the memory's {size} bytes"));
            }
            data.extend_from_slice(take(len)?);
            pages.push((index, u32::try_from(data.len()).map_err(|e| e.to_string())?));
        }
        let captured = Captured { size, pages, data, counts: counts.clone() };
        counts.now.fetch_add(1, Ordering::Relaxed);
        counts.total.fetch_add(1, Ordering::Relaxed);
        counts.bytes.fetch_add(captured.held(), Ordering::Relaxed);
        Ok((captured, rest))
    }

    /// Writes the captured pages over a memory made from the reference.
    ///
    /// # Safety
    ///
    /// `[base, base + self.size)` is the memory of an instance just made, none of whose
    /// calls is under way, and already of that size.
    pub(crate) unsafe fn restore(&self, base: *mut u8, page: usize) -> Result<(), String> {
        let mut start = 0usize;
        for &(index, end) in &self.pages {
            let end = end as usize;
            let at = index as usize * page;
            if at + page > self.size {
                return Err(format!("a captured page at {at} lies past the memory's {} bytes", self.size));
            }
            // SAFETY: inside the memory (checked above), which the caller's contract
            // gives to this call alone.
            let target = unsafe { std::slice::from_raw_parts_mut(base.add(at), page) };
            let n = lz4_flex::block::decompress_into(&self.data[start..end], target).map_err(|e| e.to_string())?;
            if n != page {
                return Err(format!("a captured page decompressed to {n} bytes"));
            }
            start = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(module: &str) -> Vec<u8> {
        wat::parse_str(format!("(component (core module $m {module}) (core instance $i (instantiate $m)))")).unwrap()
    }

    #[test]
    fn what_cannot_be_captured_is_refused_with_a_reason() {
        let cases = [
            ("(memory 1) (table 1 funcref) (func (table.set (i32.const 0) (ref.null func)))", "table.set"),
            ("(memory 1) (table 1 funcref) (func (drop (table.grow (ref.null func) (i32.const 1))))", "table.grow"),
            ("(memory 1) (data \"x\") (func (data.drop 0))", "data.drop"),
            ("(memory 1) (func) (start 0)", "start function"),
            ("(memory 1) (global (mut v128) (v128.const i64x2 0 0))", "v128"),
            ("(memory 1) (memory 1)", "more than one memory"),
            ("(func)", "no memory"),
        ];
        for (module, reason) in cases {
            let refused = instrument(&component(module)).expect_err(module);
            assert!(refused.contains(reason), "{module}: {refused}");
        }
    }

    #[test]
    fn an_instrumented_component_validates_and_keeps_its_exports() {
        let bytes = wat::parse_str(
            "(component
               (core module $m (memory (export \"memory\") 1) (global $g (mut i32) (i32.const 7))
                 (global $h (mut f64) (f64.const 1.5)) (data (i32.const 5000) \"abc\")
                 (func (export \"f\") (result i32) (global.get $g)))
               (core instance $i (instantiate $m))
               (func (export \"f\") (result u32) (canon lift (core func $i \"f\"))))",
        )
        .unwrap();
        let out = instrument(&bytes).expect("instrumented");
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all()).validate_all(&out).unwrap();
        let reference = Reference::of(&bytes).unwrap();
        let page = rustix::param::page_size();
        assert_eq!(reference.pages, [(5000 / page) as u32]);
        assert_eq!(&reference.page((5000 / page) as u32).unwrap()[5000 % page..5000 % page + 3], b"abc");
    }

    /// The hooks read and write every kind of mutable global, and grow the memory: a
    /// second instance given the first's values through them computes what the first
    /// does next.
    #[test]
    fn the_hooks_carry_globals_of_every_type_and_the_memory_size_to_a_new_instance() {
        use wasmtime::component::{Component, Linker};
        let bytes = wat::parse_str(
            "(component
               (core module $m (memory (export \"memory\") 1)
                 (global $a (mut i32) (i32.const 7)) (global $b (mut i64) (i64.const -3))
                 (global $c (mut f32) (f32.const 0.5)) (global $d (mut f64) (f64.const 1.5))
                 (global $e i32 (i32.const 100))
                 (func (export \"bump\") (result i64)
                   (global.set $a (i32.add (global.get $a) (i32.const 1)))
                   (global.set $b (i64.sub (global.get $b) (i64.const 5)))
                   (global.set $c (f32.mul (global.get $c) (f32.const 3)))
                   (global.set $d (f64.div (global.get $d) (f64.const 4)))
                   (drop (memory.grow (i32.const 1)))
                   (i64.add
                     (i64.add (i64.extend_i32_u (global.get $a)) (global.get $b))
                     (i64.add (i64.trunc_f32_s (f32.mul (global.get $c) (f32.const 1000)))
                       (i64.add (i64.trunc_f64_s (f64.mul (global.get $d) (f64.const 1000000)))
                         (i64.mul (i64.extend_i32_u (memory.size)) (i64.const 1000000000)))))))
               (core instance $i (instantiate $m))
               (func (export \"bump\") (result s64) (canon lift (core func $i \"bump\"))))",
        )
        .unwrap();
        let instrumented = instrument(&bytes).expect("instrumented");
        let engine = wasmtime::Engine::default();
        let component = Component::new(&engine, &instrumented).unwrap();
        let linker = Linker::<()>::new(&engine);
        let mut store = wasmtime::Store::new(&engine, ());
        let bump = |store: &mut wasmtime::Store<()>, instance: &wasmtime::component::Instance| {
            let f = instance.get_typed_func::<(), (i64,)>(&mut *store, "bump").unwrap();
            f.call(&mut *store, ()).unwrap().0
        };
        let first = linker.instantiate(&mut store, &component).unwrap();
        bump(&mut store, &first);
        bump(&mut store, &first);
        let u32_of = |store: &mut wasmtime::Store<()>, instance: &wasmtime::component::Instance, name: &str| {
            instance.get_typed_func::<(), (u32,)>(&mut *store, name).unwrap().call(&mut *store, ()).unwrap().0
        };
        let u64_of = |store: &mut wasmtime::Store<()>, instance: &wasmtime::component::Instance, name: &str| {
            instance.get_typed_func::<(), (u64,)>(&mut *store, name).unwrap().call(&mut *store, ()).unwrap().0
        };
        let pages = u32_of(&mut store, &first, names::MEMORY_SIZE);
        assert_eq!(pages, 3);
        // Globals 0..4 in order: i32, i64, f32, f64; the immutable one has no hooks.
        let a = u32_of(&mut store, &first, &names::get(0, false));
        let b = u64_of(&mut store, &first, &names::get(1, true));
        let c = u32_of(&mut store, &first, &names::get(2, false));
        let d = u64_of(&mut store, &first, &names::get(3, true));
        assert!(component.get_export_index(None, &names::get(4, false)[..]).is_none());
        assert_eq!((a, b as i64, f32::from_bits(c), f64::from_bits(d)), (9, -13, 4.5, 1.5 / 16.0));
        let expected = bump(&mut store, &first);

        let second = linker.instantiate(&mut store, &component).unwrap();
        let grow = second.get_typed_func::<(u32,), (u32,)>(&mut store, names::MEMORY_GROW).unwrap();
        assert_eq!(grow.call(&mut store, (pages - 1,)).unwrap().0, 1);
        let set32 = |store: &mut wasmtime::Store<()>, name: String, v: u32| {
            second.get_typed_func::<(u32,), ()>(&mut *store, &name).unwrap().call(&mut *store, (v,)).unwrap()
        };
        set32(&mut store, names::set(0, false), a);
        set32(&mut store, names::set(2, false), c);
        for (k, v) in [(1, b), (3, d)] {
            let f = second.get_typed_func::<(u64,), ()>(&mut store, &names::set(k, true)).unwrap();
            f.call(&mut store, (v,)).unwrap();
        }
        assert_eq!(bump(&mut store, &second), expected, "the second instance goes on where the first was");
    }
}
