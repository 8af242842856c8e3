//! Debian packages: probed by what the build actually uses (a file or a working command), so
//! a machine that has the tool from elsewhere passes; installed with apt-get only as root.

use std::path::Path;
use std::process::Command;

use super::{probe, Host, Report, Status};

/// One apt package and how to tell it is usable.
pub struct Package {
    pub name: &'static str,
    /// Why the project needs it, shown in the report line.
    pub why: &'static str,
    pub present: fn() -> bool,
}

/// The packages for the build, plus golang-go, linux-perf, systemd-container, elfutils, curl,
/// python3 (with venv), openssl and chromium when the tests will run, and linux-perf,
/// bpftrace and elfutils when a bench will.
pub fn packages(go: bool, bench: bool) -> Vec<Package> {
    let mut packages = build_packages();
    if go {
        packages.extend(test_packages());
    }
    if bench {
        packages.extend(bench_packages());
    }
    packages
}

/// What the build needs.
fn build_packages() -> Vec<Package> {
    vec![
        Package {
            name: "llvm-22-dev",
            why: "libLLVM for building bpf-linker",
            // bpf-linker's build links `-lLLVM`, which is this unversioned symlink.
            present: || Path::new("/usr/lib/llvm-22/lib/libLLVM.so").exists(),
        },
        Package {
            name: "gcc",
            why: "linker for Rust and the bench spinner",
            present: || probe(Command::new("gcc").arg("--version")).is_some(),
        },
    ]
}

/// What the end-to-end tests need.
fn test_packages() -> Vec<Package> {
    vec![
        Package {
            name: "golang-go",
            why: "`go tool pprof` for the end-to-end tests",
            present: || probe(Command::new("go").arg("version")).is_some(),
        },
        Package {
            name: "linux-perf",
            why: "`perf record --call-graph dwarf`, the unwinding tests' reference",
            present: || probe(Command::new("perf").arg("--version")).is_some(),
        },
        Package {
            name: "systemd-container",
            why: "`systemd-nspawn`, a real systemd as PID 1 of a container for the unit's tests",
            present: || probe(Command::new("systemd-nspawn").arg("--version")).is_some(),
        },
        Package {
            name: "elfutils",
            why: "`eu-stack -p`, the thread-dump tests' reference and the bench's peer",
            present: || probe(Command::new("eu-stack").arg("--version")).is_some(),
        },
        Package {
            name: "gdb",
            why: "reads CPython's structure offsets from the interpreters' debug info (the Python tests' reference)",
            present: || probe(Command::new("gdb").arg("--version")).is_some(),
        },
        Package {
            name: "curl",
            why: "the socket client of the end-to-end tests (`curl --unix-socket`)",
            present: || probe(Command::new("curl").arg("--version")).is_some(),
        },
        Package {
            name: "python3",
            why: "the socket-flooding client of the hardening tests, run as nobody",
            present: || probe(Command::new("/usr/bin/python3").arg("--version")).is_some(),
        },
        Package {
            name: "python3-venv",
            why: "the venv of the export tests' backend (opentelemetry-proto, grpcio-tools)",
            present: || probe(Command::new("/usr/bin/python3").args(["-c", "import ensurepip, venv"])).is_some(),
        },
        Package {
            name: "chromium",
            why: "headless screenshots of the flame graph SVGs, looked at as a person would",
            present: || probe(Command::new("chromium").arg("--version")).is_some(),
        },
        Package {
            name: "openssl",
            why: "a CA and certificate for the export tests' TLS backend",
            present: || probe(Command::new("openssl").arg("version")).is_some(),
        },
    ]
}

/// What the benches need.
fn bench_packages() -> Vec<Package> {
    vec![
        Package {
            name: "linux-perf",
            why: "`perf record`, the exec bench's peer",
            present: || probe(Command::new("perf").arg("--version")).is_some(),
        },
        Package {
            name: "bpftrace",
            why: "the benches' floor (empty programs on the same hooks) and peer",
            present: || probe(Command::new("bpftrace").arg("--version")).is_some(),
        },
        Package {
            name: "elfutils",
            why: "`eu-stack -p`, the threads bench's peer",
            present: || probe(Command::new("eu-stack").arg("--version")).is_some(),
        },
    ]
}

/// Installs whatever is missing in one apt-get run (when allowed), then reports each package.
pub fn check(host: &Host, packages: &[Package], report: &mut Report) {
    let missing: Vec<&str> = packages.iter().filter(|p| !(p.present)()).map(|p| p.name).collect();
    let attempted = !missing.is_empty() && host.root && host.apt;
    if attempted {
        install(&missing);
    }
    for package in packages {
        report.add(status(host, package, &missing, attempted));
    }
}

fn status(host: &Host, package: &Package, missing: &[&str], attempted: bool) -> Status {
    let what = format!("{} ({})", package.name, package.why);
    if !missing.contains(&package.name) {
        Status::Ok(what)
    } else if attempted && (package.present)() {
        Status::Installed(what)
    } else {
        Status::Missing { what, fix: install_command(host, package.name) }
    }
}

/// `apt-get update` only here, so an all-present machine never touches the network. Failures
/// are not fatal here: the re-probe afterwards decides, and reports the command to retry.
fn install(names: &[&str]) {
    println!("installing: {} (apt-get update && apt-get install)", names.join(" "));
    let _ = Command::new("apt-get").arg("update").status();
    let _ =
        Command::new("apt-get").args(["install", "-y"]).args(names).env("DEBIAN_FRONTEND", "noninteractive").status();
}

fn install_command(host: &Host, name: &str) -> String {
    let sudo = host.sudo();
    format!("{sudo}apt-get update && {sudo}DEBIAN_FRONTEND=noninteractive apt-get install -y {name}")
}
