//! Throwaway certificate authorities and the certificates they sign, made with the
//! `openssl` command line (`scripts/test` installs it) in a directory of the test's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A self-signed certificate authority: `NAME.crt` and `NAME.key` in its directory.
pub struct Authority {
    dir: PathBuf,
    name: String,
}

/// A certificate an [`Authority`] signed, and its private key (PEM files).
pub struct Issued {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key, unencrypted.
    pub key: PathBuf,
}

impl Authority {
    /// Makes the authority `name` in `dir` (created if missing), valid for two days.
    pub fn new(dir: &Path, name: &str) -> Authority {
        std::fs::create_dir_all(dir).unwrap();
        let authority = Authority {
            dir: dir.to_owned(),
            name: name.to_owned(),
        };
        authority.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=sluicegate test CA {name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ]);
        authority
    }

    /// The authority's own certificate, to trust it.
    pub fn cert(&self) -> PathBuf {
        self.dir.join(format!("{}.crt", self.name))
    }

    /// Signs a certificate `name` (`name.crt`, `name.key`) for 127.0.0.1 and localhost,
    /// good for a server and a client alike.
    pub fn issue(&self, name: &str) -> Issued {
        self.issue_for(name, "IP:127.0.0.1,DNS:localhost")
    }

    /// Signs a certificate `name` whose subject alternative names are `names` (openssl's
    /// form: `DNS:a.example,IP:127.0.0.1`), good for a server and a client alike.
    pub fn issue_for(&self, name: &str, names: &str) -> Issued {
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        let extensions = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&extensions),
            format!("subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        )
        .unwrap();
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{}.crt", self.name),
            "-CAkey",
            &format!("{}.key", self.name),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &extensions,
            "-out",
            &format!("{name}.crt"),
        ]);
        Issued {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        }
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect(
                "openssl is needed: run scripts/test (it installs it) or apt-get install openssl",
            );
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
