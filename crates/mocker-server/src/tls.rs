//! TLS as vLLM's server offers it (uvicorn's `ssl_*` settings): a certificate and key, and
//! optionally client certificates checked against a CA (`--ssl-cert-reqs`, Python's
//! `ssl.VerifyMode` numbers). Loaded and checked once, at bind time, so a bad file stops
//! the server before it serves.
//!
//! The same material makes the client side of a TLS deployment's own calls (the P/D side
//! channel, the P/D front's calls to its workers): it trusts `--ssl-ca-certs`, the CA
//! certificates of `--ssl-certfile`'s chain, and the server's own certificate itself (so a
//! self-signed one works), and presents the server's certificate when a peer asks for a
//! client certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::TlsAcceptor;

/// Whether clients must present a certificate (`--ssl-cert-reqs`, numbered as Python's
/// `ssl.CERT_NONE`, `CERT_OPTIONAL`, `CERT_REQUIRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientCerts {
    /// 0: no client certificate is asked for.
    #[default]
    None,
    /// 1: asked for; one that is presented must chain to `--ssl-ca-certs`.
    Optional,
    /// 2: required, and it must chain to `--ssl-ca-certs`.
    Required,
}

impl ClientCerts {
    /// The mode for `--ssl-cert-reqs N`.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            0 => Some(Self::None),
            1 => Some(Self::Optional),
            2 => Some(Self::Required),
            _ => None,
        }
    }
}

/// The TLS flags of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM certificate chain, leaf first (`--ssl-certfile`); may hold the key too.
    pub certfile: PathBuf,
    /// PEM private key (`--ssl-keyfile`); `None`: the key is in `certfile`.
    pub keyfile: Option<PathBuf>,
    /// PEM CA certificates client certificates must chain to (`--ssl-ca-certs`).
    pub ca_certs: Option<PathBuf>,
    /// Whether client certificates are asked for (`--ssl-cert-reqs`).
    pub cert_reqs: ClientCerts,
}

/// Loaded TLS material: the acceptor for connections in and the client config for the
/// deployment's own calls out.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// *ring*'s provider: it builds with a C compiler alone (aws-lc-rs wants more tools). rustls
/// deprecates it for lacking post-quantum key exchange, which a simulator's TLS can forgo.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag}: cannot read {}: {e}", path.display()))
}

fn certificates(flag: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag}: {} is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{flag}: {} holds no PEM certificate (BEGIN CERTIFICATE)", path.display()));
    }
    Ok(certs)
}

impl Tls {
    /// Reads and checks the files; `alpn` is what the server offers, in preference order.
    /// Every error names the flag whose file is at fault.
    pub fn load(options: &TlsOptions, alpn: &[&[u8]]) -> Result<Self, String> {
        let provider = provider();
        let cert_pem = read("--ssl-certfile", &options.certfile)?;
        let chain = certificates("--ssl-certfile", &options.certfile, &cert_pem)?;
        let (key_flag, key_path, key_pem) = match &options.keyfile {
            Some(path) => ("--ssl-keyfile", path.as_path(), read("--ssl-keyfile", path)?),
            None => ("--ssl-certfile", options.certfile.as_path(), cert_pem.clone()),
        };
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match (e, &options.keyfile) {
            (rustls_pki_types::pem::Error::NoItemsFound, None) => format!(
                "--ssl-certfile: {} holds no private key; give it with --ssl-keyfile",
                key_path.display()
            ),
            (rustls_pki_types::pem::Error::NoItemsFound, Some(_)) => format!(
                "{key_flag}: {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1; an encrypted key is not \
                 supported)",
                key_path.display()
            ),
            (e, _) => format!("{key_flag}: {} is not valid PEM: {e}", key_path.display()),
        })?;
        let mut roots = RootCertStore::empty();
        let client_roots = match &options.ca_certs {
            Some(path) => {
                let pem = read("--ssl-ca-certs", path)?;
                let mut store = RootCertStore::empty();
                for cert in certificates("--ssl-ca-certs", path, &pem)? {
                    store.add(cert.clone()).map_err(|e| {
                        format!(
                            "--ssl-ca-certs: {} holds a certificate that cannot be a CA: {e}",
                            path.display()
                        )
                    })?;
                    let _ = roots.add(cert);
                }
                Some(Arc::new(store))
            }
            None => None,
        };
        let verifier = match (options.cert_reqs, client_roots) {
            (ClientCerts::None, _) => WebPkiClientVerifier::no_client_auth(),
            (_, None) => {
                return Err("--ssl-cert-reqs: asking for client certificates needs --ssl-ca-certs".into())
            }
            (mode, Some(store)) => {
                let builder = WebPkiClientVerifier::builder_with_provider(store, provider.clone());
                let builder =
                    if mode == ClientCerts::Optional { builder.allow_unauthenticated() } else { builder };
                builder.build().map_err(|e| format!("--ssl-ca-certs: {e}"))?
            }
        };
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => format!(
                    "{key_flag}: the private key in {} does not match the certificate in --ssl-certfile {}",
                    key_path.display(),
                    options.certfile.display()
                ),
                e => format!("{key_flag}: {}: {e}", key_path.display()),
            })?;
        server.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // The deployment's own calls trust its CA and its own certificates: workers of one
        // process share one certificate, which may be self-signed.
        for cert in &chain {
            let _ = roots.add(cert.clone());
        }
        let verifier = OwnOrRoots {
            own: chain[0].clone(),
            roots: WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .ok(),
            provider: provider.clone(),
        };
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("{key_flag}: {}: {e}", key_path.display()))?;
        // reqwest speaks HTTP/1.1 here.
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self { acceptor: TlsAcceptor::from(Arc::new(server)), client: Arc::new(client) })
    }

    /// The acceptor that wraps each accepted connection.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// `builder` speaking TLS as a client of this deployment (see the module docs).
    pub fn client(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        builder.use_preconfigured_tls((*self.client).clone())
    }
}

/// How the deployment's own calls check a server: the server's own certificate, byte for
/// byte (the peer proves it holds its key in the handshake), else a chain to the roots.
#[derive(Debug)]
struct OwnOrRoots {
    own: CertificateDer<'static>,
    /// `None` when there are no roots (a self-signed certificate, no `--ssl-ca-certs`).
    roots: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for OwnOrRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.own.as_ref() {
            return Ok(ServerCertVerified::assertion());
        }
        match &self.roots {
            Some(roots) => roots.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
            None => Err(CertificateError::UnknownIssuer.into()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// `http` or `https`: the scheme of URLs to a server with or without TLS.
pub fn scheme(tls: Option<&Tls>) -> &'static str {
    if tls.is_some() {
        "https"
    } else {
        "http"
    }
}

/// An HTTP client for the deployment's own calls, with its TLS when it has some.
pub fn http_client(tls: Option<&Tls>, builder: reqwest::ClientBuilder) -> reqwest::Client {
    let builder = match tls {
        Some(tls) => tls.client(builder),
        None => builder,
    };
    builder.build().expect("an HTTP client from loaded TLS material builds")
}
