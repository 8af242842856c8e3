//! The newer Go toolchains the Go tests run beside the machine's own (Debian bookworm's
//! 1.19): Debian's `golang-1.2x-go` and `golang-1.2x-src` packages, fetched from
//! deb.debian.org into `<target>/go-toolchains/go-1.2x/` once. No apt source changes: each
//! package's `Filename:` and `SHA256:` come from its suite's `Packages.xz` index, the .deb is
//! checked against that hash and unpacked with `dpkg-deb -x`, giving a GOROOT at
//! `go-1.2x/usr/lib/go-1.2x` (its `bin/go` is static, so trixie's runs on bookworm too).
//!
//! A toolchain counts as present when its directory has the [`COMPLETE`] marker (written last)
//! and its `go version` runs; a failed fetch is a `missing:` item with the reason, which fails
//! the set-up, never a silent skip. Go 1.20 is packaged for no suite reachable here: it is
//! covered by unit tests only. The list is mirrored by `tests/src/go_build.rs`
//! (`FETCHED_VERSIONS`), which finds the toolchains at the same place.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{probe, Report, Status};
use crate::workspace;

const MIRROR: &str = "http://deb.debian.org/debian";

/// (minor version, Debian suite that packages it).
const TOOLCHAINS: [(&str, &str); 4] = [
    ("1.21", "bookworm-backports"),
    ("1.22", "bookworm-backports"),
    ("1.23", "bookworm-backports"),
    ("1.24", "trixie"),
];

/// Written into a toolchain's directory after both packages are unpacked: its contents are the
/// packages' versions.
const COMPLETE: &str = ".complete";

/// Where the toolchains live: `<target>/go-toolchains`.
pub fn dir() -> PathBuf {
    workspace::target_dir().join("go-toolchains")
}

/// Checks every toolchain, fetching the ones missing.
pub fn check(report: &mut Report) {
    let mut indexes = Indexes::default();
    for (version, suite) in TOOLCHAINS {
        let root = dir().join(format!("go-{version}"));
        let go = root.join(format!("usr/lib/go-{version}/bin/go"));
        let what = |found: &str| format!("Go {version} toolchain {} ({found}), for the Go tests", go.display());
        if let Some(found) = present(&root, &go) {
            report.add(Status::Ok(what(&found)));
            continue;
        }
        println!("installing: Go {version} (golang-{version}-go and -src from {MIRROR} {suite}, sha256-checked)");
        report.add(
            match fetch(&mut indexes, version, suite, &root).and_then(|()| {
                present(&root, &go).ok_or_else(|| format!("{} does not run after unpacking", go.display()))
            }) {
                Ok(found) => Status::Installed(what(&found)),
                Err(why) => Status::Missing {
                    what: format!("Go {version} toolchain for the Go tests: {why}"),
                    fix: format!("check that {MIRROR} is reachable, then `cargo xtask setup --for-test`"),
                },
            },
        );
    }
}

/// `go version`'s output when the toolchain is complete and runs.
fn present(root: &Path, go: &Path) -> Option<String> {
    root.join(COMPLETE).exists().then_some(())?;
    probe(Command::new(go).arg("version").env("GOTOOLCHAIN", "local")).map(|v| v.trim().to_string())
}

/// The suites' package indexes, each fetched at most once per set-up.
#[derive(Default)]
struct Indexes {
    by_suite: Vec<(&'static str, String)>,
}

impl Indexes {
    fn get(&mut self, suite: &'static str) -> Result<&str, String> {
        if let Some(at) = self.by_suite.iter().position(|(s, _)| *s == suite) {
            return Ok(&self.by_suite[at].1);
        }
        let url = format!("{MIRROR}/dists/{suite}/main/binary-amd64/Packages.xz");
        let path = scratch()?.join(format!("Packages-{suite}.xz"));
        download(&url, &path)?;
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&path)
            .output()
            .map_err(|e| format!("failed to run xz on {}: {e} (apt-get install xz-utils)", path.display()))?;
        if !out.status.success() {
            return Err(format!("xz could not read {url} ({})", out.status));
        }
        let _ = std::fs::remove_file(&path);
        self.by_suite.push((suite, String::from_utf8_lossy(&out.stdout).into_owned()));
        Ok(&self.by_suite.last().expect("just pushed").1)
    }
}

