//! Size limits on production code (issue #43): no function over [`MAX_FN_LINES`] lines, and no
//! file over [`MAX_FILE_LINES`] unless its `//!` header says why it is one unit (the words
//! [`ONE_UNIT`]). Test code is left out: `tests.rs` files, files under a `tests/` directory,
//! and items under `#[cfg(test)]`.
//!
//! A function's length runs from its `fn` line to the line of its closing brace, counted on
//! the source with comments and literals blanked ([`super::source::blank`]), so a brace in a
//! string does not end it. Nested functions count on their own and inside their parent.

use super::source::blank;

/// The longest production function allowed, in lines.
pub const MAX_FN_LINES: usize = 80;

/// The longest production file allowed without a reason in its header, in lines.
pub const MAX_FILE_LINES: usize = 600;

/// What a longer file's `//!` header must say (case-insensitive).
pub const ONE_UNIT: &str = "one file over 600 lines";

/// Whether `path` (relative to a crate's `src`) holds only tests.
pub(super) fn is_test_file(path: &str) -> bool {
    path == "tests.rs" || path.ends_with("/tests.rs") || path.starts_with("tests/") || path.contains("/tests/")
}

/// Each limit `text` (the file at `path`) breaks, one line each.
pub(super) fn violations(path: &str, text: &str) -> Vec<String> {
    if is_test_file(path) {
        return Vec::new();
    }
    let mut found = Vec::new();
    let lines = text.lines().count();
    let header = text.lines().take_while(|l| l.starts_with("//!") || l.trim().is_empty()).collect::<Vec<_>>();
    if lines > MAX_FILE_LINES && !header.join(" ").to_lowercase().contains(ONE_UNIT) {
        found.push(format!(
            "{path}: {lines} lines (over {MAX_FILE_LINES}); split it, or say in its //! header why it is \
             one unit (\"{ONE_UNIT}\")"
        ));
    }
    for (line, name, length) in long_functions(&blank(text)) {
        found.push(format!(
            "{path}:{line}: fn {name} is {length} lines (over {MAX_FN_LINES}); split it into named steps"
        ));
    }
    found
}

/// (1-based line, name, lines) of each function over [`MAX_FN_LINES`] outside `#[cfg(test)]`.
fn long_functions(code: &[char]) -> Vec<(usize, String, usize)> {
    let line_of = |i: usize| code[..i].iter().filter(|&&c| c == '\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if starts_with(code, i, "#[cfg(test)]") {
            i = item_end(code, i + "#[cfg(test)]".len());
            continue;
        }
        if is_keyword(code, i, "fn") {
            let name: String = code[i + 2..]
                .iter()
                .skip_while(|c| c.is_whitespace())
                .take_while(|c| c.is_alphanumeric() || **c == '_')
                .collect();
            let end = item_end(code, i);
            let length = line_of(end) - line_of(i) + 1;
            if length > MAX_FN_LINES {
                found.push((line_of(i), name, length));
            }
        }
        i += 1;
    }
    found
}

/// The index of the end of the item starting at or after `from`: its body's closing brace, or
/// the `;` of an item without a body.
fn item_end(code: &[char], from: usize) -> usize {
    let mut depth = 0usize;
    for (j, &c) in code.iter().enumerate().skip(from) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j;
                }
            }
            ';' if depth == 0 => return j,
            _ => {}
        }
    }
    code.len().saturating_sub(1)
}

fn starts_with(code: &[char], i: usize, word: &str) -> bool {
    word.chars().enumerate().all(|(k, w)| code.get(i + k) == Some(&w))
}

/// `word` at `i` as a whole identifier.
fn is_keyword(code: &[char], i: usize, word: &str) -> bool {
    let ident = |c: Option<&char>| c.is_some_and(|c| c.is_alphanumeric() || *c == '_');
    starts_with(code, i, word) && !ident(i.checked_sub(1).and_then(|p| code.get(p))) && !ident(code.get(i + word.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str, body_lines: usize) -> String {
        format!("fn {name}() {{\n{}}}\n", "    let x = 1;\n".repeat(body_lines))
    }

    #[test]
    fn a_long_function_is_named_with_its_line_and_length() {
        let text = format!("//! A module.\n\n{}{}", function("short", 10), function("long", 80));
        let found = violations("a.rs", &text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("a.rs:15: fn long is 82 lines"), "{found:?}");
    }

    #[test]
    fn test_code_and_braces_in_strings_do_not_count() {
        let in_test = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", function("long", 90));
        assert!(violations("a.rs", &in_test).is_empty());
        assert!(violations("x/tests.rs", &function("long", 90)).is_empty());
        let braces = "fn f() {\n    let s = \"}\";\n    let t = 2;\n}\n".to_string() + &function("long", 85);
        let found = violations("a.rs", &braces);
        assert_eq!(found.len(), 1, "the string's brace ends nothing: {found:?}");
        assert!(found[0].contains("fn long is 87 lines"), "{found:?}");
    }

    #[test]
    fn a_long_file_needs_its_reason_in_the_header() {
        let body = "const A: u8 = 1;\n".repeat(MAX_FILE_LINES);
        assert_eq!(violations("big.rs", &format!("//! Big.\n{body}")).len(), 1);
        let said = format!("//! Big.\n//! One file over 600 lines on purpose: its parts share a state.\n{body}");
        assert!(violations("big.rs", &said).is_empty());
    }
}
