//! Grafana Pyroscope's `push.v1.PushRequest`: one series per profile, its labels and the
//! gzip'd pprof as `raw_profile`, exactly the bytes of the file. Only the envelope is built
//! here; which labels and which files are the exporter's choice.

use prost::Message;

use super::push_proto::{
    push::v1::{PushRequest, RawProfileSeries, RawSample},
    types::v1::LabelPair,
};

/// One profile to push.
#[derive(Clone, Debug)]
pub struct Series<'a> {
    /// Label names and values, in any order (Pyroscope sorts them).
    pub labels: Vec<(String, String)>,
    /// The gzip'd pprof, as written to disk.
    pub raw_profile: &'a [u8],
    /// The profile's UUID, stable for a file, so a profile sent twice is the same profile.
    pub id: String,
}

/// The serialized `PushRequest` of `series`.
pub fn push_request(series: &[Series<'_>]) -> Vec<u8> {
    let request = PushRequest {
        series: series
            .iter()
            .map(|s| RawProfileSeries {
                labels: s
                    .labels
                    .iter()
                    .map(|(name, value)| LabelPair { name: name.clone(), value: value.clone() })
                    .collect(),
                samples: vec![RawSample { raw_profile: s.raw_profile.to_vec(), id: s.id.clone() }],
                annotations: Vec::new(),
            })
            .collect(),
    };
    request.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keep_their_labels_bytes_and_ids() {
        let series = [
            Series {
                labels: vec![("__name__".into(), "process_cpu".into())],
                raw_profile: b"\x1f\x8bone",
                id: "a".into(),
            },
            Series { labels: vec![("service_name".into(), "app".into())], raw_profile: b"two", id: "b".into() },
        ];
        let decoded = PushRequest::decode(&push_request(&series)[..]).unwrap();
        assert_eq!(decoded.series.len(), 2);
        assert_eq!(decoded.series[0].labels[0].name, "__name__");
        assert_eq!(decoded.series[0].samples[0].raw_profile, b"\x1f\x8bone");
        assert_eq!(
            (decoded.series[1].samples[0].id.as_str(), decoded.series[1].labels[0].value.as_str()),
            ("b", "app")
        );
    }
}
