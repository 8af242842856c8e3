//! `[[export]]`: the backends interval profiles are pushed to (Pyroscope, OTLP), validated
//! once into [`ExportConfig`]s. Data and validation only: secrets named by `*_file` keys are
//! read by the exporter when it starts (the config stays free of I/O), and the URL is split
//! into the parts the HTTP client needs, so a bad one is refused here, not at the first push.

use std::{collections::BTreeMap, fmt, ops::RangeInclusive, path::PathBuf, time::Duration};

use super::{
    check::{absolute_path, duration_in},
    raw::{RawAuth, RawExport},
    InvalidValue,
};

/// `timeout`: one request, from connecting to the last byte of the answer.
pub const EXPORT_TIMEOUT_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(300);
/// `max_backoff`: the longest wait between two tries of the same request.
pub const EXPORT_BACKOFF_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);
/// An export's name is a file name in the spool (its cursor), so it is kept short and plain.
pub const EXPORT_NAME_MAX_BYTES: usize = 64;

/// Headers the exporter sets itself; `Authorization` has its own keys.
const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "authorization",
    "connect-protocol-version",
    "te",
];

/// The placeholders of `service_name`.
pub const SERVICE_NAME_FIELDS: [&str; 6] = ["service", "unit", "container", "name", "exe", "hostname"];

/// One `[[export]]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    /// Unique among the exports; `[A-Za-z0-9_-]`, at most [`EXPORT_NAME_MAX_BYTES`]. Names
    /// the export in `/status` and its cursor in the spool. Default: the protocol's name.
    pub name: String,
    pub protocol: Protocol,
    pub url: ExportUrl,
    /// Per request; within [`EXPORT_TIMEOUT_RANGE`]. Default 10s.
    pub timeout: Duration,
    /// Cap of the exponential backoff between retries; within [`EXPORT_BACKOFF_RANGE`].
    /// Default 60s.
    pub max_backoff: Duration,
    /// Extra certificate authorities (PEM) for an `https` URL; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Extra request headers (e.g. `X-Scope-OrgID`), names lowercase, in the order written.
    pub headers: Vec<(String, String)>,
    pub auth: Option<Auth>,
    /// `service_name` (Pyroscope) / `service.name` (OTLP) of each profile.
    pub service_name: Template,
}

/// The push protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Grafana Pyroscope's `push.v1.PusherService/Push` (connect, protobuf).
    Pyroscope,
    /// OTLP profiles over HTTP (`/v1development/profiles`, protobuf); experimental, as the
    /// signal is.
    Otlp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pyroscope => "pyroscope",
            Self::Otlp => "otlp",
        }
    }

    /// The path appended to the URL's own.
    pub fn path(self) -> &'static str {
        match self {
            Self::Pyroscope => "/push.v1.PusherService/Push",
            Self::Otlp => "/v1development/profiles",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `http`/`https` URL split for the client: where to connect and what to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportUrl {
    pub tls: bool,
    /// Host name or IP address (IPv6 without brackets): what TLS checks the certificate for.
    pub host: String,
    pub port: u16,
    /// The URL's path without a trailing `/` (empty for the root); the protocol's path is
    /// appended to it.
    pub base_path: String,
    /// As written, for messages and `/status`.
    pub text: String,
}

impl ExportUrl {
    /// `host:port` as the `Host` header writes it.
    pub fn authority(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }
}

/// Credentials sent with every request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    Basic { username: String, password: Secret },
    Bearer(Secret),
}

/// A secret written in the file, or the file that holds it (read when the exporter starts,
/// surrounding whitespace trimmed). Never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Inline(String),
    File(PathBuf),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inline(_) => f.write_str("Secret(<inline>)"),
            Self::File(path) => write!(f, "Secret(file {})", path.display()),
        }
    }
}

/// `service_name`: text with `{field}` placeholders from [`SERVICE_NAME_FIELDS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template(Vec<Piece>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Field(&'static str),
}

impl Template {
    /// Fills the placeholders from `value` (an unknown value is empty).
    pub fn render(&self, value: impl Fn(&str) -> Option<String>) -> String {
        self.0
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.clone(),
                Piece::Field(field) => value(field).unwrap_or_default(),
            })
            .collect()
    }

    fn parse(text: &str, key: &str) -> Result<Self, InvalidValue> {
        let bad = |problem: String| {
            let allowed: Vec<String> = SERVICE_NAME_FIELDS.iter().map(|f| format!("{{{f}}}")).collect();
            InvalidValue::new(key, format!("{problem}; write text with placeholders among {}", allowed.join(", ")))
        };
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(bad(format!("{text:?} has a '}}' without its '{{'")));
            }
            let close = rest[open..].find('}').ok_or_else(|| bad(format!("{text:?} has an unclosed '{{'")))?;
            let name = &rest[open + 1..open + close];
            let field = SERVICE_NAME_FIELDS
                .into_iter()
                .find(|f| *f == name)
                .ok_or_else(|| bad(format!("{{{name}}} in {text:?} is not a placeholder")))?;
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            pieces.push(Piece::Field(field));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        if pieces.is_empty() {
            return Err(bad("the template is empty".into()));
        }
        Ok(Self(pieces))
    }
}

/// Validates every `[[export]]` table; names must be unique.
pub fn exports_from_raw(raw: &[RawExport]) -> Result<Vec<ExportConfig>, InvalidValue> {
    let mut exports: Vec<ExportConfig> = Vec::with_capacity(raw.len());
    for (index, table) in raw.iter().enumerate() {
        let export = export(table, &format!("export[{index}]"))?;
        if let Some(first) = exports.iter().position(|e| e.name == export.name) {
            let problem =
                format!("{:?} is also the name of export[{first}]; give each export its own `name`", export.name);
            return Err(InvalidValue::new(&format!("export[{index}].name"), problem));
        }
        exports.push(export);
    }
    Ok(exports)
}

