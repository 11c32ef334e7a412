//! Secrets the program never sees: what a secret is, the per-server CA whose leaves let
//! the proxy terminate TLS for the hosts that have one, and the TLS settings both ways.
//! `intercept.rs` serves an intercepted connection with them.
//!
//! The CA's key stays on the host (under the server's data directory, mode 0600); only its
//! certificate goes into a sandbox. Its name constraints permit exactly the DNS subtrees of
//! the secret hosts and no IP address, so a client that trusts it trusts nothing else it
//! might sign.

use crate::host::Host;
use http::{HeaderName, HeaderValue};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The CA's files under the directory given to `Ca::load_or_create`.
pub const CA_KEY_FILE: &str = "egress-ca-key.pem";
pub const CA_CERT_FILE: &str = "egress-ca.pem";
/// The secret hosts the stored certificate was made for, one a line.
const CA_HOSTS_FILE: &str = "egress-ca-hosts";
const CA_NAME: &str = "sandcall egress secrets CA";
/// A leaf is valid this long and reissued after `LEAF_REUSE`.
const LEAF_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
const LEAF_REUSE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The CA certificate is valid this long (its key is kept; the certificate is remade when
/// the secret hosts change).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The shortest placeholder: shorter ones could turn up in requests by chance.
const MIN_PLACEHOLDER: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("invalid secret: {0}")]
    Invalid(String),
    #[error("egress CA: {0}")]
    Ca(String),
}

/// A secret's value. It has no `Display`, and its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: String) -> Self {
        SecretValue(value)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A secret for one host and one header: the program sends `placeholder` in that header
/// (alone or inside it, as in `Bearer <placeholder>`), the upstream receives `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// A DNS name, lower case, without a trailing dot.
    pub host: String,
    pub header: HeaderName,
    pub placeholder: String,
    pub value: SecretValue,
}

