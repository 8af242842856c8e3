//! Every accepted and refused request shape, and a bounded fuzz of the parser.

use proptest::prelude::*;

use crate::{
    api::request::*,
    ids::Pid,
    profiles::{ProfileKind, View},
};

fn get(path: &str, query: Option<&str>) -> Result<ApiRequest, BadRequest> {
    ApiRequest::parse("GET", path, query)
}

fn refused(path: &str, query: &str) -> (u16, String) {
    let err = get(path, Some(query)).unwrap_err();
    (err.status, err.reason)
}

#[test]
fn index_and_status() {
    assert_eq!(get("/debug/pprof/", None), Ok(ApiRequest::Index { pid: None }));
    assert_eq!(get("/debug/pprof", None), Ok(ApiRequest::Index { pid: None }));
    assert_eq!(get("/debug/pprof/", Some("")), Ok(ApiRequest::Index { pid: None }));
    assert_eq!(get("/debug/pprof/", Some("pid=42")), Ok(ApiRequest::Index { pid: Some(Pid(42)) }));
    assert_eq!(get("/debug/pprof/", Some("pid=x")).unwrap_err().status, 400);
    assert_eq!(get("/processes", None), Ok(ApiRequest::Processes));
    assert_eq!(get("/status", None), Ok(ApiRequest::Status));
    assert_eq!(ApiRequest::parse("HEAD", "/status", None), Ok(ApiRequest::Status));
}

#[test]
fn cpu_defaults_to_thirty_seconds_like_go() {
    assert_eq!(get("/debug/pprof/profile", Some("pid=42")), Ok(ApiRequest::Profile { pid: Pid(42), seconds: 30 }));
    assert_eq!(
        get("/debug/pprof/profile", Some("seconds=300&pid=4194304")),
        Ok(ApiRequest::Profile { pid: Pid(4_194_304), seconds: 300 })
    );
}

#[test]
fn named_profiles() {
    let cases = [
        ("heap", View::of(ProfileKind::Heap)),
        ("allocs", View::ALLOCS),
        ("block", View::of(ProfileKind::Block)),
        ("mutex", View::of(ProfileKind::Mutex)),
        ("threadcreate", View::of(ProfileKind::ThreadCreate)),
    ];
    for (name, view) in cases {
        let path = format!("/debug/pprof/{name}");
        let plain = ApiRequest::Named { view, pid: Pid(7), seconds: None, debug: 0, os_threads: false };
        assert_eq!(get(&path, Some("pid=7")), Ok(plain));
        assert_eq!(get(&path, Some("pid=7&debug=0")), Ok(plain));
        let delta = ApiRequest::Named { view, pid: Pid(7), seconds: Some(5), debug: 1, os_threads: false };
        assert_eq!(get(&path, Some("pid=7&seconds=5&debug=1")), Ok(delta));
    }
}

#[test]
fn values_are_percent_decoded() {
    assert_eq!(
        get("/debug/pprof/profile", Some("pid=%34%32&seconds=%31")),
        Ok(ApiRequest::Profile { pid: Pid(42), seconds: 1 })
    );
}

#[test]
fn unknown_paths_are_404() {
    for path in ["/", "/debug", "/debug/pprof/goroutines", "/debug/pprof/heap/", "/debug/pprof//heap", "/statusx"] {
        let err = get(path, None).unwrap_err();
        assert_eq!(err.status, 404, "{path}");
        assert_eq!(err.reason, format!("no such endpoint {path}; see /debug/pprof/ or /status"));
    }
}

#[test]
fn methods_other_than_get_and_head_are_405() {
    for method in ["POST", "PUT", "DELETE", "get"] {
        let err = ApiRequest::parse(method, "/debug/pprof/profile", Some("pid=1")).unwrap_err();
        assert_eq!(err.status, 405, "{method}");
        assert_eq!(err.reason, format!("method {method} is not allowed on /debug/pprof/profile; use GET"));
    }
}

#[test]
fn missing_pid() {
    assert_eq!(refused("/debug/pprof/profile", "seconds=5"), (400, "missing pid parameter".into()));
    assert_eq!(refused("/debug/pprof/heap", ""), (400, "missing pid parameter".into()));
}

#[test]
fn bad_pids() {
    for pid in ["", "abc", "0", "4194305", "-1", "+5", " 5", "5 ", "1e3", "99999999999999999999999"] {
        let (status, reason) =
            refused("/debug/pprof/heap", &format!("pid={}", pid.replace(' ', "%20").replace('+', "%2B")));
        assert_eq!(status, 400, "{pid:?}");
        assert_eq!(reason, format!("pid must be a process id from 1 to 4194304, got {pid:?}"));
    }
}

