//! The reader against real Go binaries built here with the machine's `go` (skipped, saying
//! why, when there is none), checked against Go's own tools: `go tool nm` for function
//! ranges, `go tool objdump` for the line of every instruction (Go 1.19's tools read neither
//! a stripped nor a PIE binary's lines, so those builds are checked against the plain one's).

use std::{collections::BTreeSet, path::Path, process::Command};

use super::*;

const SOURCE: &str = r#"package main

import "fmt"

func triple(x int) int {
	return x*3 + 1 // INLINED
}

//go:noinline
func outer(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += triple(i) // CALL
	}
	return s
}

func main() { fmt.Println(outer(10)) }
"#;

fn line_of(marker: &str) -> u32 {
    SOURCE.lines().position(|l| l.contains(marker)).unwrap() as u32 + 1
}

/// Builds `SOURCE` with `args` into `dir/name`; `None` when this machine has no `go`.
fn build(dir: &Path, name: &str, args: &[&str]) -> Option<std::path::PathBuf> {
    build_with(dir, name, args, "0")
}

/// [`build`] with cgo on or off (`CGO_ENABLED`).
fn build_with(dir: &Path, name: &str, args: &[&str], cgo: &str) -> Option<std::path::PathBuf> {
    let out = dir.join(name);
    let status = Command::new("go")
        .arg("build")
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(".")
        .current_dir(dir)
        .env("GOCACHE", std::env::temp_dir().join("profiler-unit-gocache"))
        .env("GO111MODULE", "off")
        .env("CGO_ENABLED", cgo)
        .status();
    match status {
        Ok(status) if status.success() => Some(out),
        Ok(status) => panic!("go build {args:?} failed: {status}"),
        Err(err) => {
            eprintln!("skipped: no Go toolchain to build a Go binary with ({err})");
            None
        }
    }
}

/// `go tool nm -size`: (name, address, size) of the text symbols called `main.*` (local `t`
/// ones in an externally linked binary).
fn main_functions(binary: &Path) -> Vec<(String, u64, u64)> {
    let out = Command::new("go").args(["tool", "nm", "-size"]).arg(binary).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() == 4 && f[2].eq_ignore_ascii_case("t") && f[3].starts_with("main."))
                .then(|| (f[3].to_string(), u64::from_str_radix(f[0], 16).unwrap(), f[1].parse().unwrap()))
        })
        .collect()
}

/// `go tool objdump -s ^main\.`: (function, address, line, file name) of every instruction.
fn objdump_lines(binary: &Path) -> Vec<(String, u64, u32, String)> {
    let out = Command::new("go").args(["tool", "objdump", "-s", r"^main\."]).arg(binary).output().unwrap();
    let mut function = String::new();
    let mut rows = Vec::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        if let Some(rest) = line.strip_prefix("TEXT ") {
            function = rest.split('(').next().unwrap().to_string();
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 2 {
            let (file, line) = f[0].rsplit_once(':').unwrap();
            let address = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
            rows.push((function.clone(), address, line.parse().unwrap(), file.to_string()));
        }
    }
    rows
}

fn open(binary: &Path) -> (GoTable, Vec<LoadSegment>) {
    let file = File::open(binary).unwrap();
    let table = GoTable::open(&file).unwrap().expect("a Go binary");
    let segments = load_segments(MappedFile::map(&file).unwrap().bytes()).unwrap();
    (table, segments)
}