impl Secret {
    /// Checks a secret: a DNS name (not an address, not a wildcard), a header name, a
    /// placeholder of at least 8 visible ASCII characters, a value that can stand in a
    /// header, and neither inside the other.
    pub fn new(host: &str, header: &str, placeholder: &str, value: SecretValue) -> Result<Secret, SecretError> {
        let invalid = |why: String| Err(SecretError::Invalid(why));
        let host = match Host::parse(host) {
            Some(Host::Name(name)) => name,
            _ => return invalid(format!("{host:?} is not a DNS name")),
        };
        let Ok(header) = HeaderName::from_bytes(header.as_bytes()) else {
            return invalid(format!("{header:?} is not a header name"));
        };
        let visible = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
        if placeholder.len() < MIN_PLACEHOLDER || !visible(placeholder) {
            return invalid(format!(
                "the placeholder for {host} must be at least {MIN_PLACEHOLDER} visible ASCII characters"
            ));
        }
        // Said without the value.
        if value.0.is_empty() || HeaderValue::from_str(&value.0).is_err() {
            return invalid(format!("the value of the secret for {host} cannot stand in a header"));
        }
        if value.0.contains(placeholder) || placeholder.contains(&value.0) {
            return invalid(format!(
                "the placeholder and the value of the secret for {host} overlap"
            ));
        }
        Ok(Secret {
            host,
            header,
            placeholder: placeholder.to_string(),
            value,
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn ca_error(what: &str, e: impl fmt::Display) -> SecretError {
    SecretError::Ca(format!("{what}: {e}"))
}

/// The per-server CA: its signing key, its certificate and the leaves it has issued.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    hosts: Vec<String>,
    leaves: Mutex<HashMap<String, (Instant, Arc<ServerConfig>)>>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").field("hosts", &self.hosts).finish_non_exhaustive()
    }
}

impl Ca {
    /// The CA kept in `dir`: its key is created at the first start (mode 0600) and reused
    /// after; its certificate is reused while the secret hosts are the same, and remade
    /// (with the same key) when they change, since its name constraints list them.
    pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<Ca, SecretError> {
        let mut hosts: Vec<String> = hosts.to_vec();
        hosts.sort();
        hosts.dedup();
        std::fs::create_dir_all(dir).map_err(|e| ca_error(&format!("creating {}", dir.display()), e))?;
        let key_path = dir.join(CA_KEY_FILE);
        let key = match std::fs::read_to_string(&key_path) {
            Ok(pem) => KeyPair::from_pem(&pem).map_err(|e| ca_error(&format!("reading {}", key_path.display()), e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = KeyPair::generate().map_err(|e| ca_error("making a key", e))?;
                write_private(&key_path, key.serialize_pem().as_bytes(), true)?;
                key
            }
            Err(e) => return Err(ca_error(&format!("reading {}", key_path.display()), e)),
        };
        let params = ca_params(&hosts);
        let cert_path = dir.join(CA_CERT_FILE);
        let hosts_path = dir.join(CA_HOSTS_FILE);
        let listed = hosts.join("\n");
        let stored = match std::fs::read_to_string(&hosts_path) {
            Ok(text) if text == listed => std::fs::read_to_string(&cert_path).ok(),
            _ => None,
        };
        let stored_der = stored
            .as_deref()
            .and_then(|pem| CertificateDer::from_pem_slice(pem.as_bytes()).ok());
        let (cert_pem, cert_der) = match (stored, stored_der) {
            (Some(pem), Some(der)) => (pem, der),
            _ => {
                let mut params = params.clone();
                let now = time::OffsetDateTime::now_utc();
                params.not_before = now - time::Duration::days(1);
                params.not_after = now + CA_VALIDITY;
                let cert = params
                    .self_signed(&key)
                    .map_err(|e| ca_error("making its certificate", e))?;
                write_private(&cert_path, cert.pem().as_bytes(), false)?;
                write_private(&hosts_path, listed.as_bytes(), false)?;
                (cert.pem(), cert.der().clone())
            }
        };
        Ok(Ca {
            issuer: Issuer::new(params, key),
            cert_der,
            cert_pem,
            hosts,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM), for the sandbox's trust store.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The secret hosts its name constraints permit.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The TLS settings that present a leaf for `host` (issued once and reused a week).
    pub(crate) fn leaf(&self, host: &str) -> Result<Arc<ServerConfig>, SecretError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made, config)) = leaves.get(host) {
            if made.elapsed() < LEAF_REUSE {
                return Ok(config.clone());
            }
        }
        let config = Arc::new(self.issue(host)?);
        leaves.insert(host.to_string(), (Instant::now(), config.clone()));
        Ok(config)
    }

    fn issue(&self, host: &str) -> Result<ServerConfig, SecretError> {
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| ca_error(&format!("a leaf for {host}"), e))?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        params.distinguished_name = name;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + LEAF_VALIDITY;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(|e| ca_error("making a leaf key", e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| ca_error(&format!("signing a leaf for {host}"), e))?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ca_error("TLS settings", e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.cert_der.clone()], key_der)
            .map_err(|e| ca_error("TLS settings", e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The CA's parameters: the same at every start, so that leaves issued by a later start
/// chain to the stored certificate.
fn ca_params(hosts: &[String]) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    name.push(DnType::OrganizationName, "sandcall");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: hosts.iter().map(|h| GeneralSubtree::DnsName(h.clone())).collect(),
        // No address at all: only names, and only those above.
        excluded_subtrees: vec![
            GeneralSubtree::IpAddress(rcgen::CidrSubnet::from_v4_prefix([0; 4], 0)),
            GeneralSubtree::IpAddress(rcgen::CidrSubnet::from_v6_prefix([0; 16], 0)),
        ],
    });
    params
}

/// Writes a file only its owner may read, replacing it whole (or, with `new`, only if it
/// does not exist yet).
fn write_private(path: &Path, bytes: &[u8], new: bool) -> Result<(), SecretError> {
    let fail = |e: std::io::Error| ca_error(&format!("writing {}", path.display()), e);
    let target: PathBuf = if new {
        path.to_path_buf()
    } else {
        path.with_extension("tmp")
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600);
    if new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    let mut file = options.open(&target).map_err(fail)?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(fail)?;
    if !new {
        std::fs::rename(&target, path).map_err(fail)?;
    }
    Ok(())
}

/// What TLS interception needs: the CA for the program's side, and the trust store for
/// the upstream side (the distribution's, plus roots the configuration adds).
#[derive(Debug)]
pub struct Interceptor {
    pub(crate) ca: Ca,
    pub(crate) upstream: Arc<ClientConfig>,
    /// The distribution's roots (PEM), for the sandbox's bundle.
    system_pem: String,
}

impl Interceptor {
    /// Upstreams are verified against the distribution's trust store (what
    /// `rustls-native-certs` finds: `SSL_CERT_FILE`, else /etc/ssl/certs and the like) and
    /// `extra_roots_pem` (PEM certificates; for tests and private CAs).
    pub fn new(ca: Ca, extra_roots_pem: &[u8]) -> Result<Interceptor, SecretError> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "egress: reading the system's trust store");
        }
        let system_pem: String = native.certs.iter().map(|c| to_pem(c)).collect();
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, ignored, "egress: the system's trust roots");
        for cert in CertificateDer::pem_slice_iter(extra_roots_pem) {
            let cert = cert.map_err(|e| ca_error("reading the extra roots", e))?;
            roots.add(cert).map_err(|e| ca_error("adding an extra root", e))?;
        }
        if roots.is_empty() {
            return Err(SecretError::Ca("no trust roots for upstream servers".into()));
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ca_error("TLS settings", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interceptor {
            ca,
            upstream: Arc::new(config),
            system_pem,
        })
    }

    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The trust bundle for a sandbox (`SSL_CERT_FILE` and the like): the distribution's
    /// roots and the CA's certificate, PEM. Its hosts' clients verify the proxy's leaves
    /// with it, and every other host's real certificate as before.
    pub fn trust_bundle(&self) -> String {
        format!("{}{}", self.system_pem, self.ca.cert_pem)
    }
}

fn to_pem(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_value_never_prints() {
        let secret = Secret::new(
            "API.example.com.",
            "authorization",
            "PLACEHOLDER-1",
            SecretValue::new("s3cr3t-v4lue".into()),
        )
        .unwrap();
        assert_eq!(secret.host, "api.example.com");
        let shown = format!("{secret:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn secrets_are_checked() {
        let v = |s: &str| SecretValue::new(s.into());
        assert!(Secret::new("*.example.com", "x-key", "PLACEHOLDER", v("value")).is_err());
        assert!(Secret::new("10.0.0.1", "x-key", "PLACEHOLDER", v("value")).is_err());
        assert!(Secret::new("a.example.com", "x key", "PLACEHOLDER", v("value")).is_err());
        assert!(Secret::new("a.example.com", "x-key", "short", v("value")).is_err());
        assert!(Secret::new("a.example.com", "x-key", "PLACEHOLDER", v("bad\nvalue")).is_err());
        assert!(Secret::new("a.example.com", "x-key", "PLACEHOLDER", v("xPLACEHOLDERx")).is_err());
        let err = Secret::new("a.example.com", "x-key", "PLACEHOLDER", v("bad\nvalue")).unwrap_err();
        assert!(!err.to_string().contains("bad"), "{err}");
    }
}