#[test]
fn bad_seconds() {
    let not_number = |s: &str| format!("seconds must be a whole number of seconds, got {s:?}");
    assert_eq!(refused("/debug/pprof/profile", "pid=1&seconds=abc"), (400, not_number("abc")));
    assert_eq!(refused("/debug/pprof/profile", "pid=1&seconds=1.5"), (400, not_number("1.5")));
    assert_eq!(refused("/debug/pprof/profile", "pid=1&seconds="), (400, not_number("")));
    assert_eq!(refused("/debug/pprof/block", "pid=1&seconds=0"), (400, "seconds must be at least 1".into()));
    let over = (400, "seconds=301 is over the cap of 300 seconds".to_string());
    assert_eq!(refused("/debug/pprof/profile", "pid=1&seconds=301"), over);
    let huge = refused("/debug/pprof/profile", "pid=1&seconds=99999999999999999999999");
    assert_eq!(huge.0, 400);
    assert!(huge.1.contains("over the cap of 300"), "{}", huge.1);
}

#[test]
fn unknown_and_duplicate_parameters() {
    let (status, reason) = refused("/debug/pprof/profile", "pid=1&second=5");
    assert_eq!(status, 400);
    assert_eq!(reason, r#"unknown parameter "second" for /debug/pprof/profile; allowed: pid, seconds"#);
    let (status, reason) = refused("/debug/pprof/profile", "pid=1&debug=1");
    assert_eq!((status, reason.contains(r#""debug""#)), (400, true), "Go has no text CPU profile");
    let (status, reason) = refused("/status", "verbose=1");
    assert_eq!((status, reason.as_str()), (400, r#"unknown parameter "verbose": /status takes no parameters"#));
    assert_eq!(refused("/debug/pprof/", "seconds=1").0, 400, "the index takes a pid only");
    let (status, reason) = refused("/debug/pprof/heap", "pid=1&pid=2");
    assert_eq!((status, reason.as_str()), (400, r#"parameter "pid" is given more than once"#));
}

#[test]
fn debug_must_be_zero_or_one() {
    for debug in ["2", "true", "", "01"] {
        let (status, reason) = refused("/debug/pprof/heap", &format!("pid=1&debug={debug}"));
        assert_eq!((status, reason), (400, format!("debug must be 0 or 1, got {debug:?}")));
    }
}

#[test]
fn bad_escapes_are_400() {
    assert_eq!(refused("/debug/pprof/heap", "pid=%g1").0, 400);
    assert_eq!(refused("/debug/pprof/heap", "pid=%ff").0, 400);
}

#[test]
fn reasons_are_one_line() {
    let err = get("/debug/pprof/heap", Some("pid=%0A")).unwrap_err();
    assert_eq!(err.status, 400);
    assert!(!err.reason.contains('\n'), "{:?}", err.reason);
}

/// Paths drawn mostly near the real ones so the fuzz reaches the parameter code.
fn path_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/debug/pprof/".to_string()),
        Just("/debug/pprof/profile".to_string()),
        Just("/debug/pprof/heap".to_string()),
        Just("/debug/pprof/threadcreate".to_string()),
        Just("/status".to_string()),
        "/debug/pprof/[a-z/]{0,12}",
        any::<String>(),
    ]
}

fn query_strategy() -> impl Strategy<Value = Option<String>> {
    let pair = ("(pid|seconds|debug|[a-z%+]{0,4})", "[0-9a-f%+=&]{0,12}").prop_map(|(k, v)| format!("{k}={v}"));
    let structured = prop::collection::vec(pair, 0..5).prop_map(|pairs| pairs.join("&"));
    prop::option::of(prop_oneof![structured, any::<String>()])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_and_refuses_with_a_4xx(
        method in prop_oneof![Just("GET".to_string()), Just("HEAD".to_string()), "[A-Z]{0,7}"],
        path in path_strategy(),
        query in query_strategy(),
    ) {
        if let Err(err) = ApiRequest::parse(&method, &path, query.as_deref()) {
            prop_assert!((400..500).contains(&err.status), "{err}");
            prop_assert!(!err.reason.is_empty());
        }
    }
}

#[test]
fn thread_dumps_take_debug_2_and_no_window() {
    let view = View::of(ProfileKind::Threads);
    for path in ["/debug/pprof/goroutine", "/debug/pprof/threads"] {
        assert_eq!(
            get(path, Some("pid=7&debug=2")),
            Ok(ApiRequest::Named { view, pid: Pid(7), seconds: None, debug: 2, os_threads: false })
        );
        let err = get(path, Some("pid=7&seconds=5")).unwrap_err();
        assert!(err.reason.contains("allowed: pid, debug"), "{}", err.reason);
        assert_eq!(get(path, Some("pid=7&debug=3")).unwrap_err().reason, "debug must be 0, 1 or 2, got \"3\"");
        assert_eq!(
            get(path, Some("pid=7&threads=os")),
            Ok(ApiRequest::Named { view, pid: Pid(7), seconds: None, debug: 0, os_threads: true })
        );
        let err = get(path, Some("pid=7&threads=all")).unwrap_err();
        assert_eq!(err.reason, "threads must be os or goroutines, got \"all\"");
    }
    let err = get("/debug/pprof/heap", Some("pid=7&debug=2")).unwrap_err();
    assert_eq!(err.reason, "debug must be 0 or 1, got \"2\"", "only the thread dump has a per-thread form");
    let err = get("/debug/pprof/flamegraph", Some("pid=7&type=goroutine&seconds=3")).unwrap_err();
    assert!(err.reason.contains("takes no seconds"), "{}", err.reason);
}
