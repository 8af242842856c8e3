//! [`ProfileKind`]: the closed set of profile types, named as in the config file
//! (`profiles = ["cpu", "heap"]`) and in output file names, and [`View`]: a kind as a
//! `/debug/pprof/` endpoint serves it (Go's names: `profile` for CPU, `allocs` for the heap
//! with allocations as the default sample type, `goroutine` for thread dumps).

use std::{fmt, str::FromStr};

/// One type of profile. The names follow Go's runtime/pprof profiles, except that Go's
/// `profile` is called `cpu` here, as it is in the file names users already see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProfileKind {
    /// On-CPU stacks sampled at `cpu.frequency_hz`.
    Cpu,
    /// Live and allocated heap, sampled every `heap.sample_bytes` on average.
    Heap,
    /// Time spent waiting in futex waits, by waiting stack.
    Block,
    /// Time waiters spent waiting, charged to the stack that woke them (the unlocker).
    Mutex,
    /// Stacks that created threads.
    ThreadCreate,
    /// Every thread's stack and state at one moment (Go's `goroutine` endpoint).
    Threads,
    /// Time threads spent off a CPU (asleep or waiting for a core), by the stack they left
    /// it with, sampled 1 in `offcpu.sample_every` switches.
    OffCpu,
}

impl ProfileKind {
    /// Every kind, in the order used in messages.
    pub const ALL: [ProfileKind; 7] =
        [Self::Cpu, Self::Heap, Self::Block, Self::Mutex, Self::ThreadCreate, Self::Threads, Self::OffCpu];

    /// The name used in the config file and in output file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Heap => "heap",
            Self::Block => "block",
            Self::Mutex => "mutex",
            Self::ThreadCreate => "threadcreate",
            Self::Threads => "threads",
            Self::OffCpu => "offcpu",
        }
    }

    /// The allowed names, for error messages: `cpu, heap, block, mutex, threadcreate, threads,
    /// offcpu`.
    pub fn allowed() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

/// A kind as an endpoint serves it. Heap data answers two endpoints, as in Go: `heap` (in use
/// by default) and `allocs` (allocated by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct View {
    pub kind: ProfileKind,
    /// `allocs`: the heap with `alloc_space` as the default sample type.
    pub allocs: bool,
}

impl View {
    /// Every view, in the order of the index.
    pub const ALL: [View; 8] = [
        View::of(ProfileKind::Cpu),
        View::of(ProfileKind::Heap),
        View::ALLOCS,
        View::of(ProfileKind::Block),
        View::of(ProfileKind::Mutex),
        View::of(ProfileKind::ThreadCreate),
        View::of(ProfileKind::Threads),
        View::of(ProfileKind::OffCpu),
    ];

    /// Go's `allocs`.
    pub const ALLOCS: View = View { kind: ProfileKind::Heap, allocs: true };

    /// The kind's own view.
    pub const fn of(kind: ProfileKind) -> View {
        View { kind, allocs: false }
    }

    /// The views of `kind`'s data.
    pub fn of_kind(kind: ProfileKind) -> impl Iterator<Item = View> {
        Self::ALL.into_iter().filter(move |view| view.kind == kind)
    }

    /// The last path segment under `/debug/pprof/`, as Go names it.
    pub fn endpoint(self) -> &'static str {
        match (self.kind, self.allocs) {
            (_, true) => "allocs",
            (ProfileKind::Cpu, false) => "profile",
            (ProfileKind::Threads, false) => "goroutine",
            (kind, false) => kind.as_str(),
        }
    }

    /// The name people know it by: `cpu` rather than Go's endpoint name `profile`.
    pub fn name(self) -> &'static str {
        if self.allocs {
            "allocs"
        } else {
            self.kind.as_str()
        }
    }

    /// The sample type the view shows first, when it differs from the kind's own.
    pub fn default_sample_type(self) -> Option<&'static str> {
        self.allocs.then_some("alloc_space")
    }

    /// The view served at `endpoint` (`threads` is an alias of Go's `goroutine`).
    pub fn at_endpoint(endpoint: &str) -> Option<View> {
        if endpoint == ProfileKind::Threads.as_str() {
            return Some(View::of(ProfileKind::Threads));
        }
        Self::ALL.into_iter().find(|view| view.endpoint() == endpoint)
    }
}

impl fmt::Display for ProfileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProfileKind {
    type Err = String;

    /// Exact, lowercase names only: the config has one spelling per kind.
    fn from_str(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| format!("{name:?} is not a profile type; allowed: {}", Self::allowed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in ProfileKind::ALL {
            assert_eq!(kind.as_str().parse::<ProfileKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.as_str());
        }
    }

    #[test]
    fn views_are_gos_endpoints() {
        let endpoints: Vec<&str> = View::ALL.iter().map(|v| v.endpoint()).collect();
        assert_eq!(endpoints, ["profile", "heap", "allocs", "block", "mutex", "threadcreate", "goroutine", "offcpu"]);
        assert_eq!(View::at_endpoint("allocs"), Some(View::ALLOCS));
        assert_eq!(View::at_endpoint("threads"), View::at_endpoint("goroutine"), "an alias");
        assert_eq!(View::at_endpoint("cpu"), None, "Go's name is profile");
        assert_eq!(View::of_kind(ProfileKind::Heap).count(), 2);
        assert_eq!(View::ALLOCS.default_sample_type(), Some("alloc_space"));
        assert_eq!(View::of(ProfileKind::Cpu).name(), "cpu");
    }

    #[test]
    fn unknown_names_list_the_allowed_ones() {
        let err = "CPU".parse::<ProfileKind>().unwrap_err();
        assert_eq!(
            err,
            r#""CPU" is not a profile type; allowed: cpu, heap, block, mutex, threadcreate, threads, offcpu"#
        );
        assert!("goroutine".parse::<ProfileKind>().is_err());
    }
}
