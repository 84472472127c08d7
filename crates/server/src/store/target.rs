//! Where a store on etcd lives: the members' URLs and the key prefix, checked as given.

/// The default etcd key prefix.
pub const DEFAULT_ETCD_PREFIX: &str = "/tollgate";

/// Where the settings live in etcd.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdTarget {
    /// Client URLs of the cluster's members (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The key prefix: starts with `/`, no trailing `/`.
    pub prefix: String,
}

impl EtcdTarget {
    /// Reads `--etcd URL[,URL…]` and `--etcd-prefix`, saying what is wrong with either.
    pub fn parse(urls: &str, prefix: &str) -> Result<EtcdTarget, String> {
        let endpoints: Vec<String> = urls.split(',').map(str::trim).map(String::from).collect();
        if endpoints.is_empty() || endpoints.len() > 16 {
            return Err(format!("--etcd: give 1 to 16 URLs, got {}", endpoints.len()));
        }
        for e in &endpoints {
            let rest = e.strip_prefix("http://").ok_or_else(|| {
                format!("--etcd: {e:?} must be an http:// URL such as http://127.0.0.1:2379")
            })?;
            let host_port = rest.trim_end_matches('/');
            let ok = host_port
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok || host_port.contains('/') {
                return Err(format!("--etcd: {e:?} must be http://HOST:PORT"));
            }
        }
        let ok = prefix.starts_with('/')
            && prefix.len() > 1
            && prefix.len() <= 256
            && !prefix.ends_with('/')
            && prefix.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(format!(
                "--etcd-prefix: {prefix:?} must start with /, not end with /, and be 2 to 256 printable ASCII characters"
            ));
        }
        Ok(EtcdTarget { endpoints, prefix: prefix.to_string() })
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    /// Where region `name`'s controllers hold their election: `PREFIX/regions/NAME`.
    pub(crate) fn region(&self, name: &str) -> EtcdTarget {
        EtcdTarget { endpoints: self.endpoints.clone(), prefix: format!("{}/regions/{name}", self.prefix) }
    }

    pub(crate) fn describe(&self) -> String {
        format!("etcd {} prefix {}", self.endpoints.join(","), self.prefix)
    }
}
