//! Text the server writes: the index page, one-line error bodies and download file names.
//! Pure functions over the collector's answers, so the layout is tested without a socket.

use std::fmt::Write;

use super::request::PPROF_PREFIX;
use crate::{
    control::{IndexEntry, Viewer},
    ids::Pid,
    profiles::View,
};

/// The index, like Go's `/debug/pprof/` page: one block per process the viewer may see, each
/// profile with its sample count and the path that fetches it.
///
/// ```text
/// 4242 nginx 33
///   cpu                1234  /debug/pprof/profile?pid=4242
///   heap                 56  /debug/pprof/heap?pid=4242
/// ```
pub fn index(viewer: Viewer, entries: &[IndexEntry]) -> String {
    // The collector already filters by viewer; filtering again here keeps "other users'
    // processes are absent from the index" true even if that code changes.
    let visible: Vec<&IndexEntry> = entries.iter().filter(|e| viewer.may_see(e.uid)).collect();
    let mut out = format!("# {} processes visible to uid {}\n", visible.len(), viewer.uid);
    out.push_str("# pid name uid, then per profile: type, samples since the daemon started, path\n");
    for entry in visible {
        write_entry(&mut out, entry);
    }
    out
}

fn write_entry(out: &mut String, entry: &IndexEntry) {
    let _ = writeln!(out, "\n{} {} {}", entry.pid, printable(&entry.name), entry.uid);
    for &(kind, samples) in &entry.profiles {
        for view in View::of_kind(kind) {
            let path = format!("{PPROF_PREFIX}{}?pid={}", view.endpoint(), entry.pid);
            let _ = writeln!(out, "  {:<14}{samples:>8}  {path}", view.name());
        }
    }
}

/// `Content-Disposition` for a proto download: `cpu-4242.pb.gz`.
pub fn attachment(view: View, pid: Pid) -> String {
    format!("attachment; filename=\"{}-{pid}.pb.gz\"", view.name())
}

/// An error body: the reason on one line, ending in a newline.
pub fn error_body(reason: &str) -> String {
    format!("{}\n", printable(reason))
}

/// Replaces control characters (a process name or a path may hold any byte) so one
/// record stays one line.
pub fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::ProfileKind;

    fn entry(pid: u32, uid: u32, profiles: Vec<(ProfileKind, u64)>) -> IndexEntry {
        IndexEntry { pid: Pid(pid), name: format!("proc{pid}"), uid, profiles }
    }

    #[test]
    fn index_lists_each_profile_with_its_count_and_path() {
        let entries = [entry(4242, 33, vec![(ProfileKind::Cpu, 1234), (ProfileKind::Heap, 56)])];
        let text = index(Viewer::ROOT, &entries);
        let expected = "\
# 1 processes visible to uid 0
# pid name uid, then per profile: type, samples since the daemon started, path

4242 proc4242 33
  cpu               1234  /debug/pprof/profile?pid=4242
  heap                56  /debug/pprof/heap?pid=4242
  allocs              56  /debug/pprof/allocs?pid=4242
";
        assert_eq!(text, expected);
    }

    #[test]
    fn index_hides_other_users_processes() {
        let entries = [entry(1, 0, vec![]), entry(2, 1000, vec![(ProfileKind::Block, 3)]), entry(3, 1001, vec![])];
        let text = index(Viewer { uid: 1000 }, &entries);
        assert!(text.starts_with("# 1 processes visible to uid 1000\n"), "{text}");
        assert!(text.contains("\n2 proc2 1000\n  block"), "{text}");
        assert!(!text.contains("proc1") && !text.contains("proc3"), "{text}");
        let all = index(Viewer::ROOT, &entries);
        assert!(all.contains("\n1 proc1 0\n") && all.contains("\n3 proc3 1001\n"), "root sees all: {all}");
    }

    #[test]
    fn names_cannot_break_lines() {
        let mut e = entry(9, 0, vec![]);
        e.name = "evil\nname".into();
        assert!(index(Viewer::ROOT, &[e]).contains("\n9 evil?name 0\n"));
        assert_eq!(error_body("bad\r\nthing"), "bad??thing\n");
    }

    #[test]
    fn attachment_names_the_kind_and_pid() {
        assert_eq!(attachment(View::of(ProfileKind::Cpu), Pid(7)), "attachment; filename=\"cpu-7.pb.gz\"");
        assert_eq!(
            attachment(View::of(ProfileKind::ThreadCreate), Pid(8)),
            "attachment; filename=\"threadcreate-8.pb.gz\""
        );
    }
}
