//! What `/proc` says about a process while it lives: its name, executable and executable
//! memory mappings. Captured when the process is first seen in a sample (and again when a
//! sampled address falls outside the known mappings, e.g. after `dlopen`), so that addresses
//! can still be turned into (file, offset) after the process has exited.

use std::{fmt, fs, io, os::unix::fs::MetadataExt, path::PathBuf, sync::Arc};

/// A device as `/proc/PID/maps` names it (`fe:01`, `0:53` for a FUSE mount): which file
/// system a mapped file lives on, known without asking that file system anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    pub major: u32,
    pub minor: u32,
}

impl Device {
    /// Parses `major:minor` in hex, as the maps file writes it.
    fn parse(text: &str) -> Option<Self> {
        let (major, minor) = text.split_once(':')?;
        Some(Self { major: u32::from_str_radix(major, 16).ok()?, minor: u32::from_str_radix(minor, 16).ok()? })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

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
    /// Shared: a fork copies every mapping of its parent, and a machine running hundreds of
    /// programs a second forks that often.
    pub path: Arc<str>,
    /// Inode of the file (0 for anonymous and special mappings).
    pub inode: u64,
    /// The device of the file system holding the file.
    pub device: Device,
    /// The inode's generation, when the kernel said (side-band events; 0 from
    /// `/proc/PID/maps`): with device and inode, the file's identity even after the inode
    /// number is reused.
    pub generation: u64,
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

    /// Whether `other` maps the same part of the same file at the same addresses.
    pub fn same_mapping(&self, other: &MapEntry) -> bool {
        (self.start, self.end, self.offset, self.device, self.inode)
            == (other.start, other.end, other.offset, other.device, other.inode)
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
    /// Real uid of the owner at first sight, and after each exec (who may see its profiles is
    /// decided at query time from [`Credentials`]).
    pub uid: u32,
    /// When it started, in clock ticks since boot (`/proc/PID/stat` field 22): with the
    /// pid, the identity of the process, which a reused pid does not share.
    pub start_time: u64,
    /// Its credentials when last read (first sight, and each `execve`): what decides who
    /// may see it once it has exited.
    pub credentials: Credentials,
    /// The cgroup v2 path (`/system.slice/foo.service`), when readable.
    pub cgroup: Option<String>,
    /// The pid as the process itself sees it (its innermost pid namespace, `NSpid:`): JIT
    /// runtimes in containers name their perf map `/tmp/perf-<this>.map`.
    pub ns_pid: u32,
}

/// Credentials no viewer but root has: a process known only from kernel events, whose
/// owner was never read.
pub const UNKNOWN_UID: u32 = u32::MAX;

impl ProcessInfo {
    /// A process known only from the kernel's events (it exited before `/proc` was read):
    /// its mappings and name, and an owner nobody but root matches.
    pub fn from_events(pid: u32, name: &str) -> Self {
        let credentials = Credentials { uids: [UNKNOWN_UID; 4], dump_owner: UNKNOWN_UID, start_time: 0 };
        Self {
            pid,
            name: name.to_string(),
            exe: None,
            maps: Vec::new(),
            uid: UNKNOWN_UID,
            start_time: 0,
            credentials,
            cgroup: None,
            ns_pid: pid,
        }
    }

    /// The mapping that holds `addr`, by binary search.
    pub fn mapping_of(&self, addr: u64) -> Option<usize> {
        let idx = self.maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
        self.maps[idx].contains(addr).then_some(idx)
    }
}

/// A pid namespace, as the kernel's BPF helpers name it: the device (as the kernel's
/// `dev_t`) and inode of its `/proc/PID/ns/pid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PidNamespace {
    pub dev: u64,
    pub ino: u64,
}

impl PidNamespace {
    /// The initial pid namespace's inode (the kernel's `PROC_PID_INIT_INO`).
    const INITIAL_INO: u64 = 0xEFFF_FFFC;

