//! That xtask's cargo invocations leave each other's artifacts alone: structurally (profile,
//! flags, environment), and as cargo itself plans them (`--unit-graph`), which also sees the
//! features a dev-dependency turns on.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::process::Command;

use serde_json::Value;

use super::*;

/// Every invocation xtask compiles with, named for the messages.
fn invocations() -> Vec<(&'static str, Command)> {
    vec![
        ("build", build()),
        ("clippy", clippy()),
        ("test --no-run", test_binaries(&[])),
        // A tier by binary builds what it shares with the whole run the same way.
        ("test --no-run --test systemd", test_binaries(&["systemd".to_string()])),
        ("unit tests", unit_tests()),
        ("doc tests", doc_tests()),
    ]
}

fn args(cmd: &Command) -> Vec<String> {
    cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
}

#[test]
fn every_invocation_is_release_with_no_flag_or_variable_of_its_own() {
    const FORBIDDEN: [&str; 7] =
        ["--features", "--all-features", "--no-default-features", "--profile", "--config", "--target-dir", "-Z"];
    for (name, cmd) in invocations() {
        let args = args(&cmd);
        assert_eq!(args.iter().filter(|a| *a == "--release").count(), 1, "{name}: {args:?}");
        let forbidden: Vec<_> = args.iter().filter(|a| FORBIDDEN.iter().any(|f| a.starts_with(f))).collect();
        assert!(forbidden.is_empty(), "{name} passes {forbidden:?}, which would give it artifacts of its own");
        // Arguments after `--` go to the tool; the callers add them, after the cargo ones.
        assert!(!args.iter().any(|a| a == "--"), "{name}: {args:?}");
        let set: Vec<_> = cmd.get_envs().filter(|(_, value)| value.is_some()).collect();
        assert!(set.is_empty(), "{name} sets {set:?}; a build script or rustc may track it");
    }
}

/// This binary was started by `cargo test`, which sets the same package variables for it as
/// `cargo run` sets for xtask: the ground truth for what a nested cargo must not inherit.
#[test]
fn drops_every_package_variable_cargo_gave_this_process() {
    let ours = std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo, which sets CARGO_MANIFEST_DIR");
    assert_eq!(ours, env!("CARGO_MANIFEST_DIR"));
    // The ones ring's build script declares with rerun-if-env-changed.
    let tracked = ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "CARGO_PKG_VERSION_MAJOR", "CARGO_PKG_VERSION_PRE"];
    // And any other variable whose value names this package.
    let naming_us = std::env::vars()
        .filter(|(key, value)| key.starts_with("CARGO_") && (value.contains(&ours) || value == env!("CARGO_PKG_NAME")));
    let expected: HashSet<String> = tracked.iter().map(|s| s.to_string()).chain(naming_us.map(|(k, _)| k)).collect();
    for (name, cmd) in invocations() {
        let removed: HashSet<String> = cmd
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        let kept: Vec<_> = expected.difference(&removed).collect();
        assert!(kept.is_empty(), "{name} passes {kept:?} on to cargo");
    }
}

#[test]
fn cargo_settings_are_not_package_variables() {
    for setting in ["CARGO_TARGET_DIR", "CARGO_PROFILE_RELEASE_DEBUG", "CARGO_BUILD_JOBS", "RUSTFLAGS", "CARGO_HOME"] {
        assert!(!is_package_var(OsStr::new(setting)), "{setting}");
    }
    for package in ["CARGO_PKG_NAME", "CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_CRATE_NAME"] {
        assert!(is_package_var(OsStr::new(package)), "{package}");
    }
}

/// Cargo's own plan for each invocation (`cargo +nightly … --unit-graph`; nightly builds the
/// eBPF object, so it is there): every unit two invocations both build, such as the daemon's
/// library, `profiler` and the build-script run that makes the eBPF object, must be the same
/// unit (package, target, profile, features and, recursively, dependencies) in both.
#[test]
fn invocations_share_every_unit_they_have_in_common() {
    let graphs: Vec<(&str, HashMap<String, HashSet<u64>>)> =
        invocations().into_iter().map(|(name, cmd)| (name, unit_graph(name, &cmd))).collect();
    let (build_name, build) = &graphs[0];
    let daemon_units = build.keys().filter(|k| k.contains("profiler-daemon")).count();
    assert!(daemon_units >= 3, "{build_name} plans {daemon_units} profiler-daemon units: {:?}", build.keys());
    let mut differing = Vec::new();
    for (i, (a_name, a)) in graphs.iter().enumerate() {
        for (b_name, b) in &graphs[i + 1..] {
            for (unit, a_configs) in a {
                if b.get(unit).is_some_and(|b_configs| a_configs.is_disjoint(b_configs)) {
                    differing.push(format!("{unit}: {a_name} vs {b_name}"));
                }
            }
        }
    }
    assert!(differing.is_empty(), "units built differently, so built twice:\n{}", differing.join("\n"));
}

/// `(package, target, mode)` → the configurations cargo would build it in.
fn unit_graph(name: &str, cmd: &Command) -> HashMap<String, HashSet<u64>> {
    let mut nightly = Command::new("rustup");
    nightly.args(["run", "nightly", "cargo"]).args(cmd.get_args()).args(["--unit-graph", "-Z", "unstable-options"]);
    if let Some(dir) = cmd.get_current_dir() {
        nightly.current_dir(dir);
    }
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => nightly.env(key, value),
            None => nightly.env_remove(key),
        };
    }
    let output = nightly.output().expect("rustup runs (`cargo xtask setup` installs nightly)");
    assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    let graph: Value = serde_json::from_slice(&output.stdout).expect("cargo's unit graph is JSON");
    let units = graph["units"].as_array().expect("a unit graph has units");
    let mut memo = vec![None; units.len()];
    let mut configs: HashMap<String, HashSet<u64>> = HashMap::new();
    for (i, unit) in units.iter().enumerate() {
        let label = format!("{} {} {}", unit["pkg_id"], unit["target"]["name"], unit["mode"]);
        configs.entry(label).or_default().insert(unit_key(units, i, &mut memo));
    }
    configs
}

/// A unit's identity as far as cargo's artifact hash goes, its dependencies' included.
fn unit_key(units: &[Value], i: usize, memo: &mut Vec<Option<u64>>) -> u64 {
    if let Some(key) = memo[i] {
        return key;
    }
    let unit = &units[i];
    let mut deps: Vec<u64> = unit["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|dep| dep["index"].as_u64())
        .map(|dep| unit_key(units, dep as usize, memo))
        .collect();
    deps.sort_unstable();
    let mut hasher = DefaultHasher::new();
    for field in ["pkg_id", "target", "mode", "platform", "features", "profile"] {
        unit[field].to_string().hash(&mut hasher);
    }
    deps.hash(&mut hasher);
    let key = hasher.finish();
    memo[i] = Some(key);
    key
}
