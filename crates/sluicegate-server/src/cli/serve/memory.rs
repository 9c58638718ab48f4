//! The memory budget's flags: sizes in bytes as people write them, and the default budget,
//! a quarter of the memory this process may use (its cgroup's limit, else the machine's).

use std::path::Path;

/// The share of the memory available that the budget takes by default: the rest is left
/// to what the budget does not count (connections, buffers, the allocator's slack, the
/// runtime) and to the spikes of a `/metrics` scrape or a reload.
const DEFAULT_SHARE_DIVISOR: u64 = 4;

/// The smallest budget accepted: below it the store holds a few hundred keys at most, and
/// a size that small is far likelier a unit left out (`512` for `512MiB`) than meant.
const MIN_MAX_MEMORY: u64 = 64 << 10;

/// clap's value parser for byte sizes: `1048576`, `512KiB`, `512MiB`, `2GiB`, `1TiB`, and
/// the decimal `kB`, `MB`, `GB`, `TB` (case-insensitive, an optional space before the
/// unit). Below [`MIN_MAX_MEMORY`] is refused.
pub(crate) fn parse_bytes_arg(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?} is not a size in bytes, such as 512MiB or 2GB"
            ));
        }
    };
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("{text:?} is not a size in bytes, such as 512MiB or 2GB"))?;
    if bytes < MIN_MAX_MEMORY {
        return Err(format!(
            "{text:?} is below the smallest memory budget, 64KiB (a unit left out? such as \
             512MiB)"
        ));
    }
    Ok(bytes)
}

/// The default budget and where it comes from, for the log: a quarter of the cgroup's
/// memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), else of the machine's
/// memory (`/proc/meminfo`); `None` where neither can be read.
pub(crate) fn default_max_memory() -> Option<(u64, String)> {
    default_max_memory_under(Path::new("/"))
}

fn default_max_memory_under(root: &Path) -> Option<(u64, String)> {
    let read = |path: &str| std::fs::read_to_string(root.join(path)).ok();
    // cgroup v1 writes a huge number (near i64::MAX) for "no limit", v2 writes "max".
    let limited = |text: String| {
        text.trim()
            .parse::<u64>()
            .ok()
            .filter(|&bytes| bytes > 0 && bytes < 1 << 60)
    };
    let available = read("sys/fs/cgroup/memory.max")
        .and_then(limited)
        .map(|bytes| (bytes, "the cgroup's memory.max"))
        .or_else(|| {
            read("sys/fs/cgroup/memory/memory.limit_in_bytes")
                .and_then(limited)
                .map(|bytes| (bytes, "the cgroup's memory.limit_in_bytes"))
        })
        .or_else(|| {
            let meminfo = read("proc/meminfo")?;
            let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((kib.checked_mul(1024)?, "the machine's memory (MemTotal)"))
        })?;
    let (bytes, source) = available;
    let budget = (bytes / DEFAULT_SHARE_DIVISOR).max(1);
    Some((
        budget,
        format!("a quarter of {source}, {}", human_bytes(bytes)),
    ))
}

/// `bytes` as MiB with one decimal, for the log.
pub(crate) fn human_bytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units_and_zero_is_refused() {
        assert_eq!(parse_bytes_arg("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes_arg("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes_arg("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes_arg("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes_arg("100kb"), Ok(100_000));
        assert_eq!(parse_bytes_arg("1GB"), Ok(1_000_000_000));
        for bad in [
            "",
            "0",
            "0MiB",
            "12 parsecs",
            "-1",
            "1.5GiB",
            "99999999999TiB",
        ] {
            assert!(parse_bytes_arg(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_is_a_quarter_of_the_cgroup_limit_else_of_the_machine() {
        let root = std::env::temp_dir().join(format!("sluicegate-memory-{}", std::process::id()));
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "proc/meminfo",
            "MemTotal:       8000000 kB\nMemFree: 1 kB\n",
        );
        write("sys/fs/cgroup/memory.max", "max\n");
        let (bytes, source) = default_max_memory_under(&root).unwrap();
        assert_eq!(bytes, 8_000_000 * 1024 / 4);
        assert!(source.contains("MemTotal"), "{source}");
        write("sys/fs/cgroup/memory.max", "1073741824\n");
        let (bytes, source) = default_max_memory_under(&root).unwrap();
        assert_eq!(bytes, 1 << 28);
        assert!(source.contains("memory.max"), "{source}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
