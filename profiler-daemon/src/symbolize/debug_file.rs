//! Finding a mapped file's separate debug file, the way gdb and elfutils do, inside the
//! process's root (a container's debug files are its own):
//!
//! 1. by build id: `/usr/lib/debug/.build-id/xx/yyyy.debug`, taken when its own build id is
//!    the mapped file's (no checksum: the build id already says it is the same build);
//! 2. by `.gnu_debuglink`: the name it gives, in the mapped file's directory, in its
//!    `.debug/` and under `/usr/lib/debug/<directory>`, taken when the CRC-32 of its whole
//!    contents is the one the link gives.
//!
//! Each candidate is opened once, inside the root (`RESOLVE_IN_ROOT`, no symlink at the last
//! component, a regular file only: see [`crate::untrusted`]), and checked on what was
//! opened; the symbolizer then parses that descriptor. blazesym's own lookup is never used:
//! it walks host paths, and checks the link's CRC even for a file found by build id (7% of a
//! snapshot's CPU with libc6-dbg installed).

use std::{fs::File, path::Path};

use crate::{
    elf::{build_id_any, MappedFile},
    ids::Pid,
    untrusted,
};

/// Where debug files live, in every root.
const DEBUG_DIR: &str = "/usr/lib/debug";
/// The largest debug file looked at: libc6-dbg's is 5 MiB, a debug Chromium's 2 GiB.
const MAX_DEBUG_FILE_BYTES: u64 = 4 << 30;

/// How a debug file was found (for the profile's counts and notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundBy {
    BuildId,
    DebugLink,
}

/// A separate debug file, open.
#[derive(Debug)]
pub struct DebugFile {
    pub file: File,
    /// Its path inside the process's root.
    pub path: String,
    pub found_by: FoundBy,
}

/// What a mapped file says about its debug file.
pub struct Wanted<'a> {
    /// Its build id (lowercase hex).
    pub build_id: Option<&'a str>,
    /// Its `.gnu_debuglink` (name, CRC).
    pub link: Option<(&'a str, u32)>,
    /// Its path as the process sees it.
    pub mapped_path: &'a str,
    /// (device, inode) of the mapped file itself: a link naming the file is no debug file.
    pub identity: (u64, u64),
}

/// The root the files of process `pid` are looked up in: its own while it lives, else the
/// host's (where a gone process's mapped file was then also found, see [`crate::opened`]).
pub fn root_of(pid: Pid) -> String {
    let root = format!("/proc/{pid}/root");
    if std::fs::metadata(&root).is_ok() {
        root
    } else {
        "/".to_string()
    }
}

/// The debug file `wanted` names, found in `root`, or `None`.
pub fn find(root: &str, wanted: &Wanted<'_>) -> Option<DebugFile> {
    if let Some(id) = wanted.build_id.filter(|id| id.len() >= 4 && id.bytes().all(|b| b.is_ascii_hexdigit())) {
        let path = format!("{DEBUG_DIR}/.build-id/{}/{}.debug", &id[..2], &id[2..]);
        if let Some(file) = open(root, &path, wanted.identity) {
            if MappedFile::map(&file).ok().and_then(|m| build_id_any(m.bytes())).as_deref() == Some(id) {
                return Some(DebugFile { file, path, found_by: FoundBy::BuildId });
            }
            tracing::debug!(path, "debug file by build id has another build id; not used");
        }
    }
    let (name, crc) = wanted.link?;
    let dir = Path::new(wanted.mapped_path).parent().and_then(Path::to_str).unwrap_or("/");
    let dir = dir.trim_end_matches('/');
    let candidates = [format!("{dir}/{name}"), format!("{dir}/.debug/{name}"), format!("{DEBUG_DIR}{dir}/{name}")];
    candidates.into_iter().find_map(|path| {
        let file = open(root, &path, wanted.identity)?;
        let mapped = MappedFile::map(&file).ok()?;
        if crc32fast::hash(mapped.bytes()) != crc {
            tracing::debug!(path, "debug link target has another CRC; not used");
            return None;
        }
        drop(mapped);
        Some(DebugFile { file, path, found_by: FoundBy::DebugLink })
    })
}

