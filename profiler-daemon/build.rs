//! Builds the eBPF object from the `profiler-ebpf` crate (nightly, `-Z build-std=core`,
//! bpf-linker) and leaves it in `OUT_DIR/profiler-ebpf` (named after the crate's one binary,
//! not `profiler`, which is the daemon's), which `ebpf/mod.rs` embeds.

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    // The ABI crate is compiled into the eBPF object too.
    println!("cargo:rerun-if-changed=../profiler-common/src");
    let metadata =
        cargo_metadata::MetadataCommand::new().no_deps().exec().context("failed to read the workspace metadata")?;
    let package = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "profiler-ebpf")
        .ok_or_else(|| anyhow!("the profiler-ebpf package is missing from the workspace"))?;
    let root_dir = package.manifest_path.parent().ok_or_else(|| anyhow!("no parent for {}", package.manifest_path))?;
    let ebpf = aya_build::Package { name: "profiler-ebpf", root_dir: root_dir.as_str(), ..Default::default() };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Nightly)
        .context("failed to build the eBPF programs; run `cargo xtask setup` to install the nightly toolchain, rust-src and bpf-linker")
}
