//! The Rust side: the `nightly` toolchain with `rust-src` (for `-Z build-std=core`) and
//! bpf-linker 0.13.0 built against Debian's LLVM 22.
//!
//! Never installs or updates a nightly: only crates.io is reachable, and a newer nightly
//! ships LLVM 23, which breaks bpf-linker built for LLVM 22.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{probe, which, Report, Status};

const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const INSTALL_BPF_LINKER: &str = "PATH=/usr/lib/llvm-22/bin:$PATH LLVM_PREFIX=/usr/lib/llvm-22 \
    cargo install bpf-linker@0.13.0 --locked --no-default-features --features llvm-22";

/// Nightly, rust-src, nightly's LLVM version, then bpf-linker.
pub fn check(report: &mut Report) {
    let nightly = nightly();
    let have_nightly = matches!(nightly, Status::Ok(_));
    report.add(nightly);
    if have_nightly {
        report.add(rust_src());
        report.add(nightly_llvm());
    }
    bpf_linker(report);
}

/// rustfmt and clippy of the default (stable) toolchain, for `cargo xtask test`'s checks.
pub fn lint_tools(report: &mut Report) {
    for component in ["rustfmt", "clippy"] {
        report.add(stable_component(component));
    }
}

fn stable_component(component: &str) -> Status {
    let what = format!("{component} for the default toolchain (cargo xtask test checks with it)");
    let installed = || {
        let list = probe(rustup().args(["component", "list", "--installed"]));
        list.is_some_and(|l| l.lines().any(|c| c.starts_with(component)))
    };
    if installed() {
        return Status::Ok(what);
    }
    println!("installing: {component} (rustup component add)");
    let _ = rustup().args(["component", "add", component]).status();
    if installed() {
        Status::Installed(what)
    } else {
        Status::Missing { what, fix: format!("rustup component add {component}") }
    }
}

/// `rustup` with auto-install off, so a probe can never download a toolchain.
fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.env("RUSTUP_AUTO_INSTALL", "0");
    cmd
}

fn nightly() -> Status {
    let what = "rustup toolchain nightly".to_string();
    let Some(list) = probe(rustup().args(["toolchain", "list"])) else {
        let fix = "curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh".into();
        return Status::Missing { what: "rustup".into(), fix };
    };
    // `nightly-x86_64-…` is the floating nightly; `nightly-2026-…` is a dated one, not it.
    let floating =
        |name: &str| name.strip_prefix("nightly-").is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()));
    if list.lines().filter_map(|l| l.split_whitespace().next()).any(floating) {
        return Status::Ok(what);
    }
    // Printed for a human to run, never run here: which nightly it fetches decides its LLVM.
    let what = format!("{what} (one that ships LLVM 22; re-run setup to check its LLVM)");
    let fix = "rustup toolchain install nightly --profile minimal --component rust-src".into();
    Status::Missing { what, fix }
}

fn rust_src() -> Status {
    let what = "rust-src for nightly (needed by -Z build-std=core)".to_string();
    let installed = || {
        let list = probe(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]));
        list.is_some_and(|l| l.lines().any(|c| c.starts_with("rust-src")))
    };
    if installed() {
        return Status::Ok(what);
    }
    println!("installing: rust-src for nightly (rustup component add)");
    let _ = rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]).status();
    if installed() {
        Status::Installed(what)
    } else {
        Status::Missing { what, fix: "rustup component add rust-src --toolchain nightly".into() }
    }
}

/// bpf-linker links with the LLVM it was built for; nightly's bitcode must be readable by it.
fn nightly_llvm() -> Status {
    let verbose = probe(rustup().args(["run", "nightly", "rustc", "-vV"])).unwrap_or_default();
    let llvm = verbose.lines().find_map(|l| l.strip_prefix("LLVM version: ")).unwrap_or("unknown");
    if llvm.starts_with("22.") {
        Status::Ok(format!("nightly rustc uses LLVM {llvm}"))
    } else {
        Status::Warning(format!(
            "nightly rustc uses LLVM {llvm}, but bpf-linker for LLVM 22 needs a nightly with \
             LLVM 22: install a dated nightly from before the LLVM 23 upgrade and make it `nightly`"
        ))
    }
}

