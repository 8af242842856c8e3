//! Creating the socket file: its directory, a stale file left by a crashed daemon, the mode
//! and the group. Everything here runs once at start, before any client can connect.

use std::{
    ffi::CString,
    fs::{self, DirBuilder, Permissions},
    io,
    os::unix::{
        fs::{DirBuilderExt, FileTypeExt, PermissionsExt},
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
/// crashed daemon, but never a live one or a file that is not a socket. Must be called inside
/// a tokio runtime.
pub fn bind(config: &SocketConfig) -> Result<UnixListener, ApiError> {
    let path = config.path.as_path();
    if let Some(dir) = path.parent() {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|source| ApiError::CreateDir { path: dir.to_owned(), source })?;
    }
    remove_stale(path)?;
    let gid = config.group.as_deref().map(group_id).transpose()?;
    // Until the chmod below the socket has the umask's mode; a umask that lets others write
    // is unusual enough for a root daemon that the short window is accepted rather than
    // changing the process-wide umask under other threads.
    let listener = StdListener::bind(path).map_err(|source| ApiError::Bind { path: path.to_owned(), source })?;
    restrict(path, config.group.as_deref(), gid).and_then(|()| to_tokio(path, listener)).inspect_err(|_| {
        // A socket with the wrong owner or mode must not stay behind for a client to find.
        let _ = fs::remove_file(path);
    })
}

fn restrict(path: &Path, group: Option<&str>, gid: Option<u32>) -> Result<(), ApiError> {
    fs::set_permissions(path, Permissions::from_mode(SOCKET_MODE))
        .map_err(|source| ApiError::Chmod { path: path.to_owned(), source })?;
    if let (Some(group), Some(gid)) = (group, gid) {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|source| ApiError::Chown {
            path: path.to_owned(),
            group: group.to_owned(),
            source,
        })?;
    }
    Ok(())
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
