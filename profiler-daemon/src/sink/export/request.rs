//! What a batch of spooled profiles looks like on the wire for each protocol: the labels
//! (Pyroscope) or resource attributes (OTLP) made from a spool entry, the body, its content
//! type, and the limits Pyroscope enforces, kept here so that a profile it would refuse is
//! never sent.

use crate::{
    config::{ExportConfig, Protocol},
    pprof::{self, otlp::Attr, push::Series},
    sink::spool::Entry,
};

/// Pyroscope's defaults (`pkg/validation/limits.go`): at most 30 label names per series,
/// label values of at most 2048 bytes, profiles of at most 4 MiB uncompressed; the ingestion
/// rate limiter's burst (2 MB of uncompressed profiles) bounds what one request may carry.
pub const PYROSCOPE_MAX_LABELS: usize = 30;
pub const PYROSCOPE_MAX_LABEL_VALUE_BYTES: usize = 2048;
pub const PYROSCOPE_MAX_PROFILE_BYTES: u64 = 4 << 20;
/// Uncompressed profile bytes one request carries at most (a single larger profile, up to
/// [`PYROSCOPE_MAX_PROFILE_BYTES`], goes alone).
pub const MAX_REQUEST_PROFILE_BYTES: u64 = 2_000_000;
/// Profiles one request carries at most.
pub const MAX_REQUEST_PROFILES: usize = 64;

/// A spooled profile, read back for sending.
#[derive(Clone, Debug)]
pub struct Spooled {
    pub entry: Entry,
    /// The file's bytes: the gzip'd pprof.
    pub bytes: Vec<u8>,
}

impl Spooled {
    /// The uncompressed size, from gzip's trailer (ISIZE, the size modulo 2^32: profiles are
    /// far smaller than 4 GiB).
    pub fn uncompressed_bytes(&self) -> u64 {
        match self.bytes.len() {
            n if n >= 18 && self.bytes.starts_with(&[0x1f, 0x8b]) => {
                u64::from(u32::from_le_bytes(self.bytes[n - 4..].try_into().expect("4 bytes")))
            }
            n => n as u64,
        }
    }
}

/// The facts every profile of this host shares.
#[derive(Clone, Debug)]
pub struct Host {
    pub hostname: String,
}

/// An encoded request.
pub struct Body {
    pub bytes: Vec<u8>,
    pub content_type: &'static str,
}

/// Why a profile is not sent at all (counted as failed).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(
        "{path} is {bytes} bytes uncompressed, over the {PYROSCOPE_MAX_PROFILE_BYTES} bytes Pyroscope accepts \
         (validation.max-profile-size-bytes); not sent"
    )]
    TooLarge { path: String, bytes: u64 },
    #[error("failed to read {path} from the spool; not sent")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a profile the exporter can read; not sent")]
    Unreadable {
        path: String,
        #[source]
        source: pprof::DecodeError,
    },
}

/// Checks what the backend would refuse, before anything is sent.
pub fn check(protocol: Protocol, profile: &Spooled) -> Result<(), Refused> {
    let bytes = profile.uncompressed_bytes();
    match protocol {
        Protocol::Pyroscope if bytes > PYROSCOPE_MAX_PROFILE_BYTES => {
            Err(Refused::TooLarge { path: profile.entry.path.clone(), bytes })
        }
        _ => Ok(()),
    }
}

/// The request carrying `profiles`. A profile OTLP cannot read is left out and returned.
pub fn encode(config: &ExportConfig, host: &Host, profiles: &[Spooled]) -> (Body, Vec<Refused>) {
    match config.protocol {
        Protocol::Pyroscope => {
            let series: Vec<Series<'_>> = profiles
                .iter()
                .map(|p| Series {
                    labels: pyroscope_labels(config, host, &p.entry),
                    raw_profile: &p.bytes,
                    id: profile_id(host, &p.entry),
                })
                .collect();
            (Body { bytes: pprof::push::push_request(&series), content_type: "application/proto" }, Vec::new())
        }
        Protocol::Otlp => {
            let mut request = pprof::otlp::RequestBuilder::new();
            let mut refused = Vec::new();
            for p in profiles {
                match pprof::decode(&p.bytes, &p.entry.path) {
                    Ok(profile) => request.add(&resource(config, host, &p.entry), &profile),
                    Err(source) => refused.push(Refused::Unreadable { path: p.entry.path.clone(), source }),
                }
            }
            (Body { bytes: request.encode(), content_type: "application/x-protobuf" }, refused)
        }
    }
}

