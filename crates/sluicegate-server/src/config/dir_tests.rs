//! A configuration directory, read as envoyproxy/ratelimit reads its runtime directory.

use super::tests::entries;
use super::*;

/// A fresh directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Domain `domain` with one rule on key `a` (and the descriptor `value` if given).
fn domain(domain: &str, value: Option<&str>) -> String {
    let value = value
        .map(|v| format!("    value: \"{v}\"\n"))
        .unwrap_or_default();
    format!(
        "domain: {domain}\ndescriptors:\n  - key: a\n{value}    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    )
}

fn options(ignore_dotfiles: bool, merge_domains: bool) -> LoadOptions {
    LoadOptions {
        ignore_dotfiles,
        merge_domains,
        ..LoadOptions::new(DEFAULT_ALGORITHM)
    }
}

fn domains(config: &Config) -> Vec<&str> {
    let mut names: Vec<&str> = config.domains.keys().map(String::as_str).collect();
    names.sort_unstable();
    names
}

fn path_of(config: &Config, domain: &str, key: &str, value: &str) -> Option<String> {
    config
        .find(domain, &entries(&[(key, value)]))
        .unwrap()
        .map(|l| l.path.clone())
}

/// Every file at every depth, whatever its name; a link to a file read, a link to a
/// directory not followed; dot files and directories as told.
#[test]
fn every_file_below_is_read_dot_files_as_told() {
    let dir = scratch("walk");
    write(&dir.join("one.yaml"), &domain("one", None));
    write(&dir.join("sub/two.conf"), &domain("two", None));
    write(&dir.join("sub/deeper/three"), &domain("three", None));
    write(&dir.join(".hidden.yaml"), &domain("hidden", None));
    write(&dir.join(".dotdir/four.yml"), &domain("four", None));
    let outside = scratch("walk-outside");
    write(&outside.join("linked.yaml"), &domain("linked", None));
    std::os::unix::fs::symlink(outside.join("linked.yaml"), dir.join("linked.yaml")).unwrap();
    // As Kubernetes mounts a ConfigMap: `..data` links to the directory holding the
    // files. Followed, it would declare domain two a second time.
    std::os::unix::fs::symlink(dir.join("sub"), dir.join("..data")).unwrap();
    std::os::unix::fs::symlink(dir.join("sub"), dir.join("sub-link")).unwrap();

    let skipping = Config::load(&dir, options(true, false)).unwrap();
    assert_eq!(domains(&skipping), ["linked", "one", "three", "two"]);
    let reading = Config::load(&dir, options(false, false)).unwrap();
    assert_eq!(
        domains(&reading),
        ["four", "hidden", "linked", "one", "three", "two"]
    );
    // What a reload compares follows the same files.
    let before = fingerprint(&dir, true, DEFAULT_MAX_BYTES);
    write(&dir.join(".hidden.yaml"), &domain("hidden", Some("x")));
    assert_eq!(fingerprint(&dir, true, DEFAULT_MAX_BYTES), before);
    write(&dir.join("sub/deeper/three"), &domain("three", Some("x")));
    assert_ne!(fingerprint(&dir, true, DEFAULT_MAX_BYTES), before);
}

/// envoyproxy/ratelimit parses every file of the directory: a README or an editor's
/// backup beside the configuration fails the load, naming the file.
#[test]
fn a_file_that_is_not_a_configuration_fails_the_load() {
    let dir = scratch("readme");
    write(&dir.join("limits.yaml"), &domain("d", None));
    write(&dir.join("README"), "Limits of the d service.\n");
    let err = Config::load(&dir, options(true, false))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("{}: line 1", dir.join("README").display())),
        "{err}"
    );
    let err = Config::load(&dir.join("none"), options(true, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot read"), "{err}");
    let empty = scratch("no-files");
    write(&empty.join(".only-a-dot-file"), &domain("d", None));
    let err = Config::load(&empty, options(true, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no configuration"), "{err}");
}

/// A domain in two files is an error naming both, unless merged: then the second file's
/// descriptors join the first's, its wildcards tried after the first's, and a
/// descriptor both declare is an error naming both files.
#[test]
fn a_domain_in_two_files_is_an_error_unless_merged() {
    let dir = scratch("merge");
    write(&dir.join("a.yaml"), &domain("d", Some("x*")));
    write(
        &dir.join("b.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    value: \"*\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let err = Config::load(&dir, options(true, false))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "{}: domain: \"d\" is already defined in {}",
            dir.join("b.yaml").display(),
            dir.join("a.yaml").display()
        )),
        "{err}"
    );
    assert!(err.contains("--merge-domain-config"), "{err}");

    let merged = Config::load(&dir, options(true, true)).unwrap();
    assert_eq!(path_of(&merged, "d", "a", "xy").as_deref(), Some("d.a_x*"));
    assert_eq!(path_of(&merged, "d", "a", "yy").as_deref(), Some("d.a_*"));
    assert_eq!(path_of(&merged, "d", "b", "1").as_deref(), Some("d.b"));

    write(&dir.join("c.yaml"), &domain("d", Some("x*")));
    let err = Config::load(&dir, options(true, true))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "{}: line 3: d.a_x*: duplicate descriptor",
            dir.join("c.yaml").display()
        )),
        "{err}"
    );
    assert!(
        err.ends_with(&format!(
            "merged with {}, {}",
            dir.join("a.yaml").display(),
            dir.join("b.yaml").display()
        )),
        "{err}"
    );
}
