//! The guest SDK builds its bindings from its own copy of the WIT (`guest-sdk/wit/`), so the
//! published crate carries everything it needs; the host builds from `wit/`. A difference
//! between the two would make SDK-built guests disagree with the host at link time, or
//! silently drop a new import, so the copy must be the same file for file.

use std::collections::BTreeMap;
use std::path::Path;

fn wit_files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read `{}`: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wit"))
        .map(|path| {
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            let text =
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read `{}`: {e}", path.display()));
            (name, text)
        })
        .collect()
}

#[test]
fn the_guest_sdk_carries_the_hosts_wit_unchanged() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let host = wit_files(&root.join("wit"));
    let sdk = wit_files(&root.join("guest-sdk/wit"));
    assert!(host.contains_key("world.wit"), "no `wit/world.wit`: {:?}", host.keys());
    let names = |files: &BTreeMap<String, String>| files.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&sdk),
        names(&host),
        "`guest-sdk/wit/` and `wit/` hold different files: run `cp wit/*.wit guest-sdk/wit/`"
    );
    for (name, text) in &host {
        assert!(
            sdk[name] == *text,
            "`guest-sdk/wit/{name}` differs from `wit/{name}`: run `cp wit/*.wit guest-sdk/wit/`"
        );
    }
}
