//! The only module that touches the prost types of `profile.proto`: a builder that keeps the
//! string table, ids and dedup rules right, the encoder of resolved profiles, gzip
//! encode/decode, Go's legacy text form (`debug=1`) of resolved profiles, and any profile's
//! stacks folded for flame graphs.
//!
//! pprof's rules kept here: `string_table[0]` is `""`; every id is nonzero and unique within
//! its table; a sample's `location_id`s are leaf first; every `Location.mapping_id` names a
//! mapping; the file on disk is gzip-compressed.

mod builder;
mod encode;
mod fold;
#[allow(clippy::all, missing_docs)]
pub mod proto;
mod text;

use std::{
    io::{Read, Write},
    path::Path,
};

pub use builder::{FunctionKey, MappingSpec, ProfileBuilder};
pub use encode::{encode, Encoded, ProfileMeta, Shape};
use flate2::{read::GzDecoder, write::GzEncoder, Compression};
pub use fold::{fold, FoldError, Folded};
use prost::Message;
pub use text::{go_text, TextFormat};

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
}
