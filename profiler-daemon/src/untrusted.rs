//! Files that any local user controls, opened on behalf of one of their processes (a JIT's
//! `/tmp/perf-PID.map`). The daemon runs as root with `CAP_DAC_READ_SEARCH` and
//! `CAP_SYS_PTRACE`, so it opens them the way perf does, and stricter:
//!
//! - inside the process's own root (`openat2` from `/proc/PID/root` with `RESOLVE_IN_ROOT`
//!   and `RESOLVE_NO_MAGICLINKS`), so a container's absolute symlink cannot reach the
//!   daemon's files;
//! - as a path descriptor first (`O_PATH`, `O_NOFOLLOW`): a symlink at the last component,
//!   a FIFO or a device is seen for what it is without being opened (no driver runs, nothing
//!   blocks) and refused;
//! - only a regular file, owned by the process's uid (perf's own rule: a user's process
//!   can only have written a file it owns), of at most a capped size, then opened for
//!   reading through that descriptor (`O_NONBLOCK`) and read with the cap.
//!
//! A refusal says why, for the profile comment that counts it.

use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{
            ffi::OsStrExt,
            fs::{MetadataExt, OpenOptionsExt},
        },
    },
    path::Path,
};

use crate::ids::Pid;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("cannot be opened inside the process's root")]
    Open(#[source] io::Error),
    #[error("is a {kind}, not a regular file")]
    NotRegular { kind: &'static str },
    #[error("is owned by uid {owner}, not by the process's uid")]
    WrongOwner { owner: u32 },
    #[error("is {size} bytes, over the {cap}-byte cap")]
    TooLarge { size: u64, cap: u64 },
    #[error("changed while it was opened")]
    Replaced,
    #[error("could not be read")]
    Read(#[source] io::Error),
}

/// Opens `path` (absolute, as the process sees it) in process `pid`'s root for reading, if
/// it is a regular file owned by one of `owners` of at most `cap` bytes. The checks are made
/// on a path descriptor (`O_PATH`), before anything is opened for reading: opening a device
/// runs its driver, whatever the flags. The file may still grow afterwards: read it with
/// `take(cap + 1)`.
pub fn open_owned(pid: Pid, path: &Path, owners: &[u32], cap: u64) -> Result<File, Refused> {
    open_checked(&format!("/proc/{pid}/root"), path, Some(owners), cap)
}

/// Opens `path` inside the root `root` (`/proc/PID/root`, or `/` for the host's) for
/// reading, if it is a regular file of at most `cap` bytes, whoever owns it, with the same
/// checks as [`open_owned`] otherwise: for files found by a name another file gives (a
/// separate debug file), which are checked by their contents (build id, CRC) instead.
pub fn open_regular_in(root: &str, path: &Path, cap: u64) -> Result<File, Refused> {
    open_checked(root, path, None, cap)
}

fn open_checked(root: &str, path: &Path, owners: Option<&[u32]>, cap: u64) -> Result<File, Refused> {
    // A `File` only to `fstat` it: an `O_PATH` descriptor can do no more.
    let handle = File::from(open_path_in_root(root, path).map_err(Refused::Open)?);
    let meta = handle.metadata().map_err(Refused::Read)?;
    if !meta.file_type().is_file() {
        return Err(Refused::NotRegular { kind: kind(meta.mode()) });
    }
    if owners.is_some_and(|owners| !owners.contains(&meta.uid())) {
        return Err(Refused::WrongOwner { owner: meta.uid() });
    }
    if meta.size() > cap {
        return Err(Refused::TooLarge { size: meta.size(), cap });
    }
    // Through our own descriptor's magic link: the same inode, now for reading.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(Refused::Open)?;
    let reopened = file.metadata().map_err(Refused::Read)?;
    if (reopened.dev(), reopened.ino()) != (meta.dev(), meta.ino()) {
        return Err(Refused::Replaced);
    }
    Ok(file)
}

/// Reads all of such a file (see [`open_owned`]), at most `cap` bytes. The tests' way in:
/// production opens the file and reads it as it goes (`symbolize::perf_map`).
#[cfg(test)]
fn read_owned(pid: Pid, path: &Path, owners: &[u32], cap: u64) -> Result<Vec<u8>, Refused> {
    use std::io::Read;
    let file = open_owned(pid, path, owners, cap)?;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(Refused::Read)?;
    if bytes.len() as u64 > cap {
        return Err(Refused::TooLarge { size: bytes.len() as u64, cap });
    }
    Ok(bytes)
}

/// A path descriptor (`O_PATH`) of `path` inside `root` (`/proc/PID/root`), never following
/// a link out of it, a magic link, or a link at the last component (which it then names
/// itself).
fn open_path_in_root(root: &str, path: &Path) -> io::Result<OwnedFd> {
    let root = CString::new(root).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the root"))?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let dir = unsafe { libc::open(root.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if dir < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dir` is a descriptor we just opened and own.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = CString::new(relative.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: `open_how` is plain integers; all-zero is valid (and what unset fields must be).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 with a live directory descriptor, a NUL-terminated path and an
    // `open_how` of the size passed; the result is checked.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), relative.as_ptr(), &how, size_of::<libc::open_how>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor, which we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        _ => "special file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files in a scratch directory of our own process, read through our own root.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("profiler-untrusted-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn me() -> (Pid, u32) {
        // SAFETY: getuid has no preconditions.
        (Pid(std::process::id()), unsafe { libc::getuid() })
    }

    #[test]
    fn reads_a_regular_file_its_owner_wrote() {
        let s = Scratch::new("ok");
        let (pid, uid) = me();
        std::fs::write(s.0.join("map"), b"7f00 10 f\n").unwrap();
        assert_eq!(read_owned(pid, &s.0.join("map"), &[uid], 64).unwrap(), b"7f00 10 f\n");
        assert!(matches!(read_owned(pid, &s.0.join("map"), &[uid + 1], 64), Err(Refused::WrongOwner { .. })));
        assert!(matches!(read_owned(pid, &s.0.join("map"), &[uid], 4), Err(Refused::TooLarge { .. })));
    }

    #[test]
    fn refuses_fifos_links_and_huge_sparse_files_without_blocking() {
        let s = Scratch::new("attacks");
        let (pid, uid) = me();
        let fifo = CString::new(s.0.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        // Nobody ever writes to it: a blocking open would hang this test forever.
        let err = read_owned(pid, &s.0.join("fifo"), &[uid], 64 << 20).unwrap_err();
        assert!(matches!(err, Refused::NotRegular { kind: "FIFO" }), "{err}");
        std::os::unix::fs::symlink("/dev/zero", s.0.join("zero")).unwrap();
        let err = read_owned(pid, &s.0.join("zero"), &[uid], 64 << 20).unwrap_err();
        assert!(matches!(err, Refused::NotRegular { kind: "symbolic link" }), "{err}");
        // A device, reached without a link (a bind mount, a container's mknod): never opened.
        let err = read_owned(Pid(std::process::id()), Path::new("/dev/null"), &[0], 64).unwrap_err();
        assert!(matches!(err, Refused::NotRegular { kind: "character device" }), "{err}");
        let sparse = File::create(s.0.join("sparse")).unwrap();
        sparse.set_len(10 << 30).unwrap();
        let err = read_owned(pid, &s.0.join("sparse"), &[uid], 64 << 20).unwrap_err();
        assert!(matches!(err, Refused::TooLarge { size, .. } if size == 10 << 30), "{err}");
    }
}
