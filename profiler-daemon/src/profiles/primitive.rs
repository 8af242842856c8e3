//! The waiting primitive of a futex sample: which locking function of the C library or of
//! Rust's std is on its symbolized stack (`pthread_mutex_lock`, `pthread_cond_wait`,
//! `std::sync::Mutex::lock`, …). It becomes the `primitive` label of block and mutex samples,
//! so `go tool pprof -tagfocus primitive=pthread_mutex_lock` keeps lock contention only.
//!
//! Runs after symbolization (it needs function names) and before encoding; it only adds a
//! label to a resolved profile.

use crate::resolve::{LabelValue, ResolvedProfile};

/// The label key.
pub const LABEL: &str = "primitive";

/// The value when no known primitive is on the stack (a raw `syscall(SYS_futex)`, or a stack
/// whose walk stopped inside the C library, which the profile comment counts).
pub const UNKNOWN: &str = "unknown";

/// C library functions that wait on or wake a futex, by exported name. glibc also exports
/// them with leading underscores (`__pthread_mutex_lock`) and versions (`@GLIBC_2.3.2`).
const LIBC: &[&str] = &[
    "pthread_mutex_lock",
    "pthread_mutex_timedlock",
    "pthread_mutex_clocklock",
    "pthread_mutex_unlock",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "pthread_cond_signal",
    "pthread_cond_broadcast",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_timedrdlock",
    "pthread_rwlock_timedwrlock",
    "pthread_rwlock_clockrdlock",
    "pthread_rwlock_clockwrlock",
    "pthread_rwlock_unlock",
    "pthread_barrier_wait",
    "pthread_join",
    "pthread_timedjoin_np",
    "pthread_clockjoin_np",
    "pthread_once",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
    "sem_post",
];

/// Rust std's futex-based primitives (`std::sys::sync::mutex::futex::Mutex::lock_contended`,
/// shown as `<std::sys::sync::mutex::futex::Mutex>::lock` when inlined; older releases used
/// `std::sys::unix::locks::futex_mutex`), by `Type::method` prefix, and the name users know.
/// Checked in order: `Parker::unpark` before `Parker::park`.
const RUST_STD: &[(&str, &str)] = &[
    ("Mutex::lock", "std::sync::Mutex::lock"),
    ("Mutex::wake", "std::sync::Mutex::unlock"),
    ("Mutex::unlock", "std::sync::Mutex::unlock"),
    ("Condvar::wait", "std::sync::Condvar::wait"),
    ("Condvar::notify_one", "std::sync::Condvar::notify_one"),
    ("Condvar::notify_all", "std::sync::Condvar::notify_all"),
    ("RwLock::read", "std::sync::RwLock::read"),
    ("RwLock::write", "std::sync::RwLock::write"),
    ("RwLock::wake", "std::sync::RwLock::unlock"),
    ("RwLock::unlock", "std::sync::RwLock::unlock"),
    ("Parker::unpark", "std::thread::Thread::unpark"),
    ("Parker::park", "std::thread::park"),
    ("Once::call", "std::sync::Once"),
];

/// The primitive a function name stands for, if it is one.
pub fn classify(function: &str) -> Option<&'static str> {
    let bare = function.split('@').next().unwrap_or(function).trim_start_matches('_');
    if let Some(name) = LIBC.iter().find(|&&name| name == bare) {
        return Some(name);
    }
    // Only std's own futex-based implementation, not any type of that name.
    let path: String = function.chars().filter(|&c| c != '<' && c != '>').collect();
    if !path.starts_with("std::sys::") || !path.contains("futex") {
        return None;
    }
    let method = path.rsplit("::").take(2).collect::<Vec<_>>();
    let type_method = match method[..] {
        [m, t] => format!("{t}::{m}"),
        _ => return None,
    };
    RUST_STD.iter().find(|(prefix, _)| type_method.starts_with(prefix)).map(|&(_, name)| name)
}

/// glibc's internal low-level lock, under `pthread_mutex_lock`/`unlock` but also under its
/// own locks (malloc arenas, stdio): named only when no public primitive is on the stack
/// (as when the frames above the C library are lost).
const LIBC_INTERNAL: &[(&str, &str)] = &[("lll_lock_wait", "lll_lock"), ("lll_lock_wake", "lll_unlock")];

/// The internal glibc lock a function name is, if it is one (`__GI___lll_lock_wait`).
fn classify_internal(function: &str) -> Option<&'static str> {
    let bare = function.rsplit("__").next().unwrap_or(function);
    LIBC_INTERNAL.iter().find(|(name, _)| bare.trim_start_matches('_') == *name).map(|&(_, label)| label)
}

/// Adds the `primitive` label to every sample: the innermost known primitive on its stack,
/// else glibc's internal lock if that is on it, else [`UNKNOWN`].
pub fn label(profile: &mut ResolvedProfile) {
    let ResolvedProfile { locations, samples, .. } = profile;
    for sample in samples.iter_mut() {
        let mut functions = sample.locations.iter().flat_map(|&loc| locations[loc].frames.iter()).map(|f| &f.function);
        let found =
            functions.clone().find_map(|f| classify(f)).or_else(|| functions.find_map(|f| classify_internal(f)));
        sample.labels.push((LABEL, LabelValue::Str(found.unwrap_or(UNKNOWN).to_string())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_libc_and_std_primitives() {
        assert_eq!(classify("pthread_mutex_lock"), Some("pthread_mutex_lock"));
        assert_eq!(classify("___pthread_mutex_lock"), Some("pthread_mutex_lock"));
        assert_eq!(classify("pthread_cond_wait@@GLIBC_2.3.2"), Some("pthread_cond_wait"));
        assert_eq!(classify("__pthread_cond_signal"), Some("pthread_cond_signal"));
        assert_eq!(classify("std::sys::sync::mutex::futex::Mutex::lock_contended"), Some("std::sync::Mutex::lock"));
        assert_eq!(classify("<std::sys::sync::mutex::futex::Mutex>::lock"), Some("std::sync::Mutex::lock"));
        assert_eq!(
            classify("std::sys::sync::thread_parking::futex::Parker::unpark"),
            Some("std::thread::Thread::unpark")
        );
        assert_eq!(classify("std::sys::sync::thread_parking::futex::Parker::park"), Some("std::thread::park"));
        assert_eq!(classify("std::sync::poison::mutex::Mutex<T>::lock"), None, "the public wrapper: not the wait");
        assert_eq!(classify("std::sys::sync::mutex::futex::Mutex::wake"), Some("std::sync::Mutex::unlock"));
        assert_eq!(classify("main"), None);
        assert_eq!(classify_internal("__GI___lll_lock_wait"), Some("lll_lock"));
        assert_eq!(classify_internal("__lll_lock_wake"), Some("lll_unlock"));
        assert_eq!(classify_internal("lll_lock_wait_private_thing"), None);
        assert_eq!(classify("my_app::Mutex::lock_contended"), None, "only std's own");
        assert_eq!(classify("pthread_mutex_lock_wrapper"), None);
    }
}
