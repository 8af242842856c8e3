//! The summary `profiler snapshot` prints on stdout, read back as the tests need it: which
//! rows name a pid, the heap table's in-use bytes, and the closing `wrote ...` line's counts.
//!
//! The table looks like
//!
//! ```text
//! process                       pid  inuse bytes  top in-use allocation site
//! heap_sites                  16457     87029280  site_big_live
//! wrote 2 profiles to /tmp/hp (8 cpu samples, 0 lost to a full map; 3924 heap samples, 0 not tracked as live: map full)
//! ```

/// One row of the heap table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapRow {
    pub pid: u32,
    pub inuse_bytes: u64,
    /// The top in-use allocation site, as printed.
    pub top_site: String,
}

/// The rows of any table (CPU or heap) whose pid column is `pid`, as printed.
pub fn rows_naming(stdout: &str, pid: u32) -> Vec<&str> {
    let pid = pid.to_string();
    stdout.lines().filter(|line| line.split_whitespace().nth(1) == Some(pid.as_str())).collect()
}

/// The heap table's rows: the lines after its header (the one naming `inuse bytes`) up to the
/// closing `wrote` line.
pub fn heap_rows(stdout: &str) -> Vec<HeapRow> {
    stdout
        .lines()
        .skip_while(|line| !line.contains("inuse bytes"))
        .skip(1)
        .take_while(|line| !line.starts_with("wrote "))
        .filter_map(|line| {
            let mut columns = line.split_whitespace();
            let _name = columns.next()?;
            Some(HeapRow {
                pid: columns.next()?.parse().ok()?,
                inuse_bytes: columns.next()?.parse().ok()?,
                top_site: columns.collect::<Vec<_>>().join(" "),
            })
        })
        .collect()
}

/// The count before `not tracked as live` in the closing line: heap samples that found the
/// live map full.
pub fn not_tracked_as_live(stdout: &str) -> Option<u64> {
    let line = stdout.lines().find(|l| l.starts_with("wrote "))?;
    let before = &line[..line.find(" not tracked as live")?];
    before.rsplit([' ', ',', ';', '(']).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUMMARY: &str = "\
process                       pid   samples  hottest function
heap_sites                  16457         8  __check_object_size
process                       pid  inuse bytes  top in-use allocation site
heap_sites                  16457     87029280  site_big_live
wrote 2 profiles to /tmp/hp (8 cpu samples, 0 lost to a full map; 3924 heap samples, 3824 not tracked as live: map full)
";

    #[test]
    fn reads_heap_rows_and_counts() {
        assert_eq!(
            heap_rows(SUMMARY),
            [HeapRow { pid: 16457, inuse_bytes: 87029280, top_site: "site_big_live".into() }]
        );
        assert_eq!(not_tracked_as_live(SUMMARY), Some(3824));
        assert_eq!(rows_naming(SUMMARY, 16457).len(), 2);
        assert!(rows_naming(SUMMARY, 8).is_empty());
        assert!(heap_rows("no table here").is_empty());
    }
}
