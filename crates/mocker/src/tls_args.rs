//! vLLM's TLS flags of `serve` (`--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`,
//! `--ssl-cert-reqs`), checked for combinations before anything starts; the files are read
//! and checked when the servers bind.

use std::path::PathBuf;

use clap::Args;
use mocker_server::tls::{ClientCerts, TlsOptions};

use crate::UsageError;

/// TLS flags (names and meanings as `vllm serve` has them).
#[derive(Debug, Args)]
pub struct TlsFlags {
    /// PEM private key of --ssl-certfile's certificate (PKCS#8, PKCS#1 or SEC1). Needs
    /// --ssl-certfile.
    #[arg(long, value_name = "PATH")]
    pub ssl_keyfile: Option<PathBuf>,
    /// PEM certificate chain, leaf first (it may also hold the key): every port of this
    /// command then speaks HTTPS only (TLS 1.2/1.3, ALPN http/1.1), the P/D front's and
    /// workers' own calls included.
    #[arg(long, value_name = "PATH")]
    pub ssl_certfile: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to (see --ssl-cert-reqs); a
    /// P/D deployment's calls between its servers trust them too. Needs --ssl-certfile.
    #[arg(long, value_name = "PATH")]
    pub ssl_ca_certs: Option<PathBuf>,
    /// Whether clients must present a certificate, numbered as Python's ssl module: 0
    /// (CERT_NONE, the default), 1 (CERT_OPTIONAL: asked for, checked if given), 2
    /// (CERT_REQUIRED). 1 and 2 need --ssl-ca-certs. Needs --ssl-certfile.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub ssl_cert_reqs: Option<i64>,
}

impl TlsFlags {
    /// The servers' TLS options, or `None` without `--ssl-certfile`.
    pub fn options(&self) -> Result<Option<TlsOptions>, UsageError> {
        let Some(certfile) = self.ssl_certfile.clone() else {
            let given = [
                (self.ssl_keyfile.is_some(), "--ssl-keyfile"),
                (self.ssl_ca_certs.is_some(), "--ssl-ca-certs"),
                (self.ssl_cert_reqs.is_some(), "--ssl-cert-reqs"),
            ];
            return match given.iter().find(|(g, _)| *g) {
                Some((_, flag)) => Err(UsageError(format!(
                    "{flag}: TLS is off; it needs --ssl-certfile (the server's PEM certificate)"
                ))),
                None => Ok(None),
            };
        };
        let cert_reqs = match self.ssl_cert_reqs {
            None => ClientCerts::None,
            Some(n) => ClientCerts::from_number(n).ok_or_else(|| {
                UsageError(format!(
                    "--ssl-cert-reqs: must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED), got {n}"
                ))
            })?,
        };
        if cert_reqs != ClientCerts::None && self.ssl_ca_certs.is_none() {
            return Err(UsageError(format!(
                "--ssl-cert-reqs: {} asks clients for certificates, which needs --ssl-ca-certs (the CA \
                 they must chain to)",
                self.ssl_cert_reqs.unwrap_or(0)
            )));
        }
        Ok(Some(TlsOptions {
            certfile,
            keyfile: self.ssl_keyfile.clone(),
            ca_certs: self.ssl_ca_certs.clone(),
            cert_reqs,
        }))
    }
}