fn export(raw: &RawExport, key: &str) -> Result<ExportConfig, InvalidValue> {
    let at = |field: &str| format!("{key}.{field}");
    let protocol = match raw.protocol.as_str() {
        "pyroscope" => Protocol::Pyroscope,
        "otlp" => Protocol::Otlp,
        other => {
            return Err(InvalidValue::new(
                &at("protocol"),
                format!("{other:?} is not a protocol; allowed: pyroscope, otlp"),
            ))
        }
    };
    let name = match &raw.name {
        Some(name) => export_name(name, &at("name"))?,
        None => protocol.as_str().to_owned(),
    };
    let url = url(&raw.url, &at("url"))?;
    let ca_file =
        raw.ca_file.as_deref().map(|p| absolute_path(p, &at("ca_file"), "/etc/profiler/ca.pem")).transpose()?;
    if ca_file.is_some() && !url.tls {
        return Err(InvalidValue::new(&at("ca_file"), "only applies to an https url; remove it or use https://"));
    }
    Ok(ExportConfig {
        name,
        protocol,
        timeout: duration_in(&raw.timeout, &at("timeout"), EXPORT_TIMEOUT_RANGE)?,
        max_backoff: duration_in(&raw.max_backoff, &at("max_backoff"), EXPORT_BACKOFF_RANGE)?,
        ca_file,
        headers: headers(&raw.headers, &at("headers"))?,
        auth: auth(raw, key)?,
        service_name: Template::parse(&raw.service_name, &at("service_name"))?,
        url,
    })
}

fn export_name(name: &str, key: &str) -> Result<String, InvalidValue> {
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > EXPORT_NAME_MAX_BYTES || !name.chars().all(plain) {
        let problem = format!(
            "{name:?} is not an export name; write 1 to {EXPORT_NAME_MAX_BYTES} letters, digits, '-' or '_', \
             e.g. \"pyroscope-eu\""
        );
        return Err(InvalidValue::new(key, problem));
    }
    Ok(name.to_owned())
}

fn url(text: &str, key: &str) -> Result<ExportUrl, InvalidValue> {
    let bad = |problem: &str| {
        InvalidValue::new(key, format!("{text:?} {problem}; write e.g. \"https://pyroscope.example.com:4040\""))
    };
    let uri: hyper::Uri = text.parse().map_err(|_| bad("is not a URL"))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad("is not an http:// or https:// URL")),
    };
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("carries credentials; put them in basic_auth instead"));
    }
    if uri.query().is_some() || text.contains('#') {
        return Err(bad("has a query or fragment, which the protocol's path cannot follow"));
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    Ok(ExportUrl {
        tls,
        host,
        port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        base_path: uri.path().trim_end_matches('/').to_owned(),
        text: text.to_owned(),
    })
}

fn headers(raw: &BTreeMap<String, String>, key: &str) -> Result<Vec<(String, String)>, InvalidValue> {
    let mut headers = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let at = format!("{key}.{name}");
        let lower = name.to_ascii_lowercase();
        if hyper::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            return Err(InvalidValue::new(&at, "is not a header name; use letters, digits and '-'"));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            let problem = match lower.as_str() {
                "authorization" => "is set by basic_auth or bearer_token; use those keys".to_owned(),
                _ => "is set by the exporter itself; remove it".to_owned(),
            };
            return Err(InvalidValue::new(&at, problem));
        }
        if hyper::header::HeaderValue::from_str(value).is_err() {
            return Err(InvalidValue::new(&at, "the value must be visible ASCII characters and spaces, one line"));
        }
        headers.push((lower, value.clone()));
    }
    Ok(headers)
}

fn auth(raw: &RawExport, key: &str) -> Result<Option<Auth>, InvalidValue> {
    let bearer = secret(raw.bearer_token.as_deref(), raw.bearer_token_file.as_ref(), key, "bearer_token")?;
    let basic = match &raw.basic_auth {
        Some(RawAuth { username, password, password_file }) => {
            let key = format!("{key}.basic_auth");
            if username.is_empty() || username.contains(':') {
                let problem = "the username must be non-empty and without ':'";
                return Err(InvalidValue::new(&format!("{key}.username"), problem));
            }
            let password = secret(password.as_deref(), password_file.as_ref(), &key, "password")?
                .ok_or_else(|| InvalidValue::new(&key, "set password or password_file"))?;
            Some(Auth::Basic { username: username.clone(), password })
        }
        None => None,
    };
    match (basic, bearer) {
        (Some(_), Some(_)) => {
            Err(InvalidValue::new(&format!("{key}.bearer_token"), "set either basic_auth or a bearer token, not both"))
        }
        (basic, bearer) => Ok(basic.or(bearer.map(Auth::Bearer))),
    }
}

/// `NAME` or `NAME_file`, not both.
fn secret(inline: Option<&str>, file: Option<&PathBuf>, key: &str, name: &str) -> Result<Option<Secret>, InvalidValue> {
    match (inline, file) {
        (Some(_), Some(_)) => {
            Err(InvalidValue::new(&format!("{key}.{name}_file"), format!("set either {name} or {name}_file, not both")))
        }
        (Some(text), None) if text.is_empty() || text.contains(['\r', '\n']) => {
            Err(InvalidValue::new(&format!("{key}.{name}"), "must be one non-empty line"))
        }
        (Some(text), None) => Ok(Some(Secret::Inline(text.to_owned()))),
        (None, Some(path)) => {
            Ok(Some(Secret::File(absolute_path(path, &format!("{key}.{name}_file"), "/etc/profiler/token")?)))
        }
        (None, None) => Ok(None),
    }
}
