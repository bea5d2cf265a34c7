//! Who a decode server may read KV from. The peer's address arrives in the request
//! (`kv_transfer_params.remote_host` / `remote_port`, SGLang's `bootstrap_host` /
//! `bootstrap_port`), so a client could otherwise make the server POST anywhere, with any
//! path smuggled into the host. A host must be an IP address or a DNS name, and every
//! address it resolves to must lie in the allow-list (`--kv-peer-allow`; by default
//! loopback and the server's own address); the read then dials the checked address itself,
//! so a name cannot resolve differently between the check and the connection.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::error::ApiError;

/// Networks a decode server may read KV from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAllowList(Vec<IpNet>);

impl PeerAllowList {
    /// Loopback (127.0.0.0/8, ::1) and `own`, the address this server is bound to (when
    /// it is a specific one): a P/D pair on one machine, or on one address, needs no flag.
    pub fn default_for(own: IpAddr) -> Self {
        let mut nets: Vec<IpNet> =
            vec!["127.0.0.0/8".parse().expect("a CIDR"), "::1/128".parse().expect("a CIDR")];
        if !own.is_unspecified() && !own.is_loopback() {
            nets.push(IpNet::from(own));
        }
        Self(nets)
    }

    /// Parses `--kv-peer-allow`: comma-separated CIDRs or single addresses.
    pub fn parse(text: &str) -> Result<Self, String> {
        let nets = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{s:?} is not a CIDR (10.0.0.0/8) or an IP address"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if nets.is_empty() {
            return Err("expected at least one CIDR or IP address".into());
        }
        Ok(Self(nets))
    }

    /// Whether `ip` lies in an allowed network.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// The address to dial for `host:port`: `host` resolved, every address allowed.
    /// `field` names the request field the host came from.
    pub async fn resolve(&self, field: &str, host: &str, port: u16) -> Result<SocketAddr, ApiError> {
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| {
                    ApiError::invalid_field(field, format!("{field}: cannot resolve {host:?}: {e}"))
                })?
                .collect(),
        };
        match addrs.iter().find(|a| !self.allows(a.ip())) {
            Some(refused) => Err(ApiError::invalid_field(
                field,
                format!(
                    "{field}: {host} ({}) is not an allowed KV peer; allow its network with --kv-peer-allow",
                    refused.ip()
                ),
            )),
            None => addrs.into_iter().next().ok_or_else(|| {
                ApiError::invalid_field(field, format!("{field}: {host:?} resolves to no address"))
            }),
        }
    }
}

/// Checks that `host` is an IP address or a DNS name (letters, digits and hyphens in
/// dot-separated labels of 1 to 63 characters, 253 at most): no port, path, query,
/// credentials or spaces, which would change the URL the read is sent to.
pub fn check_host(field: &str, host: &str) -> Result<(), ApiError> {
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    if !host.is_empty() && host.len() <= 253 && name.split('.').all(label_ok) {
        return Ok(());
    }
    let shown: String = host.chars().take(80).collect();
    Err(ApiError::invalid_field(
        field,
        format!("{field}: expected an IP address or a host name (no port or path), got {shown:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_addresses_or_names_only() {
        for ok in ["127.0.0.1", "::1", "prefill-0", "p0.cluster.local", "p0.cluster.local.", "10.1.2.3"] {
            check_host("remote_host", ok).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        }
        for bad in [
            "127.0.0.1:8000/injected/path?q=",
            "127.0.0.1:8000",
            "user@host",
            "a b",
            "",
            "-lead",
            "x/y",
            "[::1]",
            &"a".repeat(64),
        ] {
            let e = check_host("remote_host", bad).unwrap_err();
            assert!(e.message.contains("remote_host"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn the_default_list_allows_loopback_and_the_servers_own_address() {
        let own: IpAddr = "192.0.2.7".parse().unwrap();
        let list = PeerAllowList::default_for(own);
        for ip in ["127.0.0.1", "127.9.9.9", "::1", "192.0.2.7", "::ffff:127.0.0.1"] {
            assert!(list.allows(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["192.0.2.8", "10.0.0.1", "169.254.169.254", "::2"] {
            assert!(!list.allows(ip.parse().unwrap()), "{ip}");
        }
        let parsed = PeerAllowList::parse("10.0.0.0/8, 192.0.2.9").unwrap();
        assert!(parsed.allows("10.200.0.1".parse().unwrap()) && parsed.allows("192.0.2.9".parse().unwrap()));
        assert!(!parsed.allows("127.0.0.1".parse().unwrap()), "an explicit list replaces the default");
        assert!(PeerAllowList::parse("10.0.0.0/33").is_err());
        assert!(PeerAllowList::parse(" , ").is_err());
    }

    #[tokio::test]
    async fn resolution_refuses_a_name_or_address_outside_the_list() {
        let list = PeerAllowList::parse("127.0.0.2/32").unwrap();
        assert_eq!(
            list.resolve("remote_host", "127.0.0.2", 9).await.unwrap(),
            "127.0.0.2:9".parse().unwrap()
        );
        let e = list.resolve("remote_host", "127.0.0.1", 9).await.unwrap_err();
        assert!(e.message.contains("--kv-peer-allow"), "{e:?}");
        // localhost resolves to loopback addresses only, none of them 127.0.0.2.
        assert!(list.resolve("remote_host", "localhost", 9).await.is_err());
    }
}
