//! Processes the walkers must stop asking about: those the configuration's selection leaves
//! out (`[processes]` name, exe or pid matchers, which the kernel cannot filter by).
//!
//! A walker that meets a process unregistered asks for its registration once, remembered in
//! an LRU of `REGISTER_ASKED_MAX_ENTRIES` (see `profiler-ebpf`'s `user_stack`). A process
//! the selection leaves out is never registered, so with more such processes active than
//! the LRU holds, it churned and every walk of an evicted one woke the collector again
//! (security review N15). Each one asked for is decided here once the catalogue knows it:
//! left out, it goes into the kernel's `REGISTER_DECLINED` and asks no more. An entry is
//! withdrawn when its process exits or becomes selected (an exec, which also clears the
//! kernel's entry itself, a new name or a reloaded selection).

use std::collections::{HashMap, HashSet};

use crate::{ebpf::Session, ids::Pid};

/// Asks remembered while the catalogue does not know their process yet; past it, a new ask
/// is dropped (its process asks again once the LRU evicts it).
const PENDING_KEPT: usize = 4_096;

/// Settlements an ask for a process the catalogue does not know waits (the side band's
/// records of a process may come after its first walk).
const PENDING_SETTLEMENTS: u8 = 4;

/// What the catalogue says of a process, as far as a decline goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not known (yet, or any more).
    Unknown,
    Exited,
    Selected,
    LeftOut,
}

/// What to do with an ask not yet settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    Decline,
    Wait,
    Drop,
}

/// An ask for a process seen as `seen`, with `waits` settlements left.
fn pending(seen: Seen, waits: u8) -> Pending {
    match seen {
        Seen::LeftOut => Pending::Decline,
        Seen::Unknown if waits > 1 => Pending::Wait,
        // Selected: registered by the unwinder; exited or long unknown: nothing to stop.
        Seen::Unknown | Seen::Exited | Seen::Selected => Pending::Drop,
    }
}

/// Whether a declined process's entry stays: only while it is known and still left out.
fn keeps_decline(seen: Seen) -> bool {
    seen == Seen::LeftOut
}

/// Counts, for `/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeclinedStats {
    /// Processes declined now.
    pub held: usize,
    /// Declines written since start.
    pub declined: u64,
    /// Declines refused because the kernel's map was full: those processes keep asking.
    pub full: u64,
}

/// The asks waiting for a decision and the declines the kernel holds. One owner: the
/// capture, which reads the asks and knows the selection.
#[derive(Debug, Default)]
pub struct Declined {
    pending: HashMap<Pid, u8>,
    held: HashSet<Pid>,
    declined: u64,
    full: u64,
}

impl Declined {
    /// A walker asked for `pid`'s registration.
    pub fn asked(&mut self, pid: Pid) {
        if self.held.contains(&pid) || (self.pending.len() >= PENDING_KEPT && !self.pending.contains_key(&pid)) {
            return;
        }
        self.pending.insert(pid, PENDING_SETTLEMENTS);
    }

    /// Whether [`Declined::settle`] has asks to decide.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Declines the processes asked for that `seen` says are left out (at each read of the
    /// side band: cheap when nothing was asked). Returns the first map error (the rest are
    /// still tried).
    pub fn settle_asks(&mut self, session: &mut Session, seen: impl Fn(Pid) -> Seen) -> crate::ebpf::Result<()> {
        let mut result = Ok(());
        let mut decline = Vec::new();
        self.pending.retain(|&pid, waits| match pending(seen(pid), *waits) {
            Pending::Decline => {
                decline.push(pid);
                false
            }
            Pending::Wait => {
                *waits -= 1;
                true
            }
            Pending::Drop => false,
        });
        for pid in decline {
            match session.decline_registration(pid) {
                Ok(true) => {
                    self.held.insert(pid);
                    self.declined += 1;
                }
                Ok(false) => self.full += 1,
                Err(err) => result = result.and(Err(err)),
            }
        }
        result
    }

    /// [`Declined::settle_asks`], then withdraws the declines of processes that exited or
    /// are now selected (at drains: it looks at every decline).
    pub fn settle(&mut self, session: &mut Session, seen: impl Fn(Pid) -> Seen) -> crate::ebpf::Result<()> {
        let mut result = self.settle_asks(session, &seen);
        let withdrawn: Vec<Pid> = self.held.iter().copied().filter(|&pid| !keeps_decline(seen(pid))).collect();
        for pid in withdrawn {
            self.held.remove(&pid);
            result = result.and(session.undecline_registration(pid));
        }
        result
    }

    /// Withdraws every decline (the selection changed: any process may be selected now).
    pub fn clear(&mut self, session: &mut Session) -> crate::ebpf::Result<()> {
        self.pending.clear();
        let mut result = Ok(());
        for pid in std::mem::take(&mut self.held) {
            result = result.and(session.undecline_registration(pid));
        }
        result
    }

    pub fn stats(&self) -> DeclinedStats {
        DeclinedStats { held: self.held.len(), declined: self.declined, full: self.full }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_known_left_out_process_is_declined() {
        assert_eq!(pending(Seen::LeftOut, 1), Pending::Decline);
        assert_eq!(pending(Seen::Selected, 4), Pending::Drop);
        assert_eq!(pending(Seen::Exited, 4), Pending::Drop);
    }

    #[test]
    fn an_unknown_process_is_waited_for_a_few_settlements_then_dropped() {
        let mut waits = PENDING_SETTLEMENTS;
        let mut settlements = 0;
        while pending(Seen::Unknown, waits) == Pending::Wait {
            waits -= 1;
            settlements += 1;
        }
        assert_eq!(settlements, PENDING_SETTLEMENTS - 1);
        assert_eq!(pending(Seen::Unknown, waits), Pending::Drop);
    }

    #[test]
    fn a_decline_is_withdrawn_unless_its_process_is_still_left_out() {
        assert!(keeps_decline(Seen::LeftOut));
        for seen in [Seen::Unknown, Seen::Exited, Seen::Selected] {
            assert!(!keeps_decline(seen), "{seen:?}");
        }
    }

    #[test]
    fn asks_beyond_the_pending_bound_are_dropped_but_a_repeat_is_kept() {
        let mut declined = Declined::default();
        for pid in 0..PENDING_KEPT as u32 {
            declined.asked(Pid(pid + 1));
        }
        declined.asked(Pid(u32::MAX));
        assert_eq!(declined.pending.len(), PENDING_KEPT);
        declined.asked(Pid(1));
        assert_eq!(declined.pending.len(), PENDING_KEPT);
    }
}
