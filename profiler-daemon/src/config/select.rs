//! Process selection: the `include` / `exclude` matchers of `[processes]` and `[heap]`, their
//! validation from the raw file, and matching against what is known about a process. Reading
//! `/proc` to learn those facts is not done here; the caller passes them in [`ProcessFacts`].

use std::path::{Path, PathBuf};

use super::{raw::RawMatcher, InvalidValue};

/// Highest pid the kernel can hand out (`PID_MAX_LIMIT` on 64-bit).
pub const PID_MAX_LIMIT: u32 = 4_194_304;

/// Longest `comm` the kernel keeps (`TASK_COMM_LEN` 16, less the NUL).
pub const COMM_MAX_BYTES: usize = 15;

/// systemd unit types that `unit = "…"` accepts.
pub const UNIT_SUFFIXES: [&str; 6] = [".service", ".scope", ".slice", ".socket", ".timer", ".mount"];

/// What the matchers look at. Borrowed so the caller can match straight from its own records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessFacts<'a> {
    /// The process id (tgid).
    pub pid: u32,
    /// `comm`, as in `/proc/PID/comm` (at most 15 bytes).
    pub name: &'a str,
    /// The executable, as `/proc/PID/exe` points to; `None` when unreadable (kernel threads,
    /// exited processes).
    pub exe: Option<&'a Path>,
    /// The cgroup v2 path, the part after `0::` in `/proc/PID/cgroup`, e.g.
    /// `/system.slice/nginx.service`.
    pub cgroup: Option<&'a str>,
}

/// One validated matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// `pid = N`: exactly this process id.
    Pid(u32),
    /// `name = "comm"`: exactly this `comm`.
    Name(String),
    /// `exe = "/abs/path"`: exactly this executable path.
    Exe(PathBuf),
    /// `cgroup = "/prefix"`: this cgroup or one below it, compared by whole path components
    /// (`/system.slice` matches `/system.slice/a.service`, not `/system.slicer`). Stored
    /// without a trailing `/`, except for the root `/`, which matches every cgroup.
    Cgroup(String),
    /// `unit = "foo.service"`: a process whose cgroup path has this unit as a component, i.e.
    /// ends in `/<unit>` or contains `/<unit>/`.
    Unit(String),
}

impl Matcher {
    /// Whether the process matches. A fact the caller could not learn (`exe`, `cgroup`) never
    /// matches.
    pub fn matches(&self, process: &ProcessFacts<'_>) -> bool {
        match self {
            Self::Pid(pid) => process.pid == *pid,
            Self::Name(name) => process.name == name,
            Self::Exe(exe) => process.exe == Some(exe.as_path()),
            Self::Cgroup(prefix) => process.cgroup.is_some_and(|path| is_under(path, prefix)),
            Self::Unit(unit) => process.cgroup.is_some_and(|path| path.split('/').any(|c| c == unit)),
        }
    }

    /// Validates one raw entry; `key` names it for messages, e.g. `processes.include[2]`.
    pub(super) fn from_raw(raw: &RawMatcher, key: &str) -> Result<Self, InvalidValue> {
        let field = |name: &str| format!("{key}.{name}");
        match raw {
            RawMatcher { pid: Some(pid), name: None, exe: None, cgroup: None, unit: None } => {
                pid_matcher(*pid, &field("pid"))
            }
            RawMatcher { pid: None, name: Some(name), exe: None, cgroup: None, unit: None } => {
                name_matcher(name, &field("name"))
            }
            RawMatcher { pid: None, name: None, exe: Some(exe), cgroup: None, unit: None } => {
                exe_matcher(exe, &field("exe"))
            }
            RawMatcher { pid: None, name: None, exe: None, cgroup: Some(cgroup), unit: None } => {
                cgroup_matcher(cgroup, &field("cgroup"))
            }
            RawMatcher { pid: None, name: None, exe: None, cgroup: None, unit: Some(unit) } => {
                unit_matcher(unit, &field("unit"))
            }
            _ => Err(not_exactly_one(raw, key)),
        }
    }
}

