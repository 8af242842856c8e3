//! The file a process maps, opened once and checked on the descriptor, then handed on as
//! that descriptor to every parser (unwinder, symbolizer, runtime detection).
//!
//! A mapping's path was true when the process mapped it; any user may have changed it since
//! (renamed a FIFO over it, swapped a directory for a symlink into a FUSE mount that never
//! answers). Looking a path up twice, `stat` then `open`, reads two different files when the
//! user races the lookups, and an `open` of a FIFO blocks until a writer comes. So a mapped
//! file is opened exactly once, and every check is made on what was opened:
//!
//! - first through `/proc/PID/map_files/START-END`, the mapping itself: the kernel follows it
//!   to the very inode the process maps, walking no directory a user controls (it can only
//!   be the mapped file: a FIFO cannot be mapped). [`open_mapping`] never blocks on a file
//!   on a block device, so it may run on the collector's thread for those;
//! - when the process is gone, by its path ([`open_by_path`]): inside the host's root with
//!   no symlink followed anywhere (the kernel's path of a mapping has none), then inside the
//!   process's root (`RESOLVE_IN_ROOT`). A path walk can enter any file system, so this
//!   runs on an offload worker, never inline.
//!
//! Either way the file is opened as a path descriptor (`O_PATH`: no driver runs, nothing
//! blocks), `fstat`ed (a regular file, the mapping's device and inode), and only then opened
//! for reading through that descriptor (`O_NONBLOCK`), and checked again.

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
    path::{Path, PathBuf},
};

use crate::{
    ids::Pid,
    offload::Charger,
    procs::{Device, MapEntry},
};

/// A mapped file, open for reading and checked to be the file the mapping maps.
#[derive(Debug)]
pub struct OpenedFile {
    file: File,
    /// Its size and modification time in nanoseconds: with the device and inode, what tells
    /// a file rewritten in place (whole seconds would not, for a rebuild within one).
    version: (u64, i64),
}

impl OpenedFile {
    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// (size, mtime in ns) when it was opened.
    pub fn version(&self) -> (u64, i64) {
        self.version
    }

    /// A path that names this open file and nothing else (`/proc/self/fd/N`), for parsers
    /// that take a path: opening it opens the same inode again, with no lookup of the
    /// mapping's path. Valid while `self` lives.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// The device the file lives on, from the descriptor.
    pub fn device(&self) -> Device {
        let dev = self.file.metadata().map_or(0, |m| m.dev());
        Device { major: libc::major(dev), minor: libc::minor(dev) }
    }
}

/// Why a mapped file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum NotOpened {
    #[error("cannot be opened: {0}")]
    Open(#[source] io::Error),
    #[error("is not a regular file")]
    NotRegular,
    #[error("is another file now (device or inode differ from the mapping's)")]
    Replaced,
}

/// Opens the file of `map` through the mapping itself (`/proc/PID/map_files`): no path a
/// user controls is walked, so on a block device's file system it does not block. Fails
/// when the process or its mapping is gone (then see [`open_by_path`]).
pub fn open_mapping(pid: Pid, map: &MapEntry) -> Result<OpenedFile, NotOpened> {
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", map.start, map.end);
    // Not O_NOFOLLOW: the link is the kernel's own, and following it is the point.
    let handle =
        open_path_at(libc::AT_FDCWD, Path::new(&link), libc::O_PATH | libc::O_CLOEXEC, 0).map_err(NotOpened::Open)?;
    // The kernel followed the mapping to its file: the inode is checked (the mapping may have
    // been replaced by another at the same range), not the device, which `stat` and the
    // maps disagree on for btrfs subvolumes and (before Linux 6.8) overlayfs files.
    checked(handle, map, Same::Inode)
}

/// What must match between an opened file and its mapping.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Same {
    Inode,
    DeviceAndInode,
}

