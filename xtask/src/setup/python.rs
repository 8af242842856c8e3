//! The Python venv of the end-to-end tests, under `target/test-venv`: PyPI's
//! `opentelemetry-proto` (the official OTLP classes the export tests' backend,
//! `tests/backend/backend.py`, decodes with), `grpcio-tools` (protoc, to compile our push.v1
//! .proto) and `py-spy` (its wheel's `bin/py-spy`, the reference the Python CPU profiles are
//! compared with), pinned. Created and filled only when an import fails or `py-spy --version`
//! does not run, so a ready venv costs two probes.

use std::path::PathBuf;
use std::process::Command;

use super::{probe, Host, Report, Status};
use crate::workspace;

/// Pinned: the OTLP profiles schema is experimental and changes between releases; 1.45.2 is
/// generated from the same opentelemetry-proto commit as profiler-daemon/proto/opentelemetry.
/// py-spy 0.4.3 reads CPython 3.11-3.13, the versions the profiler walks.
const PACKAGES: [&str; 3] = ["opentelemetry-proto==1.45.2", "grpcio-tools==1.85.1", "py-spy==0.4.3"];
const IMPORTS: &str =
    "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2, grpc_tools.protoc";

pub fn venv() -> PathBuf {
    workspace::target_dir().join("test-venv")
}

/// Checks the venv; creates and fills it when something is missing.
pub fn check(host: &Host, report: &mut Report) {
    let what = format!("python venv {} ({})", venv().display(), PACKAGES.join(", "));
    if ready() {
        return report.add(Status::Ok(what));
    }
    println!("installing: {what}");
    let python = venv().join("bin/python");
    if !python.exists() {
        let _ = Command::new("/usr/bin/python3").arg("-m").arg("venv").arg(venv()).status();
    }
    let _ = Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
        .args(PACKAGES)
        .status();
    report.add(match ready() {
        true => Status::Installed(what),
        false => Status::Missing {
            what,
            fix: format!(
                "{sudo}apt-get install -y python3-venv && /usr/bin/python3 -m venv {dir} && {dir}/bin/python -m pip install {}",
                PACKAGES.join(" "),
                sudo = host.sudo(),
                dir = venv().display()
            ),
        },
    });
}

fn ready() -> bool {
    probe(Command::new(venv().join("bin/python")).args(["-c", IMPORTS])).is_some()
        && probe(Command::new(venv().join("bin/py-spy")).arg("--version")).is_some()
}
