//! The scheduler's import graph, read from its sources: the one circle of files that
//! import each other is the one `host/src/scheduler/mod.rs` names ("Who imports whom"),
//! and the embedder's handler API and the cell stay out of the scheduler's and the
//! journal's insides.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn host_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").join("host/src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read `{}`: {e}", path.display()))
}

/// The lines of `source` that are code: no comment, doc comment or blank line.
fn code(source: &str) -> impl Iterator<Item = &str> {
    source.lines().map(str::trim_start).filter(|line| !line.is_empty() && !line.starts_with("//"))
}

/// Each file of `dir` (by its stem) and the sibling files its code names through
/// `super::NAME`.
fn imports(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files: BTreeMap<String, String> = std::fs::read_dir(dir)
        .expect("the scheduler's folder")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| (path.file_stem().expect("a name").to_string_lossy().into_owned(), read(&path)))
        .collect();
    let mut graph = BTreeMap::new();
    for (name, source) in &files {
        let mut named = BTreeSet::new();
        for line in code(source) {
            for (at, _) in line.match_indices("super::") {
                let rest = &line[at + "super::".len()..];
                let word: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if word != *name && files.contains_key(&word) {
                    named.insert(word);
                }
            }
        }
        graph.insert(name.clone(), named);
    }
    graph
}

/// The circles of `graph`: its strongly connected parts of more than one file
/// (Tarjan's algorithm).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, file: &'a str) {
            let next = self.index.len();
            self.index.insert(file, next);
            self.low.insert(file, next);
            self.stack.push(file);
            for named in &self.graph[file] {
                if !self.index.contains_key(named.as_str()) {
                    self.visit(named);
                    let low = self.low[file].min(self.low[named.as_str()]);
                    self.low.insert(file, low);
                } else if self.stack.contains(&named.as_str()) {
                    let low = self.low[file].min(self.index[named.as_str()]);
                    self.low.insert(file, low);
                }
            }
            if self.low[file] == self.index[file] {
                let mut part = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    part.insert(top.to_owned());
                    if top == file {
                        break;
                    }
                }
                if part.len() > 1 {
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for file in graph.keys() {
        if !walk.index.contains_key(file.as_str()) {
            walk.visit(file);
        }
    }
    walk.found
}

/// The files `mod.rs` names as the circle: those in backticks on the first line of each
/// item of the list after "One circle of files", up to "Above the circle".
fn named_circle(module_docs: &str) -> BTreeSet<String> {
    let section = module_docs
        .split_once("One circle of files")
        .and_then(|(_, rest)| rest.split_once("Above the circle"))
        .map(|(section, _)| section)
        .expect("`scheduler/mod.rs` has \"One circle of files\" … \"Above the circle\"");
    section
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("//! - "))
        .flat_map(|item| item.split('`').skip(1).step_by(2).filter_map(|quoted| quoted.strip_suffix(".rs")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_schedulers_one_circle_is_the_one_its_module_docs_name() {
    let dir = host_src().join("scheduler");
    let graph = imports(&dir);
    let found = circles(&graph);
    let named = named_circle(&read(&dir.join("mod.rs")));
    assert!(named.len() >= 2, "no circle named in `scheduler/mod.rs`: {named:?}");
    let arrows = |circle: &BTreeSet<String>| -> Vec<String> {
        circle
            .iter()
            .flat_map(|file| {
                graph[file].iter().filter(|named| circle.contains(*named)).map(move |to| format!("{file} -> {to}"))
            })
            .collect()
    };
    assert_eq!(
        found.len(),
        1,
        "one circle expected in `host/src/scheduler/`, found {}: {:?}",
        found.len(),
        found.iter().map(arrows).collect::<Vec<_>>()
    );
    assert_eq!(
        found[0],
        named,
        "the circle in the code is not the one `scheduler/mod.rs` names (\"Who imports whom\"); its arrows: {:?}",
        arrows(&found[0])
    );
}

#[test]
fn the_handler_api_and_the_cell_name_nothing_they_should_not() {
    let src = host_src();
    let handler = read(&src.join("handler.rs"));
    let into_scheduler: Vec<&str> = code(&handler).filter(|line| line.contains("scheduler::")).collect();
    assert!(into_scheduler.is_empty(), "`handler.rs` names the scheduler's insides: {into_scheduler:?}");
    for file in ["cell.rs", "worker.rs"] {
        let source = read(&src.join("scheduler").join(file));
        let journal: Vec<&str> = code(&source).filter(|line| line.contains("journal::")).collect();
        assert!(journal.is_empty(), "`scheduler/{file}` names the journal's types: {journal:?}");
    }
    let cell = read(&src.join("scheduler/cell.rs"));
    let durable: Vec<&str> = code(&cell).filter(|line| line.contains("durable::")).collect();
    assert!(durable.is_empty(), "`scheduler/cell.rs` names durability's types: {durable:?}");
}