/// Opens the file of `map` by its path, for a process that is gone (its mapping can no
/// longer be followed): the path in the host's root when it holds no symlink and leads to
/// the mapping's device and inode, else the path inside the process's root. May block in
/// a file system on the way: run it on an offload worker.
pub fn open_by_path(pid: Pid, map: &MapEntry) -> Result<OpenedFile, NotOpened> {
    if map.path.ends_with(" (deleted)") {
        return Err(NotOpened::Replaced);
    }
    let path = Path::new(&*map.path);
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let direct = open_path_at(libc::AT_FDCWD, path, flags, libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS);
    match direct.map_err(NotOpened::Open).and_then(|handle| checked(handle, map, Same::DeviceAndInode)) {
        Ok(opened) => Ok(opened),
        Err(direct) => in_root(pid, path, map).map_err(|_| direct),
    }
}

/// Opens the file of `map` on an offload worker: through the mapping (a stall charged to
/// its device), else by path (a stall charged to no device until the walk has ended, as it
/// may lead anywhere).
pub fn open_on_worker(charger: &Charger, pid: Pid, map: &MapEntry) -> Option<OpenedFile> {
    if let Ok(file) = open_mapping(pid, map) {
        return Some(file);
    }
    charger.charge_to(None);
    let file = open_by_path(pid, map).ok()?;
    charger.charge_to(Some(file.device()));
    Some(file)
}

/// Opens the file of `map` on the calling thread, only where that cannot block: through
/// the mapping, on a block device's file system. `None` otherwise (a file elsewhere, or a
/// process gone): that needs [`open_on_worker`].
pub fn open_inline(pid: Pid, map: &MapEntry) -> Option<OpenedFile> {
    if map.device.major == 0 {
        return None;
    }
    open_mapping(pid, map).ok()
}

/// The file at `path` inside the process's root (a container's), never leaving it.
fn in_root(pid: Pid, path: &Path, map: &MapEntry) -> Result<OpenedFile, NotOpened> {
    let root = File::open(format!("/proc/{pid}/root")).map_err(NotOpened::Open)?;
    let relative = path.strip_prefix("/").unwrap_or(path);
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    let handle = open_path_at(root.as_raw_fd(), relative, flags, resolve).map_err(NotOpened::Open)?;
    checked(handle, map, Same::DeviceAndInode)
}

/// `handle` (an `O_PATH` descriptor) checked to be `map`'s regular file (by `same`), then
/// opened for reading through itself and checked again.
fn checked(handle: OwnedFd, map: &MapEntry, same: Same) -> Result<OpenedFile, NotOpened> {
    let handle = File::from(handle);
    let meta = handle.metadata().map_err(NotOpened::Open)?;
    if !meta.file_type().is_file() {
        return Err(NotOpened::NotRegular);
    }
    let matches = |meta: &std::fs::Metadata| match same {
        Same::Inode => meta.ino() == map.inode,
        Same::DeviceAndInode => {
            same_file(meta, map) || (meta.ino() == map.inode && reports_another_device(handle.as_raw_fd()))
        }
    };
    if !matches(&meta) {
        return Err(NotOpened::Replaced);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(NotOpened::Open)?;
    let meta = file.metadata().map_err(NotOpened::Open)?;
    if !matches(&meta) {
        return Err(NotOpened::Replaced);
    }
    let version = (meta.size(), meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec()));
    Ok(OpenedFile { file, version })
}

/// Whether the file system of `fd` is one whose files `stat` with another device than the
/// mappings and the kernel's events name (overlayfs: the layer's device or the overlay's;
/// btrfs: the subvolume's or the file system's): there, the inode alone is compared.
fn reports_another_device(fd: i32) -> bool {
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
    // SAFETY: `statfs` is plain integers; all-zero is a valid value to be overwritten.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a valid out pointer; the result is checked.
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 {
        return false;
    }
    matches!(fs.f_type as i64, OVERLAYFS_SUPER_MAGIC | BTRFS_SUPER_MAGIC)
}