/// `__name__` as Pyroscope names each profile type (its Go SDK's names where there is one).
pub fn pyroscope_name(kind: &str) -> &str {
    match kind {
        "cpu" => "process_cpu",
        "heap" => "memory",
        // A thread dump, `goroutine/count` as Go's goroutine profile.
        "threads" => "goroutine",
        other => other,
    }
}

/// The series labels of one profile, sorted by name, within Pyroscope's limits.
pub fn pyroscope_labels(config: &ExportConfig, host: &Host, entry: &Entry) -> Vec<(String, String)> {
    let mut labels = vec![
        ("__name__", pyroscope_name(&entry.kind).to_owned()),
        ("service_name", service_name(config, host, entry)),
        ("hostname", host.hostname.clone()),
        ("pid", entry.pid.to_string()),
        ("process_name", entry.name.clone()),
        // Every value is the interval's own (allocations included), not a running total:
        // Pyroscope must not subtract the previous profile from it.
        ("__delta__", "false".to_owned()),
    ];
    if let Some(unit) = &entry.unit {
        labels.push(("systemd_unit", unit.clone()));
    }
    if let Some(container) = &entry.container {
        labels.push(("container_id", container.clone()));
    }
    debug_assert!(labels.len() <= PYROSCOPE_MAX_LABELS);
    let mut labels: Vec<(String, String)> = labels
        .into_iter()
        .map(|(name, value)| (name.to_owned(), truncate(value, PYROSCOPE_MAX_LABEL_VALUE_BYTES)))
        .collect();
    labels.sort();
    labels
}

/// The OTLP resource of one profile (semantic-convention attribute names).
pub fn resource(config: &ExportConfig, host: &Host, entry: &Entry) -> Vec<(&'static str, Attr)> {
    let executable = entry.exe.as_deref().and_then(|exe| exe.rsplit('/').next()).unwrap_or(&entry.name);
    let mut attributes = vec![
        ("service.name", Attr::Str(service_name(config, host, entry))),
        ("host.name", Attr::Str(host.hostname.clone())),
        ("process.pid", Attr::Int(i64::from(entry.pid))),
        ("process.executable.name", Attr::Str(executable.to_owned())),
    ];
    if let Some(exe) = &entry.exe {
        attributes.push(("process.executable.path", Attr::Str(exe.clone())));
    }
    if let Some(container) = &entry.container {
        attributes.push(("container.id", Attr::Str(container.clone())));
    }
    attributes
}

/// The config's template filled in; an empty result falls back to the process name.
pub fn service_name(config: &ExportConfig, host: &Host, entry: &Entry) -> String {
    let rendered = config.service_name.render(|field| match field {
        "service" => Some(default_service(entry)),
        "unit" => entry.unit.clone(),
        "container" => entry.container.clone(),
        "name" => Some(entry.name.clone()),
        "exe" => entry.exe.clone(),
        "hostname" => Some(host.hostname.clone()),
        _ => None,
    });
    if rendered.is_empty() {
        entry.name.clone()
    } else {
        rendered
    }
}

/// The container (its short id, as `docker ps` shows it), else the systemd service (without
/// `.service`), else the process name. A `.scope` is not a service: a login session's or a
/// container runtime's scope says nothing about what runs in it.
fn default_service(entry: &Entry) -> String {
    if let Some(container) = &entry.container {
        return container.chars().take(12).collect();
    }
    match entry.unit.as_deref().and_then(|unit| unit.strip_suffix(".service")) {
        Some(service) => service.to_owned(),
        None => entry.name.clone(),
    }
}

