//! Text the server writes: the index pages (HTML, laid out like Go's `net/http/pprof`
//! index), the process list as JSON, one-line error bodies and download file names. Pure
//! functions over the collector's answers, so the layout is tested without a socket.

use std::fmt::Write;

use serde_json::json;

use crate::{
    control::{IndexEntry, Viewer},
    ids::Pid,
    profiles::View,
};

/// Go's one-line descriptions (net/http/pprof's `profileDescriptions`), for the endpoints a
/// native process has. The heap's second sentence (the `gc` parameter) does not apply.
fn description(view: View) -> &'static str {
    match view.endpoint() {
        "allocs" => "A sampling of all past memory allocations",
        "block" => "Stack traces that led to blocking on synchronization primitives",
        "goroutine" => "Stack traces of all current goroutines",
        "heap" => "A sampling of memory allocations of live objects.",
        "mutex" => "Stack traces of holders of contended mutexes",
        "profile" => {
            "CPU profile. You can specify the duration in the seconds GET parameter. After you get the profile \
             file, use the go tool pprof command to investigate the profile."
        }
        "threadcreate" => "Stack traces that led to the creation of new OS threads",
        // Not a Go profile; worded as Go words its own.
        "offcpu" => {
            "Time threads spent off CPU (asleep or waiting for a core), by stack. You can specify the duration \
             in the seconds GET parameter."
        }
        _ => "",
    }
}

const HEAD: &str = "<html>\n<head>\n<title>/debug/pprof/</title>\n<style>\n.profile-name{\n\tdisplay:inline-block;\n\twidth:6rem;\n}\n</style>\n</head>\n<body>\n/debug/pprof/<br>\n<br>\n";
const TAIL: &str = "</body>\n</html>";

/// The index: the processes the viewer may see, each linking to its own page.
pub fn index(viewer: Viewer, entries: &[IndexEntry]) -> String {
    // The collector already filters by viewer; filtering again here keeps "other users'
    // processes are absent from the index" true even if that code changes.
    let visible: Vec<&IndexEntry> = entries.iter().filter(|e| viewer.may_see(e.uid)).collect();
    let mut out = String::from(HEAD);
    let _ = writeln!(out, "{} processes visible to uid {}:", visible.len(), viewer.uid);
    out.push_str(
        "<table>\n<thead><td>Pid</td><td>Process</td><td>Uid</td><td>Unit or container</td><td>Profiles</td></thead>\n",
    );
    for entry in visible {
        let pid = entry.pid;
        let _ = write!(
            out,
            "<tr><td>{pid}</td><td><a href='?pid={pid}'>{}</a></td><td>{}</td><td>{}</td><td>",
            html(&entry.name),
            entry.uid,
            html(attribution(entry))
        );
        let links: Vec<String> = views(entry)
            .map(|(view, count)| format!("<a href='{}'>{}</a> {count}", href(view, pid), view.name()))
            .collect();
        let _ = writeln!(out, "{}</td></tr>", links.join(", "));
    }
    out.push_str("</table>\n");
    out.push_str(TAIL);
    out
}

/// One process's page, as Go's index is laid out: the profiles with their counts and links,
/// then Go's descriptions.
pub fn process(entry: &IndexEntry) -> String {
    let pid = entry.pid;
    let mut out = String::from(HEAD);
    let _ =
        writeln!(out, "pid {pid} {} (uid {}; {})<br>\n<br>", html(&entry.name), entry.uid, html(attribution(entry)));
    out.push_str("Types of profiles available:\n<table>\n<thead><td>Count</td><td>Profile</td></thead>\n");
    let mut views: Vec<(View, u64)> = views(entry).collect();
    views.sort_by_key(|(view, _)| view.endpoint());
    for &(view, count) in &views {
        let _ =
            writeln!(out, "<tr><td>{count}</td><td><a href='{}'>{}</a></td></tr>", href(view, pid), view.endpoint());
    }
    out.push_str("</table>\n<br>\n<p>\nProfile Descriptions:\n<ul>\n");
    for (view, _) in views {
        let _ = writeln!(out, "<li><div class=profile-name>{}: </div> {}</li>", view.endpoint(), description(view));
    }
    out.push_str("</ul>\n</p>\n");
    out.push_str(TAIL);
    out
}

