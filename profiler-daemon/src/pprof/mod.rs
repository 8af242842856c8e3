//! The only module that touches protobuf types: those of `profile.proto` (a builder that
//! keeps the string table, ids and dedup rules right, the encoder of resolved profiles, gzip
//! encode/decode, Go's legacy text forms (`debug=1`, and the thread dump's `debug=2`) of
//! resolved profiles, and any profile's stacks folded for flame graphs), and the exporters'
//! wire formats: Pyroscope's `push.v1.PushRequest` (`push`) and OTLP profiles translated
//! from pprof (`otlp`).
//!
//! pprof's rules kept here: `string_table[0]` is `""`; every id is nonzero and unique within
//! its table; a sample's `location_id`s are leaf first; every `Location.mapping_id` names a
//! mapping; the file on disk is gzip-compressed.

mod builder;
mod encode;
mod fold;
mod goroutine_text;
pub mod otlp;
// Generated: the messages this crate does not build are kept, as the protos have them.
#[allow(clippy::all, missing_docs, dead_code)]
mod otlp_proto;
#[allow(clippy::all, missing_docs)]
pub mod proto;
pub mod push;
#[allow(clippy::all, missing_docs, dead_code)]
mod push_proto;
mod text;
mod thread_text;

use std::{
    io::{Read, Write},
    path::Path,
};

pub use builder::{FunctionKey, MappingSpec, ProfileBuilder};
pub use encode::{encode, Encoded, ProfileMeta, Shape};
use flate2::{read::GzDecoder, write::GzEncoder, Compression};
pub use fold::{fold, FoldError, Folded};
use prost::Message;
pub use text::TextFormat;

use crate::resolve::ResolvedProfile;

/// `resolved` in Go's text layout `format`.
pub fn go_text(resolved: &ResolvedProfile, format: TextFormat) -> String {
    let mut out = String::new();
    match format {
        TextFormat::Heap { rate } => text::heap(resolved, rate, &mut out),
        TextFormat::Contention { mutex_period } => text::contention(resolved, mutex_period, &mut out),
        // A Go process's dump is of its goroutines: Go's own layouts.
        TextFormat::Count { name: "threads" } if goroutine_text::is_goroutines(resolved) => {
            goroutine_text::grouped(resolved, &mut out)
        }
        TextFormat::Threads if goroutine_text::is_goroutines(resolved) => goroutine_text::each(resolved, &mut out),
        TextFormat::Count { name } => text::count(resolved, name, &mut out),
        TextFormat::Threads => thread_text::per_thread(resolved, &mut out),
        TextFormat::Generic { name, sample_types } => text::generic(resolved, name, sample_types, &mut out),
    }
    out
}

/// Serializes and gzips a profile, the form `go tool pprof` reads.
pub fn encode_gzip(profile: &proto::Profile) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    // Writing into a Vec cannot fail.
    gz.write_all(&profile.encode_to_vec()).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

/// Why a file could not be read back as a profile.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("failed to read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid profile.proto message")]
    Proto {
        path: String,
        #[source]
        source: prost::DecodeError,
    },
}

/// Decodes a (possibly gzipped) serialized profile.
pub fn decode(bytes: &[u8], what: &str) -> Result<proto::Profile, DecodeError> {
    let mut raw = Vec::new();
    let data = if bytes.starts_with(&[0x1f, 0x8b]) {
        GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(|source| DecodeError::Io { path: what.to_string(), source })?;
        &raw[..]
    } else {
        bytes
    };
    proto::Profile::decode(data).map_err(|source| DecodeError::Proto { path: what.to_string(), source })
}

/// Reads and decodes a profile file.
pub fn decode_file(path: &Path) -> Result<proto::Profile, DecodeError> {
    let what = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| DecodeError::Io { path: what.clone(), source })?;
    decode(&bytes, &what)
}

#[cfg(test)]
mod tests {
    /// The generated code names the hash of the `.proto` it came from: a changed `.proto`
    /// without regenerated code fails here.
    #[test]
    fn the_generated_code_matches_its_proto() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let generated = std::fs::read_to_string(format!("{dir}/src/pprof/proto.rs")).unwrap();
        let named = generated.lines().find_map(|l| l.strip_prefix("// source sha256: ")).expect("a hash line");
        let out = std::process::Command::new("sha256sum").arg(format!("{dir}/proto/profile.proto")).output().unwrap();
        let actual = String::from_utf8(out.stdout).unwrap();
        assert_eq!(actual.split_whitespace().next(), Some(named), "proto.rs is stale: regenerate it");
    }

    /// The same for the exporters' protos: every source the generated file names, by hash.
    #[test]
    fn the_generated_wire_formats_match_their_protos() {
        let dir = env!("CARGO_MANIFEST_DIR");
        for generated in ["push_proto.rs", "otlp_proto.rs"] {
            let text = std::fs::read_to_string(format!("{dir}/src/pprof/{generated}")).unwrap();
            let sources: Vec<(&str, &str)> = text
                .lines()
                .filter_map(|l| l.strip_prefix("// source sha256: "))
                .filter_map(|l| l.split_once(' '))
                .collect();
            assert!(sources.len() >= 2, "{generated} names its sources");
            for (hash, source) in sources {
                let path = format!("{dir}/../{source}");
                let out = std::process::Command::new("sha256sum").arg(&path).output().unwrap();
                let actual = String::from_utf8(out.stdout).unwrap();
                assert_eq!(
                    actual.split_whitespace().next(),
                    Some(hash),
                    "{generated} is stale for {source}: regenerate it"
                );
            }
        }
    }
}