/// The `[processes]` selection: which processes are profiled at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessSelection {
    /// Empty means every process.
    pub include: Vec<Matcher>,
    /// Wins over `include`.
    pub exclude: Vec<Matcher>,
}

impl ProcessSelection {
    /// Whether the process is profiled: not excluded, and included (or `include` is empty).
    pub fn matches(&self, process: &ProcessFacts<'_>) -> bool {
        let included = self.include.is_empty() || matches_any(&self.include, process);
        included && !matches_any(&self.exclude, process)
    }

    /// Whether every process is selected (no matchers at all).
    pub fn is_all(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}

/// Whether any matcher in the list matches; false for an empty list.
pub fn matches_any(matchers: &[Matcher], process: &ProcessFacts<'_>) -> bool {
    matchers.iter().any(|matcher| matcher.matches(process))
}

/// Validates a list; `key` is the list's key, e.g. `heap.include`.
pub(super) fn matchers_from_raw(raw: &[RawMatcher], key: &str) -> Result<Vec<Matcher>, InvalidValue> {
    raw.iter().enumerate().map(|(index, entry)| Matcher::from_raw(entry, &format!("{key}[{index}]"))).collect()
}

fn is_under(path: &str, prefix: &str) -> bool {
    prefix == "/" || path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn pid_matcher(pid: i64, key: &str) -> Result<Matcher, InvalidValue> {
    match u32::try_from(pid) {
        Ok(pid @ 1..=PID_MAX_LIMIT) => Ok(Matcher::Pid(pid)),
        // pid 0 is the idle task, which the sampler already skips: matching it is a mistake.
        _ => Err(InvalidValue::new(key, format!("{pid} is not a pid; allowed 1 to {PID_MAX_LIMIT}"))),
    }
}

fn name_matcher(name: &str, key: &str) -> Result<Matcher, InvalidValue> {
    if name.is_empty() {
        return Err(InvalidValue::new(key, "the name is empty; write the process's comm, e.g. \"nginx\""));
    }
    if name.len() > COMM_MAX_BYTES {
        // The kernel truncates comm, so a longer name could never match.
        let cut = (0..=COMM_MAX_BYTES).rev().find(|&i| name.is_char_boundary(i)).unwrap_or(0);
        return Err(InvalidValue::new(
            key,
            format!(
                "{name:?} is {} bytes; the kernel keeps at most {COMM_MAX_BYTES} bytes of a \
                 process name, so write {:?} or match by exe instead",
                name.len(),
                &name[..cut]
            ),
        ));
    }
    Ok(Matcher::Name(name.to_owned()))
}

fn exe_matcher(exe: &str, key: &str) -> Result<Matcher, InvalidValue> {
    if !exe.starts_with('/') {
        return Err(InvalidValue::new(
            key,
            format!("{exe:?} is not an absolute path; write the full path, e.g. \"/usr/sbin/nginx\""),
        ));
    }
    Ok(Matcher::Exe(PathBuf::from(exe)))
}

fn cgroup_matcher(cgroup: &str, key: &str) -> Result<Matcher, InvalidValue> {
    if !cgroup.starts_with('/') {
        return Err(InvalidValue::new(
            key,
            format!(
                "{cgroup:?} is not a cgroup path; write the path from /proc/PID/cgroup, \
                 starting with '/', e.g. \"/system.slice\""
            ),
        ));
    }
    let trimmed = cgroup.trim_end_matches('/');
    Ok(Matcher::Cgroup(if trimmed.is_empty() { "/".to_owned() } else { trimmed.to_owned() }))
}

fn unit_matcher(unit: &str, key: &str) -> Result<Matcher, InvalidValue> {
    let has_suffix = UNIT_SUFFIXES.iter().any(|suffix| unit.len() > suffix.len() && unit.ends_with(suffix));
    if !has_suffix || unit.contains('/') || unit.contains(char::is_whitespace) {
        return Err(InvalidValue::new(
            key,
            format!(
                "{unit:?} is not a systemd unit name; write a name ending in one of {}, e.g. \
                 \"nginx.service\"",
                UNIT_SUFFIXES.join(" ")
            ),
        ));
    }
    Ok(Matcher::Unit(unit.to_owned()))
}

fn not_exactly_one(raw: &RawMatcher, key: &str) -> InvalidValue {
    let set: Vec<&str> = [
        ("pid", raw.pid.is_some()),
        ("name", raw.name.is_some()),
        ("exe", raw.exe.is_some()),
        ("cgroup", raw.cgroup.is_some()),
        ("unit", raw.unit.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, is_set)| is_set.then_some(name))
    .collect();
    let found = if set.is_empty() { "the matcher is empty".to_owned() } else { format!("sets {}", set.join(" and ")) };
    InvalidValue::new(
        key,
        format!(
            "{found}; a matcher sets exactly one of pid, name, exe, cgroup or unit (write one \
             entry per condition: a process matching any entry matches the list)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // A fn, not a const: `Path::new` is not const.
    fn nginx() -> ProcessFacts<'static> {
        ProcessFacts {
            pid: 4242,
            name: "nginx",
            exe: Some(Path::new("/usr/sbin/nginx")),
            cgroup: Some("/system.slice/nginx.service"),
        }
    }

    /// A process with nothing but a pid and name, like a kernel thread or one already gone.
    const BARE: ProcessFacts<'static> = ProcessFacts { pid: 7, name: "kworker/0:1", exe: None, cgroup: None };

    fn parse(raw: RawMatcher) -> Result<Matcher, String> {
        Matcher::from_raw(&raw, "processes.include[0]").map_err(|err| err.to_string())
    }

    #[test]
    fn each_kind_matches_its_fact() {
        assert!(Matcher::Pid(4242).matches(&nginx()));
        assert!(!Matcher::Pid(4243).matches(&nginx()));
        assert!(Matcher::Name("nginx".into()).matches(&nginx()));
        assert!(!Matcher::Name("ngin".into()).matches(&nginx()));
        assert!(Matcher::Exe("/usr/sbin/nginx".into()).matches(&nginx()));
        assert!(!Matcher::Exe("/usr/sbin/nginx-debug".into()).matches(&nginx()));
    }

    #[test]
    fn cgroup_prefix_matches_whole_components() {
        for prefix in ["/", "/system.slice", "/system.slice/nginx.service"] {
            assert!(Matcher::Cgroup(prefix.into()).matches(&nginx()), "{prefix}");
        }
        for prefix in ["/system.sl", "/user.slice", "/system.slice/nginx.service/worker"] {
            assert!(!Matcher::Cgroup(prefix.into()).matches(&nginx()), "{prefix}");
        }
    }

    #[test]
    fn unit_matches_last_or_inner_component() {
        let unit = Matcher::Unit("nginx.service".into());
        assert!(unit.matches(&nginx()));
        let nested = ProcessFacts { cgroup: Some("/system.slice/nginx.service/workers"), ..nginx() };
        assert!(unit.matches(&nested));
        let similar = ProcessFacts { cgroup: Some("/system.slice/nginx.service.d"), ..nginx() };
        assert!(!unit.matches(&similar));
        assert!(Matcher::Unit("system.slice".into()).matches(&nginx()));
    }

    #[test]
    fn unknown_facts_never_match() {
        for matcher in
            [Matcher::Exe("/usr/sbin/nginx".into()), Matcher::Cgroup("/".into()), Matcher::Unit("nginx.service".into())]
        {
            assert!(!matcher.matches(&BARE), "{matcher:?}");
        }
    }

    #[test]
    fn exclude_wins_and_empty_include_means_all() {
        let all = ProcessSelection::default();
        assert!(all.is_all() && all.matches(&nginx()) && all.matches(&BARE));

        let only_nginx = ProcessSelection { include: vec![Matcher::Name("nginx".into())], exclude: vec![] };
        assert!(only_nginx.matches(&nginx()) && !only_nginx.matches(&BARE));

        let but_not_4242 = ProcessSelection { exclude: vec![Matcher::Pid(4242)], ..only_nginx };
        assert!(!but_not_4242.matches(&nginx()));

        let all_but_nginx = ProcessSelection { include: vec![], exclude: vec![Matcher::Unit("nginx.service".into())] };
        assert!(!all_but_nginx.matches(&nginx()) && all_but_nginx.matches(&BARE));
    }

    #[test]
    fn validates_each_kind() {
        let pid = |pid| RawMatcher { pid: Some(pid), ..RawMatcher::default() };
        assert_eq!(parse(pid(1)), Ok(Matcher::Pid(1)));
        assert_eq!(parse(pid(PID_MAX_LIMIT.into())), Ok(Matcher::Pid(PID_MAX_LIMIT)));
        for bad in [0, -1, i64::from(PID_MAX_LIMIT) + 1] {
            let err = parse(pid(bad)).unwrap_err();
            assert!(err.starts_with("processes.include[0].pid: ") && err.contains("1 to 4194304"), "{err}");
        }

        let cgroup = |path: &str| RawMatcher { cgroup: Some(path.into()), ..RawMatcher::default() };
        assert_eq!(parse(cgroup("/system.slice/")), Ok(Matcher::Cgroup("/system.slice".into())));
        assert_eq!(parse(cgroup("//")), Ok(Matcher::Cgroup("/".into())));
        assert!(parse(cgroup("system.slice")).unwrap_err().starts_with("processes.include[0].cgroup: "));

        let exe = |path: &str| RawMatcher { exe: Some(path.into()), ..RawMatcher::default() };
        assert_eq!(parse(exe("/usr/sbin/nginx")), Ok(Matcher::Exe("/usr/sbin/nginx".into())));
        for bad in ["nginx", "./nginx", ""] {
            assert!(parse(exe(bad)).unwrap_err().contains(".exe: "), "{bad}");
        }
    }

    #[test]
    fn validates_names() {
        let name = |name: &str| RawMatcher { name: Some(name.into()), ..RawMatcher::default() };
        assert_eq!(parse(name("postgres")), Ok(Matcher::Name("postgres".into())));
        assert_eq!(parse(name("fifteen-bytes-x")), Ok(Matcher::Name("fifteen-bytes-x".into())));
        assert!(parse(name("")).unwrap_err().contains(".name: the name is empty"));
        let err = parse(name("a-very-long-daemon")).unwrap_err();
        assert!(err.contains("write \"a-very-long-dae\""), "{err}");
        // Truncation hints stay on a character boundary.
        assert!(parse(name("ééééééééé")).unwrap_err().contains("\"ééééééé\""));
    }

    #[test]
    fn validates_units() {
        let unit = |unit: &str| RawMatcher { unit: Some(unit.into()), ..RawMatcher::default() };
        for good in ["nginx.service", "session-3.scope", "user.slice", "dbus.socket", "a.timer", "home.mount"] {
            assert_eq!(parse(unit(good)), Ok(Matcher::Unit(good.into())));
        }
        for bad in ["nginx", ".service", "nginx.target", "a/b.service", "my app.service"] {
            let err = parse(unit(bad)).unwrap_err();
            assert!(err.starts_with("processes.include[0].unit: ") && err.contains(".service .scope"), "{err}");
        }
    }

    #[test]
    fn requires_exactly_one_key() {
        let err = parse(RawMatcher::default()).unwrap_err();
        assert!(err.starts_with("processes.include[0]: the matcher is empty; "), "{err}");
        let two = RawMatcher { pid: Some(1), name: Some("init".into()), ..RawMatcher::default() };
        let err = parse(two).unwrap_err();
        assert!(
            err.contains("sets pid and name; a matcher sets exactly one of pid, name, exe, cgroup or unit"),
            "{err}"
        );
    }

    #[test]
    fn list_keys_carry_the_index() {
        let raw = [RawMatcher { pid: Some(1), ..RawMatcher::default() }, RawMatcher::default()];
        let err = matchers_from_raw(&raw, "heap.include").unwrap_err();
        assert_eq!(err.key, "heap.include[1]");
    }
}
