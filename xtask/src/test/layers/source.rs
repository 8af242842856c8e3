//! Reading a file's text, not the compiler's: comments and string literals blanked, then
//! the `crate::`, `$crate::` and `super::` paths of its code (outside `#[cfg(test)]` items),
//! and the root file's re-exports.

use std::collections::BTreeSet;

/// `a/b/c.rs` → `[a, b, c]`; `a/mod.rs` and `a.rs` → `[a]`; `lib.rs` and `main.rs` → `[]`.
pub(super) fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|last| last == "mod") || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main"))
    {
        parts.pop();
    }
    parts
}

/// What a path names: a top-level name (a module, or an item of the root), or the root itself.
#[derive(Debug, PartialEq)]
pub(super) enum Target {
    Module(String),
    Root,
}

/// The root file's `use a::…` statements (its re-exports): each as (line, module `a`, the names
/// it brings in).
pub(super) fn root_imports(code: &[char], modules: &BTreeSet<String>) -> Vec<(usize, String, Vec<String>)> {
    let text: String = code.iter().collect();
    let mut imports = Vec::new();
    let mut offset = 0;
    for statement in text.split(';') {
        let leading = statement.len() - statement.trim_start().len();
        let line = 1 + text[..offset + leading].matches('\n').count();
        offset += statement.len() + 1;
        let trimmed = statement.trim();
        let Some(rest) = trimmed.strip_prefix("pub use ").or_else(|| trimmed.strip_prefix("use ")) else { continue };
        let rest = rest.trim().trim_start_matches("crate::").trim_start_matches("self::");
        let Some(module) = rest.split("::").next().filter(|first| modules.contains(*first)) else { continue };
        let names = rest.split(|c: char| !is_ident(c)).filter(|name| !name.is_empty() && *name != "as");
        imports.push((line, module.to_string(), names.map(str::to_string).collect()));
    }
    imports
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code with comments and the contents of string and char literals turned into spaces
/// (newlines kept, so line numbers stay right).
pub(super) fn blank(text: &str) -> Vec<char> {
    let mut out: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < out.len() {
        let start = i;
        i = match (out[i], out.get(i + 1).copied()) {
            ('/', Some('/')) => out[i..].iter().position(|&c| c == '\n').map_or(out.len(), |n| i + n),
            ('/', Some('*')) => block_comment_end(&out, i),
            ('"', _) => string_end(&out, i + 1, None),
            ('r', Some('"' | '#'))
                if i == 0 || !is_ident(out[i - 1]) || (out[i - 1] == 'b' && (i < 2 || !is_ident(out[i - 2]))) =>
            {
                let hashes = out[i + 1..].iter().take_while(|&&c| c == '#').count();
                if out.get(i + 1 + hashes) == Some(&'"') {
                    string_end(&out, i + 2 + hashes, Some(hashes))
                } else {
                    i + 1
                }
            }
            ('\'', Some('\\')) => out[i + 3..].iter().position(|&c| c == '\'').map_or(out.len(), |n| i + 4 + n),
            ('\'', Some(_)) if out.get(i + 2) == Some(&'\'') => i + 3,
            _ => {
                i += 1;
                continue;
            }
        };
        i = i.min(out.len());
        for c in &mut out[start..i] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
    out
}

/// The index after a (nested) block comment that opens at `i`.
fn block_comment_end(code: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < code.len() {
        match (code[i], code.get(i + 1).copied()) {
            ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
            ('*', Some('/')) => {
                (depth, i) = (depth - 1, i + 2);
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    code.len()
}

/// The index after a string whose contents start at `i`; `raw` is the number of `#` of a raw
/// string (no escapes), `None` for a plain one.
fn string_end(code: &[char], mut i: usize, raw: Option<usize>) -> usize {
    let hashes = raw.unwrap_or(0);
    while i < code.len() {
        match code[i] {
            '\\' if raw.is_none() => i += 2,
            '"' if code[i + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes => return i + 1 + hashes,
            _ => i += 1,
        }
    }
    code.len()
}

/// What a file's code says about the graph.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Every `crate::…` and `super::…` path that leaves the file's top-level module, as
    /// (line, target).
    pub(super) references: Vec<(usize, Target)>,
    /// The children declared as `#[cfg(test)] mod x;`, whose files are test code.
    pub(super) test_mods: Vec<String>,
}

/// Scans blanked code; `module` is the file's module path, and inline `mod x { … }` blocks
/// deepen it. `#[cfg(test)]` items are skipped.
pub(super) fn scan(code: &[char], module: &[String]) -> Scan {
    const CFG_TEST: &str = "#[cfg(test)]";
    let mut found = Scan::default();
    let mut line = 1;
    let mut depth = 0usize;
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < code.len() {
        match code[i] {
            '\n' => line += 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if inline_mods.last() == Some(&depth) {
                    inline_mods.pop();
                }
            }
            '#' if code[i..].iter().take(CFG_TEST.len()).copied().eq(CFG_TEST.chars()) => {
                let start = skip_space(code, i + CFG_TEST.len());
                let end = item_end(code, start);
                if word_at(code, start) == "mod" && code.get(end - 1) == Some(&';') {
                    found.test_mods.push(word_at(code, skip_space(code, start + 3)));
                }
                line += code[i..end].iter().filter(|&&c| c == '\n').count();
                i = end;
                continue;
            }
            c if is_ident(c) && (i == 0 || !is_ident(code[i - 1])) => {
                let word = word_at(code, i);
                let after = i + word.len();
                if word == "mod" && opens_inline_mod(code, after) {
                    inline_mods.push(depth);
                } else if word == "crate" || word == "super" {
                    let module_depth = module.len() + inline_mods.len();
                    let targets = path_targets(code, i, module_depth);
                    found.references.extend(targets.into_iter().map(|target| (line, target)));
                }
                i = after;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The index after the item that starts at `i`: after its first `;` outside brackets, or after
/// its first `{…}` block (further attributes before it are part of it).
fn item_end(code: &[char], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < code.len() {
        match code[i] {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            ';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    code.len()
}

fn word_at(code: &[char], i: usize) -> String {
    code[i..].iter().take_while(|&&c| is_ident(c)).collect()
}

fn skip_space(code: &[char], mut i: usize) -> usize {
    while code.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// After `mod`: a name and then `{` (not `;`).
fn opens_inline_mod(code: &[char], i: usize) -> bool {
    let i = skip_space(code, i);
    let name = word_at(code, i);
    !name.is_empty() && code.get(skip_space(code, i + name.len())) == Some(&'{')
}

/// The top-level targets of a path starting at `i` (`crate::a`, `super::super::b`,
/// `crate::{a, b::c}`), or none when the path stays inside the file's top-level module.
fn path_targets(code: &[char], mut i: usize, module_depth: usize) -> Vec<Target> {
    let mut supers = 0;
    loop {
        let word = word_at(code, i);
        let after = skip_space(code, i + word.len());
        let has_sep = code.get(after) == Some(&':') && code.get(after + 1) == Some(&':');
        match word.as_str() {
            "super" => supers += 1,
            "crate" if supers == 0 => supers = usize::MAX,
            _ => break,
        }
        if !has_sep {
            // `use super::{self}` style ends here: the path names a module, not inside ours.
            return if supers == usize::MAX || supers >= module_depth { vec![Target::Root] } else { Vec::new() };
        }
        i = skip_space(code, after + 2);
    }
    if supers != usize::MAX && supers < module_depth {
        return Vec::new();
    }
    if code.get(i) == Some(&'{') {
        return group_heads(code, i).into_iter().map(name_target).collect();
    }
    let word = word_at(code, i);
    vec![if word.is_empty() { Target::Root } else { name_target(word) }]
}

fn name_target(word: String) -> Target {
    if word == "self" || word == "super" {
        Target::Root
    } else {
        Target::Module(word)
    }
}

/// The first name of each item of the `{…}` group that opens at `i`.
fn group_heads(code: &[char], mut i: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = false;
    while i < code.len() {
        match code[i] {
            '{' => {
                depth += 1;
                expect_head = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_head = true,
            c if expect_head && is_ident(c) => {
                let word = word_at(code, i);
                i += word.len();
                heads.push(word);
                expect_head = false;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}
