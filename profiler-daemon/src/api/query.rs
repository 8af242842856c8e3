//! Query strings: splitting `a=1&b=2`, percent-decoding keys and values, and refusing
//! duplicates and unknown names. Meaning (what a pid is) belongs to [`super::request`].

use std::fmt;

/// More parameters than any endpoint takes; a cap keeps the duplicate check trivially cheap.
const MAX_PARAMS: usize = 16;

/// Why a query string was refused; always a 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamError {
    BadEscape,
    NotUtf8,
    TooMany,
    Duplicate(String),
    Unknown { name: String, path: String, allowed: &'static [&'static str] },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadEscape => f.write_str("invalid percent-encoding in the query string"),
            Self::NotUtf8 => f.write_str("the query string is not UTF-8 after percent-decoding"),
            Self::TooMany => write!(f, "more than {MAX_PARAMS} query parameters"),
            Self::Duplicate(name) => write!(f, "parameter {name:?} is given more than once"),
            Self::Unknown { name, path, allowed: [] } => {
                write!(f, "unknown parameter {name:?}: {path} takes no parameters")
            }
            Self::Unknown { name, path, allowed } => {
                write!(f, "unknown parameter {name:?} for {path}; allowed: {}", allowed.join(", "))
            }
        }
    }
}

/// Decoded `name=value` pairs, names unique.
#[derive(Debug, Default)]
pub struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    /// Parses `raw` (without the `?`). As in Go's `url.ParseQuery`, empty segments are
    /// skipped, a segment without `=` has an empty value and `+` means a space.
    pub fn parse(raw: &str) -> Result<Self, ParamError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for segment in raw.split('&').filter(|s| !s.is_empty()) {
            if pairs.len() == MAX_PARAMS {
                return Err(ParamError::TooMany);
            }
            let (name, value) = segment.split_once('=').unwrap_or((segment, ""));
            let name = decode(name)?;
            if pairs.iter().any(|(seen, _)| *seen == name) {
                return Err(ParamError::Duplicate(name));
            }
            pairs.push((name, decode(value)?));
        }
        Ok(Self { pairs })
    }

    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Refuses any parameter not in `allowed`; `path` is for the message.
    pub fn only(&self, path: &str, allowed: &'static [&'static str]) -> Result<(), ParamError> {
        match self.pairs.iter().find(|(name, _)| !allowed.contains(&name.as_str())) {
            Some((name, _)) => Err(ParamError::Unknown { name: name.clone(), path: path.into(), allowed }),
            None => Ok(()),
        }
    }
}

/// Percent-decodes one key or value (`%41` → `A`, `+` → space).
fn decode(text: &str) -> Result<String, ParamError> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let (hex, tail) = rest.split_at_checked(2).ok_or(ParamError::BadEscape)?;
                bytes.push(hex_byte(hex).ok_or(ParamError::BadEscape)?);
                rest = tail;
            }
            _ => bytes.push(b),
        }
    }
    String::from_utf8(bytes).map_err(|_| ParamError::NotUtf8)
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_decodes() {
        let p = Params::parse("pid=4%32&&name=a+b%2Fc&flag").unwrap();
        assert_eq!(p.get("pid"), Some("42"));
        assert_eq!(p.get("name"), Some("a b/c"));
        assert_eq!(p.get("flag"), Some(""));
        assert_eq!(p.get("absent"), None);
        assert!(Params::parse("").unwrap().only("/x", &[]).is_ok());
    }

    #[test]
    fn decodes_names_too_so_duplicates_cannot_hide() {
        assert_eq!(Params::parse("pid=1&%70id=2").unwrap_err(), ParamError::Duplicate("pid".into()));
    }

    #[test]
    fn refuses_bad_escapes_and_non_utf8() {
        for raw in ["pid=%", "pid=%4", "pid=%zz", "p%id=1", "pid=%+1"] {
            assert_eq!(Params::parse(raw).unwrap_err(), ParamError::BadEscape, "{raw}");
        }
        assert_eq!(Params::parse("pid=%ff").unwrap_err(), ParamError::NotUtf8);
    }

    #[test]
    fn caps_the_number_of_parameters() {
        let raw: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=1")).collect();
        assert_eq!(Params::parse(&raw.join("&")).unwrap_err(), ParamError::TooMany);
    }

    #[test]
    fn unknown_names_list_the_allowed_ones() {
        let p = Params::parse("second=5").unwrap();
        let err = p.only("/debug/pprof/profile", &["pid", "seconds"]).unwrap_err();
        assert_eq!(err.to_string(), r#"unknown parameter "second" for /debug/pprof/profile; allowed: pid, seconds"#);
        let err = p.only("/status", &[]).unwrap_err();
        assert_eq!(err.to_string(), r#"unknown parameter "second": /status takes no parameters"#);
    }
}