fn same_file(meta: &std::fs::Metadata, map: &MapEntry) -> bool {
    let dev = meta.dev();
    (libc::major(dev), libc::minor(dev), meta.ino()) == (map.device.major, map.device.minor, map.inode)
}

/// `openat2(dir, path, flags, resolve)`; where `openat2` is refused (a kernel before 5.6,
/// or a seccomp filter that predates it, as `systemd-nspawn`'s may), `openat` with the same
/// flags, checked afterwards as far as it can be (see [`open_path_without_openat2`]).
fn open_path_at(dir: i32, path: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: `open_how` is plain integers; all-zero is valid (and what unset fields must be).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: openat2 with a descriptor (or AT_FDCWD), a NUL-terminated path and an
    // `open_how` of the size passed; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_openat2, dir, c_path.as_ptr(), &how, size_of::<libc::open_how>()) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENOSYS | libc::EPERM) => open_path_without_openat2(dir, path, &c_path, flags, resolve),
            _ => Err(err),
        };
    }
    // SAFETY: the kernel returned a new descriptor, which we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat` for [`open_path_at`]: with no resolve flag, the same call; with
/// `RESOLVE_NO_SYMLINKS` (an absolute path), the opened file's own path (`/proc/self/fd`)
/// must be the path asked for, which it is not when a symlink was followed on the way;
/// `RESOLVE_IN_ROOT` cannot be had without `openat2` and is refused.
fn open_path_without_openat2(dir: i32, path: &Path, c_path: &CString, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    if resolve & libc::RESOLVE_IN_ROOT != 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    // SAFETY: a descriptor (or AT_FDCWD) and a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::openat(dir, c_path.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor, which we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if resolve & libc::RESOLVE_NO_SYMLINKS != 0 {
        let opened = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if !path.is_absolute() || opened != path {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// This test binary's own first executable mapping.
    fn own_text() -> MapEntry {
        let maps = crate::procs::read_maps(std::process::id()).expect("own maps");
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        maps.into_iter().find(|m| Path::new(&*m.path) == exe).expect("a mapping of the test binary")
    }

    #[test]
    fn a_mapping_opens_through_map_files_and_by_path_as_the_same_file() {
        let map = own_text();
        let pid = Pid(std::process::id());
        let by_path = open_by_path(pid, &map).expect("by path");
        let ino = |f: &OpenedFile| f.file().metadata().unwrap().ino();
        assert_eq!(ino(&by_path), map.inode);
        let reopened = std::fs::metadata(by_path.fd_path()).unwrap();
        assert_eq!(reopened.ino(), map.inode, "the fd path names the same inode");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // `cargo xtask test --unit` runs as anyone; the end-to-end tests, as root, open
            // every mapping this way.
            eprintln!("map_files needs CAP_CHECKPOINT_RESTORE (root): only the path was opened");
            return;
        }
        let mapped = open_mapping(pid, &map).expect("map_files");
        assert_eq!(ino(&mapped), map.inode);
        assert_eq!(mapped.version(), by_path.version());
    }

    #[test]
    fn a_fifo_or_a_symlink_at_the_path_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("opened-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("lib.so");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let meta = std::fs::symlink_metadata(&fifo).unwrap();
        let map = MapEntry {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            path: fifo.to_string_lossy().into(),
            inode: meta.ino(),
            device: Device { major: libc::major(meta.dev()), minor: libc::minor(meta.dev()) },
            generation: 0,
            unmapped: false,
        };
        // A pid that is not alive: only the path is left to try. With no writer, an open
        // for reading of a FIFO would block for ever; the test finishing is the check.
        let gone = Pid(0x7fff_fff0);
        assert!(matches!(open_by_path(gone, &map), Err(NotOpened::NotRegular)));
        let real = dir.join("real");
        std::fs::write(&real, b"x").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real_meta = std::fs::metadata(&real).unwrap();
        let through_link = MapEntry { path: link.to_string_lossy().into(), inode: real_meta.ino(), ..map.clone() };
        assert!(open_by_path(gone, &through_link).is_err(), "a symlink on the way is not followed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