/// `path` opened inside `root`, if it is a regular file other than the mapped file.
fn open(root: &str, path: &str, identity: (u64, u64)) -> Option<File> {
    use std::os::unix::fs::MetadataExt;
    let file = untrusted::open_regular_in(root, Path::new(path), MAX_DEBUG_FILE_BYTES).ok()?;
    let meta = file.metadata().ok()?;
    ((meta.dev(), meta.ino()) != identity).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A scratch directory standing for a root, removed at the end.
    struct Root(std::path::PathBuf);

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn run(cmd: &mut Command) {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A stripped program with a debug link, and its debug file, under `root`/usr/bin.
    fn program(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let bin = root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let src = bin.join("p.c");
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let exe = bin.join("p");
        run(Command::new("cc").args(["-g", "-Wl,--build-id", "-o"]).arg(&exe).arg(&src));
        let debug = bin.join("p.debug");
        run(Command::new("objcopy").arg("--only-keep-debug").arg(&exe).arg(&debug));
        run(Command::new("strip").arg("--strip-all").arg(&exe));
        run(Command::new("objcopy").arg(format!("--add-gnu-debuglink={}", debug.display())).arg(&exe));
        (exe, debug)
    }

    fn wanted_of<'a>(bytes: &'a [u8], id: &'a Option<String>, link: &'a Option<(String, u32)>) -> Wanted<'a> {
        let _ = bytes;
        Wanted {
            build_id: id.as_deref(),
            link: link.as_ref().map(|(n, c)| (n.as_str(), *c)),
            mapped_path: "/usr/bin/p",
            identity: (0, 0),
        }
    }

    #[test]
    fn finds_by_build_id_first_then_by_a_checked_debug_link() {
        let root = Root(std::env::temp_dir().join(format!("profiler-debug-file-{}", std::process::id())));
        let (exe, debug) = program(&root.0);
        let bytes = std::fs::read(&exe).unwrap();
        let id = crate::elf::build_id(&bytes);
        let link = crate::elf::debug_link(&bytes);
        assert_eq!(link.as_ref().map(|l| l.0.as_str()), Some("p.debug"));
        let root_str = root.0.to_str().unwrap();
        // Beside the program: by its link, CRC checked.
        let found = find(root_str, &wanted_of(&bytes, &id, &link)).unwrap();
        assert_eq!((found.found_by, found.path.as_str()), (FoundBy::DebugLink, "/usr/bin/p.debug"));
        // A link whose CRC is not the file's is not followed.
        let wrong = link.clone().map(|(n, c)| (n, c ^ 1));
        assert!(find(root_str, &wanted_of(&bytes, &None, &wrong)).is_none());
        // By build id, which wins.
        let id_hex = id.clone().unwrap();
        let by_id = root.0.join(format!("usr/lib/debug/.build-id/{}", &id_hex[..2]));
        std::fs::create_dir_all(&by_id).unwrap();
        std::fs::copy(&debug, by_id.join(format!("{}.debug", &id_hex[2..]))).unwrap();
        let found = find(root_str, &wanted_of(&bytes, &id, &link)).unwrap();
        assert_eq!(found.found_by, FoundBy::BuildId);
        // A file at the build-id path with another build id is not taken.
        let other: Option<String> = Some(format!("{}00", &id_hex[..id_hex.len() - 2]));
        std::fs::create_dir_all(root.0.join(format!("usr/lib/debug/.build-id/{}", &id_hex[..2]))).unwrap();
        std::fs::copy(
            &debug,
            root.0.join(format!("usr/lib/debug/.build-id/{}/{}.debug", &id_hex[..2], &other.as_ref().unwrap()[2..])),
        )
        .unwrap();
        assert!(find(root_str, &wanted_of(&bytes, &other, &None)).is_none());
        // A symlink planted at the candidate path is not followed.
        std::fs::remove_file(root.0.join("usr/bin/p.debug")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.0.join("usr/bin/p.debug")).unwrap();
        assert!(find(root_str, &wanted_of(&bytes, &None, &link)).is_none());
    }
}