fn bpf_linker(report: &mut Report) {
    let what = "bpf-linker 0.13.0 built for LLVM 22".to_string();
    let fix = INSTALL_BPF_LINKER.to_string();
    let why = match find() {
        Ok((desc, path)) => return report_found(report, Status::Ok(desc), &path),
        Err(why) => why,
    };
    if !Path::new(LLVM_PREFIX).join("lib/libLLVM.so").exists() {
        let fix = format!("install llvm-22-dev first, then {fix}");
        return report.add(Status::Missing { what: format!("{what}; {why}"), fix });
    }
    install(&why);
    match find() {
        Ok((desc, path)) => report_found(report, Status::Installed(desc), &path),
        Err(why) => report.add(Status::Missing { what: format!("{what}; {why}"), fix }),
    }
}

fn install(why: &str) {
    println!("installing: bpf-linker 0.13.0 for LLVM 22 ({why}; cargo install takes about 3 minutes)");
    let path = std::env::var("PATH").unwrap_or_default();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["install", "bpf-linker@0.13.0", "--locked", "--no-default-features", "--features", "llvm-22"])
        // Without these the build looks for the default LLVM and fails with `-lLLVM` not found.
        .env("PATH", format!("{LLVM_PREFIX}/bin:{path}"))
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .status();
    if let Err(err) = status {
        eprintln!("warning: failed to run cargo install ({err})");
    }
}

/// The first good copy, looking on PATH (what rustc will run) and then in cargo's bin dir
/// (where `cargo install` puts it); otherwise why the first copy found is unusable.
fn find() -> Result<(String, PathBuf), String> {
    let in_cargo_bin = cargo_bin().map(|dir| dir.join("bpf-linker")).filter(|p| p.is_file());
    let mut why = None;
    for path in [which("bpf-linker"), in_cargo_bin].into_iter().flatten() {
        match inspect(&path) {
            Ok(desc) => return Ok((desc, path)),
            Err(err) => why = why.or(Some(err)),
        }
    }
    Err(why.unwrap_or_else(|| "not found on PATH or in cargo's bin dir".into()))
}

fn cargo_bin() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME").map(PathBuf::from);
    let home = home.or_else(|| Some(PathBuf::from(std::env::var_os("HOME")?).join(".cargo")))?;
    Some(home.join("bin"))
}

/// `Ok(description)` if this binary is 0.13.0 and loads libLLVM 22, else why not.
fn inspect(path: &Path) -> Result<String, String> {
    let version = probe(Command::new(path).arg("--version")).unwrap_or_default();
    let version = version.trim();
    if version != "bpf-linker 0.13.0" {
        return Err(format!("{} reports {version:?}", path.display()));
    }
    let ldd = probe(Command::new("ldd").arg(path)).unwrap_or_default();
    let dynamic = probe(Command::new("readelf").args(["-d"]).arg(path)).unwrap_or_default();
    if ldd.contains("libLLVM.so.22") || dynamic.contains("llvm-22") {
        Ok(format!("{version} (LLVM 22) at {}", path.display()))
    } else {
        Err(format!("{} is not linked against libLLVM.so.22", path.display()))
    }
}

/// rustc runs the linker by name, so a copy found only in cargo's bin dir is not enough.
fn report_found(report: &mut Report, status: Status, found: &Path) {
    report.add(status);
    if which("bpf-linker").as_deref() != Some(found) {
        let dir = found.parent().map(|d| d.display().to_string()).unwrap_or_default();
        let warning =
            format!("PATH does not resolve bpf-linker to {}; put it first: export PATH={dir}:$PATH", found.display());
        report.add(Status::Warning(warning));
    }
}
