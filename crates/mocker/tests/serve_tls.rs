//! `mocker serve` over TLS with vLLM's flags (`--ssl-certfile`, `--ssl-keyfile`,
//! `--ssl-ca-certs`, `--ssl-cert-reqs`): the real binary on 127.0.0.1 with a CA and
//! certificates made afresh by rcgen, the openai SDK on an httpx client that trusts the CA
//! (tests/python/serve_tls.py).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{repo_root, run_script, KEY};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// PEM files of one test: a CA, a server certificate for 127.0.0.1 and localhost signed by
/// it (usable as a client certificate too), a client certificate signed by it, a
/// self-signed certificate for 127.0.0.1, and a stray key.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("serve_tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name.push(DnType::CommonName, "mocker test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.extended_key_usages = usages;
            params.distinguished_name.push(DnType::CommonName, "mocker test");
            (params.signed_by(&key, &issuer).unwrap().pem(), key.serialize_pem())
        };
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let (server, server_key) =
            leaf(vec!["127.0.0.1".into(), "localhost".into()], vec![ServerAuth, ClientAuth]);
        let (client, client_key) = leaf(vec!["client".into()], vec![ClientAuth]);
        let write = |file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
        write("ca.pem", &ca_cert.pem());
        write("server.pem", &server);
        write("server.key", &server_key);
        // Leaf then CA: trusted by the deployment's own calls without --ssl-ca-certs.
        write("fullchain.pem", &format!("{server}{}", ca_cert.pem()));
        write("combined.pem", &format!("{server}{server_key}"));
        write("client.pem", &client);
        write("client.key", &client_key);
        write("other.key", &KeyPair::generate().unwrap().serialize_pem());
        let self_key = KeyPair::generate().unwrap();
        let mut own = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        own.distinguished_name.push(DnType::CommonName, "mocker self-signed");
        write("self.pem", &own.self_signed(&self_key).unwrap().pem());
        write("self.key", &self_key.serialize_pem());
        write("garbage.pem", "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n");
        write("empty.pem", "just text, no PEM blocks\n");
        Self { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `mocker serve` and the URLs it announced (workers first, the front last).
struct Serve {
    child: Child,
    urls: Vec<String>,
    lines: Vec<String>,
    rest: mpsc::Receiver<String>,
}

impl Serve {
    /// Starts the binary; waits for `announced` "... on URL" lines.
    fn start(args: &[&str], announced: usize) -> Self {
        let tokenizer = repo_root().join("tests/fixtures/tokenizers/all-minilm-l6-v2");
        let mut child = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "--model-name", "mocker-test"])
            .args(["--api-key", KEY, "--speedup-ratio", "20", "--tokenizer"])
            .arg(tokenizer)
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("mocker starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut urls, mut lines) = (Vec::new(), Vec::new());
        while urls.len() < announced {
            let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{lines:?}"));
            if let Some(url) = line.rsplit(" on ").next().filter(|u| u.contains("://")) {
                urls.push(url.trim().to_string());
            }
            lines.push(line);
        }
        Self { child, urls, lines, rest: rx }
    }

    /// The rest of the first later line that starts with `prefix`.
    fn line_after(&self, prefix: &str) -> String {
        loop {
            let line = self.rest.recv_timeout(Duration::from_secs(30)).expect("the line comes");
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_string();
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The main port and a second worker of `--num-workers 2` over TLS (a chain file: the leaf,
/// then its CA): announced as https,
/// plain and streamed completions and chats through the openai SDK, plain HTTP answered
/// with a JSON 400 naming https, a client that does not trust the CA refused, garbage in
/// place of a handshake dropped, and the server serving on after all of it.
#[test]
fn every_worker_serves_the_openai_sdk_over_tls() {
    let pki = Pki::new("basic");
    let (cert, key, ca) = (pki.path("fullchain.pem"), pki.path("server.key"), pki.path("ca.pem"));
    let serve = Serve::start(&["--num-workers", "2", "--ssl-certfile", &cert, "--ssl-keyfile", &key], 2);
    for url in &serve.urls {
        assert!(url.starts_with("https://127.0.0.1:"), "{:?}", serve.lines);
        let result = run_script("serve_tls.py", &["basic", url, KEY, &ca]);
        assert_eq!(result["ok"], true, "{result}");
    }
}

/// With the key in the certificate file (no --ssl-keyfile, as uvicorn's load_cert_chain
/// takes it), a TLS handshake holds a connection slot: with --max-connections 1 a second
/// TLS connection is answered 503 after its handshake; a connection that completes its
/// handshake but sends nothing, and one that never starts it, are both closed by the
/// header timeout, which frees the slot.
#[test]
fn handshakes_count_against_the_connection_limit_and_the_header_timeout() {
    let pki = Pki::new("limit");
    let serve = Serve::start(
        &[
            "--ssl-certfile",
            &pki.path("combined.pem"),
            "--max-connections",
            "1",
            "--header-timeout-seconds",
            "1",
        ],
        1,
    );
    let result = run_script("serve_tls.py", &["limit", &serve.urls[0], KEY, &pki.path("ca.pem")]);
    assert_eq!(result["ok"], true, "{result}");
}

/// --ssl-ca-certs with --ssl-cert-reqs 2 (CERT_REQUIRED): a client without a certificate is
/// refused, one with a certificate the CA signed is served.
#[test]
fn client_certificates_are_required_with_cert_reqs_2() {
    let pki = Pki::new("mtls");
    let ca = pki.path("ca.pem");
    let serve = Serve::start(
        &[
            "--ssl-certfile",
            &pki.path("server.pem"),
            "--ssl-keyfile",
            &pki.path("server.key"),
            "--ssl-ca-certs",
            &ca,
            "--ssl-cert-reqs",
            "2",
        ],
        1,
    );
    let result = run_script(
        "serve_tls.py",
        &["mtls", &serve.urls[0], KEY, &ca, &pki.path("client.pem"), &pki.path("client.key")],
    );
    assert_eq!(result["ok"], true, "{result}");
}

/// The announced URLs of a P/D deployment: prefill, decode, then the front.
fn deployment(args: &[&str]) -> Serve {
    let mut all = vec!["--prefill-workers", "1", "--decode-workers", "1", "--block-size", "16"];
    all.extend_from_slice(args);
    let serve = Serve::start(&all, 3);
    for url in &serve.urls {
        assert!(url.starts_with("https://"), "{:?}", serve.lines);
    }
    serve
}

/// A P/D deployment over TLS with a self-signed certificate (no CA anywhere): the front
/// reaches its workers and the decode worker reads the prefill's KV over https, trusting the
/// deployment's own certificate; every request is a handoff, none is recomputed.
#[test]
fn a_pd_deployment_transfers_kv_over_tls() {
    let pki = Pki::new("pd");
    let own = pki.path("self.pem");
    let serve = deployment(&["--ssl-certfile", &own, "--ssl-keyfile", &pki.path("self.key")]);
    let (decode, front) = (&serve.urls[1], &serve.urls[2]);
    let result = run_script("serve_tls.py", &["pd", front, KEY, &own, decode]);
    assert_eq!(result["ok"], true, "{result}");
}

/// The same with client certificates required: the front and the decode worker present the
/// server's certificate to the workers they call.
#[test]
fn a_pd_deployment_presents_its_certificate_where_one_is_required() {
    let pki = Pki::new("pd-mtls");
    let ca = pki.path("ca.pem");
    let serve = deployment(&[
        "--ssl-certfile",
        &pki.path("server.pem"),
        "--ssl-keyfile",
        &pki.path("server.key"),
        "--ssl-ca-certs",
        &ca,
        "--ssl-cert-reqs",
        "2",
    ]);
    let (decode, front) = (&serve.urls[1], &serve.urls[2]);
    let args = ["pd", front, KEY, &ca, decode, &pki.path("client.pem"), &pki.path("client.key")];
    let result = run_script("serve_tls.py", &args);
    assert_eq!(result["ok"], true, "{result}");
}

/// --ssl-cert-reqs 1 (CERT_OPTIONAL): a client without a certificate is served, so is one
/// with a certificate the CA signed; one whose certificate no configured CA signed is refused.
#[test]
fn client_certificates_are_checked_when_given_with_cert_reqs_1() {
    let pki = Pki::new("optional");
    let ca = pki.path("ca.pem");
    let serve = Serve::start(
        &["--ssl-certfile", &pki.path("combined.pem"), "--ssl-ca-certs", &ca, "--ssl-cert-reqs", "1"],
        1,
    );
    let args = [
        "optional",
        &serve.urls[0],
        KEY,
        &ca,
        &pki.path("client.pem"),
        &pki.path("client.key"),
        &pki.path("self.pem"),
        &pki.path("self.key"),
    ];
    let result = run_script("serve_tls.py", &args);
    assert_eq!(result["ok"], true, "{result}");
}

/// SGLang's PD protocol over TLS: the prefill server's bootstrap port speaks only TLS, and
/// the decode server reads the room over https (the prompt arrives as cached, no recompute).
#[test]
fn sglang_bootstrap_reads_go_over_tls() {
    let pki = Pki::new("sglang");
    let own = pki.path("self.pem");
    let tls = ["--ssl-certfile", own.as_str(), "--ssl-keyfile", &pki.path("self.key"), "--block-size", "16"];
    let mut args = tls.to_vec();
    args.extend(["--engine-args", r#"{"backend": "sglang", "worker_type": "prefill", "bootstrap_port": 0}"#]);
    let prefill = Serve::start(&args, 1);
    let at = prefill.line_after("mocker: SGLang bootstrap server on ");
    let port =
        at.strip_suffix(" (TLS)").unwrap_or_else(|| panic!("{at}")).rsplit(':').next().unwrap().to_string();
    let mut args = tls.to_vec();
    args.extend(["--engine-args", r#"{"backend": "sglang", "worker_type": "decode"}"#]);
    let decode = Serve::start(&args, 1);
    let result = run_script("serve_tls.py", &["sglang", &prefill.urls[0], &decode.urls[0], KEY, &own, &port]);
    assert_eq!(result["ok"], true, "{result}");
}

/// Runs `mocker serve` with `args`; it must exit 2 naming each of `named` on stderr.
fn assert_refused(args: &[&str], named: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .output()
        .expect("mocker runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    for name in named {
        assert!(stderr.contains(name), "{args:?} should name {name}: {stderr}");
    }
    assert!(!stderr.contains("serving model on"), "{args:?} started: {stderr}");
}

#[test]
fn bad_tls_flags_and_files_exit_2_naming_the_flag() {
    let pki = Pki::new("refusals");
    let [ca, combined, empty, garbage, other_key, server_key, server] =
        ["ca.pem", "combined.pem", "empty.pem", "garbage.pem", "other.key", "server.key", "server.pem"]
            .map(|f| pki.path(f));
    let missing = pki.path("missing.pem");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["--ssl-keyfile", &server_key], vec!["--ssl-keyfile", "--ssl-certfile"]),
        (vec!["--ssl-ca-certs", &ca], vec!["--ssl-ca-certs", "--ssl-certfile"]),
        (vec!["--ssl-cert-reqs", "2"], vec!["--ssl-cert-reqs", "--ssl-certfile"]),
        (
            vec!["--ssl-certfile", &combined, "--ssl-cert-reqs", "3"],
            vec!["--ssl-cert-reqs", "CERT_REQUIRED", "got 3"],
        ),
        (vec!["--ssl-certfile", &combined, "--ssl-cert-reqs", "-1"], vec!["--ssl-cert-reqs", "got -1"]),
        (vec!["--ssl-certfile", &combined, "--ssl-cert-reqs", "two"], vec!["--ssl-cert-reqs"]),
        (
            vec!["--ssl-certfile", &combined, "--ssl-cert-reqs", "1"],
            vec!["--ssl-cert-reqs", "--ssl-ca-certs"],
        ),
        (
            vec!["--ssl-certfile", &missing, "--ssl-keyfile", &server_key],
            vec!["--ssl-certfile", "missing.pem"],
        ),
        (vec!["--ssl-certfile", &server, "--ssl-keyfile", &missing], vec!["--ssl-keyfile", "missing.pem"]),
        (vec!["--ssl-certfile", &garbage, "--ssl-keyfile", &server_key], vec!["--ssl-certfile", "PEM"]),
        (
            vec!["--ssl-certfile", &empty, "--ssl-keyfile", &server_key],
            vec!["--ssl-certfile", "no PEM certificate"],
        ),
        (vec!["--ssl-certfile", &server], vec!["--ssl-certfile", "no private key", "--ssl-keyfile"]),
        (vec!["--ssl-certfile", &server, "--ssl-keyfile", &ca], vec!["--ssl-keyfile", "no PEM private key"]),
        (
            vec!["--ssl-certfile", &server, "--ssl-keyfile", &other_key],
            vec!["--ssl-keyfile", "does not match"],
        ),
        (
            vec!["--ssl-certfile", &combined, "--ssl-ca-certs", &empty, "--ssl-cert-reqs", "2"],
            vec!["--ssl-ca-certs", "no PEM certificate"],
        ),
        (
            vec!["--ssl-certfile", &combined, "--ssl-ca-certs", &missing],
            vec!["--ssl-ca-certs", "missing.pem"],
        ),
    ];
    for (args, named) in &cases {
        assert_refused(args, named);
    }
    // A P/D deployment checks the files before its front binds, too.
    assert_refused(
        &[
            "--prefill-workers",
            "1",
            "--decode-workers",
            "1",
            "--ssl-certfile",
            &server,
            "--ssl-keyfile",
            &other_key,
        ],
        &["--ssl-keyfile", "does not match"],
    );
}
