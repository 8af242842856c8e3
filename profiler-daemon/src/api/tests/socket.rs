//! The socket file: directory, stale files, mode and group.

use std::os::unix::{
    fs::{MetadataExt, PermissionsExt},
    net::UnixListener as StdListener,
};

use super::TempDir;
use crate::{
    api::{bind, group_id, ApiError},
    config::SocketConfig,
};

fn config(dir: &TempDir, group: Option<String>) -> SocketConfig {
    SocketConfig { path: dir.0.join("sock"), group }
}

/// The name of our effective group, from /etc/group, so chown works without root.
fn own_group() -> Option<(String, u32)> {
    // SAFETY: getegid has no preconditions and cannot fail.
    let gid = unsafe { libc::getegid() };
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    let line = groups.lines().find(|line| line.split(':').nth(2) == Some(&gid.to_string()))?;
    Some((line.split(':').next()?.to_owned(), gid))
}

#[tokio::test]
async fn the_socket_is_0660_with_the_configured_group() {
    let dir = TempDir::new("mode");
    let (group, gid) = own_group().expect("the effective group is in /etc/group");
    assert_eq!(group_id(&group).unwrap(), gid);
    let config = config(&dir, Some(group));
    let _listener = bind(&config).unwrap();
    let meta = std::fs::metadata(&config.path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), gid);
}

#[tokio::test]
async fn an_unknown_group_is_named_and_leaves_no_socket() {
    let dir = TempDir::new("group");
    let config = config(&dir, Some("no-such-group-xyz".into()));
    let err = bind(&config).unwrap_err();
    assert!(matches!(err, ApiError::UnknownGroup { .. }), "{err:?}");
    let expected = "socket group \"no-such-group-xyz\" does not exist; \
                    create it (`groupadd no-such-group-xyz`) or change [socket] group";
    assert_eq!(err.to_string(), expected);
    assert!(!config.path.exists());
}

#[tokio::test]
async fn a_stale_socket_is_replaced() {
    let dir = TempDir::new("stale");
    let config = config(&dir, None);
    drop(StdListener::bind(&config.path).unwrap()); // the file stays, nobody listens
    assert!(bind(&config).is_ok());
}

#[tokio::test]
async fn a_live_socket_or_another_file_is_left_alone() {
    let dir = TempDir::new("live");
    let config = config(&dir, None);
    let _live = bind(&config).unwrap();
    let err = bind(&config).unwrap_err();
    assert!(matches!(err, ApiError::InUse { .. }), "{err:?}");
    assert!(err.to_string().contains("`systemctl stop profiler`"), "{err}");

    let file = config.path.with_file_name("file");
    std::fs::write(&file, "data").unwrap();
    let err = bind(&SocketConfig { path: file.clone(), group: None }).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{} exists and is not a socket; remove it or set another [socket] path", file.display())
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
}

#[tokio::test]
async fn a_directory_others_can_write_is_refused_unless_sticky() {
    let dir = TempDir::new("unsafe");
    let config = config(&dir, None);
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = bind(&config).unwrap_err();
    assert!(matches!(err, ApiError::UnsafeDir { .. }), "{err:?}");
    let expected = format!("the socket directory {} is writable by others (mode 0777);", dir.0.display());
    assert!(err.to_string().starts_with(&expected), "{err}");
    assert!(!config.path.exists());

    // Sticky, as /tmp: others can add entries but not rename or remove ours.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let _listener = bind(&config).unwrap();
    let meta = std::fs::symlink_metadata(&config.path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
}