fn frames_at(table: &GoTable, segments: &[LoadSegment], address: u64) -> Frames {
    let offset = segments
        .iter()
        .find(|s| address >= s.vaddr && address - s.vaddr < s.file_size)
        .map(|s| s.file_offset + (address - s.vaddr))
        .unwrap();
    table.frames(offset).unwrap_or_else(|| panic!("{address:#x} not named"))
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("profiler-go-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("main.go"), SOURCE).unwrap();
    dir
}

#[test]
fn a_go_binary_is_named_as_gos_own_tools_name_it_stripped_or_not() {
    let dir = scratch("plain");
    let Some(plain) = build(&dir, "plain", &[]) else { return };
    let stripped = build(&dir, "stripped", &["-ldflags=-s -w"]).unwrap();
    let truth = objdump_lines(&plain);
    assert!(truth.len() > 20, "objdump gave {} instructions", truth.len());
    // Stripping moves the data after the code (displacements into it change), not the code:
    // the plain build's instructions are at the same addresses.
    let text = |path: &Path| {
        let bytes = std::fs::read(path).unwrap();
        Elf::parse(&bytes).unwrap().section(".text").unwrap().address_range()
    };
    assert_eq!(text(&plain), text(&stripped), "stripping moved the code: the plain build is no ground truth");
    for binary in [&plain, &stripped] {
        let (table, segments) = open(binary);
        assert!(table.version.as_deref().is_some_and(|v| v.starts_with("go1.")), "{:?}", table.version);
        assert!(table.expands_inlined_calls(), "{}", binary.display());
        for (function, address, line, file) in &truth {
            let frames = frames_at(&table, &segments, *address);
            let outer = frames.last().unwrap();
            assert_eq!(&outer.function, function, "{} at {address:#x}", binary.display());
            assert_eq!(frames[0].line, *line, "{} at {address:#x}: {frames:?}", binary.display());
            let named = frames[0].file.as_deref().unwrap_or_default();
            assert!(named.ends_with(&format!("/{file}")), "{frames:?}, objdump says {file}");
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn inlined_calls_are_frames_of_their_own_with_the_call_site_line() {
    let dir = scratch("inline");
    let Some(plain) = build(&dir, "plain", &[]) else { return };
    let pie = build(&dir, "pie", &["-buildmode=pie"]).unwrap();
    let truth: BTreeSet<u32> =
        objdump_lines(&plain).into_iter().filter(|(f, ..)| f == "main.outer").map(|(_, _, line, _)| line).collect();
    for binary in [&plain, &pie] {
        let (table, segments) = open(binary);
        let functions = main_functions(binary);
        let (_, start, size) = functions.iter().find(|(name, ..)| name == "main.outer").unwrap();
        let mut lines = BTreeSet::new();
        let mut inlined = 0;
        for address in *start..start + size {
            let frames = frames_at(&table, &segments, address);
            assert_eq!(frames.last().unwrap().function, "main.outer", "{frames:?}");
            assert!(frames.iter().all(|f| f.offset == address - start), "{frames:?}");
            lines.insert(frames[0].line);
            if frames[0].function == "main.triple" {
                inlined += 1;
                assert_eq!(frames.len(), 2, "{frames:?}");
                assert_eq!((frames[0].line, frames[1].line), (line_of("INLINED"), line_of("CALL")), "{frames:?}");
            }
        }
        assert!(inlined > 0, "{}: no instruction of main.outer is the inlined main.triple", binary.display());
        assert_eq!(lines, truth, "{}: the lines of main.outer", binary.display());
        // Every main.* function is named as its symbol says, over its whole range.
        for (name, start, size) in functions {
            for address in [start, start + size / 2, start + size - 1] {
                assert_eq!(frames_at(&table, &segments, address).last().unwrap().function, name);
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_file_that_is_no_go_binary_is_left_to_the_others() {
    let own = File::open("/proc/self/exe").unwrap();
    assert!(GoTable::open(&own).unwrap().is_none());
}

#[test]
fn a_go_binary_whose_table_is_corrupt_is_an_error_that_says_what() {
    let dir = scratch("corrupt");
    let Some(plain) = build(&dir, "plain", &[]) else { return };
    let mut bytes = std::fs::read(&plain).unwrap();
    let at = {
        let elf = Elf::parse(&bytes).unwrap();
        let table = elf.section(".gopclntab").unwrap();
        let segments = load_segments(&bytes).unwrap();
        file_offset(&segments, table.addr).unwrap() as usize
    };
    bytes[at..at + 4].copy_from_slice(&0xffff_fffbu32.to_le_bytes()); // Go 1.2's layout
    let corrupt = dir.join("corrupt");
    std::fs::write(&corrupt, &bytes).unwrap();
    let err = GoTable::open(&File::open(&corrupt).unwrap()).err().expect("refused");
    assert!(matches!(err, GoError::UnknownMagic(0xffff_fffb)), "{err}");
    assert!(err.to_string().contains("0xfffffffb"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A cgo PIE is linked by the system linker: its pclntab is merged into `.data.rel.ro` (no
/// section of its own, found by its header) and its moduledata's pointers are relocations.
#[test]
fn a_cgo_pie_is_found_without_its_section_and_inlines_through_its_relocations() {
    let dir = scratch("cgopie");
    std::fs::write(
        dir.join("c.go"),
        "package main\n\n// int c_one(void) { return 1; }\nimport \"C\"\n\nvar _ = C.c_one\n",
    )
    .unwrap();
    let Some(pie) = build_with(&dir, "cgopie", &["-buildmode=pie"], "1") else { return };
    let bytes = std::fs::read(&pie).unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    assert!(elf.section(".gopclntab").is_none() && elf.section(".data.rel.ro.gopclntab").is_none());
    let (table, segments) = open(&pie);
    assert!(table.expands_inlined_calls(), "moduledata not found through .rela.dyn");
    let functions = main_functions(&pie);
    let (_, start, size) = functions.iter().find(|(name, ..)| name == "main.outer").unwrap();
    let inlined = (*start..start + size)
        .map(|address| frames_at(&table, &segments, address))
        .inspect(|frames| assert_eq!(frames.last().unwrap().function, "main.outer", "{frames:?}"))
        .filter(|frames| frames[0].function == "main.triple")
        .count();
    assert!(inlined > 0, "main.triple is not expanded in the cgo PIE");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The symbolizer's file worker names a running Go process's code from its pclntab: Go's
/// name and line (checked against `go tool objdump`), with no note that its DWARF was
/// refused, although it was (a cap of 0 bytes): its lines do not come from there.
#[test]
fn the_file_worker_names_a_running_go_program_from_its_pclntab() {
    use crate::{
        ids::Pid,
        offload::Charger,
        symbolize::elf::{ElfFiles, ElfRequest},
    };
    let dir = scratch("running");
    std::fs::write(
        dir.join("main.go"),
        SOURCE.replace("import \"fmt\"", "import (\n\t\"fmt\"\n\t\"time\"\n)").replace(
            "func main() { fmt.Println(outer(10)) }",
            "func main() { fmt.Println(outer(10)); time.Sleep(time.Hour) }",
        ),
    )
    .unwrap();
    let Some(binary) = build(&dir, "running", &[]) else { return };
    let mut child = Command::new(&binary).stdout(std::process::Stdio::piped()).spawn().unwrap();
    // Its first line is printed once its code runs (and its mappings are in place).
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let truth: Vec<_> = objdump_lines(&binary).into_iter().filter(|(f, ..)| f == "main.outer").collect();
    let maps = crate::procs::read_maps(child.id()).unwrap();
    let map = maps.iter().find(|m| m.contains(truth[0].1)).unwrap().clone();
    let offsets = truth.iter().map(|(_, address, ..)| map.file_offset(*address)).collect();
    let request = ElfRequest { pid: Pid(child.id()), map, offsets };
    let mut files = ElfFiles::default();
    files.max_debug_info = Some(0);
    let answer = files.symbolize(&request, &Charger::default());
    let _ = child.kill();
    let _ = child.wait();
    for ((function, address, line, _), frames) in truth.iter().zip(&answer.frames) {
        assert_eq!(frames.last().map(|f| f.function.as_str()), Some(function.as_str()), "{address:#x}: {frames:?}");
        assert_eq!(frames[0].line, *line, "{address:#x}: {frames:?}");
    }
    assert_eq!(answer.note, None, "a Go binary's lines are not its DWARF's");
    std::fs::remove_dir_all(dir).unwrap();
}
