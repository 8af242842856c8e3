//! Creating the socket file: its directory, a stale file left by a crashed daemon, the mode
//! and the group. Everything here runs once at start, before any client can connect.

use std::{
    ffi::{CString, OsStr},
    fs::{self, DirBuilder},
    io,
    os::unix::{
        ffi::OsStrExt,
        fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt},
        io::AsRawFd,
        net::{UnixListener as StdListener, UnixStream as StdStream},
    },
    path::Path,
};

use tokio::net::UnixListener;

use crate::config::SocketConfig;

use super::ApiError;

/// Owner and group may connect; nobody else. Connecting needs write permission.
const SOCKET_MODE: u32 = 0o660;
const DIR_MODE: u32 = 0o755;
/// getgrnam_r's buffer starts here and doubles on ERANGE up to the cap (huge groups).
const GROUP_BUF_START: usize = 1024;
const GROUP_BUF_MAX: usize = 1 << 20;

/// Binds the control socket at `config.path` with mode 0660 and group `config.group`.
///
/// Creates the parent directory (0755) if needed and replaces a stale socket left by a
/// crashed daemon, but never a live one or a file that is not a socket. Refuses a parent
/// directory that others could write to (see [`restrict`] for why). Must be called inside a
/// tokio runtime.
pub fn bind(config: &SocketConfig) -> Result<UnixListener, ApiError> {
    let path = config.path.as_path();
    let dir_path = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| ApiError::NotASocket { path: path.to_owned() })?;
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir_path)
        .map_err(|source| ApiError::CreateDir { path: dir_path.to_owned(), source })?;
    let dir = open_private_dir(dir_path)?;
    remove_stale(path)?;
    let gid = config.group.as_deref().map(group_id).transpose()?;
    let listener = StdListener::bind(path).map_err(|source| ApiError::Bind { path: path.to_owned(), source })?;
    restrict(&dir, name, path, config.group.as_deref(), gid).and_then(|()| to_tokio(path, listener)).inspect_err(|_| {
        // A socket with the wrong owner or mode must not stay behind for a client to find.
        // SAFETY: `dir` and `name` are valid for the call.
        let _ = at(&dir, name, |dir, name| unsafe { libc::unlinkat(dir, name, 0) });
    })
}

