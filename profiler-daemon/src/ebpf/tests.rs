//! The embedded object against the ABI's names: every map and program name constant exists
//! in the object, and every map in it is named by a constant, so a renamed static or
//! function fails here rather than at load time on a user's machine. And the hot programs'
//! code against what the BPF target slips into it (a byte-at-a-time `memset`).

use std::collections::BTreeSet;

use profiler_common::{maps, programs};

use super::EBPF_OBJECT;

fn object() -> aya_obj::Object {
    aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded eBPF object parses")
}

#[test]
fn every_map_of_the_object_is_named_in_the_abi_and_back() {
    let object = object();
    // Sections named `.rodata*`, `.data*`, `.bss*` are the compiler's, for the load-time
    // globals (reached by their names in `profiler_common::globals`) and constant pools.
    let in_object: BTreeSet<&str> =
        object.maps.keys().map(String::as_str).filter(|name| !name.starts_with('.')).collect();
    let named: BTreeSet<&str> = maps::ALL.into_iter().collect();
    let unnamed: Vec<_> = in_object.difference(&named).collect();
    assert!(unnamed.is_empty(), "maps in the object without a constant in profiler_common::maps: {unnamed:?}");
    let absent: Vec<_> = named.difference(&in_object).collect();
    assert!(absent.is_empty(), "map constants with no map in the object: {absent:?}");
    assert!(object.maps.contains_key(".rodata"), "the load-time globals' section");
}

#[test]
fn every_program_of_the_object_is_named_in_the_abi_and_back() {
    let object = object();
    let in_object: BTreeSet<&str> = object.programs.keys().map(String::as_str).collect();
    let named: BTreeSet<&str> = programs::ALL.into_iter().collect();
    assert_eq!(in_object, named, "programs in the object vs profiler_common::programs::ALL");
}

/// The programs that run on every sample, allocator call or wait, and the user-stack walk
/// they share. The BPF target compiles a zeroed aggregate (a struct literal with a run of
/// zero fields, `[0; N]`, aya's `bpf_get_current_comm`) into a call of `memset`, a loop of
/// one-byte stores: it was a fifth of `cpu_sample`'s time (bench unwind). Allowed elsewhere:
/// the futex entry programs call it only when the per-thread array slot is taken (the spill
/// map), `offcpu_switch` only for a sampled switch.
const NO_MEMSET: [&str; 14] = [
    programs::CPU_SAMPLE,
    programs::MALLOC_ENTER,
    programs::CALLOC_ENTER,
    programs::REALLOC_ENTER,
    programs::REALLOCARRAY_ENTER,
    programs::POSIX_MEMALIGN_ENTER,
    programs::MEMALIGN_ENTER,
    programs::PVALLOC_ENTER,
    programs::FREE_ENTER,
    programs::ALLOC_EXIT,
    programs::FUTEX_EXIT,
    programs::OFFCPU_SWITCH_IN,
    "profiler_capture_user_stack",
    "step_callback",
];

#[test]
fn hot_programs_call_no_byte_at_a_time_memset() {
    use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};

    let file = object::File::parse(EBPF_OBJECT).expect("the embedded eBPF object parses as ELF");
    let Some(memset) = file.symbols().find(|s| s.name() == Ok("memset")).map(|s| s.index()) else {
        return; // nothing calls it
    };
    // Every function symbol, by section: its name and byte range.
    let functions: Vec<_> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .filter_map(|s| Some((s.section_index()?, s.address(), s.address() + s.size(), s.name().ok()?.to_string())))
        .collect();
    for name in NO_MEMSET {
        assert!(functions.iter().any(|f| named(&f.3, name)), "no function {name} in the object: rename it here too");
    }
    let mut callers = BTreeSet::new();
    for section in file.sections() {
        for (offset, relocation) in section.relocations() {
            if relocation.target() != RelocationTarget::Symbol(memset) {
                continue;
            }
            let caller = functions
                .iter()
                .find(|f| f.0 == section.index() && (f.1..f.2).contains(&offset))
                .map_or_else(|| format!("?@{}+{offset:#x}", section.name().unwrap_or("?")), |f| f.3.clone());
            callers.insert(caller);
        }
    }
    assert!(!callers.is_empty(), "the object has a memset but nothing calls it: check this test's reading");
    let hot: Vec<_> = callers.iter().filter(|c| NO_MEMSET.iter().any(|name| named(c, name))).collect();
    assert!(
        hot.is_empty(),
        "hot programs call memset (one byte per store): {hot:?}; write the zeros as fields (volatile \
         writes, or memory the helper fills, as `maps::current_comm` does); all callers: {callers:?}"
    );
}

/// Whether symbol `symbol` is function `name`: a program or `no_mangle` function by its own
/// name, a private function by the end of its mangled one (`…13step_callback`).
fn named(symbol: &str, name: &str) -> bool {
    symbol == name || symbol.strip_suffix(name).is_some_and(|head| head.ends_with(&name.len().to_string()))
}
