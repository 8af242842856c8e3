//! JIT perf maps (`/tmp/perf-PID.map`, the format JITs write for perf): read on the
//! symbolizer's offload worker, since the map is a file its process's user controls (see
//! [`crate::untrusted`] for how it is opened).

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read},
    path::Path,
};

use super::{Frame, Frames};
use crate::{ids::Pid, untrusted};

/// The largest perf map read: a JIT that names a million functions writes about 64 MiB.
pub const PERF_MAP_MAX_BYTES: u64 = 64 << 20;
/// Perf map bytes read between two [`super::Symbolizer::forget_perf_maps`] (one dump), across
/// processes: past it, maps are refused, so that many large maps cannot stall a dump.
pub const PERF_MAP_BUDGET_BYTES: u64 = 256 << 20;

/// Streams the perf map of `pid` at `path` for the names of `wanted` (sorted, distinct); a
/// later line wins for an address two lines cover (a JIT reusing memory appends the new
/// symbol). Returns the names found and the bytes read; a missing map names nothing, and
/// `Err` says why the map was refused.
#[allow(clippy::type_complexity)]
pub fn read(pid: Pid, path: &Path, owners: &[u32], wanted: &[u64]) -> Result<(Vec<(u64, Frames)>, u64), String> {
    let refused = |what: &dyn std::fmt::Display| format!("{} of pid {pid} {what}", path.display());
    let file = match untrusted::open_owned(pid, path, owners, PERF_MAP_MAX_BYTES) {
        Ok(file) => file,
        Err(untrusted::Refused::Open(err)) if err.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(err) => return Err(refused(&crate::error::chain(&err))),
    };
    let mut names: HashMap<u64, (u64, String)> = HashMap::new();
    let mut reader = BufReader::new(file.take(PERF_MAP_MAX_BYTES + 1));
    let mut line = Vec::new();
    let mut read = 0u64;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(n) => read += n as u64,
            Err(err) => return Err(refused(&format!("could not be read: {err}"))),
        }
        let text = String::from_utf8_lossy(&line);
        let Some((start, end, name)) = perf_map_line(&text) else { continue };
        let first = wanted.partition_point(|&a| a < start);
        for &addr in wanted[first..].iter().take_while(|&&a| a < end) {
            names.insert(addr, (addr - start, name.to_string()));
        }
    }
    if read > PERF_MAP_MAX_BYTES {
        return Err(refused(&format!("grew past the {PERF_MAP_MAX_BYTES}-byte cap while it was read")));
    }
    let found = names
        .into_iter()
        .map(|(addr, (offset, function))| (addr, vec![Frame { function, file: None, line: 0, offset }]))
        .collect();
    Ok((found, read))
}

/// One line of a perf map, `START SIZE NAME` with hex numbers (with or without `0x`), as
/// (start, end, name); `None` for a line that is not one, or a range past the end of the
/// address space.
pub fn perf_map_line(line: &str) -> Option<(u64, u64, &str)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut parts = line.splitn(3, ' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    let end = start.checked_add(size)?;
    (size > 0 && !name.is_empty()).then_some((start, end, name))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::super::Symbolizer;
    use super::*;

    #[test]
    fn perf_maps_parse_and_look_up() {
        let map = "7f0000001000 40 jit_spin\n0x7f0000002000 0x10 LazyCompile:*foo bar.js:1\nbad line\n7f0000001000 20 jit_spin_v2\n";
        let dir = std::env::temp_dir().join(format!("perf-map-test-{}", std::process::id()));
        std::fs::write(&dir, map).unwrap();
        let mut sym = Symbolizer::new();
        let (me, uid) = (Pid(std::process::id()), std::fs::metadata(&dir).unwrap().uid());
        let addrs = [0x7f0000001010, 0x7f0000001030, 0x7f0000002004, 0x7f0000001040, 0x10];
        let frames = sym.perf_map(me, &dir, &[uid], &addrs).unwrap();
        let names: Vec<&str> = frames.iter().map(|f| f.first().map_or("", |f| f.function.as_str())).collect();
        assert_eq!(names, ["jit_spin_v2", "jit_spin", "LazyCompile:*foo bar.js:1", "", ""], "the later line wins");
        assert_eq!(frames[0][0].offset, 0x10);
        // Not the process's own file: refused, with the reason, once per read.
        let refused = sym.perf_map(me, &dir, &[uid + 1], &[0x7f0000001010]);
        assert!(refused.is_ok(), "the first answer is cached until the maps are forgotten");
        sym.forget_perf_maps();
        let refused = sym.perf_map(me, &dir, &[uid + 1], &[0x7f0000001010]).unwrap_err();
        assert!(refused.contains("owned by uid"), "{refused}");
        assert_eq!(sym.perf_maps_refused, 1);
        let missing = sym.perf_map(me, Path::new("/nonexistent/perf-1.map"), &[uid], &[1]).unwrap();
        assert!(missing[0].is_empty(), "no map is no refusal");
        std::fs::remove_file(&dir).unwrap();
    }
}
