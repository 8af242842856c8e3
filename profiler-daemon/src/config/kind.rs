//! [`ProfileKind`]: the closed set of profile types the daemon can produce, named as in the
//! config file (`profiles = ["cpu", "heap"]`). Naming only; which kinds are implemented is the
//! pipeline's business.

use std::{fmt, str::FromStr};

/// One type of profile. The names follow Go's runtime/pprof profiles, except that Go's
/// `profile` is called `cpu` here, as it is in the file names users already see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProfileKind {
    /// On-CPU stacks sampled at `cpu.frequency_hz`.
    Cpu,
    /// Live and allocated heap, sampled every `heap.sample_bytes` on average.
    Heap,
    /// Time spent blocked off-CPU.
    Block,
    /// Time spent waiting for contended locks.
    Mutex,
    /// Stacks that created threads.
    ThreadCreate,
}

impl ProfileKind {
    /// Every kind, in the order used in messages.
    pub const ALL: [ProfileKind; 5] = [Self::Cpu, Self::Heap, Self::Block, Self::Mutex, Self::ThreadCreate];

    /// The name used in the config file and in output file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Heap => "heap",
            Self::Block => "block",
            Self::Mutex => "mutex",
            Self::ThreadCreate => "threadcreate",
        }
    }

    /// The allowed names, for error messages: `cpu, heap, block, mutex, threadcreate`.
    pub fn allowed() -> String {
        Self::ALL.map(Self::as_str).join(", ")
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
    fn unknown_names_list_the_allowed_ones() {
        let err = "CPU".parse::<ProfileKind>().unwrap_err();
        assert_eq!(err, r#""CPU" is not a profile type; allowed: cpu, heap, block, mutex, threadcreate"#);
        assert!("goroutine".parse::<ProfileKind>().is_err());
    }
}