/// The processes as JSON: what `profiler ps` shows.
pub fn processes(viewer: Viewer, entries: &[IndexEntry]) -> String {
    let list: Vec<serde_json::Value> = entries
        .iter()
        .filter(|e| viewer.may_see(e.uid))
        .map(|e| {
            let profiles: serde_json::Map<String, serde_json::Value> =
                e.profiles.iter().map(|(kind, n)| (kind.to_string(), (*n).into())).collect();
            json!({
                "pid": e.pid.0, "name": e.name, "uid": e.uid, "unit": e.unit, "container": e.container,
                "profiles": profiles,
            })
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap_or_else(|_| "[]".into()) + "\n"
}

/// Each of the process's views with its kind's event count (the heap's data answers both
/// `heap` and `allocs`).
fn views(entry: &IndexEntry) -> impl Iterator<Item = (View, u64)> + '_ {
    entry.profiles.iter().flat_map(|&(kind, count)| View::of_kind(kind).map(move |view| (view, count)))
}

/// The link to a view, relative to the index: the text form where Go has one, the proto
/// download for CPU (Go's `profile` has no text form).
fn href(view: View, pid: Pid) -> String {
    match view.endpoint() {
        "profile" => format!("profile?pid={pid}"),
        endpoint => format!("{endpoint}?pid={pid}&amp;debug=1"),
    }
}

/// The unit or container, when the cgroup names one.
fn attribution(entry: &IndexEntry) -> &str {
    entry.container.as_deref().or(entry.unit.as_deref()).unwrap_or("-")
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

/// Text safe inside HTML (a process names itself).
fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in printable(text).chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::ProfileKind;

    fn entry(pid: u32, uid: u32, profiles: Vec<(ProfileKind, u64)>) -> IndexEntry {
        IndexEntry { pid: Pid(pid), name: format!("proc{pid}"), uid, unit: None, container: None, profiles }
    }

    #[test]
    fn a_process_page_is_gos_index_with_counts_links_and_descriptions() {
        let mut e = entry(4242, 33, vec![(ProfileKind::Cpu, 1234), (ProfileKind::Heap, 56)]);
        e.unit = Some("nginx.service".into());
        let page = process(&e);
        assert!(page.starts_with("<html>\n<head>\n<title>/debug/pprof/</title>"), "{page}");
        assert!(page.contains("pid 4242 proc4242 (uid 33; nginx.service)<br>"), "{page}");
        let rows: Vec<&str> = page.lines().filter(|l| l.starts_with("<tr>")).collect();
        assert_eq!(
            rows,
            [
                "<tr><td>56</td><td><a href='allocs?pid=4242&amp;debug=1'>allocs</a></td></tr>",
                "<tr><td>56</td><td><a href='heap?pid=4242&amp;debug=1'>heap</a></td></tr>",
                "<tr><td>1234</td><td><a href='profile?pid=4242'>profile</a></td></tr>",
            ]
        );
        assert!(
            page.contains("<li><div class=profile-name>allocs: </div> A sampling of all past memory allocations</li>")
        );
        assert!(page.ends_with("</body>\n</html>"));
    }

    #[test]
    fn the_index_lists_what_the_viewer_may_see() {
        let entries = [entry(1, 0, vec![]), entry(2, 1000, vec![(ProfileKind::Block, 3)]), entry(3, 1001, vec![])];
        let text = index(Viewer { uid: 1000 }, &entries);
        assert!(text.contains("1 processes visible to uid 1000:"), "{text}");
        assert!(text.contains("<tr><td>2</td><td><a href='?pid=2'>proc2</a></td><td>1000</td><td>-</td><td><a href='block?pid=2&amp;debug=1'>block</a> 3</td></tr>"), "{text}");
        assert!(!text.contains("proc1") && !text.contains("proc3"), "{text}");
        let all = index(Viewer::ROOT, &entries);
        assert!(all.contains("?pid=1'") && all.contains("?pid=3'"), "root sees all: {all}");
        let json: serde_json::Value = serde_json::from_str(&processes(Viewer { uid: 1000 }, &entries)).unwrap();
        assert_eq!(json[0]["pid"], 2);
        assert_eq!(json[0]["profiles"]["block"], 3);
        assert_eq!(json.as_array().unwrap().len(), 1);
    }

    #[test]
    fn names_cannot_break_lines_or_markup() {
        let mut e = entry(9, 0, vec![]);
        e.name = "evil\n<b>'x'".into();
        let text = index(Viewer::ROOT, &[e]);
        assert!(text.contains(">evil?&lt;b&gt;&#39;x&#39;</a>"), "{text}");
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
