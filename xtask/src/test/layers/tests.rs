use super::*;

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(path, text)| (path.to_string(), text.to_string())).collect()
}

fn arrows(graph: &Graph) -> Vec<String> {
    graph.arrows.iter().flat_map(|(from, tos)| tos.keys().map(move |to| format!("{from}->{to}"))).collect()
}

#[test]
fn a_planted_cycle_is_found_and_named_with_its_lines() {
    let crate_files = files(&[
        ("lib.rs", "pub mod config;\npub mod profiles;\npub mod catalog;\npub mod units;\n"),
        ("config.rs", "//! Config.\n\npub use crate::profiles::Kind;\nuse crate::units::Bytes;\n"),
        ("profiles/mod.rs", "mod kind;\npub use kind::Kind;\nuse crate::catalog::Catalog;\n"),
        ("profiles/kind.rs", "pub enum Kind {}\n"),
        ("catalog/mod.rs", "mod events;\n"),
        ("catalog/events.rs", "fn f() {\n    let _ = super::super::config::load();\n}\n"),
        ("units.rs", "pub struct Bytes;\n"),
    ]);
    let graph = Graph::from_files(&crate_files);
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1, "{:?}", arrows(&graph));
    assert_eq!(
        cycles[0].to_string(),
        "catalog -> config (catalog/events.rs:2) -> profiles (config.rs:3) -> catalog (profiles/mod.rs:3)"
    );
}

#[test]
fn cutting_the_planted_arrow_leaves_no_cycle() {
    let crate_files = files(&[
        ("lib.rs", "pub mod config;\npub mod profiles;\npub mod catalog;\n"),
        ("config.rs", "use crate::profiles::Kind;\n"),
        ("profiles/mod.rs", "use crate::catalog::Catalog;\n"),
        ("catalog/mod.rs", "// was: use crate::config::load;\nconst DOC: &str = \"crate::config\";\n"),
    ]);
    let graph = Graph::from_files(&crate_files);
    assert!(graph.cycles().is_empty(), "{:?}", arrows(&graph));
    assert_eq!(arrows(&graph), ["config->profiles", "profiles->catalog"]);
    assert_eq!(graph.floors(), [vec!["catalog", "crate"], vec!["profiles"], vec!["config"]]);
}

#[test]
fn groups_inline_test_modules_super_and_root_reexports_resolve_to_modules() {
    let crate_files = files(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod error;\npub use error::{Error, Result};\n"),
        ("a.rs", "use crate::{b::X, c};\nfn f() -> crate::Result<()> { Ok(()) }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"),
        ("b/mod.rs", "mod inner;\n"),
        ("b/inner.rs", "use super::Thing;\nuse super::super::c::Y;\nlet s = r#\"crate::a\"#; let q = '\"'; // crate::a\n"),
        ("c.rs", "/* crate::a /* nested */ crate::a */ fn g<'a>(x: &'a str) {}\n"),
        ("error.rs", ""),
    ]);
    let graph = Graph::from_files(&crate_files);
    assert_eq!(arrows(&graph), ["a->b", "a->c", "a->error", "b->c", "crate->error"]);
    assert!(graph.cycles().is_empty());
}

#[test]
fn test_code_may_reach_up_production_code_may_not() {
    let crate_files = files(&[
        ("lib.rs", "pub mod api;\npub mod client;\n#[cfg(test)]\nmod properties;\n"),
        ("client/mod.rs", "use crate::api::MAX;\n"),
        ("api/mod.rs", "pub const MAX: u64 = 1;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nuse crate::client::get;\n"),
        ("api/tests/mod.rs", "use crate::client::get;\n"),
        ("properties.rs", "use crate::client::get;\n"),
        ("api/server.rs", "#[cfg(test)]\nfn helper() { crate::client::get(); }\nfn serve() {}\n"),
    ]);
    let graph = Graph::from_files(&crate_files);
    assert_eq!(arrows(&graph), ["client->api"]);
    let with_production_arrow =
        [crate_files, files(&[("api/page.rs", "fn f() {}\nuse crate::client::get;\n")])].concat();
    let cycles = Graph::from_files(&with_production_arrow).cycles();
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].to_string(), "api -> client (api/page.rs:2) -> api (client/mod.rs:1)");
}

#[test]
fn the_workspace_has_no_module_cycle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace");
    if let Err(err) = check(workspace) {
        panic!("{err:#}");
    }
}
