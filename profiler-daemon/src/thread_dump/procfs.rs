//! What `/proc` says of one thread, for a thread dump: its name and scheduler state
//! (`/proc/PID/task/TID/stat`) and where in the kernel it waits (`wchan`). A thread that
//! exited since the iterator saw it has no directory any more: [`Gone`].

use std::io::ErrorKind;

use crate::ids::{Pid, Tid};

/// The thread exited (its `/proc` entry is gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gone;

/// A thread's name, state letter and wait channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadFacts {
    pub name: String,
    /// `R`, `S`, `D`, `T`, `t`, `Z`, `X`, `I`, as `ps` shows them.
    pub state: char,
    /// The kernel function it sleeps in (`None` while it runs, or when hidden).
    pub wchan: Option<String>,
}

/// Reads thread `tid` of process `pid`.
pub fn read(pid: Pid, tid: Tid) -> Result<ThreadFacts, Gone> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = read_file(&format!("{dir}/stat"))?;
    let (name, state) = parse_stat(&stat).ok_or(Gone)?;
    let wchan = read_file(&format!("{dir}/wchan"))?;
    let wchan = (!wchan.is_empty() && wchan != "0").then_some(wchan);
    Ok(ThreadFacts { name, state, wchan })
}

/// `/proc/…/stat`'s name (between the first `(` and the last `)`, since a name may hold
/// either) and the state letter after it.
fn parse_stat(stat: &str) -> Option<(String, char)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let state = stat.get(close + 1..)?.trim_start().chars().next()?;
    Some((name, state))
}

fn read_file(path: &str) -> Result<String, Gone> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.trim_end().to_string()),
        // ESRCH: the task is exiting; ENOENT: it is gone.
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => Err(Gone),
        // Anything else (EACCES on wchan without ptrace rights) leaves the field empty.
        Err(_) => Ok(String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_may_hold_parentheses_and_spaces() {
        assert_eq!(parse_stat("42 (a) b)) S 1 2 3"), Some(("a) b)".into(), 'S')));
        assert_eq!(parse_stat("42 (x"), None);
    }

    #[test]
    fn reads_this_thread_and_knows_when_one_is_gone() {
        let pid = Pid(std::process::id());
        // SAFETY: gettid has no preconditions.
        let tid = Tid(unsafe { libc::gettid() } as u32);
        let facts = read(pid, tid).unwrap();
        assert_eq!(facts.state, 'R', "this thread is running while it reads");
        assert!(!facts.name.is_empty());
        assert_eq!(read(pid, Tid(0x7fff_fff0)), Err(Gone));
    }
}