/// A UUID made from the host and the file's path (which holds the process, the type and the
/// time), so that a profile sent again after a restart carries the same id.
pub fn profile_id(host: &Host, entry: &Entry) -> String {
    let mut hash: u128 = 0x6c62272e07bb014262b821756295c58d; // FNV-1a 128 offset basis
    for byte in host.hostname.bytes().chain([0]).chain(entry.path.bytes()) {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(0x0000000001000000000000000000013B);
    }
    // Version 8 (custom), RFC 4122 variant.
    let hash = (hash & !(0xf << 76) | 0x8 << 76) & !(0x3 << 62) | 0x2 << 62;
    let hex = format!("{hash:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

fn truncate(mut value: String, max: usize) -> String {
    if value.len() > max {
        let mut end = max;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn export(service_name: &str) -> ExportConfig {
        let text = format!("[[export]]\nprotocol = \"pyroscope\"\nurl = \"http://h\"\nservice_name = {service_name:?}");
        Config::parse(&text, std::path::Path::new("t")).unwrap().exports.remove(0)
    }

    fn entry() -> Entry {
        Entry {
            path: "nginx-42/heap-20261201T000000Z.pb.gz".into(),
            kind: "heap".into(),
            pid: 42,
            name: "nginx".into(),
            exe: Some("/usr/sbin/nginx".into()),
            unit: Some("nginx.service".into()),
            container: None,
        }
    }

    #[test]
    fn labels_name_the_type_the_service_and_the_process() {
        let host = Host { hostname: "web-1".into() };
        let labels = pyroscope_labels(&export("{service}"), &host, &entry());
        let get = |name: &str| labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("__name__"), Some("memory"));
        assert_eq!(get("service_name"), Some("nginx"));
        assert_eq!((get("hostname"), get("pid"), get("__delta__")), (Some("web-1"), Some("42"), Some("false")));
        assert_eq!(get("systemd_unit"), Some("nginx.service"));
        assert!(labels.windows(2).all(|w| w[0].0 < w[1].0), "sorted, no duplicates: {labels:?}");
        let templated = pyroscope_labels(&export("{hostname}-{name}{container}"), &host, &entry());
        assert!(templated.contains(&("service_name".into(), "web-1-nginx".into())));
        let empty = Entry { unit: None, ..entry() };
        assert_eq!(service_name(&export("{unit}"), &host, &empty), "nginx", "an empty result falls back to the name");
        let contained = Entry { container: Some("0123456789ab".repeat(5) + "cdef"), ..entry() };
        assert_eq!(service_name(&export("{service}"), &host, &contained), "0123456789ab");
    }

    #[test]
    fn long_values_are_cut_at_the_limit_on_a_char_boundary() {
        let host = Host { hostname: "é".repeat(1500) };
        let labels = pyroscope_labels(&export("{service}"), &host, &entry());
        let hostname = &labels.iter().find(|(n, _)| n == "hostname").unwrap().1;
        assert_eq!(hostname.len(), 2048);
    }

    #[test]
    fn profile_ids_are_stable_uuids() {
        let host = Host { hostname: "h".into() };
        let (a, b) = (profile_id(&host, &entry()), profile_id(&host, &Entry { path: "x".into(), ..entry() }));
        assert_eq!(a, profile_id(&host, &entry()));
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "8", "version 8: {a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "RFC 4122 variant: {a}");
    }

    #[test]
    fn oversized_profiles_are_refused_before_sending() {
        let mut gz = vec![0x1f, 0x8b];
        gz.extend([0; 12]);
        gz.extend((5u32 << 20).to_le_bytes());
        let big = Spooled { entry: entry(), bytes: gz };
        assert_eq!(big.uncompressed_bytes(), 5 << 20);
        assert!(check(Protocol::Pyroscope, &big).unwrap_err().to_string().contains("max-profile-size-bytes"));
        assert!(check(Protocol::Otlp, &big).is_ok());
    }
}
