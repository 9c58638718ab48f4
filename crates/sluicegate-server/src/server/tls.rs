//! TLS on the service's listeners (rustls, ring): the certificate and key read from PEM
//! files and read again when they change (new handshakes use the new pair; a pair that
//! does not load is logged and the previous one keeps serving), and, with a client
//! authority, mTLS: a client without a certificate it signed is refused in the handshake,
//! and, with a client name too, a client whose certificate does not carry that name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::client::verify_server_name;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio_rustls::TlsAcceptor;

/// Where the service's certificate, key and (for mTLS) client authority are.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    /// The certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With it, clients must present a certificate this authority (PEM) signed.
    pub client_ca: Option<PathBuf>,
    /// With it (and `client_ca`), the client's certificate must also carry this name (a DNS
    /// name or an IP address among its subject alternative names), as envoyproxy/ratelimit
    /// checks GRPC_CLIENT_TLS_SAN.
    pub client_san: Option<String>,
}

/// The TLS side of a listener.
pub(super) struct Tls {
    acceptor: TlsAcceptor,
    certificate: Arc<Certificate>,
    options: TlsOptions,
    /// The files' bytes the pair in force was parsed from: an edit made between the start
    /// and the first look is still an edit.
    loaded: PemFiles,
}

impl Tls {
    /// Loads the files: what is wrong with them is an error now, at start.
    pub(super) fn load(options: TlsOptions) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let loaded = read_files(&options)?;
        let pair = parse_pair(&options, &loaded, &provider)?;
        let certificate = Arc::new(Certificate {
            current: ArcSwap::from_pointee(pair),
        });
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match (&options.client_ca, &options.client_san) {
            (Some(path), san) => {
                let roots = trusted_roots(path)?;
                let mut verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .with_context(|| format!("{}: client authority", path.display()))?;
                if let Some(san) = san {
                    let name = ServerName::try_from(san.clone())
                        .with_context(|| format!("{san:?}: not a DNS name or an IP address"))?;
                    verifier = Arc::new(NamedClients {
                        authority: verifier,
                        name,
                    });
                }
                builder.with_client_cert_verifier(verifier)
            }
            (None, Some(san)) => {
                anyhow::bail!("the client name {san:?} needs a client authority to check it")
            }
            (None, None) => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::clone(&certificate) as Arc<dyn ResolvesServerCert>);
        // HTTP/2 first: gRPC clients insist on it; HTTP/1.1 clients get HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            certificate,
            options,
            loaded,
        })
    }

    pub(super) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Reads the certificate and key every `interval`, and puts a changed pair in force
    /// for the handshakes that follow.
    pub(super) async fn reload_on_change(self: Arc<Self>, interval: Duration) {
        let provider = rustls::crypto::ring::default_provider();
        // What the files held at the last look, or why they could not be read: an edit, or
        // a failure, is acted on once. The bytes that tell an edit are the bytes parsed.
        let look = || read_files(&self.options).map_err(|e| format!("{e:#}"));
        let mut loaded = Ok(self.loaded.clone());
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let now = look();
            if now == loaded {
                continue;
            }
            match now
                .as_ref()
                .map(|files| parse_pair(&self.options, files, &provider))
            {
                Ok(Ok(pair)) => {
                    self.certificate.current.store(Arc::new(pair));
                    tracing::info!(cert = %self.options.cert.display(), "TLS certificate reloaded");
                }
                // Files half-written by a deployment land here once, then load next time.
                Ok(Err(e)) => {
                    tracing::error!(error = %format!("{e:#}"), "TLS certificate rejected; the previous one keeps serving");
                }
                Err(e) => {
                    tracing::error!(error = %e, "TLS certificate unreadable; the previous one keeps serving");
                }
            }
            loaded = now;
        }
    }
}

/// Clients with a certificate the authority signed that also carries `name`.
#[derive(Debug)]
struct NamedClients {
    authority: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClients {
    fn offer_client_auth(&self) -> bool {
        self.authority.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.authority.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.authority.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .authority
            .verify_client_cert(end_entity, intermediates, now)?;
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, &self.name)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.authority
            .verify_tls12_signature(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.authority
            .verify_tls13_signature(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.authority.supported_verify_schemes()
    }
}

/// The certificate and key files' bytes.
type PemFiles = (Vec<u8>, Vec<u8>);

/// The pair in force, swapped whole on reload.
#[derive(Debug)]
struct Certificate {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The certificate and key files' bytes.
fn read_files(options: &TlsOptions) -> anyhow::Result<PemFiles> {
    let read = |path: &Path| {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    };
    Ok((read(&options.cert)?, read(&options.key)?))
}

/// The certificate and key in `files`, checked to belong together.
fn parse_pair(
    options: &TlsOptions,
    (cert_pem, key_pem): &PemFiles,
    provider: &CryptoProvider,
) -> anyhow::Result<CertifiedKey> {
    let certs = parse_certs(cert_pem, &options.cert)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .with_context(|| format!("{}: no PEM private key in it", options.key.display()))?;
    CertifiedKey::from_der(certs, key, provider).with_context(|| {
        format!(
            "{} and {}: not a certificate and its key",
            options.cert.display(),
            options.key.display()
        )
    })
}

/// The authorities of a PEM file, to trust: the server's client authority for mTLS, and
/// the authority `sluicegate check --tls-ca` trusts.
pub(crate) fn trusted_roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots
            .add(cert)
            .with_context(|| format!("{}: not a CA certificate", path.display()))?;
    }
    Ok(roots)
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_certs(&pem, path)
}

/// The certificates of a PEM file's text; at least one.
fn parse_certs(pem: &[u8], path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no certificate in it",
        path.display()
    );
    Ok(certs)
}
