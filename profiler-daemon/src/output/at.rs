//! File calls relative to an open directory: the output directory opened once, each
//! component below it created and opened without following a symbolic link, temporary files
//! with random names created exclusively, renamed into place, and their modes set.

use std::{
    ffi::{CString, OsStr, OsString},
    fs,
    io::{self, Write},
    os::unix::{
        ffi::OsStrExt,
        fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
        io::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    },
    path::{Component, Path},
};

use super::{DIR_MODE, FILE_MODE};

/// Attempts at a free random temporary name before giving up (a collision of 64 random
/// bits means something else is wrong).
const TEMP_ATTEMPTS: usize = 4;

/// Opens the directory `path` is to be written in: `root` (created with [`DIR_MODE`] if
/// missing, followed if a symbolic link), then each component between, never following a
/// symbolic link. Returns it with `path`'s file name.
pub(super) fn open_parent<'a>(root: &Path, path: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
    let outside = || io::Error::new(io::ErrorKind::InvalidInput, format!("not a file below {}", root.display()));
    // `a.pb.gz` lies below `.` although it does not start with it.
    let rel = match path.strip_prefix(root) {
        Ok(rel) => rel,
        Err(_) if root == Path::new(".") && path.is_relative() => path,
        Err(_) => return Err(outside()),
    };
    let mut parts = Vec::new();
    for part in rel.components() {
        match part {
            Component::Normal(name) => parts.push(name),
            _ => return Err(outside()),
        }
    }
    let name = parts.pop().ok_or_else(outside)?;
    let mut dir = open_root(root)?;
    let mut shown = root.to_path_buf();
    for part in parts {
        shown.push(part);
        dir = open_subdir(dir.as_fd(), part, &shown)?;
    }
    Ok((dir, name))
}

/// Creates `root` with [`DIR_MODE`] (and any missing parents) and opens it.
pub(super) fn open_root(root: &Path) -> io::Result<OwnedFd> {
    fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(root)?;
    let dir = fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(root)?;
    Ok(dir.into())
}

/// Creates `name` in `parent` with [`DIR_MODE`] if missing and opens it, refusing a symbolic
/// link, a non-directory, or a directory of another user. A directory of ours that others
/// may read (an older version's 0755) is narrowed to [`DIR_MODE`]. `shown` is its path,
/// for errors.
fn open_subdir(parent: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> io::Result<OwnedFd> {
    let c_name = c_name(name)?;
    // SAFETY: `parent` is an open descriptor and `c_name` a NUL-terminated string.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), c_name.as_ptr(), DIR_MODE) } != 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::AlreadyExists {
            return Err(err);
        }
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let dir = open_at(parent, &c_name, flags, 0).map_err(|err| match err.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => refused(shown, "is a symbolic link or not a directory"),
        _ => err,
    })?;
    let meta = fs::File::from(dir.try_clone()?).metadata()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(refused(shown, &format!("belongs to uid {}, not to the daemon's uid {euid}", meta.uid())));
    }
    if meta.mode() & 0o777 & !DIR_MODE != 0 {
        fchmod(dir.as_fd(), meta.mode() & DIR_MODE)?;
    }
    Ok(dir)
}

/// The error for a path the daemon will not write through, saying what to do.
fn refused(path: &Path, what: &str) -> io::Error {
    io::Error::other(format!("{} {what}; refusing to write through it: remove it", path.display()))
}

/// Writes `bytes` to a new temporary file beside `name` in `dir`, and returns it, still
/// open, with its name; on failure nothing is left behind.
pub(super) fn write_temp(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    bytes: &[u8],
) -> io::Result<(fs::File, OsString)> {
    let (mut file, tmp) = create_temp(dir, name, path)?;
    match file.write_all(bytes) {
        Ok(()) => Ok((file, tmp)),
        Err(err) => {
            let _ = unlink_at(dir, &tmp);
            Err(err)
        }
    }
}

/// Creates `.<name>.tmp-<16 random hex digits>` in `dir` with [`FILE_MODE`], exclusively:
/// a name that exists (whatever it is, a symbolic link too) is never opened, another
/// random name is tried. The leading dot keeps retention from listing it.
pub(super) fn create_temp(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> io::Result<(fs::File, OsString)> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    for _ in 0..TEMP_ATTEMPTS {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".tmp-{:016x}", random_u64()?));
        match open_at(dir, &c_name(&tmp)?, flags, FILE_MODE) {
            Ok(fd) => return Ok((fd.into(), tmp)),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(err),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name beside {} after {TEMP_ATTEMPTS} random tries", path.display()),
    ))
}

/// Renames the temporary file `tmp` to `name`, both in `dir`, unless `name` is something
/// other than a regular file. `rename` itself never follows a symbolic link at `name` (it
/// would replace the link), so the check only turns that into a clear refusal.
pub(super) fn install(dir: BorrowedFd<'_>, tmp: &OsStr, name: &OsStr, path: &Path) -> io::Result<()> {
    let c_target = c_name(name)?;
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is open, `c_target` NUL-terminated, `st` valid to write.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), c_target.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc == 0 && st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refused(path, "exists and is not a regular file (a symbolic link?)"));
    }
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::NotFound {
            return Err(err);
        }
    }
    let c_tmp = c_name(tmp)?;
    // SAFETY: as above; both names are relative to the same open directory.
    let rc = unsafe { libc::renameat(dir.as_raw_fd(), c_tmp.as_ptr(), dir.as_raw_fd(), c_target.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `openat(2)`.
fn open_at(dir: BorrowedFd<'_>, name: &CString, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is open and `name` NUL-terminated; the mode is passed as the variadic
    // argument `openat` reads only with O_CREAT.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `unlinkat(2)` of a file.
pub(super) fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let c_name = c_name(name)?;
    // SAFETY: `dir` is open and `c_name` NUL-terminated.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c_name.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fchmod(2)`.
fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: `fd` is open.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a file name"))
}

/// 64 bits from the kernel's random pool (`getrandom(2)`), for temporary names nobody can
/// predict.
fn random_u64() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        match usize::try_from(n) {
            Ok(n) if n == buf.len() => return Ok(u64::from_ne_bytes(buf)),
            Ok(_) => return Err(io::Error::other("getrandom returned fewer bytes than asked for")),
            Err(_) => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}
