//! The embedded object against the ABI's names: every map and program name constant exists
//! in the object, and every map in it is named by a constant, so a renamed static or
//! function fails here rather than at load time on a user's machine.

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
