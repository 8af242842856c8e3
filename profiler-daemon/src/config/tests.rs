//! Loading and validation tests: defaults, the documented example file, one bad value per
//! rule (each error must name the file and the key), and a bounded fuzz of the loader.

use std::path::Path;

use proptest::prelude::*;

use super::*;

const FILE: &str = "/etc/profiler/profiler.toml";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(FILE))
}

/// The message as `main` prints it: the error and its sources joined with ": ".
fn message(err: &ConfigError) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Asserts that `text` is rejected with a message that starts with the file and `key`, then
/// contains `needle`.
#[track_caller]
fn assert_rejected(text: &str, key: &str, needle: &str) {
    let err = parse(text).expect_err(text);
    let message = message(&err);
    assert!(message.starts_with(&format!("{FILE}: {key}: ")), "{text}\n=> {message}");
    assert!(message.contains(needle), "{text}\n=> {message}\n(expected {needle:?})");
}

#[test]
fn empty_file_is_the_default() {
    let config = parse("").unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.output_dir, Path::new("/var/lib/profiler"));
    assert_eq!(config.socket, SocketConfig { path: "/run/profiler/profiler.sock".into(), group: None });
    assert_eq!(config.interval, Duration::from_secs(60));
    assert_eq!(
        config.retention,
        Retention { max_age: Duration::from_secs(7 * 86_400), max_total_bytes: 1 << 30, min_free_bytes: 512 << 20 }
    );
    assert_eq!(config.profiles, [ProfileKind::Cpu, ProfileKind::Threads], "thread dumps answer goroutine by default");
    assert_eq!(config.cpu.frequency_hz, 19);
    assert!(config.processes.is_all());
    assert_eq!(config.heap, HeapConfig { include: vec![], sample_bytes: 512 << 10 });
}

#[test]
fn example_file_is_the_default() {
    let example = include_str!("../../../config/profiler.toml");
    assert_eq!(parse(example).unwrap(), Config::default());
}

#[test]
fn reads_every_key() {
    let text = r#"
        output_dir = "/srv/profiles"
        interval = "5m"
        profiles = ["heap", "cpu"]
        [socket]
        path = "/run/p.sock"
        group = "profiler"
        [retention]
        max_age = "12h"
        max_total_bytes = 1048576
        min_free_bytes = "0B"
        [cpu]
        frequency_hz = 99
        [processes]
        include = [{ unit = "nginx.service" }, { cgroup = "/system.slice/" }]
        exclude = [{ pid = 1 }]
        [heap]
        sample_bytes = 1
        [[heap.include]]
        exe = "/usr/bin/app"
    "#;
    let config = parse(text).unwrap();
    assert_eq!(config.output_dir, Path::new("/srv/profiles"));
    assert_eq!(config.interval, Duration::from_secs(300));
    assert_eq!(config.profiles, [ProfileKind::Heap, ProfileKind::Cpu]);
    assert_eq!(config.socket.group.as_deref(), Some("profiler"));
    assert_eq!(config.retention.max_total_bytes, 1 << 20);
    assert_eq!(config.retention.min_free_bytes, 0);
    assert_eq!(config.cpu.frequency_hz, 99);
    assert_eq!(
        config.processes.include,
        [Matcher::Unit("nginx.service".into()), Matcher::Cgroup("/system.slice".into())]
    );
    assert_eq!(config.processes.exclude, [Matcher::Pid(1)]);
    assert_eq!(config.heap.include, [Matcher::Exe("/usr/bin/app".into())]);
    assert_eq!(config.heap.sample_bytes, 1);
}

#[test]
fn heap_needs_the_profile_the_selection_and_the_opt_in() {
    let app = ProcessFacts { pid: 10, name: "app", exe: Some(Path::new("/usr/bin/app")), cgroup: None };
    let mut config = parse("profiles = [\"cpu\", \"heap\"]\n[heap]\ninclude = [{ name = \"app\" }]").unwrap();
    assert!(config.heap_profiles(&app));
    assert!(!config.heap_profiles(&ProcessFacts { name: "other", ..app }));
    config.processes.exclude = vec![Matcher::Pid(10)];
    assert!(!config.heap_profiles(&app));
    config.processes.exclude.clear();
    config.profiles = vec![ProfileKind::Cpu];
    assert!(!config.heap_profiles(&app));
    assert!(!Config::default().heap.matches(&app), "heap is opt-in");
}