    /// Whether this is the initial (the host's) pid namespace.
    pub fn is_initial(self) -> bool {
        self.ino == Self::INITIAL_INO
    }
}

/// The pid namespace this process runs in.
pub fn own_pid_namespace() -> io::Result<PidNamespace> {
    pid_namespace_at("/proc/self/ns/pid")
}

/// The pid namespace process `pid` runs in (its own, innermost one: where the ids it
/// knows itself and its threads by are given).
pub fn pid_namespace(pid: u32) -> io::Result<PidNamespace> {
    pid_namespace_at(&format!("/proc/{pid}/ns/pid"))
}

fn pid_namespace_at(path: &str) -> io::Result<PidNamespace> {
    let meta = fs::metadata(path)?;
    // stat's st_dev is the userspace encoding; the kernel compares its own dev_t (major << 20
    // | minor).
    let dev = meta.dev();
    let (major, minor) = (u64::from(libc::major(dev)), u64::from(libc::minor(dev)));
    Ok(PidNamespace { dev: major << 20 | minor, ino: meta.ino() })
}

/// Whether a process (or thread) with this pid exists now, in the profiler's pid namespace.
/// `kill(pid, 0)`: the signal-0 probe checks the pid without sending anything, and costs a
/// fraction of a `stat` of `/proc/PID` (the daemon asks for every idle process each second:
/// at 2,000 processes those path walks were 44% of its CPU).
pub fn exists(pid: u32) -> bool {
    signal_probe(pid != 0 && pid <= i32::MAX as u32, || {
        // SAFETY: signal 0 sends nothing; it only checks the pid.
        unsafe { libc::kill(pid as libc::pid_t, 0) }
    })
}

/// Whether thread `tid` of process `pid` exists (`tgkill` with signal 0: the thread must
/// belong to that process).
pub fn thread_exists(pid: u32, tid: u32) -> bool {
    signal_probe(tid != 0 && pid <= i32::MAX as u32 && tid <= i32::MAX as u32, || {
        // SAFETY: signal 0 sends nothing; it only checks the ids.
        unsafe { libc::syscall(libc::SYS_tgkill, pid as libc::pid_t, tid as libc::pid_t, 0) as libc::c_int }
    })
}

/// Whether a signal-0 probe found its target: it succeeded, or was refused for permission
/// (the target exists but belongs to someone else); ESRCH is "no such process".
fn signal_probe(valid: bool, probe: impl FnOnce() -> libc::c_int) -> bool {
    valid && (probe() == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Reads name, executable and mappings of `pid`.
pub fn read_process(pid: u32) -> io::Result<ProcessInfo> {
    let name = read_comm(pid)?;
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok();
    let maps = read_maps(pid)?;
    let credentials = read_credentials(pid)?;
    let (uid, start_time) = (credentials.uids[0], credentials.start_time);
    let cgroup = read_cgroup(pid);
    let ns_pid = read_ns_pid(pid).unwrap_or(pid);
    Ok(ProcessInfo { pid, name, exe, maps, uid, start_time, credentials, cgroup, ns_pid })
}

/// Who a process is now, for the decision whether a client may see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// Real, effective, saved and file-system uid (`Uid:` of `/proc/PID/status`).
    pub uids: [u32; 4],
    /// The owner of `/proc/PID`: the effective uid, or root when the process is not
    /// dumpable (setuid programs, `prctl(PR_SET_DUMPABLE, 0)`) — the kernel's own signal
    /// that its memory layout is not its users' to see.
    pub dump_owner: u32,
    /// As [`ProcessInfo::start_time`].
    pub start_time: u64,
}

impl Credentials {
    /// Whether `uid` may see the process as ptrace would let it: every uid is `uid` and
    /// the process is dumpable (it is `uid`'s in `/proc`).
    pub fn all_of(&self, uid: u32) -> bool {
        self.uids.iter().all(|&u| u == uid) && self.dump_owner == uid
    }
}

/// Reads the credentials of `pid` now.
pub fn read_credentials(pid: u32) -> io::Result<Credentials> {
    let dump_owner = fs::metadata(format!("/proc/{pid}"))?.uid();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let uids = parse_uids(&status)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no Uid line in /proc/{pid}/status")))?;
    let start_time = read_start_time(pid)?;
    Ok(Credentials { uids, dump_owner, start_time })
}

fn parse_uids(status: &str) -> Option<[u32; 4]> {
    let mut fields = status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().map(|f| f.parse().ok());
    Some([fields.next()??, fields.next()??, fields.next()??, fields.next()??])
}

/// Field 22 of `/proc/PID/stat`, counted after the `comm`, which may hold spaces and `)`.
pub fn read_start_time(pid: u32) -> io::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_time(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no start time in /proc/{pid}/stat")))
}

/// How long process `pid` has run: its start time against the system's uptime; `None` when
/// either cannot be read.
pub fn age(pid: u32) -> Option<std::time::Duration> {
    let started_ticks = read_start_time(pid).ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let uptime: f64 = fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    let started = started_ticks as f64 / (ticks_per_s.max(1) as f64);
    Some(std::time::Duration::from_secs_f64((uptime - started).max(0.0)))
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // After "pid (comm) " come fields 3 (state) onwards: field 22 is the 20th.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The number of threads of a process (`Threads:` of `/proc/PID/status`).
pub fn thread_count(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:"))?.trim().parse().ok()
}

/// The innermost namespace's pid of a process: the last field of `NSpid:` in
/// `/proc/PID/status`.
fn read_ns_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The unified (v2) cgroup path of a process: the `0::` line of `/proc/PID/cgroup`.
pub fn read_cgroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

/// The systemd unit a cgroup v2 path names: its innermost `.service` or `.scope`
/// component (`/system.slice/nginx.service` → `nginx.service`).
pub fn unit_of(cgroup: &str) -> Option<&str> {
    cgroup.rsplit('/').find(|c| c.ends_with(".service") || c.ends_with(".scope"))
}

/// The container id a cgroup v2 path names, as docker, containerd, CRI-O and podman name
/// their cgroups: `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope` (systemd driver) or a bare `<id>` under `docker/` or `kubepods`
/// (cgroupfs driver), where `<id>` is 64 hex digits.
pub fn container_of(cgroup: &str) -> Option<&str> {
    let is_id = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let components: Vec<&str> = cgroup.split('/').filter(|c| !c.is_empty()).collect();
    for (i, component) in components.iter().enumerate().rev() {
        let scoped = component.strip_suffix(".scope").and_then(|name| {
            ["docker-", "cri-containerd-", "crio-", "libpod-"].iter().find_map(|prefix| name.strip_prefix(prefix))
        });
        if let Some(id) = scoped.filter(|id| is_id(id)) {
            return Some(id);
        }
        let under_runtime = components[..i].iter().any(|c| *c == "docker" || c.starts_with("kubepods"));
        if is_id(component) && under_runtime {
            return Some(component);
        }
    }
    None
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
fn parse_maps(text: &str) -> Vec<MapEntry> {
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
    let device = Device::parse(fields.next()?)?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    Some(MapEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.into(),
        inode: inode.parse().ok()?,
        device,
        generation: 0,
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

    /// Ground truth from this process: itself and its thread exist; a child it reaped does
    /// not; a thread id under the wrong process does not.
    #[test]
    fn existence_probes_follow_the_kernel() {
        let me = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let other = std::thread::spawn(|| unsafe { libc::gettid() } as u32).join().unwrap();
        assert!(exists(me) && thread_exists(me, me) && thread_exists(me, tid));
        assert!(!thread_exists(me, other), "an exited thread");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        assert!(exists(pid), "not reaped yet: a zombie still has its pid");
        assert!(!thread_exists(me, pid), "another process's id is not our thread");
        child.wait().unwrap();
        assert!(!exists(pid) && !thread_exists(pid, pid));
        assert!(!exists(0) && !exists(u32::MAX));
    }

    #[test]
    fn keeps_executable_mappings_sorted() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 3);
        assert_eq!(&*maps[0].path, "/usr/bin/my prog");
        assert_eq!(maps[0].offset, 0x1000);
        assert_eq!(&*maps[1].path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(maps[1].device, Device { major: 0xfe, minor: 1 });
        assert_eq!(maps[1].device.to_string(), "254:1");
        assert_eq!(&*maps[2].path, "[vdso]");
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
            start_time: 1,
            credentials: Credentials { uids: [0; 4], dump_owner: 0, start_time: 1 },
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
    fn units_and_containers_come_from_the_cgroup() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(unit_of("/system.slice/nginx.service"), Some("nginx.service"));
        assert_eq!(unit_of("/user.slice/user-1000.slice/session-3.scope"), Some("session-3.scope"));
        assert_eq!(unit_of("/user.slice"), None);
        for path in [
            format!("/system.slice/docker-{id}.scope"),
            format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope"),
            format!("/machine.slice/libpod-{id}.scope/container"),
            format!("/docker/{id}"),
            format!("/kubepods/besteffort/pod1/{id}"),
        ] {
            assert_eq!(container_of(&path), Some(id), "{path}");
        }
        assert_eq!(container_of(&format!("/user.slice/{id}")), None, "not under a container runtime");
        assert_eq!(container_of("/system.slice/docker.service"), None);
    }

    #[test]
    fn knows_its_pid_namespace() {
        let ns = own_pid_namespace().unwrap();
        assert!(ns.ino != 0);
        // The tests run on the host, in its namespace.
        assert!(ns.is_initial(), "{ns:?}");
    }

    #[test]
    fn reads_credentials_and_identity() {
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_uids("Name:\tx\nUid:\t1000\t0\t1000\t1000\n"), Some([1000, 0, 1000, 1000]));
        let me = read_credentials(std::process::id()).unwrap();
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        assert!(me.all_of(uid), "{me:?}");
        assert!(!Credentials { dump_owner: 0, ..me }.all_of(uid) || uid == 0);
        assert!(!Credentials { uids: [uid, uid, uid.wrapping_add(1), uid], ..me }.all_of(uid));
        assert_eq!(me.start_time, read_process(std::process::id()).unwrap().start_time);
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
