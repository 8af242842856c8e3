//! An export's HTTP/1.1 client: one connection to its backend, kept alive between pushes and
//! opened again when the server closed it or an exchange failed. An export sends one request at
//! a time (in order), so a pool would buy nothing. TLS is rustls with the `ring` provider,
//! verified against the system's roots or the export's `ca_file` ([`tls_config`]).
//!
//! Every exchange (connecting, TLS, the request and the whole answer) is bounded by the
//! export's `timeout`; an answer's body is read up to [`MAX_ANSWER_BYTES`].

use std::{io, path::Path, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    body::Bytes,
    client::conn::http1::{self, SendRequest},
    header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST, RETRY_AFTER, USER_AGENT},
    Method, Request,
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::{
    rustls::{self, pki_types::ServerName, RootCertStore},
    TlsConnector,
};

use crate::config::ExportUrl;

/// An error answer is kept for the log and `/status`; no backend's answer to a push is
/// longer than this.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// What the server answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// `Retry-After` in seconds, when the server sent one.
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

/// Why an exchange did not produce an answer. All of these are worth a retry.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("failed to connect to {authority}")]
    Connect {
        authority: String,
        #[source]
        source: io::Error,
    },
    #[error("TLS handshake with {authority} failed")]
    Tls {
        authority: String,
        #[source]
        source: io::Error,
    },
    #[error("HTTP exchange with {authority} failed")]
    Http {
        authority: String,
        #[source]
        source: hyper::Error,
    },
    #[error("reading the answer of {authority} failed")]
    Body {
        authority: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("no answer from {authority} within {timeout:?}")]
    Timeout { authority: String, timeout: Duration },
}

/// Why the TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("failed to read the CA certificates in {path}; it must hold PEM certificates")]
    CaFile {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no usable CA certificate")]
    NoCertificate { path: String },
    #[error("no system CA certificates found; install the ca-certificates package or set ca_file")]
    NoSystemRoots,
    #[error("failed to set up TLS")]
    Rustls(#[source] rustls::Error),
}

/// The client configuration for `https` URLs: the certificates in `ca_file`, else the
/// system's roots (as OpenSSL finds them, e.g. `/etc/ssl/certs`).
pub fn tls_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let name = || path.display().to_string();
            for cert in
                CertificateDer::pem_file_iter(path).map_err(|source| TlsError::CaFile { path: name(), source })?
            {
                let cert = cert.map_err(|source| TlsError::CaFile { path: name(), source })?;
                // A certificate rustls cannot use is skipped; none at all is an error below.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(TlsError::NoCertificate { path: name() });
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(TlsError::NoSystemRoots);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One backend's connection.
pub struct Client {
    url: ExportUrl,
    tls: Option<TlsConnector>,
    timeout: Duration,
    connection: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    /// `tls` is required for an `https` URL.
    pub fn new(url: &ExportUrl, tls: Option<Arc<rustls::ClientConfig>>, timeout: Duration) -> Self {
        Self { url: url.clone(), tls: tls.map(TlsConnector::from), timeout, connection: None }
    }

    /// POSTs `body` to the URL's path followed by `path`, with `headers`.
    pub async fn post(
        &mut self,
        path: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Vec<u8>,
    ) -> Result<Answer, ExchangeError> {
        let result = match tokio::time::timeout(self.timeout, self.exchange(path, headers, body)).await {
            Ok(result) => result,
            Err(_) => Err(ExchangeError::Timeout { authority: self.url.authority(), timeout: self.timeout }),
        };
        if result.is_err() {
            // Half a request or half an answer may be on the wire: start afresh.
            self.connection = None;
        }
        result
    }

    async fn exchange(
        &mut self,
        path: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Vec<u8>,
    ) -> Result<Answer, ExchangeError> {
        let authority = self.url.authority();
        let uri = format!("{}{path}", self.url.base_path);
        let mut request = Request::builder().method(Method::POST).uri(uri);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .header(HOST, &authority)
            .header(USER_AGENT, concat!("profiler/", env!("CARGO_PKG_VERSION")))
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(Bytes::from(body)))
            .expect("the headers were validated with the config");
        let sender = self.connection().await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| ExchangeError::Http { authority: authority.clone(), source })?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let _ = response.headers().get(CONTENT_TYPE);
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|source| ExchangeError::Body { authority, source })?
            .to_bytes();
        Ok(Answer { status, retry_after, body })
    }

    /// The open connection, or a new one.
    async fn connection(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, ExchangeError> {
        if let Some(sender) = &self.connection {
            if sender.is_closed() {
                self.connection = None;
            }
        }
        if self.connection.is_none() {
            self.connection = Some(self.connect().await?);
        }
        let sender = self.connection.as_mut().expect("just connected");
        // A kept-alive connection the server is closing right now fails the send; the retry
        // then connects again.
        let authority = self.url.authority();
        sender.ready().await.map_err(|source| ExchangeError::Http { authority, source })?;
        Ok(sender)
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, ExchangeError> {
        let authority = self.url.authority();
        let tcp = TcpStream::connect((self.url.host.as_str(), self.url.port))
            .await
            .map_err(|source| ExchangeError::Connect { authority: authority.clone(), source })?;
        let _ = tcp.set_nodelay(true);
        let http = |source| ExchangeError::Http { authority: authority.clone(), source };
        match &self.tls {
            Some(tls) => {
                let tls_err = |source| ExchangeError::Tls { authority: authority.clone(), source };
                let name = ServerName::try_from(self.url.host.clone())
                    .map_err(|err| tls_err(io::Error::new(io::ErrorKind::InvalidInput, err)))?;
                let stream = tls.connect(name, tcp).await.map_err(tls_err)?;
                let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.map_err(http)?;
                tokio::spawn(connection);
                Ok(sender)
            }
            None => {
                let (sender, connection) = http1::handshake(TokioIo::new(tcp)).await.map_err(http)?;
                tokio::spawn(connection);
                Ok(sender)
            }
        }
    }
}