/// One package's stanza facts.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    version: String,
    filename: String,
    sha256: String,
}

/// The stanza of `package` in a `Packages` index.
fn entry(index: &str, package: &str) -> Option<Entry> {
    let stanza = index.split("\n\n").find(|s| s.lines().next() == Some(&format!("Package: {package}")))?;
    let field = |name: &str| {
        stanza.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": ")).map(str::to_string))
    };
    Some(Entry { version: field("Version")?, filename: field("Filename")?, sha256: field("SHA256")? })
}

/// Fetches, checks and unpacks both packages of `version` into `root` (through a temporary
/// directory renamed at the end, so a half-done unpack is never taken for a toolchain).
fn fetch(indexes: &mut Indexes, version: &str, suite: &'static str, root: &Path) -> Result<(), String> {
    let staging = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir_all(root);
    let mut versions = Vec::new();
    for package in [format!("golang-{version}-go"), format!("golang-{version}-src")] {
        let index = indexes.get(suite)?;
        let entry = entry(index, &package).ok_or_else(|| format!("{package} is not in {suite}'s Packages index"))?;
        let deb = scratch()?.join(format!("{package}.deb"));
        download(&format!("{MIRROR}/{}", entry.filename), &deb)?;
        let sum = sha256(&deb)?;
        if sum != entry.sha256 {
            let _ = std::fs::remove_file(&deb);
            return Err(format!("{} has sha256 {sum}, the index says {}", entry.filename, entry.sha256));
        }
        let status = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&staging)
            .status()
            .map_err(|e| format!("failed to run dpkg-deb: {e}"))?;
        if !status.success() {
            return Err(format!("dpkg-deb -x {} failed ({status})", deb.display()));
        }
        let _ = std::fs::remove_file(&deb);
        println!("  fetched {package} {} ({}), sha256 ok, unpacked", entry.version, entry.filename);
        versions.push(format!("{package} {}\n", entry.version));
    }
    std::fs::write(staging.join(COMPLETE), versions.concat()).map_err(|e| format!("failed to write marker: {e}"))?;
    std::fs::rename(&staging, root).map_err(|e| format!("failed to move {} into place: {e}", staging.display()))
}

fn scratch() -> Result<PathBuf, String> {
    let path = dir().join("downloads");
    std::fs::create_dir_all(&path).map_err(|e| format!("failed to create {}: {e}", path.display()))?;
    Ok(path)
}

fn download(url: &str, to: &Path) -> Result<(), String> {
    let status = Command::new("curl")
        .args(["--fail", "--silent", "--show-error", "--location", "--retry", "2", "--output"])
        .arg(to)
        .arg(url)
        .status()
        .map_err(|e| format!("failed to run curl: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("downloading {url} failed ({status})")),
    }
}

fn sha256(path: &Path) -> Result<String, String> {
    let out =
        probe(Command::new("sha256sum").arg(path)).ok_or_else(|| format!("sha256sum {} failed", path.display()))?;
    Ok(out.split_whitespace().next().unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_stanza_gives_its_file_and_hash() {
        let index = "Package: golang-1.21-doc\nVersion: 1\nFilename: pool/doc.deb\nSHA256: aa\n\n\
                     Package: golang-1.21-go\nSource: golang-1.21\nVersion: 1.21.13-1~bpo12+1\n\
                     Filename: pool/go.deb\nSize: 3\nSHA256: bb\n";
        let found = entry(index, "golang-1.21-go").unwrap();
        assert_eq!(
            found,
            Entry { version: "1.21.13-1~bpo12+1".into(), filename: "pool/go.deb".into(), sha256: "bb".into() }
        );
        assert!(entry(index, "golang-1.21").is_none(), "a prefix is not the package");
    }
}