#[test]
fn sample_bytes_accepts_one_byte_both_ways() {
    for text in ["[heap]\nsample_bytes = \"1B\"", "[heap]\nsample_bytes = 1"] {
        assert_eq!(parse(text).unwrap().heap.sample_bytes, 1, "{text}");
    }
    assert_eq!(parse("[heap]\nsample_bytes = \"1GiB\"").unwrap().heap.sample_bytes, 1 << 30);
}

#[test]
fn rejects_bad_durations() {
    assert_rejected(
        "[retention]\nmax_age = \"7 days\"",
        "retention.max_age",
        r#""7 days" is not a duration; write a number and a unit (ns, us, ms, s, m, h or d), e.g. "7d""#,
    );
    assert_rejected("interval = 60", "interval", r#"60 has no unit; write it as a string, e.g. "60s""#);
    assert_rejected("interval = \"500ms\"", "interval", r#""500ms" is out of range; allowed 1s to 1d"#);
    assert_rejected("interval = \"25h\"", "interval", "allowed 1s to 1d");
    assert_rejected("interval = \"-1s\"", "interval", "is not a duration");
    assert_rejected(
        "interval = \"5m\"\n[retention]\nmax_age = \"1m\"",
        "retention.max_age",
        r#""1m" is shorter than interval (5m)"#,
    );
    assert!(parse("interval = \"1s\"").is_ok() && parse("interval = \"1d\"").is_ok());
}

#[test]
fn rejects_bad_byte_sizes() {
    assert_rejected(
        "[retention]\nmax_total_bytes = \"1 GiB\"",
        "retention.max_total_bytes",
        "is not a byte size; write a number and a unit (B, KiB",
    );
    assert_rejected(
        "[retention]\nmax_total_bytes = 0",
        "retention.max_total_bytes",
        "0 is out of range; allowed 1B to no limit",
    );
    assert_rejected("[retention]\nmin_free_bytes = -1", "retention.min_free_bytes", "-1 is not a byte size");
    assert_rejected("[retention]\nmin_free_bytes = \"512\"", "retention.min_free_bytes", r#""512" is not a byte size"#);
    assert_rejected("[heap]\nsample_bytes = 0", "heap.sample_bytes", "0 is out of range; allowed 1B to 1GiB");
    assert_rejected("[heap]\nsample_bytes = \"2GiB\"", "heap.sample_bytes", "allowed 1B to 1GiB");
}

#[test]
fn rejects_bad_numbers_and_paths() {
    for bad in ["0", "10001", "-5"] {
        assert_rejected(
            &format!("[cpu]\nfrequency_hz = {bad}"),
            "cpu.frequency_hz",
            &format!("{bad} is out of range; allowed 1 to 10000"),
        );
    }
    assert_rejected(
        "output_dir = \"profiles\"",
        "output_dir",
        r#""profiles" is not an absolute path; write e.g. "/var/lib/profiler""#,
    );
    assert_rejected("output_dir = \"\"", "output_dir", "is not an absolute path");
    assert_rejected("[socket]\npath = \"p.sock\"", "socket.path", "is not an absolute path");
    let long = format!("[socket]\npath = \"/{}\"", "s".repeat(107));
    assert_rejected(&long, "socket.path", "the path is 108 bytes; a unix socket path is at most 107 bytes");
}

#[test]
fn rejects_bad_group_names() {
    for bad in ["", "wheel/x", "two words", "a:b", "tab\t", "nul\\u0000"] {
        assert_rejected(
            &format!("[socket]\ngroup = \"{bad}\""),
            "socket.group",
            "is not a group name; write a non-empty name without '/', ':' or spaces",
        );
    }
    assert_eq!(parse("[socket]\ngroup = \"prof-users_1\"").unwrap().socket.group.as_deref(), Some("prof-users_1"));
}

#[test]
fn rejects_bad_profile_lists() {
    assert_rejected(
        "profiles = [\"cpu\", \"goroutine\"]",
        "profiles[1]",
        r#""goroutine" is not a profile type; allowed: cpu, heap, block, mutex, threadcreate, threads, offcpu"#,
    );
    assert_rejected("profiles = [\"cpu\", \"heap\", \"cpu\"]", "profiles[2]", r#""cpu" is listed twice"#);
    assert_rejected(
        "profiles = []",
        "profiles",
        "the list is empty; enable at least one of cpu, heap, block, mutex, threadcreate, threads, offcpu",
    );
    let every = r#"profiles = ["cpu", "heap", "block", "mutex", "threadcreate", "threads", "offcpu"]"#;
    assert_eq!(parse(every).unwrap().profiles, ProfileKind::ALL);
}

#[test]
fn rejects_bad_matchers_with_their_index() {
    assert_rejected(
        "[processes]\ninclude = [{ pid = 1 }, { exe = \"nginx\" }]",
        "processes.include[1].exe",
        "is not an absolute path",
    );
    assert_rejected(
        "[processes]\nexclude = [{ pid = 1, name = \"init\" }]",
        "processes.exclude[0]",
        "sets pid and name; a matcher sets exactly one",
    );
    assert_rejected("[heap]\ninclude = [{ unit = \"nginx\" }]", "heap.include[0].unit", "is not a systemd unit name");
    assert_rejected("[[processes.include]]\n", "processes.include[0]", "the matcher is empty");
}

/// Errors that come from the TOML parser: the file first, then toml's own message.
#[track_caller]
fn assert_parse_error(text: &str, needles: &[&str]) {
    let err = parse(text).expect_err(text);
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    let message = message(&err);
    assert!(message.starts_with(&format!("{FILE} is not a valid profiler config: ")), "{message}");
    for needle in needles {
        assert!(message.contains(needle), "{message}\n(expected {needle:?})");
    }
}

#[test]
fn rejects_unknown_keys() {
    assert_parse_error("intervall = \"60s\"", &["unknown field `intervall`, expected one of", "`interval`"]);
    assert_parse_error("[retention]\nmax_size = \"1GiB\"", &["unknown field `max_size`", "`max_total_bytes`"]);
    assert_parse_error("[processes]\ninclude = [{ comm = \"x\" }]", &["unknown field `comm`", "`name`"]);
    assert_parse_error("[gpu]\n", &["unknown field `gpu`"]);
}

#[test]
fn type_and_syntax_errors_carry_line_and_column() {
    assert_parse_error("interval = \"60s\"\noutput_dir = \n", &["line 2, column"]);
    assert_parse_error("\n\n[cpu]\nfrequency_hz = \"19\"", &["line 4", "invalid type: string \"19\""]);
    assert_parse_error("interval = true", &["line 1", "expected a number with a unit in a string"]);
    assert_parse_error(
        "[processes]\ninclude = [\"nginx\"]",
        &["expected a table with one of pid, name, exe, cgroup or unit"],
    );
    assert_parse_error("cpu = 5", &["expected a [cpu] table"]);
}

#[test]
fn missing_file_names_it() {
    let err = Config::load(Path::new("/nonexistent/profiler.toml")).unwrap_err();
    assert!(message(&err).starts_with("failed to read config file /nonexistent/profiler.toml: "), "{err}");
}

#[test]
fn check_loads_the_file_and_summarises() {
    let dir = std::env::temp_dir().join(format!("profiler-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("profiler.toml");
    std::fs::write(&path, "[socket]\ngroup = \"profiler\"").unwrap();
    let summary = check(&path).unwrap();
    std::fs::write(&path, "interval = \"0s\"").unwrap();
    let err = check(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(
        summary,
        format!(
            "ok: {}: profiles cpu,threads every 1m, cpu at 19 Hz, all processes; into /var/lib/profiler \
             (keep 7d, at most 1GiB, leave 512MiB free); socket /run/profiler/profiler.sock (group profiler)",
            path.display()
        )
    );
    assert_eq!(err.to_string(), format!("{}: interval: \"0s\" is out of range; allowed 1s to 1d", path.display()));
}

/// Keys and values the fuzzer combines into TOML-ish lines.
fn toml_ish_line() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "interval",
        "output_dir",
        "profiles",
        "max_age",
        "max_total_bytes",
        "min_free_bytes",
        "frequency_hz",
        "include",
        "exclude",
        "sample_bytes",
        "path",
        "group",
        "pid",
        "name",
        "exe",
        "cgroup",
        "unit",
        "x",
    ]);
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{0,25}(\\.[0-9]{0,5})?(ns|us|ms|s|m|h|d|B|KiB|GiB|TiB|KB|TB|[a-zµ]{0,3})".prop_map(|s| format!("{s:?}")),
        "[ -~]{0,12}".prop_map(|s| format!("{s:?}")),
        Just("[]".to_owned()),
        Just("[{ pid = 1 }, { unit = \"a.service\" }, { cgroup = \"/\" }]".to_owned()),
        "\\[\\{ (pid|name|exe|cgroup|unit) = \"[ -~]{0,8}\" \\}\\]",
        Just("[\"cpu\", \"heap\"]".to_owned()),
        Just("true".to_owned()),
        Just("{}".to_owned()),
    ];
    let header = prop::sample::select(vec![
        "",
        "[socket]\n",
        "[retention]\n",
        "[cpu]\n",
        "[processes]\n",
        "[heap]\n",
        "[[processes.include]]\n",
        "[[heap.include]]\n",
    ]);
    (header, key, value).prop_map(|(header, key, value)| format!("{header}{key} = {value}\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = parse(&text);
    }

    #[test]
    fn toml_ish_input_never_panics(lines in prop::collection::vec(toml_ish_line(), 0..8)) {
        let _ = parse(&lines.concat());
    }
}

#[test]
fn flags_override_the_file_and_are_checked_like_its_keys() {
    let dir = std::env::temp_dir().join(format!("profiler-config-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profiler.toml");
    std::fs::write(&file, "interval = \"10s\"\noutput_dir = \"/var/lib/a\"\n").unwrap();
    let overrides = Overrides {
        output_dir: Some("/var/lib/b".into()),
        socket: None,
        interval: Some(std::time::Duration::from_secs(5)),
        ..Overrides::default()
    };
    let config = Config::load_with(Some(&file), &overrides).unwrap();
    assert_eq!(config.output_dir, Path::new("/var/lib/b"));
    assert_eq!(config.interval, std::time::Duration::from_secs(5));
    let bad = Overrides { interval: Some(std::time::Duration::from_secs(0)), ..Overrides::default() };
    let err = Config::load_with(Some(&file), &bad).unwrap_err();
    assert!(message(&err).starts_with("--interval: "), "the flag, not the file's key: {}", message(&err));
    let relative = Overrides { output_dir: Some("out".into()), ..Overrides::default() };
    assert!(message(&Config::load_with(None, &relative).unwrap_err()).starts_with("--output: "));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reads_export_tables() {
    let text = r#"
        [[export]]
        protocol = "pyroscope"
        url = "https://pyroscope.example.com:4443/base/"
        timeout = "5s"
        max_backoff = "2m"
        ca_file = "/etc/profiler/ca.pem"
        headers = { "X-Scope-OrgID" = "tenant-1" }
        basic_auth = { username = "fleet", password_file = "/etc/profiler/password" }
        service_name = "{hostname}/{service}"
        [[export]]
        name = "collector"
        protocol = "otlp"
        url = "http://[::1]:4318"
        bearer_token = "s3cret"
    "#;
    let config = parse(text).unwrap();
    let [pyroscope, otlp] = &config.exports[..] else { panic!("two exports: {:?}", config.exports) };
    assert_eq!((pyroscope.name.as_str(), pyroscope.protocol), ("pyroscope", Protocol::Pyroscope));
    let url = &pyroscope.url;
    assert_eq!(
        (url.tls, url.host.as_str(), url.port, url.base_path.as_str()),
        (true, "pyroscope.example.com", 4443, "/base")
    );
    assert_eq!((pyroscope.timeout, pyroscope.max_backoff), (Duration::from_secs(5), Duration::from_secs(120)));
    assert_eq!(pyroscope.headers, [("x-scope-orgid".to_owned(), "tenant-1".to_owned())]);
    assert_eq!(
        pyroscope.auth,
        Some(Auth::Basic { username: "fleet".into(), password: Secret::File("/etc/profiler/password".into()) })
    );
    let fill = |field: &str| Some(format!("<{field}>"));
    assert_eq!(pyroscope.service_name.render(fill), "<hostname>/<service>");
    assert_eq!((otlp.name.as_str(), otlp.url.host.as_str(), otlp.url.port), ("collector", "::1", 4318));
    assert_eq!(otlp.url.authority(), "[::1]:4318");
    assert_eq!(otlp.auth, Some(Auth::Bearer(Secret::Inline("s3cret".into()))));
    assert_eq!((otlp.timeout, otlp.max_backoff), (Duration::from_secs(10), Duration::from_secs(60)), "defaults");
    assert_eq!(otlp.service_name.render(fill), "<service>");
    assert!(!format!("{:?}", otlp.auth).contains("s3cret"), "secrets are never printed");
    assert!(config.to_string().contains("export pyroscope to https://pyroscope.example.com:4443/base/ (pyroscope)"));
}

#[test]
fn rejects_bad_export_tables() {
    let table = |extra: &str| format!("[[export]]\nprotocol = \"pyroscope\"\nurl = \"http://localhost:4040\"\n{extra}");
    assert_rejected(
        "[[export]]\nprotocol = \"zipkin\"\nurl = \"http://h\"",
        "export[0].protocol",
        r#""zipkin" is not a protocol; allowed: pyroscope, otlp"#,
    );
    for (url, problem) in [
        ("ftp://h", "is not an http:// or https:// URL"),
        ("localhost:4040", "is not an http:// or https:// URL"),
        ("http://user:pw@h", "carries credentials; put them in basic_auth"),
        ("http://h/?tenant=1", "has a query or fragment"),
        ("not a url", "is not a URL"),
    ] {
        let text = format!("[[export]]\nprotocol = \"otlp\"\nurl = {url:?}");
        assert_rejected(&text, "export[0].url", problem);
    }
    assert_rejected(&table("timeout = \"0s\""), "export[0].timeout", "allowed 1s to 5m");
    assert_rejected(&table("max_backoff = \"2h\""), "export[0].max_backoff", "allowed 1s to 1h");
    assert_rejected(&table("ca_file = \"/ca.pem\""), "export[0].ca_file", "only applies to an https url");
    assert_rejected(&table("name = \"a b\""), "export[0].name", "is not an export name");
    assert_rejected(
        &table("headers = { Authorization = \"x\" }"),
        "export[0].headers.Authorization",
        "basic_auth or bearer_token",
    );
    assert_rejected(
        &table("headers = { Content-Type = \"x\" }"),
        "export[0].headers.Content-Type",
        "set by the exporter",
    );
    assert_rejected(&table("headers = { \"a b\" = \"x\" }"), "export[0].headers.a b", "is not a header name");
    assert_rejected(&table("headers = { X-A = \"two\\nlines\" }"), "export[0].headers.X-A", "one line");
    assert_rejected(
        &table("bearer_token = \"t\"\nbearer_token_file = \"/t\""),
        "export[0].bearer_token_file",
        "set either bearer_token or bearer_token_file, not both",
    );
    assert_rejected(&table("bearer_token_file = \"t\""), "export[0].bearer_token_file", "is not an absolute path");
    assert_rejected(
        &table("bearer_token = \"t\"\nbasic_auth = { username = \"u\", password = \"p\" }"),
        "export[0].bearer_token",
        "either basic_auth or a bearer token",
    );
    assert_rejected(
        &table("basic_auth = { username = \"u\" }"),
        "export[0].basic_auth",
        "set password or password_file",
    );
    assert_rejected(
        &table("basic_auth = { username = \"a:b\", password = \"p\" }"),
        "export[0].basic_auth.username",
        "without ':'",
    );
    assert_rejected(
        &table("service_name = \"{pid}\""),
        "export[0].service_name",
        "{pid} in \"{pid}\" is not a placeholder",
    );
    assert_rejected(&table("service_name = \"{unit\""), "export[0].service_name", "has an unclosed '{'");
    assert_rejected(&table("service_name = \"\""), "export[0].service_name", "the template is empty");
    assert_rejected(&format!("{}{}", table(""), table("")), "export[1].name", "is also the name of export[0]");
    assert_parse_error("[[export]]\nprotocol = \"otlp\"", &["missing field `url`"]);
    assert_parse_error(&table("token = \"x\""), &["unknown field `token`"]);
}

#[test]
fn stack_shares_are_percentages_of_one_to_a_hundred() {
    let config = parse("[limits]\nprocess_share_percent = 10\nuid_share_percent = 60").unwrap();
    assert_eq!(config.limits, StackShares { process_percent: 10, uid_percent: 60 });
    assert_eq!(parse("").unwrap().limits, StackShares { process_percent: 25, uid_percent: 100 });
    assert_rejected(
        "[limits]\nprocess_share_percent = 0",
        "limits.process_share_percent",
        "0 is out of range; allowed 1 to 100",
    );
    assert_rejected(
        "[limits]\nuid_share_percent = 101",
        "limits.uid_share_percent",
        "101 is out of range; allowed 1 to 100",
    );
    assert_parse_error(
        "[limits]\nuid_share_percent = \"50%\"",
        &["uid_share_percent", "invalid type: string \"50%\", expected i64"],
    );
}
