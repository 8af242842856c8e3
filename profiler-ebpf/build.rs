//! Rebuild the eBPF object when the linker changes: building this crate depends on the
//! `bpf-linker` binary, which cargo cannot see as a dependency.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup` to install it"),
    }
}