/// Opens the socket's directory, refusing one that others could change entries of: it must
/// belong to us or root and be writable by its owner only, unless it is sticky (as `/tmp`),
/// where others cannot rename or remove our entries either.
fn open_private_dir(dir_path: &Path) -> Result<fs::File, ApiError> {
    let unsafe_dir = |problem: String| ApiError::UnsafeDir { path: dir_path.to_owned(), problem };
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir_path)
        .map_err(|source| ApiError::CreateDir { path: dir_path.to_owned(), source })?;
    let meta = dir.metadata().map_err(|source| ApiError::CreateDir { path: dir_path.to_owned(), source })?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(unsafe_dir(format!("belongs to uid {}, neither root nor the daemon's uid {euid}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 && meta.mode() & libc::S_ISVTX == 0 {
        return Err(unsafe_dir(format!("is writable by others (mode {:04o})", meta.mode() & 0o7777)));
    }
    Ok(dir)
}

/// Gives the socket `name`, just bound in `dir`, mode 0660 and group `gid`.
///
/// Why not by path, and why not on the socket's descriptor:
/// - `chmod`/`chown` by path resolve the path again, following symbolic links: if others
///   could write the directory, they could swap the socket for a link to `/etc/shadow`
///   between `bind` and `chmod`, and root would give it mode 0660 and the socket's group.
/// - `fchmod`/`fchown` on an `AF_UNIX` socket's descriptor change the socket's own (sockfs)
///   inode, not the file `bind` created: on Linux the path keeps the umask's mode (checked
///   on 6.x: after `fchmod(fd, 0600)`, `stat` of the path still shows 0755).
/// - Setting the umask around `bind` would change it for every thread of the process at
///   once (and for concurrent tests), narrowing the modes of whatever they create.
///
/// So: the directory is one only we can change entries of ([`open_private_dir`]), every
/// call below is relative to its descriptor, the entry is first checked to be a socket of
/// ours (not a link), and the owner change does not follow links either. Between `bind`
/// and the `chmod` the socket has the umask's mode, as it always had: connecting needs
/// write permission, which a usual umask (022, or the unit's 027) gives nobody else, and a
/// client that connects in that instant is still judged by its credentials.
fn restrict(dir: &fs::File, name: &OsStr, path: &Path, group: Option<&str>, gid: Option<u32>) -> Result<(), ApiError> {
    let chmod_err = |source| ApiError::Chmod { path: path.to_owned(), source };
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` and `name` are valid for the call; `st` is valid to write.
    at(dir, name, |dir, name| unsafe { libc::fstatat(dir, name, &mut st, libc::AT_SYMLINK_NOFOLLOW) })
        .map_err(chmod_err)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK || st.st_uid != unsafe { libc::geteuid() } {
        return Err(chmod_err(io::Error::other("the file there is not the socket just bound")));
    }
    // SAFETY: as above. The entry is a socket (not a link) in a directory only we can change.
    at(dir, name, |dir, name| unsafe { libc::fchmodat(dir, name, SOCKET_MODE, 0) }).map_err(chmod_err)?;
    if let (Some(group), Some(gid)) = (group, gid) {
        // SAFETY: as above; `uid_t::MAX` (-1) leaves the owner as it is.
        at(dir, name, |dir, name| unsafe {
            libc::fchownat(dir, name, libc::uid_t::MAX, gid, libc::AT_SYMLINK_NOFOLLOW)
        })
        .map_err(|source| ApiError::Chown { path: path.to_owned(), group: group.to_owned(), source })?;
    }
    Ok(())
}

/// Runs a `*at(2)` call on `name` relative to `dir`; its `-1` becomes the error.
fn at(dir: &fs::File, name: &OsStr, call: impl FnOnce(i32, *const libc::c_char) -> i32) -> io::Result<()> {
    let name = CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if call(dir.as_raw_fd(), name.as_ptr()) == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn to_tokio(path: &Path, listener: StdListener) -> Result<UnixListener, ApiError> {
    let bind_err = |source| ApiError::Bind { path: path.to_owned(), source };
    listener.set_nonblocking(true).map_err(bind_err)?;
    UnixListener::from_std(listener).map_err(bind_err)
}

/// Removes `path` if it is a socket nobody answers on.
fn remove_stale(path: &Path) -> Result<(), ApiError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ApiError::Probe { path: path.to_owned(), source }),
    };
    if !meta.file_type().is_socket() {
        return Err(ApiError::NotASocket { path: path.to_owned() });
    }
    match StdStream::connect(path) {
        Ok(_) => Err(ApiError::InUse { path: path.to_owned() }),
        Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {
            fs::remove_file(path).map_err(|source| ApiError::RemoveStale { path: path.to_owned(), source })
        }
        Err(source) => Err(ApiError::Probe { path: path.to_owned(), source }),
    }
}

/// Resolves a group name to its gid with `getgrnam_r` (thread-safe, unlike `getgrnam`).
pub fn group_id(group: &str) -> Result<u32, ApiError> {
    let unknown = || ApiError::UnknownGroup { group: group.to_owned() };
    let name = CString::new(group).map_err(|_| unknown())?;
    let mut buf = vec![0u8; GROUP_BUF_START];
    loop {
        // SAFETY: an all-zero `group` is a valid value of this plain C struct (null pointers).
        let mut entry: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's real
        // length; `entry`'s string pointers point into `buf`, which outlives their (no) use.
        let rc = unsafe { libc::getgrnam_r(name.as_ptr(), &mut entry, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
        match rc {
            0 if found.is_null() => return Err(unknown()),
            0 => return Ok(entry.gr_gid),
            libc::ERANGE if buf.len() < GROUP_BUF_MAX => buf.resize(buf.len() * 2, 0),
            // glibc reports "no such group" as ENOENT and friends in some configurations.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Err(unknown()),
            errno => {
                return Err(ApiError::GroupLookup {
                    group: group.to_owned(),
                    source: io::Error::from_raw_os_error(errno),
                })
            }
        }
    }
}
