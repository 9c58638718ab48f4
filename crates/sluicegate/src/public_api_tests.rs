//! Holds the public API to the list in docs/library.md: every public item at the root or
//! in a public module (a `pub` item, or a name a `pub use` re-exports) must be listed
//! there, and nothing else. A new public name is a decision, not an accident.
//!
//! The walk reads the source with `syn` from `lib.rs` down through the public modules,
//! whatever the features (an item behind a feature is listed under its feature's heading).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use syn::{Item, UseTree, Visibility};

/// Every public path the crate's source declares, `sluicegate::…`.
fn declared() -> BTreeSet<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = BTreeSet::new();
    walk_file(&src.join("lib.rs"), &src, "sluicegate", &mut paths);
    paths
}

fn walk_file(file: &Path, dir: &Path, prefix: &str, paths: &mut BTreeSet<String>) {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    walk_items(&parsed.items, dir, prefix, paths);
}

fn walk_items(items: &[Item], dir: &Path, prefix: &str, paths: &mut BTreeSet<String>) {
    for item in items {
        let (vis, name) = match item {
            Item::Use(u) => {
                if matches!(u.vis, Visibility::Public(_)) {
                    use_names(&u.tree, &mut |name| {
                        paths.insert(format!("{prefix}::{name}"));
                    });
                }
                continue;
            }
            Item::Mod(m) => {
                if !matches!(m.vis, Visibility::Public(_)) {
                    continue;
                }
                let name = m.ident.to_string();
                let path = format!("{prefix}::{name}");
                paths.insert(path.clone());
                match &m.content {
                    Some((_, inner)) => walk_items(inner, &dir.join(&name), &path, paths),
                    None => {
                        let file = [
                            dir.join(format!("{name}.rs")),
                            dir.join(&name).join("mod.rs"),
                        ]
                        .into_iter()
                        .find(|f| f.exists())
                        .unwrap_or_else(|| panic!("no file for module {path}"));
                        walk_file(&file, &module_dir(&file, &name), &path, paths);
                    }
                }
                continue;
            }
            Item::Fn(f) => (&f.vis, f.sig.ident.to_string()),
            Item::Struct(s) => (&s.vis, s.ident.to_string()),
            Item::Enum(e) => (&e.vis, e.ident.to_string()),
            Item::Const(c) => (&c.vis, c.ident.to_string()),
            Item::Static(s) => (&s.vis, s.ident.to_string()),
            Item::Trait(t) => (&t.vis, t.ident.to_string()),
            Item::Type(t) => (&t.vis, t.ident.to_string()),
            Item::Union(u) => (&u.vis, u.ident.to_string()),
            _ => continue,
        };
        if matches!(vis, Visibility::Public(_)) {
            paths.insert(format!("{prefix}::{name}"));
        }
    }
}

/// Where the files of `name`'s own submodules live.
fn module_dir(file: &Path, name: &str) -> PathBuf {
    let parent = file.parent().expect("a file in a directory");
    if file.ends_with("mod.rs") {
        parent.to_path_buf()
    } else {
        parent.join(name)
    }
}

/// The names a `use` tree brings in (renamed ones by their new name).
fn use_names(tree: &UseTree, add: &mut impl FnMut(String)) {
    match tree {
        UseTree::Path(p) => use_names(&p.tree, add),
        UseTree::Name(n) => add(n.ident.to_string()),
        UseTree::Rename(r) => add(r.rename.to_string()),
        UseTree::Group(g) => g.items.iter().for_each(|t| use_names(t, add)),
        UseTree::Glob(_) => panic!("a public glob re-export hides which names are public"),
    }
}

/// The items docs/library.md lists: under a heading `` ## `path` ``, each line
/// `` - `name` `` is `path::name`.
fn listed() -> BTreeSet<String> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/library.md");
    let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut module = None;
    let mut paths = BTreeSet::new();
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            module = heading
                .strip_prefix('`')
                .and_then(|rest| rest.split_once('`'))
                .map(|(path, _)| path.to_owned());
        } else if let (Some(module), Some(item)) = (&module, line.strip_prefix("- `")) {
            let name = item.split_once('`').expect("a closing backtick").0;
            paths.insert(format!("{module}::{name}"));
        }
    }
    paths
}

#[test]
fn the_public_api_is_the_one_docs_library_md_lists() {
    let declared = declared();
    let listed = listed();
    let unlisted: Vec<_> = declared.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&declared).collect();
    assert!(
        unlisted.is_empty() && gone.is_empty(),
        "the public API changed.\n  public but not in docs/library.md: {unlisted:?}\n  \
         in docs/library.md but not public: {gone:?}\nIf the change is meant, list each new \
         item in docs/library.md under its module's heading (`## `sluicegate::…``) as \
         \"- `name`: what it is for\", and remove the ones that are gone; if not, make the \
         item pub(crate) or move it behind the `internals` feature."
    );
}

#[test]
fn the_walk_finds_items_and_re_exports_of_every_kind() {
    let declared = declared();
    for path in [
        "sluicegate::Limiter",
        "sluicegate::headers::seconds_up",
        "sluicegate::redis::Scripting",
        "sluicegate::internals::parse_duration",
    ] {
        assert!(declared.contains(path), "{path} not found in {declared:?}");
    }
    assert!(!declared.iter().any(|p| p.ends_with("::whole_micros")));
}
