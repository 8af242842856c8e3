//! What `/proc` says about a process while it lives: its name, executable and executable
//! memory mappings. Captured when the process is first seen in a sample (and again when a
//! sampled address falls outside the known mappings, e.g. after `dlopen`), so that addresses
//! can still be turned into (file, offset) after the process has exited.

use std::{fs, io, path::PathBuf};

/// One executable, file-backed (or special, like `[vdso]`) mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset that `start` maps.
    pub offset: u64,
    /// The path as the process sees it (`/usr/lib/x86_64-linux-gnu/libc.so.6`, `[vdso]`).
    pub path: String,
    /// Inode of the file (0 for anonymous and special mappings).
    pub inode: u64,
    /// No longer in the process's latest `/proc/PID/maps` (a `dlclose`d library, the image
    /// an `execve` replaced): kept so that samples taken before still resolve, but not a
    /// mapping the process has now.
    pub unmapped: bool,
}

impl MapEntry {
    /// Whether `addr` lies inside this mapping.
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }

    /// The file offset of `addr` (which must be inside the mapping).
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }

    /// Whether the mapping is backed by a file that can be symbolized.
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// A process as captured from `/proc/PID`.
#[derive(Clone, Debug)]
pub struct ProcessInfo {
    pub pid: u32,
    /// `comm` of the process (its main thread).
    pub name: String,
    /// Target of `/proc/PID/exe`, when readable.
    pub exe: Option<PathBuf>,
    /// Executable mappings, sorted by start address.
    pub maps: Vec<MapEntry>,
    /// Real uid of the owner (who may see its profiles).
    pub uid: u32,
    /// The cgroup v2 path (`/system.slice/foo.service`), when readable.
    pub cgroup: Option<String>,
    /// The pid as the process itself sees it (its innermost pid namespace, `NSpid:`): JIT
    /// runtimes in containers name their perf map `/tmp/perf-<this>.map`.
    pub ns_pid: u32,
}

impl ProcessInfo {
    /// The mapping that holds `addr`, by binary search.
    pub fn mapping_of(&self, addr: u64) -> Option<usize> {
        let idx = self.maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
        self.maps[idx].contains(addr).then_some(idx)
    }
}

/// Whether a process with this pid exists now.
pub fn exists(pid: u32) -> bool {
    pid != 0 && fs::metadata(format!("/proc/{pid}")).is_ok()
}

/// Reads name, executable and mappings of `pid`.
pub fn read_process(pid: u32) -> io::Result<ProcessInfo> {
    let name = read_comm(pid)?;
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok();
    let maps = read_maps(pid)?;
    let uid = read_uid(pid)?;
    let cgroup = read_cgroup(pid);
    let ns_pid = read_ns_pid(pid).unwrap_or(pid);
    Ok(ProcessInfo { pid, name, exe, maps, uid, cgroup, ns_pid })
}

/// The innermost namespace's pid of a process: the last field of `NSpid:` in
/// `/proc/PID/status`.
pub fn read_ns_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The unified (v2) cgroup path of a process: the `0::` line of `/proc/PID/cgroup`.
pub fn read_cgroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

/// Every process id in `/proc` now.
pub fn list_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The real uid of a process, from the `Uid:` line of `/proc/PID/status`.
pub fn read_uid(pid: u32) -> io::Result<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no Uid line in /proc/{pid}/status")))
}

/// The `comm` of a process, without the trailing newline.
pub fn read_comm(pid: u32) -> io::Result<String> {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))?;
    Ok(comm.trim_end_matches('\n').to_string())
}

/// The executable mappings of `pid`, sorted by address.
pub fn read_maps(pid: u32) -> io::Result<Vec<MapEntry>> {
    Ok(parse_maps(&fs::read_to_string(format!("/proc/{pid}/maps"))?))
}

/// Parses `/proc/PID/maps`, keeping only executable mappings.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    let mut maps: Vec<MapEntry> = text.lines().filter_map(parse_maps_line).collect();
    maps.sort_by_key(|m| m.start);
    maps
}

fn parse_maps_line(line: &str) -> Option<MapEntry> {
    // start-end perms offset dev inode path (path may contain spaces, or be absent)
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    Some(MapEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.to_string(),
        inode: inode.parse().ok()?,
        unmapped: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234 /usr/bin/my prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234 /usr/bin/my prog
7f0000000000-7f0000020000 r-xp 00028000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
7ffd00010000-7ffd00020000 rw-p 00000000 00:00 0 
";

    #[test]
    fn keeps_executable_mappings_sorted() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].path, "/usr/bin/my prog");
        assert_eq!(maps[0].offset, 0x1000);
        assert_eq!(maps[1].path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(maps[2].path, "[vdso]");
        assert!(!maps[2].is_file());
        assert!(maps[1].is_file());
    }

    #[test]
    fn finds_mapping_and_offset() {
        let info = ProcessInfo {
            pid: 1,
            name: "x".into(),
            exe: None,
            maps: parse_maps(MAPS),
            uid: 0,
            cgroup: None,
            ns_pid: 1,
        };
        let idx = info.mapping_of(0x7f0000000010).unwrap();
        assert_eq!(info.maps[idx].file_offset(0x7f0000000010), 0x28010);
        assert_eq!(info.mapping_of(0x55d0c0a00500), None, "not executable");
        assert_eq!(info.mapping_of(0x7f0000020000), None, "end is exclusive");
        assert_eq!(info.mapping_of(1), None);
    }

    #[test]
    fn reads_own_process() {
        let info = read_process(std::process::id()).unwrap();
        assert!(!info.name.is_empty());
        // SAFETY: getuid has no preconditions and cannot fail.
        assert_eq!(info.uid, unsafe { libc::getuid() });
        assert_eq!(read_ns_pid(std::process::id()), Some(std::process::id()), "not in a pid namespace");
        let here = parse_maps_line as fn(&str) -> Option<MapEntry> as usize as u64;
        assert!(info.mapping_of(here).is_some(), "own code is mapped");
    }
}
