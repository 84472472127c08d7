//! Certificates made inside a test (none are committed): an authority, and leaf certificates
//! it signs for loopback, written as PEM files.

use std::path::{Path, PathBuf};

/// A certificate authority whose files live in a directory.
pub struct Pki {
    dir: PathBuf,
    name: String,
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
}

impl Pki {
    /// A new authority named `name`, its certificate written to `DIR/NAME.pem`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        Pki { dir: dir.to_path_buf(), name: name.to_string(), params, key }
    }

    /// The authority's certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// A certificate with common name `cn`, for `localhost` and `127.0.0.1`, written to
    /// `DIR/FILE.pem` and `DIR/FILE.key`; `expired`: valid only in 2020. The two files.
    pub fn issue(&self, cn: &str, file: &str, expired: bool) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let (c, k) = (self.dir.join(format!("{file}.pem")), self.dir.join(format!("{file}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}
